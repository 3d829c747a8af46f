"""The attention backend registry: every configurable name is registered once, with a factory
that makes a backend of that name; the `cpu` backend is the kernel or, on a pool the kernel
cannot take, exactly torch_native."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from attention_cases import make_case, run

import sgl.runtime.attention as attn
from sgl.runtime.attention import ATTENTION_BACKENDS, REGISTRY, auto_order, backend_name
from sgl.runtime.attention.cpu_backend import CpuBackend
from sgl.runtime.attention.torch_native import TorchNativeBackend

MIXED = [(20, 17), (45, 1), (0, 1), (0, 23), (63, 3), (31, 16), (10, 70)]


def no_kernel(*args):
    raise AssertionError("the kernel must not run on this pool")


def test_every_configurable_name_is_registered():
    assert set(REGISTRY) == set(ATTENTION_BACKENDS) - {"auto"}
    for name, entry in REGISTRY.items():
        assert entry.name == name
    for device in ("cpu", "cuda", "mps"):
        assert set(auto_order(torch.device(device))) <= set(REGISTRY)
        assert (
            auto_order(torch.device(device))[-1] == "torch_native"
        )  # the fallback that always runs


def test_checks_explain_and_torch_native_runs_anywhere():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert "runs on the CPU" in REGISTRY["cpu"].check(cuda, torch.float32)
    assert "torch_native" in REGISTRY["cpu"].check(cpu, torch.float64)
    assert REGISTRY["cpu"].check(cpu, None) is None
    for device in (cpu, cuda):
        for dtype in (None, torch.float32, torch.bfloat16):
            assert REGISTRY["torch_native"].check(device, dtype) is None


def test_made_backends_carry_their_registered_name():
    backend = attn.create_attention_backend("torch_native", "cpu")
    assert backend.name == backend_name(backend) == "torch_native"
    assert CpuBackend(no_kernel).name == "cpu"  # until bind sees a pool the kernel cannot take
    # (triton and flashinfer are not imported here: importing triton outside the interpreter
    # mode would break test_triton_attention; tests/gpu makes them by name)


@pytest.mark.parametrize("dtype, head_dim", [(torch.float32, 24), (torch.bfloat16, 48)])
def test_cpu_backend_without_its_kernel_is_torch_native(dtype, head_dim):
    case = make_case(MIXED, 2, head_dim, dtype, heads=4, max_context=256, capacity=1200)
    backend = CpuBackend(no_kernel)
    backend.bind(case.batch.kv_pool, case.batch.req_to_token, case.q.shape[1])
    assert backend.name == backend_name(backend) == "torch_native" and not backend.uses_kernel
    got = run(backend, case)
    want = run(
        TorchNativeBackend(),
        make_case(MIXED, 2, head_dim, dtype, heads=4, max_context=256, capacity=1200),
    )
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_cpu_backend_on_a_kernel_pool_is_cpu():
    case = make_case(MIXED, 2, 64, torch.float32)
    backend = CpuBackend(no_kernel)
    backend.bind(case.batch.kv_pool, case.batch.req_to_token, case.q.shape[1])
    assert backend.name == "cpu" and backend.uses_kernel


def test_gpu_backends_are_imported_only_when_chosen():
    code = (
        "import sys, sgl.runtime.attention as a\n"
        "a.create_attention_backend('auto', 'cpu', __import__('torch').bfloat16)\n"
        "a.create_attention_backend('torch_native', 'cuda')\n"
        "bad = [m for m in ('triton', 'flashinfer', 'sgl.runtime.attention.triton_backend',\n"
        "       'sgl.runtime.attention.flashinfer_backend') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.skipif(not attn.triton_available(), reason="triton is not installed")
def test_triton_is_made_by_name():
    code = (
        "import sgl.runtime.attention as a; "
        "assert a.create_attention_backend('triton', 'cpu').name == 'triton'"
    )
    env = {**__import__("os").environ, "TRITON_INTERPRET": "1"}
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, env=env)
