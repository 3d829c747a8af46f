"""`python -m sgl.launch_server` as a user starts it: CLI options reach the engine and the
app, and SIGTERM lets an in-flight request finish, then exits 0."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading

import pytest
import requests

from server_helpers import assert_error, wait_until

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
    cmd = [sys.executable, "-m", "sgl.launch_server", "--model-path", "default", "--host", "127.0.0.1",
           "--port", str(port), "--max-total-tokens", "4096", "--schedule-policy", "fcfs",
           "--served-model-name", "launched", "--api-key", "k", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert wait_until(lambda: _up(url) or proc.poll() is not None, timeout=180, interval=0.25)
        assert proc.poll() is None, proc.stdout.read()
        auth = {"Authorization": "Bearer k"}
        assert_error(requests.get(url + "/v1/models", timeout=10), 401)
        assert [m["id"] for m in requests.get(url + "/v1/models", headers=auth, timeout=10).json()["data"]] == \
            ["launched"]
        info = requests.get(url + "/get_server_info", headers=auth, timeout=10).json()
        assert info["max_total_tokens"] == 4096 and info["schedule_policy"] == "fcfs"

        result: dict = {}

        def run() -> None:
            body = {"text": "Count:", "sampling_params": {"max_new_tokens": 24, "ignore_eos": True}}
            result["resp"] = requests.post(url + "/generate", json=body, headers=auth, timeout=120)

        t = threading.Thread(target=run)
        t.start()
        assert wait_until(lambda: requests.get(url + "/get_server_info", headers=auth, timeout=10)
                          .json()["num_running_reqs"] > 0, timeout=60, interval=0.02)
        proc.send_signal(signal.SIGTERM)
        t.join(timeout=120)
        assert result["resp"].status_code == 200
        assert result["resp"].json()["meta_info"]["completion_tokens"] == 24  # finished, not cut off
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
