"""`--dp-size`: what each worker is started with, and how the CPUs are shared out."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sgl.server.data_parallel import (
    SUPERVISOR_OPTIONS,
    Stopped,
    Worker,
    cpu_slices,
    router_command,
    wait_healthy,
    worker_argv,
)
from sgl.server.launch import build_parser


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--dp-size", "2", "--port", "31000", "--host", "0.0.0.0"],
        [
            "--dp-size",
            "3",
            "--quantization",
            "none",
            "--torch-compile",
            "--no-scheduler-process",
            "--max-total-tokens",
            "4096",
            "--cors-allow-origins",
            "http://a",
            "http://b",
            "--router-policy",
            "round_robin",
            "--served-model-name",
            "m",
            "--router-balance-abs-threshold",
            "8",
        ],
    ],
)
def test_worker_argv_reproduces_every_worker_option(argv):
    """Parsing a worker's options gives the supervisor's namespace back, but for the
    supervisor's own options (left at their defaults: a worker gets its port from it)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    worker = parser.parse_args(worker_argv(parser, args))
    defaults = parser.parse_args([])
    for name, value in vars(args).items():
        expected = getattr(defaults, name) if name in SUPERVISOR_OPTIONS else value
        assert getattr(worker, name) == expected, name


def test_worker_argv_never_carries_the_api_key():
    parser = build_parser()
    args = parser.parse_args(["--dp-size", "2", "--api-key", "secret-key"])
    assert "secret-key" not in worker_argv(parser, args)


@pytest.mark.parametrize(
    "cpus,n,expected",
    [
        ([0, 1], 2, [[0], [1]]),
        ([0, 1, 2, 3, 4], 2, [[0, 1, 2], [3, 4]]),
        ([4, 5, 6, 7], 4, [[4], [5], [6], [7]]),
        ([0, 1, 2], 1, [[0, 1, 2]]),
    ],
)
def test_cpu_slices_cover_the_cpus_once(cpus, n, expected):
    assert cpu_slices(cpus, n) == expected


def test_cpu_slices_refuse_more_workers_than_cpus():
    with pytest.raises(ValueError, match="--dp-size 3 needs at least 3 CPUs"):
        cpu_slices([0, 1], 3)


def test_router_command_names_workers_policy_and_address():
    cmd = router_command(
        ["http://127.0.0.1:1", "http://127.0.0.1:2"], "cache_aware", "0.0.0.0", 30000, None
    )
    assert cmd[1:3] == ["-m", "sglang_router.launch_router"]
    i = cmd.index("--worker-urls")
    assert cmd[i + 1 : i + 3] == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    assert (
        cmd[cmd.index("--policy") + 1] == "cache_aware" and cmd[cmd.index("--port") + 1] == "30000"
    )
    assert cmd[cmd.index("--balance-abs-threshold") + 1] == "2" and "--api-key" not in cmd


def test_dp_size_below_one_is_refused(capsys):
    from sgl.server.launch import main

    with pytest.raises(SystemExit) as e:
        main(["--dp-size", "0"])
    assert e.value.code == 2 and "--dp-size must be >= 1" in capsys.readouterr().err


def test_a_signal_while_workers_start_stops_the_wait():
    """Ctrl-C while the models load: the wait ends at once (the supervisor then stops them)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        w = Worker(0, 9, [], {}, None, proc)  # port 9: nothing answers
        with pytest.raises(Stopped):
            wait_healthy([w], timeout=600, stopping=lambda: True)
        with pytest.raises(RuntimeError, match="not healthy after 0 s"):
            wait_healthy([w], timeout=0)
    finally:
        proc.kill()
        proc.wait()
