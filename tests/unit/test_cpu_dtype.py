"""dtype="auto" on CPU: bf16 where the CPU has AMX-BF16 or AVX512-BF16, float32 elsewhere.

Both sides run on any machine: SGL_CPU_FLAGS_OVERRIDE stands in for /proc/cpuinfo's flags.
"""

from __future__ import annotations

import pytest
import torch

from sgl.runtime import cpu_features
from sgl.runtime.config import EngineConfig


@pytest.fixture
def flags(monkeypatch):
    def set_flags(text: str) -> None:
        monkeypatch.setenv("SGL_CPU_FLAGS_OVERRIDE", text)
        cpu_features.cpu_flags.cache_clear()

    yield set_flags
    cpu_features.cpu_flags.cache_clear()


@pytest.mark.parametrize(
    "text,dtype,why",
    [
        ("fpu sse avx512f amx_tile amx_bf16 amx_int8 avx512_bf16", torch.bfloat16, "AMX-BF16"),
        ("fpu sse avx512f avx512_bf16 avx512_vnni", torch.bfloat16, "AVX512-BF16"),
        ("fpu sse avx2 fma avx512f", torch.float32, "no AMX-BF16 or AVX512-BF16"),
        ("", torch.float32, "no AMX-BF16 or AVX512-BF16"),
    ],
)
def test_auto_dtype_follows_the_cpu(flags, text, dtype, why):
    flags(text)
    got, reason = EngineConfig().resolve_dtype(torch.device("cpu"))
    assert got == dtype and why in reason


def test_explicit_dtype_wins(flags):
    flags("amx_tile amx_bf16")
    assert EngineConfig(dtype="float32").resolve_dtype(torch.device("cpu")) == (
        torch.float32,
        "set by the dtype option",
    )


def test_engine_reports_its_choice(flags):
    import sgl

    flags("avx2 fma")
    with sgl.Engine(model_path="tiny-llama", load_format="dummy", max_total_tokens=256) as engine:
        info = engine.get_server_info()
    assert info["dtype"] == "float32" and "no AMX-BF16" in info["dtype_reason"]
    assert info["quantization"] == "auto" and info["weight_layouts"] == {
        "dense": 2 * 4 + 2
    }  # + embeddings, LM head


def test_usable_cpus_follow_the_affinity_mask():
    """A process limited to one CPU (taskset, a container's cpuset) counts one, whatever the machine
    has."""
    import os
    import subprocess
    import sys

    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no CPU affinity on this platform")
    cpu = sorted(os.sched_getaffinity(0))[0]
    code = (
        f"import os; os.sched_setaffinity(0, {{{cpu}}}); "
        "from sgl.runtime.cpu_features import usable_cpus; print(usable_cpus())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"
    assert cpu_features.usable_cpus() == len(os.sched_getaffinity(0))
