"""Attention backends behind one interface (`base.AttentionBackend`)."""

from __future__ import annotations

from sgl.runtime.attention.base import AttentionBackend, ForwardBatch


def create_attention_backend(name: str, device: str) -> AttentionBackend:
    if name in ("auto", "torch_native"):
        from sgl.runtime.attention.torch_native import TorchNativeBackend

        return TorchNativeBackend()
    raise ValueError(f"attention_backend must be one of 'auto', 'torch_native'; got {name!r}")


__all__ = ["AttentionBackend", "ForwardBatch", "create_attention_backend"]
