"""`python -m sgl.launch_server` as a user starts it: CLI options reach the engine and the
app, SIGTERM drains (in-flight requests finish, new ones get 503) and exits 0, and an engine
fault exits 1 after the failed requests are answered, so a supervisor restarts the server."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pytest
import requests
from process_helpers import fault_env, gone
from server_helpers import assert_error, sse_lines, wait_until

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _up(url: str) -> bool:
    try:
        return requests.get(url + "/health", timeout=2).status_code == 200
    except requests.ConnectionError:
        return False


def test_launch_server_cli_and_graceful_sigterm():
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [
        sys.executable,
        "-m",
        "sgl.launch_server",
        "--model-path",
        "default",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-total-tokens",
        "4096",
        "--schedule-policy",
        "fcfs",
        "--served-model-name",
        "launched",
        "--api-key",
        "k",
        "--log-level",
        "warning",
        "--graceful-shutdown-timeout",
        "600",
    ]  # long: a loaded machine may decode slowly
    proc = subprocess.Popen(
        cmd,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert wait_until(lambda: _up(url) or proc.poll() is not None, timeout=180, interval=0.25)
        assert proc.poll() is None, proc.stdout.read()
        auth = {"Authorization": "Bearer k"}
        assert_error(requests.get(url + "/v1/models", timeout=10), 401)
        assert [
            m["id"]
            for m in requests.get(url + "/v1/models", headers=auth, timeout=10).json()["data"]
        ] == ["launched"]
        info = requests.get(url + "/get_server_info", headers=auth, timeout=10).json()
        assert info["max_total_tokens"] == 4096 and info["schedule_policy"] == "fcfs"
        assert (
            info["scheduler_process"] and len(info["scheduler_pids"]) == 1
        )  # the server's default

        # a long stream in flight: SIGTERM drains, so it finishes while new requests get 503
        body = {
            "text": "Count:",
            "sampling_params": {"max_new_tokens": 200, "ignore_eos": True},
            "stream": True,
        }
        with requests.post(
            url + "/generate", json=body, headers=auth, stream=True, timeout=120
        ) as stream:
            lines = sse_lines(stream)
            assert next(line for line in lines if line).startswith("data: {")
            proc.send_signal(signal.SIGTERM)
            assert wait_until(
                lambda: requests.get(url + "/health", timeout=10).status_code == 503,
                timeout=60,
                interval=0.02,
            )
            refused = requests.post(url + "/generate", json=body, headers=auth, timeout=60)
            assert_error(refused, 503)
            assert int(refused.headers["Retry-After"]) >= 1
            events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        assert events[-1]["meta_info"]["finish_reason"]["type"] == "length"
        assert events[-1]["meta_info"]["completion_tokens"] == 200  # finished, not cut off
        assert proc.wait(timeout=60) == 0
        assert all(gone(pid) for pid in info["scheduler_pids"])  # stopped with the server
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _start_tiny_server(port: int, tmp_path, *flags: str, fault: bool = False) -> subprocess.Popen:
    env = {**os.environ, **(fault_env(tmp_path) if fault else {})}
    cmd = [
        sys.executable,
        "-m",
        "sgl.launch_server",
        "--model-path",
        "tiny-llama",
        "--load-format",
        "dummy",
        "--max-total-tokens",
        "1024",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
        *flags,
    ]
    return subprocess.Popen(
        cmd,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.parametrize("mode", ["--scheduler-process", "--no-scheduler-process"])
def test_an_engine_fault_answers_with_an_incident_and_exits_1(mode, tmp_path):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _start_tiny_server(port, tmp_path, mode, fault=True)
    try:
        assert wait_until(lambda: _up(url) or proc.poll() is not None, timeout=180, interval=0.25)
        assert proc.poll() is None, proc.stdout.read()
        ok = requests.post(
            url + "/generate",
            json={"text": "a", "sampling_params": {"max_new_tokens": 2}},
            timeout=60,
        )
        assert ok.status_code == 200
        r = requests.post(
            url + "/generate",
            json={"text": "a", "sampling_params": {"max_new_tokens": 2}, "rid": "boom"},
            timeout=60,
        )
        err = assert_error(r, 500)
        incident = err["message"].split("incident ")[1].split(";")[0]
        assert proc.wait(timeout=60) == 1
        log = proc.stdout.read()
        assert f"incident {incident}" in log and "Traceback" in log and "injected fault" in log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("tp_size,killed_rank", [(1, 0), (2, 1)])
def test_a_killed_scheduler_process_fails_the_stream_and_exits_1(tmp_path, tp_size, killed_rank):
    """A scheduler process dies (OOM killer, a crash in native code; at --tp-size 2 the rank
    that does not talk to the server): the request in flight fails at once, the server drains
    and exits non-zero for its supervisor, and no scheduler process is left (/health's 503 is
    held in test_tensor_parallel_serving.py, on an app that does not exit)."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _start_tiny_server(port, tmp_path, "--tp-size", str(tp_size))
    try:
        assert wait_until(lambda: _up(url) or proc.poll() is not None, timeout=180, interval=0.25)
        assert proc.poll() is None, proc.stdout.read()
        pids = requests.get(url + "/get_server_info", timeout=10).json()["scheduler_pids"]
        assert len(pids) == tp_size
        pid = pids[killed_rank]
        body = {
            "text": "Count:",
            "sampling_params": {"max_new_tokens": 900, "ignore_eos": True},
            "stream": True,
        }
        with requests.post(url + "/generate", json=body, stream=True, timeout=120) as stream:
            lines = sse_lines(stream)
            assert next(line for line in lines if line).startswith("data: {")
            os.kill(pid, signal.SIGKILL)
            rest = [line for line in lines if line.startswith("data: {")]
        error = json.loads(rest[-1][6:])["error"]
        incident = error["message"].split("incident ")[1].split(";")[0]
        assert proc.wait(timeout=60) == 1
        log = proc.stdout.read()
        assert (
            f"incident {incident}: the scheduler process (pid {pid}, rank {killed_rank}) exited "
            "unexpectedly" in log
        ), log[-3000:]
        assert all(gone(p) for p in pids)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


