"""Helpers for tests that start processes: whether one has exited, a fault injected into
every Python process a test starts (scheduler processes included), and a Python process that
cannot import the runtime's packages (as after a bare `pip install sgl`)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

# Loaded by every Python process whose PYTHONPATH holds its folder (`sitecustomize`): the
# model's forward raises for the request whose rid is $SGL_TEST_FAIL_RID (a stand-in for a
# kernel or memory error), in the server and in its scheduler processes alike.
FAULT_HOOK = """
import os
if os.environ.get("SGL_TEST_FAIL_RID"):
    from sgl.runtime.model_runner import ModelRunner
    forward = ModelRunner.forward
    def forward_or_fail(self, step, *args, **kwargs):
        if any(r.rid == os.environ["SGL_TEST_FAIL_RID"] for r in step.reqs):
            raise RuntimeError("injected fault")
        return forward(self, step, *args, **kwargs)
    ModelRunner.forward = forward_or_fail
"""


def fault_env(folder: Path, rid: str = "boom") -> dict[str, str]:
    """Environment variables that make processes started with them fail the step of `rid`."""
    (folder / "sitecustomize.py").write_text(FAULT_HOOK)
    return {
        "PYTHONPATH": f"{folder}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "SGL_TEST_FAIL_RID": rid,
    }


def gone(pid: int) -> bool:
    """The process has exited (or is a zombie its parent has not waited for yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1].startswith("Z")
    except FileNotFoundError:
        return True


def call_in_background(fn) -> tuple[threading.Thread, dict]:
    """Start `fn()` on a thread; returns it and a dict that gets "result" or "error"."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["result"] = fn()
        except BaseException as e:  # checked by the test
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


# The packages of the runtime and server extras (pip's names and import names).
RUNTIME_PACKAGES = {
    "torch",
    "transformers",
    "tokenizers",
    "outlines-core",
    "outlines_core",
    "numpy",
    "safetensors",
    "gguf",
    "fastapi",
    "uvicorn",
    "lark",
    "interegular",
    "nvidia-cublas",
}
_ALSO_BLOCKED = {"pydantic", "jsonschema", "ninja", "aiohttp", "starlette"}
# Code to run first in a `python -c` child: every runtime or server package is unimportable there.
BLOCK_RUNTIME = f"""
import importlib.abc, sys
_BLOCKED = {sorted(RUNTIME_PACKAGES | _ALSO_BLOCKED)!r}
class _Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in _BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, _Blocker())
"""
