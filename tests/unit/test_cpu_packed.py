"""Dense bf16 layers prepacked for oneDNN (model/cpu_packed.py), held to float64 and HF.

PackedLinear's output is checked against float64 x W^T on the same bf16 input and weight
(the layer's only error is its bf16 output rounding, ~2^-8 relative); a packed model against
HF float32 on exactly the weights it holds.
"""

from __future__ import annotations

import os

import pytest
import torch
from tiny_models import TinyRunner, hf_tiny

from sgl.runtime import cpu_features
from sgl.runtime.model.cpu_packed import PackedLinear, pack_dense_layers, packing_applies
from sgl.runtime.model.linear_ops import linear_ops_built
from sgl.runtime.model.row_grid import EXACT_ROWS, padded_rows

needs_packing = pytest.mark.skipif(
    not packing_applies(torch.bfloat16, torch.device("cpu")),
    reason="this CPU has no native bf16 matmul (oneDNN packing is not used here)",
)


def _reference(layer: PackedLinear, x: torch.Tensor) -> torch.Tensor:
    y = x.bfloat16().double() @ layer.held_weight().double().t()
    return y if layer.bias is None else y + layer.bias.double()


@needs_packing
@pytest.mark.parametrize("rows", [1, 5, 48, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_matches_float64(rows, bias):
    gen = torch.Generator().manual_seed(rows)
    w = torch.randn(192, 256, generator=gen) * 0.05
    b = torch.randn(192, generator=gen) if bias else None
    layer = PackedLinear(w, b)
    assert torch.equal(layer.held_weight(), w.bfloat16().float())  # packing changes the layout only
    x = torch.randn(rows, 256, generator=gen).bfloat16()
    y = layer(x)
    assert y.shape == (rows, 192) and y.dtype == torch.bfloat16
    ref = _reference(layer, x)
    assert (y.double() - ref).abs().max() <= 1e-2 * ref.abs().max()


@needs_packing
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to compare teams")
@pytest.mark.parametrize(
    ("out_features", "in_features", "rows"),
    [(960, 576, 512), (960, 576, 654), (576, 1536, 256), (576, 576, 384), (2048, 8192, 160)],
)
def test_many_rows_give_the_same_bits_on_one_thread_or_two(out_features, in_features, rows):
    """oneDNN plans a call for its threads, and for these shapes (SmolLM2's layers; measured on
    an AMX Xeon) its plan for two split the sum over K, so the same rows gave other bits with
    one thread than with two and a greedy output changed with the machine's load (the thread
    team shrinks under it, runtime/cpu_share.py). Row slices planned for one thread each do not
    depend on the team."""
    assert linear_ops_built()
    gen = torch.Generator().manual_seed(rows)
    layer = PackedLinear(torch.randn(out_features, in_features, generator=gen) * 0.05, None)
    x = torch.randn(rows, in_features, generator=gen).bfloat16()
    team = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two = layer(x)
        torch.set_num_threads(1)
        one = layer(x)
    finally:
        torch.set_num_threads(team)
    assert torch.equal(one, two)


def test_row_grid_bounds_shapes_and_padding():
    """Every row count maps to a grid value at or above it with under 1/16 padding; the grid
    up to 8192 rows has 176 values, so oneDNN's and ideep's per-shape caches (1024 each) hold
    all of a weight's shapes instead of growing and churning with every new prompt length."""
    grid = set()
    for rows in range(1, 8193):
        p = padded_rows(rows)
        assert p >= rows and (p == rows if rows <= EXACT_ROWS else (p - rows) * 16 < rows)
        assert padded_rows(p) == p  # grid values map to themselves
        grid.add(p)
    assert len(grid) == EXACT_ROWS + 7 * 16


@needs_packing
@pytest.mark.parametrize("shape", [(2, 150, 256), (1, 65, 256), (77, 256)])
def test_padded_rows_leave_outputs_unchanged(shape):
    gen = torch.Generator().manual_seed(11)
    layer = PackedLinear(
        torch.randn(192, 256, generator=gen) * 0.05, torch.randn(192, generator=gen)
    )
    x = torch.randn(*shape, generator=gen).bfloat16()
    y = layer(x)
    assert y.shape == (*shape[:-1], 192)
    ref = _reference(layer, x.reshape(-1, 256)).reshape(*shape[:-1], 192)
    assert (y.double() - ref).abs().max() <= 1e-2 * ref.abs().max()


@needs_packing
def test_compiled_packed_linear_serves_every_row_count_in_one_graph():
    """Under torch.compile the layer calls our C++ op (inductor cannot lower oneDNN's packed
    linear for a weight it did not pack itself): one graph with a symbolic row count."""
    from torch._dynamo.utils import counters

    if not linear_ops_built():
        pytest.skip("no C++ compiler")
    gen = torch.Generator().manual_seed(3)
    layer = PackedLinear(torch.randn(96, 64, generator=gen), torch.randn(96, generator=gen))
    torch._dynamo.reset()
    graphs = counters["stats"]["unique_graphs"]
    compiled = torch.compile(lambda x: layer(x) * 2, dynamic=None)
    for rows in (2, 33, 5):
        x = torch.randn(rows, 64, generator=gen).bfloat16()
        torch._dynamo.mark_dynamic(x, 0)
        ref = 2 * _reference(layer, x)
        assert (compiled(x).double() - ref).abs().max() <= 1e-2 * ref.abs().max()
    assert counters["stats"]["unique_graphs"] - graphs == 1


@needs_packing
@pytest.mark.parametrize("tie", [False, True])
def test_packed_model_matches_hf_on_its_weights(tmp_path, tie):
    """Every dense layer and the LM head packed (a tied head as its own packed copy): logits
    vs HF float32 on the weights the model holds, within bf16's error over 2 layers."""
    from sgl.runtime.model.loader import load_model
    from sgl.runtime.model.quant import quantization_summary

    hf = hf_tiny(arch="llama", tie=tie, kv_heads=2, seed=9)
    hf.save_pretrained(tmp_path)
    ours, _ = load_model(str(tmp_path), torch.bfloat16, torch.device("cpu"))
    assert pack_dense_layers(ours) == 4 * 2 + 1
    assert quantization_summary(ours) == {"dense_packed": 9, "dense": 1}  # + the embedding lookup
    _assert_matches_hf_on_held_weights(
        ours, hf_tiny(arch="llama", tie=tie, kv_heads=2, seed=9), list(range(2, 40))
    )


def _assert_matches_hf_on_held_weights(ours, oracle, ids: list[int]) -> None:
    """Logits of `ours` (bf16) vs HF float32 on the weights it holds, within bf16's error over 2
    layers."""
    from sgl.runtime.model.held_weights import held_hf_state_dict

    missing, unexpected = oracle.load_state_dict(held_hf_state_dict(ours), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    got = TinyRunner(ours, kv_dtype=torch.bfloat16).step({0: ids})[0]
    with torch.no_grad():
        want = oracle(torch.tensor([ids])).logits[0]
    assert (got - want).abs().max() <= 3e-2 * (want.max() - want.min())


@needs_packing
@pytest.mark.parametrize("rows", [1, 3, 200])
def test_packed_experts_match_the_per_token_definition(rows):
    """Experts packed one PackedLinear pair each: same output as the per-token loop in float64
    over the bf16 weights (the stacked ones are gone), at decode and prefill row counts."""
    from sgl.runtime.model.moe import StackedExperts

    torch.manual_seed(rows)
    experts = StackedExperts(6, 128, 64, "silu")
    with torch.no_grad():
        experts.gate_up_proj.normal_(0, 0.1)
        experts.down_proj.normal_(0, 0.1)
    experts = experts.bfloat16()
    gate_up, down = (w.double() for w in experts.stacked_weights())
    experts.pack_for_cpu()
    assert not list(experts.parameters()) and len(experts.per_expert) == 6
    assert all(
        torch.equal(a.double(), b) for a, b in zip(experts.stacked_weights(), (gate_up, down))
    )
    x = torch.randn(rows, 128).bfloat16()
    chosen = torch.stack([torch.arange(rows) % 6, (torch.arange(rows) + 1) % 6], dim=1)
    weights = torch.rand(rows, 2)
    with torch.inference_mode():
        got = experts(x, chosen, weights).double()
    want = torch.zeros(rows, 128, dtype=torch.float64)
    for t in range(rows):
        for j in range(2):
            e = int(chosen[t, j])
            g, u = (gate_up[e] @ x[t].double()).split(64)
            want[t] += weights[t, j].double() * (down[e] @ (torch.nn.functional.silu(g) * u))
    assert (got - want).abs().max() <= 2e-2 * want.abs().max()


@needs_packing
@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe"])
def test_packed_moe_model_matches_hf_on_its_weights(tmp_path, arch):
    """A MoE model packed for the CPU (dense layers and every expert) against HF on its weights."""
    from sgl.runtime.model.loader import load_model
    from sgl.runtime.model.moe import StackedExperts

    hf = hf_tiny(arch=arch, seed=5)
    hf.save_pretrained(tmp_path)
    ours, _ = load_model(str(tmp_path), torch.bfloat16, torch.device("cpu"))
    pack_dense_layers(ours)
    blocks = [m for m in ours.modules() if isinstance(m, StackedExperts)]
    assert blocks and all(b.per_expert is not None for b in blocks)
    _assert_matches_hf_on_held_weights(ours, hf_tiny(arch=arch, seed=5), list(range(2, 90)))


def test_packing_needs_native_bf16(monkeypatch):
    monkeypatch.setenv("SGL_CPU_FLAGS_OVERRIDE", "avx2 fma")
    cpu_features.cpu_flags.cache_clear()
    try:
        assert not packing_applies(torch.bfloat16, torch.device("cpu"))
    finally:
        monkeypatch.delenv("SGL_CPU_FLAGS_OVERRIDE")
        cpu_features.cpu_flags.cache_clear()
    assert not packing_applies(torch.float32, torch.device("cpu"))
