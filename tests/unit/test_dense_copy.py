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
from sgl.runtime.model.quant import Int4Linear, Int8Linear, quantized_linear
from sgl.runtime.model.quant_tensor import per_row_int8, quantize_int4, quantize_int8

pytestmark = pytest.mark.skipif(
    not packing_applies(torch.bfloat16, torch.device("cpu")),
    reason="dense copies are kept only where bf16 matmuls are native (AMX / AVX512-BF16)",
)


class TwoLayers(torch.nn.Module):
    """An int4 layer with a bias and an int8 one: on the VNNI kernels where the CPU has them, or
    (torch_kernels) on torch's packed ops."""

    def __init__(self, torch_kernels: bool = False) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        w4, bias, w8 = (
            torch.randn(96, 128, generator=gen) * 0.05,
            torch.randn(96, generator=gen),
            torch.randn(128, 96, generator=gen) * 0.05,
        )
        if torch_kernels:
            self.a, self.b = (
                Int4Linear(quantize_int4(w4, 32), bias),
                Int8Linear(per_row_int8(quantize_int8(w8)), None),
            )
        else:
            self.a, self.b = (
                quantized_linear(quantize_int4(w4, 32), bias),
                quantized_linear(quantize_int8(w8), None),
            )


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


@pytest.mark.parametrize("torch_kernels", [False, True], ids=["model-kernels", "torch-kernels"])
@pytest.mark.parametrize("rows", [1, 5, 64, 200])
def test_the_copy_computes_the_held_weight(rows, torch_kernels):
    model = TwoLayers(torch_kernels)
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


@pytest.mark.parametrize("torch_kernels", [False, True], ids=["model-kernels", "torch-kernels"])
def test_compiled_graph_takes_the_copy_from_its_row_count(torch_kernels):
    """Compiled with a symbolic row count (cpu_compile's batched graph), each layer's C++ op takes
    the copy from `dense_from` rows and the quantized kernel below, in one graph. The copy here
    holds twice the weight, so which route ran shows in the result."""
    from torch._dynamo.utils import counters

    from sgl.runtime.model import quant_route
    from sgl.runtime.model.cpu_packed import pack_bf16
    from sgl.runtime.model.linear_ops import compiled_ops_ready

    model = TwoLayers(torch_kernels)
    quant_route.prepare_for_compile(model)
    if not compiled_ops_ready():
        pytest.skip("no C++ compiler: compiled graphs trace the torch-ops route")
    dense_copy.add_dense_copies(model, lambda: 1 << 30)
    for layer in (model.a, model.b):
        layer.dense_packed = pack_bf16(layer.held_weight().to(torch.bfloat16) * 2)
        layer.dense_from, layer.crossover = 16, 1 << 30
        torch._dynamo.reset()
        graphs = counters["stats"]["unique_graphs"]
        compiled = torch.compile(layer, dynamic=None)
        for rows in (3, 40, 7, 16):
            x = torch.randn(
                rows, layer.in_features, generator=torch.Generator().manual_seed(rows)
            ).to(torch.bfloat16)
            torch._dynamo.mark_dynamic(x, 0)
            y = compiled(x).double()
            plain = reference(layer, x.float())
            doubled = plain * 2 - (0 if layer.bias is None else layer.bias.double())
            want, other = (doubled, plain) if rows >= 16 else (plain, doubled)
            assert (y - want).abs().max() <= 2e-2 * want.abs().max(), rows
            assert (y - other).abs().max() > 0.2 * want.abs().max(), rows
        assert counters["stats"]["unique_graphs"] - graphs == 1
