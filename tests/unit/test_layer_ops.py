"""The fused CPU layer ops (csrc/layer_ops_cpu.cpp) against the torch ops they replace and
against float64: RoPE and the gated activation bit for bit, the norm within the dtype's
rounding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sgl.runtime.model import layer_ops
from sgl.runtime.model.llama import RMSNorm
from sgl.runtime.model.rope import rotate

pytestmark = pytest.mark.skipif(
    not layer_ops.layer_ops_built(), reason="the C++ layer ops cannot be built here"
)
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def rounding_steps(dtype: torch.dtype, fp32: float) -> float:
    """How many of the dtype's rounding steps two correct results may be apart: in bf16 / fp16
    the final rounding dominates (one step); in float32 the steps of the computation itself
    show (a sum of squares in another order), `fp32` of them."""
    return fp32 if dtype == torch.float32 else 1.01


def ulps(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """|got - want| in units of the dtype's spacing at want (relative eps)."""
    return (got.double() - want.double()).abs() / (
        torch.finfo(dtype).eps * want.double().abs().clamp_min(1e-3)
    )


def torch_norm(x: torch.Tensor, w: torch.Tensor, eps: float, offset: float) -> torch.Tensor:
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (x32 * (offset + w.float())).to(x.dtype) if offset else w * x32.to(x.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_rms_norm_matches_the_torch_ops(dtype, offset):
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(67, 576, generator=g) * 3).to(dtype)
    w = (torch.randn(576, generator=g) * 0.3 + 1).to(dtype)
    out = torch.ops.sgl_layer.rms_norm(x, w, 1e-6, offset)
    want = torch_norm(x, w, 1e-6, offset)
    assert out.dtype == dtype and out.shape == x.shape
    # The sum of squares runs in another order: at most one rounding step apart, rarely.
    assert ulps(out, want, dtype).max() <= rounding_steps(dtype, 4)
    if dtype != torch.float32:
        assert (out != want).float().mean() < 0.01
    x64 = x.double()
    exact = x64 / x64.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt() * (offset + w.double())
    assert ulps(out, exact, dtype).max() <= rounding_steps(dtype, 4) + 1


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_of_a_strided_per_head_view(dtype):
    """q_norm / k_norm run on [T, heads, D] views into the fused qkv output."""
    g = torch.Generator().manual_seed(2)
    qkv = torch.randn(5, 3 * 4 * 32, generator=g).to(dtype)
    q = qkv[:, : 4 * 32].view(5, 4, 32)
    w = (torch.randn(32, generator=g) + 1).to(dtype)
    out = torch.ops.sgl_layer.rms_norm(q, w, 1e-6, 0.0)
    assert out.is_contiguous() and out.shape == q.shape
    assert ulps(out, torch_norm(q, w, 1e-6, 0.0), dtype).max() <= rounding_steps(dtype, 4)


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_is_the_add_then_the_norm(dtype):
    g = torch.Generator().manual_seed(3)
    x, a = (torch.randn(9, 256, generator=g).to(dtype) for _ in range(2))
    w = (torch.randn(256, generator=g) + 1).to(dtype)
    total, normed = torch.ops.sgl_layer.add_rms_norm(x, a, w, 1e-5, 0.0)
    assert torch.equal(total, x + a)
    assert torch.equal(normed, torch.ops.sgl_layer.rms_norm(x + a, w, 1e-5, 0.0))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "rotated", [64, 32]
)  # all of each head, or the leading part (partial rotary)
def test_rotate_equals_the_torch_ops_bit_for_bit(dtype, rotated):
    g = torch.Generator().manual_seed(4)
    qkv = torch.randn(6, 16 * 64, generator=g).to(dtype)
    q = qkv[:, : 9 * 64].view(6, 9, 64)  # strided rows, as split from the fused projection
    angles = torch.rand(6, rotated // 2, generator=g) * 50
    cos = torch.cat((angles.cos(), angles.cos()), -1).unsqueeze(1)
    sin = torch.cat((-angles.sin(), angles.sin()), -1).unsqueeze(1)
    out = torch.ops.sgl_layer.rotate(q, cos, sin)
    assert out.is_contiguous()
    assert torch.equal(out, rotate(q, cos, sin))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gelu", [False, True])
def test_gated_act_equals_the_torch_ops_bit_for_bit(dtype, gelu):
    g = torch.Generator().manual_seed(5)
    gate_up = (torch.randn(33, 2 * 1536, generator=g) * 4).to(dtype)
    gate, up = gate_up.split(1536, -1)
    want = (F.gelu(gate, approximate="tanh") if gelu else F.silu(gate)) * up
    assert torch.equal(torch.ops.sgl_layer.gated_act(gate_up, gelu), want)


def test_bad_inputs_are_refused_by_name():
    x = torch.randn(2, 8)
    with pytest.raises(RuntimeError, match="w must be"):
        torch.ops.sgl_layer.rms_norm(x, torch.ones(8, dtype=torch.bfloat16), 1e-6, 0.0)
    with pytest.raises(RuntimeError, match="cos and sin"):
        torch.ops.sgl_layer.rotate(
            x.view(2, 1, 8), torch.ones(2, 4, dtype=torch.float64), torch.ones(2, 4)
        )
    with pytest.raises(RuntimeError, match="gate_up"):
        torch.ops.sgl_layer.gated_act(torch.randn(2, 7), False)
    with pytest.raises(RuntimeError, match="x and a"):
        torch.ops.sgl_layer.add_rms_norm(x, torch.randn(3, 8), torch.ones(8), 1e-6, 0.0)


def test_modules_take_the_fused_route_in_cpu_steps_eager_and_compiled(monkeypatch):
    """RMSNorm goes through the fused op where `fused_ops_for` says so, with the torch route's
    result; a torch.compile graph traces through the op too (its shape registered), whole, and
    gives the eager call's result bit for bit."""
    norm = RMSNorm(64, 1e-6)
    norm.weight.data = torch.randn(64) + 1
    x = torch.randn(3, 64)
    calls = []
    real = torch.ops.sgl_layer.rms_norm
    monkeypatch.setattr(
        torch.ops.sgl_layer, "rms_norm", lambda *args: calls.append(args) or real(*args)
    )
    with torch.no_grad():
        fused = norm(x)
        assert len(calls) == 1
        monkeypatch.setattr("sgl.runtime.model.llama.fused_ops_for", lambda t: False)
        plain = norm(x)
        assert len(calls) == 1
    assert ulps(fused, plain, torch.float32).max() <= rounding_steps(torch.float32, 4)
    monkeypatch.undo()
    compiled = torch.compile(norm, backend="aot_eager", fullgraph=True)  # fake tensors: the shapes
    with torch.no_grad():
        assert torch.equal(compiled(x), fused)
