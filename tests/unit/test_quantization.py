"""Weight-only int8 / int4 quantization and GGUF blocks kept quantized (sgl/runtime/model/quant.py,
gguf_weights.py).

Oracles: the `gguf` package's own dequantizers (our codes and scales must stand for the same
weights), brute-force float64 matmuls on the weights the kernels hold, and HF transformers
run on those held weights (so only our kernels' error remains).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from tiny_models import TinyRunner, hf_tiny

from sgl.runtime.model import quant, quant_route, quant_tensor
from sgl.runtime.model.quant import Int4Linear, Int8Linear, pack_int4, unpack_int4
from sgl.runtime.model.quant_route import DEQUANT_MIN_TOKENS
from sgl.runtime.model.quant_tensor import quantize_int4, quantize_int8

gguf = pytest.importorskip("gguf")


def _random_blocks(qtype: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    """Random bytes for an [n, k] tensor of `qtype` with finite, sane fp16 scales."""
    rng = np.random.default_rng(seed)
    elems, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    raw = rng.integers(0, 256, size=(n, k // elems, size), dtype=np.uint8)
    n_halves = {"Q4_0": 1, "Q8_0": 1, "Q4_1": 2, "Q4_K": 2}[qtype]  # the leading fp16 fields
    halves = rng.uniform(0.001, 0.05, size=(n, k // elems, n_halves)).astype(np.float16)
    if qtype == "Q4_1":
        halves[..., 1] = -halves[..., 1]  # the min is usually negative
    raw[..., : 2 * n_halves] = halves.view(np.uint8).reshape(n, k // elems, 2 * n_halves)
    return raw.reshape(-1)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0", "Q4_K"])
def test_gguf_blocks_stand_for_what_gguf_dequantizes(qtype):
    from sgl.runtime.model.gguf_weights import _EXACT

    n, k = 8, 512
    raw = _random_blocks(qtype, n, k)
    q = _EXACT[qtype](raw, n, k)
    assert q.kind == ("int8" if qtype == "Q8_0" else "int4") and q.group == 32
    want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype]).reshape(n, k)
    torch.testing.assert_close(q.dequantize(), torch.from_numpy(want), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0", "Q4_K"])
def test_block_tensors_read_in_row_chunks_equal_the_whole(tmp_path, qtype):
    """GgufTensors reads a quantized tensor a few rows at a time (peak memory): the result is the
    decoder's on the whole tensor, at chunk sizes that do and do not divide the rows."""
    from sgl.runtime.model.gguf_weights import _EXACT, GgufTensors

    n, k = 37, 512
    raw = _random_blocks(qtype, n, k, seed=2)
    path = tmp_path / "t.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("t", raw.reshape(n, -1), raw_dtype=gguf.GGMLQuantizationType[qtype])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tensors = GgufTensors(path, gguf.GGUFReader(str(path)))
    whole = _EXACT[qtype](raw, n, k)
    for chunk in (k, 5 * k, 1 << 22):
        got = tensors.read_blocks("t", qtype, n, k, chunk_elems=chunk)
        assert torch.equal(got.codes, whole.codes) and torch.equal(got.scales, whole.scales)
        assert (got.zeros is None) == (whole.zeros is None)
        assert got.zeros is None or torch.equal(got.zeros, whole.zeros)
    assert torch.equal(tensors.read("t").codes, whole.codes)


@pytest.mark.parametrize("n,k", [(64, 64), (192, 96), (960, 576)])
def test_int4_pack_roundtrip(n, k):
    codes = torch.randint(
        0, 16, (n, k), dtype=torch.uint8, generator=torch.Generator().manual_seed(n)
    )
    assert torch.equal(unpack_int4(pack_int4(codes), n, k), codes)


