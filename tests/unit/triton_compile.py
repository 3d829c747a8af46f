"""Compile Triton kernels for an H100/H200 target without a GPU: interpreted kernels (what the
CPU tests run) are not compiled ones, so each Triton test module also compiles its kernels."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def assert_compiles_for_sm90(script: str, cache_dir) -> None:
    """Run `script` (it prints "compiled" when every kernel compiled) outside the interpreter."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(cache_dir)
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    if proc.returncode != 0 and "ptxas" in proc.stderr and "not found" in proc.stderr.lower():
        pytest.skip("this triton build ships no ptxas")
    assert proc.returncode == 0 and "compiled" in proc.stdout, proc.stderr[-3000:]
