"""Attention backends behind one interface (`base.AttentionBackend`), and the choice among them.

Each backend is registered once (`register`): its name, a factory, and a check that says why
it cannot run on a device and KV dtype, naming the fix. Naming a backend runs its check;
`auto` walks a preference order for the device and takes the first that passes and loads.
Factories import their module, so GPU packages (flashinfer, triton) are imported only when
chosen and the CPU install never needs them. The `cpu` backend's kernel is compiled on
first use; where that fails (no C++ compiler), `auto` falls back to torch_native with a
warning.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from sgl.runtime.attention.base import (
    FEATURES,
    AttentionBackend,
    CudaGraphHooks,
    ForwardBatch,
    supports_cuda_graph,
)

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


@dataclass(frozen=True)
class RegisteredBackend:
    name: str
    make: Callable[[], AttentionBackend]
    # Why the backend cannot run on (device, KV dtype; None: not yet known), naming the fix; None:
    # it can.
    check: Callable[[torch.device, torch.dtype | None], str | None]
    # Which of base.FEATURES it implements (known without importing it).
    features: frozenset[str] = frozenset()


REGISTRY: dict[str, RegisteredBackend] = {}


def register(
    name: str,
    make: Callable[[], AttentionBackend],
    check: Callable[[torch.device, torch.dtype | None], str | None],
    features: frozenset[str] = frozenset(),
) -> None:
    REGISTRY[name] = RegisteredBackend(name, make, check, features)


_FEATURE_NAMES = {
    "sliding_window": "sliding-window attention",
    "logit_cap": "attention logit soft-capping",
}


def missing_features(entry: RegisteredBackend, needs: frozenset[str]) -> str | None:
    """Why the backend cannot run a model needing `needs`, naming the backends that can; None: it
    can."""
    lacking = sorted(needs - entry.features)
    if not lacking:
        return None
    able = [n for n, e in REGISTRY.items() if needs <= e.features]
    what = " and ".join(_FEATURE_NAMES.get(f, f) for f in lacking)
    return (
        f"attention_backend={entry.name!r} does not implement {what}, which this model's layers "
        "use; "
        f"use attention_backend='auto' or one of {able}"
    )


def auto_order(device: torch.device) -> tuple[str, ...]:
    """The backends `auto` tries on this device, best first (each still has to pass its check)."""
    if device.type == "cpu":
        return ("cpu", "torch_native")
    if device.type == "cuda":
        return ("flashinfer", "triton", "torch_native")
    return ("torch_native",)


# ---------------------------------------------------------------------------- the backends


def _make_torch_native() -> AttentionBackend:
    from sgl.runtime.attention.torch_native import TorchNativeBackend

    return TorchNativeBackend()


def _check_torch_native(device: torch.device, dtype: torch.dtype | None) -> str | None:
    return None  # runs wherever torch does


def _make_cpu() -> AttentionBackend:
    from sgl.runtime.attention.cpu_backend import CpuBackend
    from sgl.runtime.attention.cpu_kernel import load_paged_attention, load_prefill_attention

    return CpuBackend(load_paged_attention(), load_prefill_attention())


def _check_cpu(device: torch.device, dtype: torch.dtype | None) -> str | None:
    if device.type != "cpu":
        return (
            f"attention_backend='cpu' runs on the CPU (device is {str(device)!r}); "
            "use 'auto', or 'triton' / 'flashinfer' on CUDA"
        )
    if dtype is not None and dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return (
            "attention_backend='cpu' supports a float32, bfloat16 or float16 KV cache, not "
            f"{dtype}; "
            "use one of those dtypes, or attention_backend='torch_native'"
        )
    return None


def _make_triton() -> AttentionBackend:
    from sgl.runtime.attention.triton_backend import TritonBackend

    return TritonBackend()


def _check_triton(device: torch.device, dtype: torch.dtype | None) -> str | None:
    if not _module_available("triton"):
        return f"attention_backend='triton' needs the triton package: {CUDA_EXTRA_HINT}"
    if not _module_available("sgl.runtime.attention.triton_backend"):
        return (
            "attention_backend='triton' is not available in this build of sgl "
            "(no triton_backend module)"
        )
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return (
            f"attention_backend='triton' needs a CUDA device (device is {str(device)!r}); use "
            "attention_backend='torch_native' on CPU, or set TRITON_INTERPRET=1 to run the Triton "
            "kernels in Triton's interpreter (slow; for tests)"
        )
    return None


def _make_flashinfer() -> AttentionBackend:
    from sgl.runtime.attention.flashinfer_backend import FlashInferBackend

    return FlashInferBackend()


def _check_flashinfer(device: torch.device, dtype: torch.dtype | None) -> str | None:
    if not flashinfer_available():
        return f"attention_backend='flashinfer' needs the flashinfer package: {CUDA_EXTRA_HINT}"
    if device.type != "cuda":
        return (
            f"attention_backend='flashinfer' needs a CUDA device (device is {str(device)!r}); "
            "use attention_backend='torch_native' on CPU"
        )
    if dtype is not None and dtype not in (torch.float16, torch.bfloat16):  # no float32 kernels
        return (
            f"attention_backend='flashinfer' supports float16 and bfloat16 KV caches, not {dtype}; "
            "use dtype='bfloat16', or attention_backend='triton' or 'torch_native'"
        )
    return None


_ALL = frozenset(FEATURES)
register("cpu", _make_cpu, _check_cpu, _ALL)
register("torch_native", _make_torch_native, _check_torch_native, _ALL)
register("triton", _make_triton, _check_triton, _ALL)
register(
    "flashinfer", _make_flashinfer, _check_flashinfer
)  # not yet: window_left / logits_soft_cap per layer


# ---------------------------------------------------------------------------- choosing


def _auto(
    device: torch.device, dtype: torch.dtype | None, needs: frozenset[str]
) -> AttentionBackend:
    candidates = [
        REGISTRY[n]
        for n in auto_order(device)
        if REGISTRY[n].check(device, dtype) is None and missing_features(REGISTRY[n], needs) is None
    ]
    for i, entry in enumerate(candidates):
        try:
            backend = entry.make()
        except (
            ImportError,
            OSError,
            RuntimeError,
        ) as e:  # installed but broken (e.g. a CUDA mismatch)
            if i == len(candidates) - 1:
                raise
            logger.warning(
                "attention backend %s failed to load (%s); trying the next one", entry.name, e
            )
            continue
        logger.info("attention backend: %s", entry.name)
        return backend
    raise ValueError(
        f"no attention backend can run on {device} with {dtype}"
    )  # torch_native always can


def create_attention_backend(
    name: str,
    device: str | torch.device,
    dtype: torch.dtype | None = None,
    needs: frozenset[str] = frozenset(),
) -> AttentionBackend:
    """The backend called `name` for `device` (and the KV dtype, which rules flashinfer in or out)
    that implements the attention features the model `needs` (`ModelConfig.attention_features`).

    `auto` takes the fastest one that is installed, fits the device and has the features; naming
    a backend that cannot run raises a ValueError that says why and what to do instead.
    """
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS}; got {name!r}")
    device = torch.device(device)
    if name == "auto":
        return _auto(device, dtype, needs)
    entry = REGISTRY[name]
    reason = entry.check(device, dtype) or missing_features(entry, needs)
    if reason is not None:
        raise ValueError(reason)
    try:
        return entry.make()
    except RuntimeError as e:  # e.g. the CPU kernel could not be built
        raise ValueError(f"{e}; use attention_backend='torch_native'") from e


def backend_name(backend: AttentionBackend) -> str:
    """Short name of a backend instance, for server info and benchmark reports."""
    return backend.name


__all__ = [
    "ATTENTION_BACKENDS",
    "AttentionBackend",
    "CudaGraphHooks",
    "ForwardBatch",
    "REGISTRY",
    "RegisteredBackend",
    "auto_order",
    "backend_name",
    "create_attention_backend",
    "flashinfer_available",
    "missing_features",
    "register",
    "supports_cuda_graph",
    "triton_available",
]