def test_chunked_packing_and_requantization_equal_whole():
    """pack_int4 and quantize go a few million weights at a time: the result is the same."""
    gen = torch.Generator().manual_seed(3)
    codes = torch.randint(0, 16, (320, 128), dtype=torch.uint8, generator=gen)
    assert torch.equal(pack_int4(codes, chunk_elems=64 * 128), pack_int4(codes))
    w = torch.randn(300, 128, generator=gen)
    for kind in ("int8", "int4"):
        whole, chunked = (
            quant_tensor.quantize(w, kind, 32),
            quant_tensor.quantize(w, kind, 32, chunk_elems=7 * 128),
        )
        assert torch.equal(whole.codes, chunked.codes) and torch.equal(whole.scales, chunked.scales)
    q8 = quant_tensor.QuantizedTensor(
        "int8",
        torch.randint(-127, 128, (300, 128), dtype=torch.int8, generator=gen),
        torch.rand(300, 4, generator=gen),
        None,
        32,
    )  # Q8_0-like groups of 32
    per_row = quant_tensor.quantize(q8, "int8", 128, chunk_elems=5 * 128)
    assert torch.equal(per_row.codes, quantize_int8(q8.dequantize()).codes)


def test_quantizers_round_to_the_nearest_level():
    w = torch.randn(40, 256, generator=torch.Generator().manual_seed(1))
    q8 = quantize_int8(w)
    assert (q8.dequantize() - w).abs().max() <= q8.scales.max() / 2 + 1e-6
    assert q8.codes.abs().max() == 127  # the largest weight of each row maps to +-127
    for g in (32, 64, 128):
        q4 = quantize_int4(w, g)
        err = (q4.dequantize() - w).abs().reshape(40, 256 // g, g).amax(2)
        assert (err <= q4.scales / 2 + 1e-6).all()


def _held_reference(module, x: torch.Tensor) -> torch.Tensor:
    """float64 x W^T (+ b) on the bf16-rounded input the kernel reads and the weight it holds."""
    y = x.bfloat16().double() @ module.held_weight().double().t()
    return y if module.bias is None else y + module.bias.double()


@pytest.mark.parametrize("kind,group", [("int8", None), ("int4", 32), ("int4", 64), ("int4", 128)])
@pytest.mark.parametrize("rows", [1, 5, DEQUANT_MIN_TOKENS + 7])
@pytest.mark.parametrize("out_features", [192, 97])  # 97: int4 pads to a block of 64 rows
@pytest.mark.parametrize("route", ["packed", "dequantized"])
def test_quantized_linear_matches_its_held_weights(
    kind, group, rows, out_features, route, monkeypatch
):
    gen = torch.Generator().manual_seed(rows)
    w = torch.randn(out_features, 256, generator=gen) * 0.05
    bias = torch.randn(out_features, generator=gen)
    q = quantize_int8(w) if kind == "int8" else quantize_int4(w, group)
    module = Int8Linear(q, bias) if kind == "int8" else Int4Linear(q, bias)
    torch.testing.assert_close(
        module.held_weight(), q.rounded_scales().dequantize(), rtol=0, atol=1e-6
    )
    x = torch.randn(rows, 256, generator=gen)
    crossover = 10**9 if route == "packed" else 0  # past DEQUANT_MIN_TOKENS rows: the route forced
    monkeypatch.setattr(quant_route, "crossover_rows", lambda layer: crossover)
    y = module(x)
    assert y.shape == (rows, out_features) and y.dtype == torch.float32
    ref = _held_reference(module, x)
    # bf16 output (and, dequantized, bf16-rounded weights): ~2^-8 relative.
    assert (y.double() - ref).abs().max() <= 1e-2 * ref.abs().max()


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_dynamic_batch_compile_chooses_the_route_at_run_time(kind):
    """Compiled with a symbolic row count (cpu_compile's batched graph), a quantized layer
    decides packed-or-dequantized inside a custom op on each call's real rows: one graph
    serves row counts on both sides of the crossover, each equal to the held-weight reference."""
    from torch._dynamo.utils import counters

    gen = torch.Generator().manual_seed(11)
    w = torch.randn(192, 256, generator=gen) * 0.05
    module = (
        Int8Linear(quantize_int8(w), None)
        if kind == "int8"
        else Int4Linear(quantize_int4(w, 32), None)
    )
    if not quant.linear_ops_built():
        pytest.skip("no C++ compiler: compiled graphs trace the torch-ops route")
    quant_route.prepare_for_compile(module)
    module.crossover = 20
    torch._dynamo.reset()
    graphs = counters["stats"]["unique_graphs"]
    compiled = torch.compile(module, dynamic=None)
    packed = "_weight_int8pack_mm" if kind == "int8" else "_weight_int4pack_mm_for_cpu"
    for rows in (3, 40, 7, 25):
        x = torch.randn(rows, 256, generator=gen)
        torch._dynamo.mark_dynamic(x, 0)
        ref = _held_reference(module, x)
        with torch.profiler.profile() as prof:
            y = compiled(x)
        assert (y.double() - ref).abs().max() <= 1e-2 * ref.abs().max()
        ran_packed = any(packed in e.key for e in prof.key_averages())
        assert ran_packed == (rows <= 20), (rows, [e.key for e in prof.key_averages()])
    assert counters["stats"]["unique_graphs"] - graphs == 1


@pytest.mark.parametrize("kernel", ["C++", "torch ops"])
def test_int4_dequantize_equals_the_held_weight(kernel, monkeypatch):
    """The W^T of the prefill route (in the dense dtype): the held (float32) weight, rounded
    once to bf16 where that is the dense dtype (C++), or through torch ops (the fallback where
    no compiler is present)."""
    if kernel == "torch ops":
        monkeypatch.setattr(quant, "int4_dequant_op", lambda: None)
    elif quant.int4_dequant_op() is None:
        pytest.skip("no C++ compiler: the int4 dequantize kernel cannot be built here")
    for n, k, g in ((192, 256, 32), (97, 128, 64), (640, 512, 128)):
        layer = Int4Linear(
            quantize_int4(torch.randn(n, k, generator=torch.Generator().manual_seed(n)), g), None
        )
        got = layer.dequantized_t()
        assert got.shape == (k, layer.padded_out) and got.dtype == quant_route.dense_dtype()
        held = layer.held_weight().t()
        if kernel == "C++":
            assert torch.equal(
                got[:, :n], held.to(got.dtype)
            )  # at most one rounding, to nearest even
        else:
            assert (got[:, :n].float() - held).abs().max() <= 2**-7 * held.abs().max()


@pytest.mark.parametrize(
    "flags, want",
    [
        ("avx2 fma", torch.float32),
        ("avx2 amx_tile amx_bf16", torch.bfloat16),
        ("avx512f avx512_bf16", torch.bfloat16),
    ],
)
def test_the_dense_route_multiplies_in_bf16_only_where_the_cpu_has_it(flags, want, monkeypatch):
    """Prefill's dequantized route runs in bf16 only on AMX / AVX512-BF16: elsewhere oneDNN
    emulates bf16 (25x slower than float32 on an AVX2 EPYC), so it runs in float32. Either
    way a layer's output equals its held weights' product."""
    from sgl.runtime import cpu_features

    monkeypatch.setenv("SGL_CPU_FLAGS_OVERRIDE", flags)
    cpu_features.cpu_flags.cache_clear()
    quant_route.dense_dtype.cache_clear()
    monkeypatch.setattr(
        quant_route, "crossover_rows", lambda layer: 0
    )  # the dense route for > 16 rows
    try:
        assert quant_route.dense_dtype() == want
        gen = torch.Generator().manual_seed(5)
        w = torch.randn(97, 256, generator=gen) * 0.05
        for module in (Int8Linear(quantize_int8(w), None), Int4Linear(quantize_int4(w, 32), None)):
            weight = (
                module.dequantized_t() if isinstance(module, Int4Linear) else module.dequantized()
            )
            assert weight.dtype == want
            x = torch.randn(40, 256, generator=gen)
            ref = _held_reference(module, x)
            assert (module(x).double() - ref).abs().max() <= 1e-2 * ref.abs().max()
    finally:
        cpu_features.cpu_flags.cache_clear()
        quant_route.dense_dtype.cache_clear()


def test_crossover_is_measured_once_per_shape_and_kept_on_disk(tmp_path, monkeypatch):
    """Measured once per shape on this machine, then read back by a later process (here: a
    cleared in-memory table), so compiled graphs that embed it stay the same between starts."""
    from sgl.runtime.model import crossovers

    monkeypatch.setenv("SGL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(crossovers, "_table", None)
    q = quantize_int8(torch.randn(128, 256) * 0.05)
    a, b = Int8Linear(q, None), Int8Linear(q, None)
    calls = []
    measure = a.packed_mm
    monkeypatch.setattr(a, "packed_mm", lambda x: calls.append(1) or measure(x))
    rows = quant_route.crossover_rows(a)
    assert (
        rows >= DEQUANT_MIN_TOKENS and quant_route.crossover_rows(b) == rows and calls
    )  # b: not measured again
    measured_calls = len(calls)
    path = crossovers.crossover_file()
    assert path.is_relative_to(tmp_path) and list(json.loads(path.read_text()).values()) == [rows]
    monkeypatch.setattr(crossovers, "_table", None)  # a new process
    assert quant_route.crossover_rows(a) == rows and len(calls) == measured_calls


def _hf_with(hf, state: dict[str, torch.Tensor]):
    import copy

    model = copy.deepcopy(hf)
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    return model.eval()


def _hf_logits(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float()


def _use_kernels(kernel: str, monkeypatch) -> None:
    """Quantized layers on our VNNI kernels (skipped where this CPU lacks them) or torch's."""
    from sgl.runtime.model import quant_vnni

    if kernel == "torch":
        monkeypatch.setattr(quant_vnni, "vnni_available", lambda: False)
    elif not quant_vnni.vnni_available():
        pytest.skip("no AVX-512 VNNI (or no compiler) here")


@pytest.mark.parametrize("kernel", ["vnni", "torch"])
@pytest.mark.parametrize("qtype,embed", [("Q4_1", "Q8_0"), ("Q4_0", "Q4_0"), ("Q8_0", "Q8_0")])
def test_quantized_gguf_model_matches_hf_on_its_held_weights(
    tmp_path, qtype, embed, kernel, monkeypatch
):
    """Fidelity (b): a GGUF loaded quantized vs HF on exactly the weights our kernels hold.
    Tolerance 3e-2 of the logits' range: activations enter each int kernel rounded to bf16
    (2^-8 relative) over 2 layers; an indexing or layout bug gives O(1) errors. Q8_0 keeps its
    groups of 32 on the VNNI kernels; torch's int8 kernel takes one scale per row."""
    from sgl.runtime.model.gguf_export import write_llama_gguf
    from sgl.runtime.model.held_weights import held_hf_state_dict
    from sgl.runtime.model.loader import load_model

    _use_kernels(kernel, monkeypatch)
    hf = hf_tiny(arch="llama", tie=False, kv_heads=2, seed=5)
    path = tmp_path / f"tiny-{qtype}.gguf"
    write_llama_gguf(path, hf.config.to_dict(), hf.state_dict().items(), qtype, embed_qtype=embed)
    ours, _ = load_model(str(path), torch.float32, torch.device("cpu"), quantization="auto")
    layouts = quant.quantization_summary(ours)
    want = ("int8_g32" if kernel == "vnni" else "int8") if qtype == "Q8_0" else "int4_g32"
    lm_head = (
        1 if want.startswith("int8") else 0
    )  # an untied LM head is an int8 layer when the model is quantized
    assert (
        layouts[want] == 4 * hf.config.num_hidden_layers + lm_head
    )  # qkv, o, gate_up, down per layer
    oracle = _hf_with(hf, held_hf_state_dict(ours))
    runner = TinyRunner(ours)
    for ids in ([3, 17, 5, 88, 41, 9, 60], list(range(1, 60))):
        got, want_logits = runner.step({len(ids): ids})[len(ids)], _hf_logits(oracle, ids)
        span = want_logits.max() - want_logits.min()
        assert (got - want_logits).abs().max() <= 3e-2 * span


@pytest.mark.parametrize("kernel", ["vnni", "torch"])
def test_quantized_weights_track_the_file_weights(tmp_path, kernel, monkeypatch):
    """What repacking costs against the GGUF's own values. On the VNNI kernels nothing: they hold
    Q4_1's and Q8_0's fp16 scales and mins as they are. On torch's, Q4_1 rounds its scales to bf16
    (<= 2^-8 of a group's scale) and a Q8_0 LM head is requantized per row (<= half a level)."""
    from sgl.runtime.model.gguf_export import write_llama_gguf
    from sgl.runtime.model.gguf_model import read_gguf
    from sgl.runtime.model.held_weights import held_hf_state_dict
    from sgl.runtime.model.loader import load_model

    _use_kernels(kernel, monkeypatch)
    hf = hf_tiny(arch="llama", tie=False, kv_heads=2, seed=6)
    path = tmp_path / "tiny.gguf"
    write_llama_gguf(path, hf.config.to_dict(), hf.state_dict().items(), "Q4_1", embed_qtype="Q8_0")
    ours, _ = load_model(str(path), torch.float32, torch.device("cpu"), quantization="auto")
    held = held_hf_state_dict(ours)
    _, exact = read_gguf(path)
    for name, w in exact.items():
        err = (held[name] - w).abs().max() / w.abs().max()
        limit = 1 / 127 if "embed" in name or "lm_head" in name else 2**-8
        assert err <= (1e-6 if kernel == "vnni" else limit), (name, float(err))


@pytest.mark.parametrize("quantization,layout", [("int8", "int8"), ("int4", "int4_g32")])
def test_dense_checkpoint_quantized_on_load(tmp_path, quantization, layout):
    from sgl.runtime.model.held_weights import held_hf_state_dict
    from sgl.runtime.model.loader import load_model

    hf = hf_tiny(arch="qwen2", tie=False, kv_heads=2, seed=8)  # biases on q/k/v
    hf.save_pretrained(tmp_path)
    ours, _ = load_model(
        str(tmp_path), torch.float32, torch.device("cpu"), quantization=quantization
    )
    assert quant.quantization_summary(ours)[layout] == 8 + (layout == "int8")  # + the int8 LM head
    ids = list(range(2, 40))
    got = TinyRunner(ours).step({0: ids})[0]
    want = _hf_logits(_hf_with(hf, held_hf_state_dict(ours)), ids)
    assert (got - want).abs().max() <= 3e-2 * (want.max() - want.min())


def test_engine_options_are_checked():
    import sgl

    with pytest.raises(ValueError, match="quantization must be one of"):
        sgl.Engine(model_path="tiny-llama", load_format="dummy", quantization="int3")
    with pytest.raises(ValueError, match="int4_group_size must be one of"):
        sgl.Engine(
            model_path="tiny-llama", load_format="dummy", quantization="int4", int4_group_size=48
        )


def test_quantization_is_a_cpu_layout():
    from sgl.runtime.worker import effective_quantization

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert [effective_quantization(q, cpu) for q in ("auto", "none", "int8", "int4")] == [
        "auto",
        "none",
        "int8",
        "int4",
    ]
    assert effective_quantization("auto", cuda) == "none"  # a GGUF loads dense on the GPU
    with pytest.raises(ValueError, match="CPU only"):
        effective_quantization("int4", cuda)


def test_model_bytes_counts_shared_storage_once_and_opaque_packed_weights():
    """oneDNN's packed bf16 weights (mkldnn tensors, used where the CPU has AVX512-BF16 or AMX)
    have no storage to read; they are counted by their elements."""
    from sgl.runtime.worker import model_bytes

    model = torch.nn.Linear(8, 4, bias=False)
    model.tied = model.weight  # the same storage held twice counts once
    model.packed = torch.zeros(16, 32).to_mkldnn()
    assert model_bytes(model) == 8 * 4 * 4 + 16 * 32 * 4


def _random_k_blocks(qtype: str, n: int, k: int, seed: int) -> np.ndarray:
    """Random [n, k] blocks of a type whose fp16 fields sit elsewhere than _random_blocks's
    (Q6_K: d last; Q5_K: d and dmin first; Q5_0: d first), with sane values."""
    rng = np.random.default_rng(seed)
    elems, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    raw = rng.integers(0, 256, size=(n, k // elems, size), dtype=np.uint8)
    halves = rng.uniform(0.001, 0.05, size=(n, k // elems, 2)).astype(np.float16).view(np.uint8)
    if qtype == "Q6_K":
        raw[..., size - 2 :] = halves[..., :2]
    elif qtype == "Q5_K":
        raw[..., :4] = halves
    else:
        raw[..., :2] = halves[..., :2]
    return raw.reshape(-1)


@pytest.mark.parametrize("kernel", ["vnni", "torch"])
@pytest.mark.parametrize("qtype", ["Q6_K", "Q5_K", "Q5_0"])
def test_requantized_types_stay_within_their_stated_error(qtype, kernel, monkeypatch):
    """Types without an exact layout are dequantized and requantized to int8 per row (what the
    loader does, QuantPolicy "auto"). Stated error against the file's own values: half a level
    of the row's scale (max|w| / 127), plus the scale's rounding as the kernel holds it
    (fp16 on the VNNI kernels: 127 x 2^-11 of a level; bf16 on torch's: 127 x 2^-8)."""
    from sgl.runtime.model.quant_policy import QuantPolicy

    _use_kernels(kernel, monkeypatch)
    n, k = 24, 512
    raw = _random_k_blocks(qtype, n, k, seed=4)
    exact = torch.from_numpy(
        gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype]).reshape(n, k).copy()
    )
    q = QuantPolicy("auto").linear_weight(exact, "int8")
    held = quant.quantized_linear(q, None).held_weight()
    level = exact.abs().amax(dim=1) / 127
    scale_rounding = 127 * (2**-11 if kernel == "vnni" else 2**-8)
    assert ((held - exact).abs().amax(dim=1) <= level * (0.5 + scale_rounding) * 1.001).all()


def test_q4_k_on_vnni_within_fp16_rounding_of_its_scales(monkeypatch):
    """Q4_K's scale and min are products (d x sc, dmin x m) that the VNNI layout holds in fp16:
    each weight is off by at most 2^-11 of (15 x its group's scale + |its min|)."""
    from sgl.runtime.model.gguf_weights import _EXACT

    _use_kernels("vnni", monkeypatch)
    n, k = 32, 512
    raw = _random_blocks("Q4_K", n, k, seed=5)
    exact = torch.from_numpy(
        gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_K).reshape(n, k).copy()
    )
    q = _EXACT["Q4_K"](raw, n, k)
    held = quant.quantized_linear(q, None).held_weight()
    low = q.zeros - 8 * q.scales
    bound = (2**-11 * (15 * q.scales.abs() + low.abs())).repeat_interleave(32, dim=1) + 1e-7
    assert ((held - exact).abs() <= bound).all()


def test_crossovers_are_timed_with_the_weight_out_of_the_cache(monkeypatch):
    """Each timed call of a big layer comes right after an eviction pass (a forward pass reads
    its weights from memory); a small one is timed warm; the eviction buffer is not kept."""
    from sgl.runtime.model import crossovers

    events: list[str] = []

    class Recorder:
        def __call__(self) -> None:
            events.append("evict")

    monkeypatch.setattr(crossovers, "CacheEvictor", Recorder)
    monkeypatch.setattr(crossovers, "_table", {})
    monkeypatch.setattr(crossovers, "_write", lambda *a: None)

    def measure() -> int:
        crossovers.cold_seconds(lambda: events.append("call"), 3, crossovers.EVICT_MIN_BYTES)
        crossovers.cold_seconds(lambda: events.append("small"), 2, crossovers.EVICT_MIN_BYTES - 1)
        return 7

    assert crossovers.measured("some layer", measure) == 7
    assert events == ["evict", "call"] * 3 + ["small"] * 2
    assert crossovers._evictor is None


def test_the_last_level_cache_size_is_read_from_sysfs(tmp_path):
    from sgl.runtime.model.crossovers import last_level_cache_bytes

    for i, size in enumerate(("48K", "2048K", "32M", "bogus")):
        (tmp_path / f"index{i}").mkdir()
        (tmp_path / f"index{i}" / "size").write_text(size + "\n")
    assert last_level_cache_bytes(str(tmp_path)) == 32 << 20
    assert last_level_cache_bytes(str(tmp_path / "missing")) is None
