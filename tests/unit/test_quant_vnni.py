"""The AVX-512 VNNI quantized kernels and their layers (sgl/runtime/model/quant_vnni.py,
csrc/quant_matmul_cpu.cpp).

Oracles: float64 matmuls on the weights the layers hold, the QuantizedTensor they were made
from (the tile layout must hold exactly its codes, with fp16 scales), and a stated bound on
the one error the kernel adds: activations rounded to int16 with one scale per row, so
|y - x W^T| <= sum_k |W[n, k]| * max|x| / 65534 (+ float32 accumulation).
"""

from __future__ import annotations

import pytest
import torch

from sgl.runtime.model import quant, quant_route, quant_vnni
from sgl.runtime.model.quant_tensor import QuantizedTensor, quantize_int4, quantize_int8

pytestmark = pytest.mark.skipif(
    not quant_vnni.vnni_available(), reason="no AVX-512 VNNI (or no compiler) here"
)


def _fp16_scales(q: QuantizedTensor) -> QuantizedTensor:
    """`q` with its scales (and int4 mins) rounded to fp16, as the tile layout holds them."""
    if q.kind == "int8":
        return QuantizedTensor("int8", q.codes, q.scales.half().float(), None, q.group)
    scale, low = q.scales.half().float(), (q.zeros - 8 * q.scales).half().float()
    return QuantizedTensor("int4", q.codes, scale, low + 8 * scale, q.group)


def _int8_groups(w: torch.Tensor, group: int) -> QuantizedTensor:
    """int8 codes with one scale per `group` inputs (GGUF Q8_0's layout at group 32)."""
    n, k = w.shape
    q = quantize_int8(w.reshape(n * k // group, group))
    return QuantizedTensor(
        "int8", q.codes.reshape(n, k), q.scales.reshape(n, k // group), None, group
    )


def _layer(kind: str, group: int, n: int, k: int, seed: int, bias: bool = False):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * 0.05
    q = quantize_int4(w, group) if kind == "int4" else _int8_groups(w, group)
    b = torch.randn(n, generator=gen) if bias else None
    cls = quant_vnni.VnniInt4Linear if kind == "int4" else quant_vnni.VnniInt8Linear
    return cls(q, b), q


def _activation_bound(layer, x: torch.Tensor) -> torch.Tensor:
    """Per output: what rounding x to int16 (one scale per row) may cost, plus float32 slop."""
    w = layer.held_weight().double()
    amax = x.double().abs().amax(dim=1, keepdim=True)
    exact = x.double() @ w.t()
    return w.abs().sum(dim=1) * amax / 65534 + 1e-5 * exact.abs() + 1e-6


@pytest.mark.parametrize(
    "kind,group",
    [("int4", 32), ("int4", 64), ("int4", 128), ("int8", 32), ("int8", 256), ("int8", 512)],
)
@pytest.mark.parametrize("n", [16, 97, 200])
def test_tiles_hold_exactly_the_codes_with_fp16_scales(kind, group, n):
    layer, q = _layer(kind, group, n, 512, seed=n)
    assert torch.equal(layer.held_weight(), _fp16_scales(q).dequantize())


@pytest.mark.parametrize("kind,group", [("int4", 32), ("int4", 128), ("int8", 32), ("int8", 512)])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9])
@pytest.mark.parametrize("n", [97, 160])
def test_kernel_within_the_int16_activation_bound(kind, group, rows, n):
    """float32 in, float32 out: only the activation's int16 rounding separates the kernel from
    float64 on the held weight. Rows 5 and 9 cross the kernel's blocks of 4 rows; 97 outputs
    end in a part tile."""
    layer, _ = _layer(kind, group, n, 512, seed=rows + n)
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows)) * 3
    x[0, 7] = 40.0  # an outlier: the row's scale is set by it
    y = layer.packed_mm(x)
    assert y.shape == (rows, n) and y.dtype == torch.float32
    exact = x.double() @ layer.held_weight().double().t()
    assert ((y.double() - exact).abs() <= _activation_bound(layer, x)).all()


def test_kernel_on_zero_and_bf16_rows():
    layer, _ = _layer("int4", 32, 64, 256, seed=1)
    x = torch.zeros(2, 256)
    x[1] = torch.randn(256)
    y = layer.packed_mm(x.bfloat16())
    assert y.dtype == torch.bfloat16 and torch.equal(y[0], torch.zeros(64, dtype=torch.bfloat16))
    exact = x[1:].bfloat16().double() @ layer.held_weight().double().t()
    assert (y[1:].double() - exact).abs().max() <= 2**-8 * exact.abs().max()  # bf16 output


@pytest.mark.parametrize("kind,group", [("int4", 32), ("int4", 64), ("int8", 32), ("int8", 256)])
def test_dequantized_weight_is_the_held_weight_in_bf16(kind, group):
    layer, _ = _layer(kind, group, 97, 256, seed=3)
    got = layer.dequantized_t()
    assert got.shape == (256, 112) and got.dtype == torch.bfloat16  # 97 outputs padded to 7 tiles
    assert torch.equal(
        got[:, :97], layer.held_weight().t().bfloat16()
    )  # one rounding, to nearest even


