"""Dense bf16 copies beside quantized layers (sgl/runtime/model/dense_copy.py).

Oracle: a float64 matmul on the weight the quantized layer holds (`held_weight()`), rounded
to bf16 as the copy is; the copy's route must match it to bf16 matmul accuracy, and the
quantized route must be left as it was below the copy's row count.
"""

from __future__ import annotations

import pytest
import torch

from sgl.runtime.model import dense_copy
from sgl.runtime.model.cpu_packed import packing_applies
from sgl.runtime.model.quant import quantize_int4, quantize_int8, quantized_linear

pytestmark = pytest.mark.skipif(not packing_applies(torch.bfloat16, torch.device("cpu")),
                                reason="dense copies are kept only where bf16 matmuls are native (AMX / AVX512-BF16)")


class TwoLayers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.a = quantized_linear(quantize_int4(torch.randn(96, 128, generator=gen) * 0.05, 32),
                                  torch.randn(96, generator=gen))
        self.b = quantized_linear(quantize_int8(torch.randn(128, 96, generator=gen) * 0.05), None)


def reference(layer, x: torch.Tensor) -> torch.Tensor:
    w = layer.held_weight().to(torch.bfloat16).double()
    y = x.double() @ w.t()
    return y if layer.bias is None else y + layer.bias.double()


def test_copies_follow_the_budget():
    model = TwoLayers()
    need = 96 * 128 * 2 + 128 * 96 * 2
    assert dense_copy.add_dense_copies(model, lambda: need - 1) == 0
    assert model.a.dense_packed is None and model.b.dense_packed is None
    assert dense_copy.add_dense_copies(model, lambda: need) == need
    assert model.a.dense_packed is not None and model.b.dense_packed is not None
    assert dense_copy.budget_bytes("off", 1 << 40) == 0
    assert dense_copy.budget_bytes("auto", 10 << 30) == int((10 << 30) * dense_copy.AUTO_FRACTION)
    assert dense_copy.budget_bytes("auto", 1 << 40) == dense_copy.AUTO_MAX_BYTES
    with pytest.raises(ValueError, match="dense_copy must be one of"):
        dense_copy.budget_bytes("always", 1 << 30)


@pytest.mark.parametrize("rows", [1, 5, 64, 200])
def test_the_copy_computes_the_held_weight(rows):
    model = TwoLayers()
    x = torch.randn(rows, 128).to(torch.bfloat16)
    before = model.a(x)
    dense_copy.add_dense_copies(model, lambda: 1 << 30)
    model.a.dense_from = 2  # force the copy's route for every row count above one
    y = model.a(x)
    assert y.dtype == x.dtype and y.shape == (rows, 96)
    if rows < 2:
        assert torch.equal(y, before)  # below the copy's row count nothing changed
    else:
        ref = reference(model.a, x.float())
        assert (y.double() - ref).abs().max() <= 2e-2 * ref.abs().max()


def test_dense_rows_is_a_probe_row_count_or_never():
    model = TwoLayers()
    dense_copy.add_dense_copies(model, lambda: 1 << 30)
    for layer in (model.a, model.b):
        assert layer.dense_from in (*dense_copy.PROBE_ROWS, dense_copy.NEVER)