MARKER = "zq-private-prompt-7781"  # a string no log line has a reason to contain


@pytest.mark.parametrize("log_requests", [False, True])
def test_prompts_and_outputs_are_logged_only_when_asked(log_requests):
    """At the most verbose log level, a server started without `--log-requests` writes no
    prompt and no output into its log, for a good request or a refused one; with it, both."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [
        sys.executable,
        "-m",
        "sgl.launch_server",
        "--model-path",
        "tiny-llama",
        "--load-format",
        "dummy",
        "--max-total-tokens",
        "1024",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "debug",
        *(["--log-requests"] if log_requests else []),
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert wait_until(lambda: _up(url) or proc.poll() is not None, timeout=180, interval=0.25)
        assert proc.poll() is None, proc.stdout.read()
        outputs = [
            requests.post(
                url + "/generate",
                json={"text": MARKER, "sampling_params": {"max_new_tokens": 8}},
                timeout=60,
            ).json()["text"],
            requests.post(
                url + "/v1/completions", json={"prompt": MARKER, "max_tokens": 8}, timeout=60
            ).json()["choices"][0]["text"],
            requests.post(
                url + "/v1/chat/completions",
                json={"messages": [{"role": "user", "content": MARKER}], "max_tokens": 8},
                timeout=60,
            ).json()["choices"][0]["message"]["content"],
        ]
        refused = requests.post(
            url + "/generate",
            json={"text": MARKER, "sampling_params": {"temperature": -1}},
            timeout=60,
        )
        assert_error(refused, 400, "temperature")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        log = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "POST /generate" in log  # the access log is on: the log was captured at all
    distinctive = [text for text in outputs if len(text.strip()) >= 12]
    if log_requests:
        assert log.count(MARKER) >= 4 and log.count("  response: {") >= 4
    else:
        assert MARKER not in log and not any(text.strip() in log for text in distinctive), log[
            -3000:
        ]


def test_sglang_command_line_with_a_config_file_and_a_chat_template(tmp_path):
    """SGLang's spellings and a --config file reach the server.

    The file's chat template renders /tokenize's messages, its served name is the model's id,
    and its guarded /metrics needs the key."""
    (tmp_path / "t.jinja").write_text(
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    (tmp_path / "cfg.yaml").write_text(
        f"chat_template: {tmp_path / 't.jinja'}\nserved-model-name: cfg-model\n"
        "metrics_require_api_key: true\ndtype: float\n"
    )
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    (tmp_path / "key").write_text("k")
    proc = _start_tiny_server(
        port,
        tmp_path,
        "--config",
        str(tmp_path / "cfg.yaml"),
        "--tp",
        "1",
        "--served-model-name",
        "cli-model",
        "--api-key-file",
        str(tmp_path / "key"),
    )
    key = {"Authorization": "Bearer k"}
    try:
        assert wait_until(lambda: _up(url) or proc.poll() is not None, timeout=180, interval=0.25)
        assert proc.poll() is None, proc.stdout.read()
        assert (
            requests.get(url + "/v1/models/cli-model", headers=key, timeout=30).json()["id"]
            == "cli-model"
        )
        assert_error(
            requests.get(url + "/v1/models/cfg-model", headers=key, timeout=30), 404, "model"
        )
        assert_error(requests.get(url + "/metrics", timeout=30), 401)
        info = requests.get(url + "/get_server_info", headers=key, timeout=30).json()
        assert info["dtype"] == "float32", info.get("dtype")
        roles = requests.get(url + "/get_model_info", headers=key, timeout=30).json()["chat_roles"]
        assert (roles["prefix"]["user"], roles["suffix"]["user"]) == ("<user>", "")
        msgs = [{"role": "user", "content": "Hi"}]
        got = requests.post(
            url + "/tokenize", json={"messages": msgs}, headers=key, timeout=30
        ).json()["tokens"]
        want = requests.post(
            url + "/tokenize",
            json={"prompt": "<user>Hi<assistant>", "add_special_tokens": False},
            headers=key,
            timeout=30,
        ).json()["tokens"]
        assert got == want
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
