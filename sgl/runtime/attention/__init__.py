"""Attention backends behind one interface (`base.AttentionBackend`), and the choice among them.

Backends that need GPU packages (flashinfer, triton) are imported only when chosen, so the
CPU install never needs them. The `cpu` backend's kernel is compiled on first use; where
that fails (no C++ compiler), `auto` falls back to torch_native with a warning.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from typing import Callable

import torch

from sgl.runtime.attention.base import AttentionBackend, CudaGraphHooks, ForwardBatch, supports_cuda_graph

logger = logging.getLogger(__name__)

ATTENTION_BACKENDS = ("auto", "cpu", "torch_native", "triton", "flashinfer")
CUDA_EXTRA_HINT = "pip install sgl[cuda]"


def _module_available(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def flashinfer_available() -> bool:
    return _module_available("flashinfer")


def triton_available() -> bool:
    """The triton package and our kernels for it (sgl/runtime/attention/triton_backend.py)."""
    return _module_available("triton") and _module_available("sgl.runtime.attention.triton_backend")


def _make_torch_native() -> AttentionBackend:
    from sgl.runtime.attention.torch_native import TorchNativeBackend

    return TorchNativeBackend()


def _make_cpu() -> AttentionBackend:
    from sgl.runtime.attention.cpu_backend import CpuBackend
    from sgl.runtime.attention.cpu_kernel import load_paged_attention

    return CpuBackend(load_paged_attention())


def _make_triton() -> AttentionBackend:
    from sgl.runtime.attention.triton_backend import TritonBackend

    return TritonBackend()


def _make_flashinfer() -> AttentionBackend:
    from sgl.runtime.attention.flashinfer_backend import FlashInferBackend

    return FlashInferBackend()


def _is_cuda(device: str | torch.device) -> bool:
    return torch.device(device).type == "cuda"


def _auto_candidates(device: str | torch.device, dtype: torch.dtype | None) -> list[tuple[str, Callable[[], AttentionBackend]]]:
    """Backends `auto` tries, best first: flashinfer, then triton (CUDA only); cpu (CPU, float32);
    then torch_native."""
    out: list[tuple[str, Callable[[], AttentionBackend]]] = []
    if torch.device(device).type == "cpu" and dtype in (None, torch.float32):
        out.append(("cpu", _make_cpu))
    if _is_cuda(device):
        # flashinfer's kernels take fp16/bf16 only; a float32 engine goes to triton or torch.
        if flashinfer_available() and dtype in (None, torch.float16, torch.bfloat16):
            out.append(("flashinfer", _make_flashinfer))
        if triton_available():
            out.append(("triton", _make_triton))
    out.append(("torch_native", _make_torch_native))
    return out


def create_attention_backend(
    name: str, device: str | torch.device, dtype: torch.dtype | None = None
) -> AttentionBackend:
    """The backend called `name` for `device` (and the KV dtype, which rules flashinfer in or out).

    `auto` takes the fastest one that is installed and fits the device; naming a backend that
    cannot run raises a ValueError that says why and what to do instead.
    """
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS}; got {name!r}")
    if name == "auto":
        candidates = _auto_candidates(device, dtype)
        for i, (cand, make) in enumerate(candidates):
            try:
                backend = make()
            except (ImportError, OSError, RuntimeError) as e:  # installed but broken (e.g. a CUDA mismatch)
                if i == len(candidates) - 1:
                    raise
                logger.warning("attention backend %s failed to load (%s); trying the next one", cand, e)
                continue
            logger.info("attention backend: %s", cand)
            return backend
    if name == "torch_native":
        return _make_torch_native()
    if name == "cpu":
        if torch.device(device).type != "cpu":
            raise ValueError(f"attention_backend='cpu' runs on the CPU (device is {str(device)!r}); "
                             "use 'auto', or 'triton' / 'flashinfer' on CUDA")
        if dtype is not None and dtype != torch.float32:
            raise ValueError(f"attention_backend='cpu' supports a float32 KV cache, not {dtype}; "
                             "use dtype='float32', or attention_backend='torch_native'")
        try:
            return _make_cpu()
        except RuntimeError as e:
            raise ValueError(f"{e}; use attention_backend='torch_native'") from e
    if name == "triton":
        if not _module_available("triton"):
            raise ValueError(f"attention_backend='triton' needs the triton package: {CUDA_EXTRA_HINT}")
        if not _module_available("sgl.runtime.attention.triton_backend"):
            raise ValueError("attention_backend='triton' is not available in this build of sgl (no triton_backend module)")
        if not _is_cuda(device) and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(
                f"attention_backend='triton' needs a CUDA device (device is {str(device)!r}); use "
                "attention_backend='torch_native' on CPU, or set TRITON_INTERPRET=1 to run the Triton "
                "kernels in Triton's interpreter (slow; for tests)"
            )
        return _make_triton()
    # flashinfer
    if not flashinfer_available():
        raise ValueError(f"attention_backend='flashinfer' needs the flashinfer package: {CUDA_EXTRA_HINT}")
    if not _is_cuda(device):
        raise ValueError(
            f"attention_backend='flashinfer' needs a CUDA device (device is {str(device)!r}); "
            "use attention_backend='torch_native' on CPU"
        )
    if dtype is not None and dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(
            f"attention_backend='flashinfer' supports float16 and bfloat16 KV caches, not {dtype}; "
            "use dtype='bfloat16', or attention_backend='triton' or 'torch_native'"
        )
    return _make_flashinfer()


def backend_name(backend: AttentionBackend) -> str:
    """Short name of a backend instance, for server info and benchmark reports."""
    if getattr(backend, "uses_kernel", True) is False:  # CpuBackend on a dtype/head_dim its kernel lacks
        return "torch_native"
    return {
        "CpuBackend": "cpu",
        "TorchNativeBackend": "torch_native",
        "TritonBackend": "triton",
        "FlashInferBackend": "flashinfer",
    }.get(type(backend).__name__, type(backend).__name__)


__all__ = [
    "ATTENTION_BACKENDS",
    "AttentionBackend",
    "CudaGraphHooks",
    "ForwardBatch",
    "backend_name",
    "create_attention_backend",
    "flashinfer_available",
    "supports_cuda_graph",
    "triton_available",
]