@pytest.mark.parametrize("kind", ["int4", "int8"])
@pytest.mark.parametrize("route", ["kernel", "dequantized"])
def test_layer_routes_match_the_held_weight(kind, route, monkeypatch):
    layer, _ = _layer(kind, 32, 97, 256, seed=4, bias=True)
    monkeypatch.setattr(quant_route, "crossover_rows", lambda _: 10**9 if route == "kernel" else 0)
    x = torch.randn(
        quant_route.DEQUANT_MIN_TOKENS + 3, 256, generator=torch.Generator().manual_seed(4)
    )
    y = layer(x)
    ref = x.bfloat16().double() @ layer.held_weight().double().t() + layer.bias.double()
    assert y.shape == ref.shape and y.dtype == torch.float32
    assert (y.double() - ref).abs().max() <= 1e-2 * ref.abs().max()  # bf16 weights / bf16 matmul


def test_embedding_rows_and_logits():
    gen = torch.Generator().manual_seed(5)
    q = quantize_int8(torch.randn(300, 128, generator=gen))
    q = QuantizedTensor(
        "int8", q.codes, q.scales.repeat(1, 4) * torch.rand(300, 4, generator=gen), None, 32
    )
    emb = quant_vnni.VnniInt8Embedding(q, torch.float32)
    held = emb.held_weight()
    ids = torch.tensor([[0, 299, 17], [15, 16, 255]])
    assert torch.equal(emb(ids), held[ids])
    assert quant.quantization_summary(emb) == {"int8_embedding_g32": 1}
    hidden = torch.randn(3, 128, generator=gen)
    logits = emb.logits(hidden)
    exact = hidden.double() @ held.double().t()
    assert logits.shape == (3, 300) and logits.dtype == torch.float32
    assert ((logits.double() - exact).abs() <= _activation_bound(emb, hidden)).all()


def test_dynamic_batch_compile_routes_at_run_time():
    """One graph with a symbolic row count serves both sides of the crossover: the kernel at
    few rows, the dequantized bf16 matmul (aten::mm) at many."""
    from torch._dynamo.utils import counters

    layer, _ = _layer("int4", 32, 192, 256, seed=6)
    quant_route.prepare_for_compile(layer)
    layer.crossover = 20
    torch._dynamo.reset()
    graphs = counters["stats"]["unique_graphs"]
    compiled = torch.compile(layer, dynamic=None)
    for rows in (3, 40, 7, 25):
        x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows))
        torch._dynamo.mark_dynamic(x, 0)
        with torch.profiler.profile() as prof:
            y = compiled(x)
        ref = x.bfloat16().double() @ layer.held_weight().double().t()
        assert (y.double() - ref).abs().max() <= 1e-2 * ref.abs().max()
        ran_dense = any(e.key == "aten::mm" for e in prof.key_averages())
        assert ran_dense == (rows > 20), rows
    assert counters["stats"]["unique_graphs"] - graphs == 1


def test_bad_inputs_are_refused_with_the_field_named_and_nan_propagates():
    layer, _ = _layer("int4", 32, 64, 256, seed=7)
    with pytest.raises(RuntimeError, match=r"x must be \[M, 256\]"):
        layer.packed_mm(torch.randn(2, 128))
    x = torch.randn(2, 256)
    x[0, 5] = float("inf")
    y = layer.packed_mm(x)  # as a float matmul: the row's outputs are NaN, the others unharmed
    assert y[0].isnan().all() and y[1].isfinite().all()
    with pytest.raises(RuntimeError, match="out_features"):
        torch.ops.sgl_qmm.int4_mm(torch.randn(1, 256), layer.qweight, layer.qscales, 32, 65)


def test_quantized_linear_picks_the_vnni_layers_and_keeps_int8_groups(monkeypatch):
    q8 = _int8_groups(torch.randn(64, 128), 32)
    assert isinstance(quant.quantized_linear(q8, None), quant_vnni.VnniInt8Linear)
    assert quant.quantized_linear(q8, None).layout == "int8_g32"
    monkeypatch.setattr(quant_vnni, "vnni_available", lambda: False)
    torch_layer = quant.quantized_linear(q8, None)
    assert (
        isinstance(torch_layer, quant.Int8Linear) and torch_layer.layout == "int8"
    )  # requantized per row


@pytest.mark.parametrize("n", [64, 97])
def test_consumed_codes_pack_in_place_to_the_same_tiles(n):
    """The loader's embeddings are packed in their own storage (a tile's rows are the same bytes
    in both layouts); a part tile (97 rows) cannot be, and is copied instead."""
    q = _int8_groups(torch.randn(n, 256, generator=torch.Generator().manual_seed(n)), 32)
    want_codes, want_scales = quant_vnni.pack_int8_tiles(q)
    original = q.codes.clone()
    got_codes, got_scales = quant_vnni.pack_int8_tiles(q, consume=True, chunk_tiles=3)
    assert torch.equal(got_codes, want_codes) and torch.equal(got_scales, want_scales)
    assert (got_codes.data_ptr() == q.codes.data_ptr()) == (n % 16 == 0)
    if n % 16:
        assert torch.equal(q.codes, original)  # not consumed: left as it was
