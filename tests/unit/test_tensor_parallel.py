"""Tensor parallelism on CPU: two processes over gloo hold the shards of tiny random-weight
models and must compute the logits the whole model computes at tp size 1 (same weights,
same chunked prefill and batched decode, the real attention backend on a per-rank KV pool).

One spawn runs every case (both ranks loop over them; each rank also runs the tp=1 model
itself), so the processes start once. Tolerances, measured on these models:
  - float32: 1e-5 absolute (only the order of the row-parallel sums differs; seen <= 3e-7).
  - int8 / int4 / GGUF Q8_0 / Q4_0 codes and bf16 models: 1e-2 of the logits' range (seen
    <= 4e-3: one bf16 rounding of each rank's partial sum, as the quantized layers compute
    in bf16; int8 from dense weights has per-row scales over each rank's input slice, int4
    and GGUF codes the same groups as at tp size 1). The quantized layers are held on their
    packed kernels (see `_worker`).
Refusals and the shards' layout need no collectives and run in this process.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest
import torch
from tiny_models import FAMILY_CONFIGS, TinyRunner, hf_tiny, prefill_in_chunks_then_decode

from sgl.runtime.distributed import TPGroup, init_tp_group
from sgl.runtime.model.config import ModelConfig
from sgl.runtime.model.cpu_packed import pack_dense_layers, packing_applies
from sgl.runtime.model.llama import LlamaForCausalLM
from sgl.runtime.model.loader import load_hf_state_dict, load_model

TP = 2
SPAWN_TIMEOUT_S = 240
DENSE_ATOL = 1e-5
QUANT_RTOL = 1e-2  # of the logits' range

# name -> (hf_tiny arguments, how ours loads: "dict" state dict, "safetensors" directory,
# "int8" / "int4" quantized from it, "Q8_0" / "Q4_0" a GGUF kept quantized)
CASES: dict[str, tuple[dict, str]] = {
    **{arch: (dict(arch=arch, tie=arch.startswith("gemma")), "dict") for arch in FAMILY_CONFIGS},
    "llama-tied": (dict(arch="llama", tie=True), "safetensors"),
    "llama-kv1": (dict(arch="llama", kv_heads=1), "dict"),  # 1 KV head, replicated on both ranks
    # 3 KV heads on 2 ranks: 2 and 1, with 4 and 2 query heads (SmolLM2's 9 / 3 heads alike)
    "llama-kv3": (dict(arch="llama", num_attention_heads=6, kv_heads=3, hidden_size=96), "dict"),
    "llama-kv3-Q4_0": (
        dict(
            arch="llama", num_attention_heads=6, kv_heads=3, hidden_size=96, intermediate_size=128
        ),
        "Q4_0",
    ),  # o_proj's codes cut at 64 of 96 inputs: on their blocks of 32
    "llama-biases": (
        dict(arch="llama", attention_bias=True, mlp_bias=True),
        "dict",
    ),  # row-parallel biases
    "qwen2": (dict(arch="qwen2"), "dict"),  # qkv bias
    "llama-int8": (dict(arch="llama", intermediate_size=128), "int8"),
    "llama-int4": (dict(arch="llama", intermediate_size=128), "int4"),
    "qwen3_moe-int8": (dict(arch="qwen3_moe", moe_intermediate_size=64), "int8"),
    "qwen3_moe-int4": (dict(arch="qwen3_moe", moe_intermediate_size=64), "int4"),
    "llama-Q8_0": (dict(arch="llama", intermediate_size=128), "Q8_0"),
    "llama-Q4_0": (dict(arch="llama", intermediate_size=128, tie=True), "Q4_0"),
    "mixtral-Q4_0": (
        dict(arch="mixtral", intermediate_size=128),
        "Q4_0",
    ),  # each expert's codes cut
    "qwen2_moe-bf16": (
        dict(arch="qwen2_moe"),
        "bf16",
    ),  # bf16 sums over gloo; packed where packing applies
}


def _load(hf, how: str, workdir: Path, tp: TPGroup | None) -> LlamaForCausalLM:
    """Ours from `hf`'s weights, whole (tp None) or this rank's shard."""
    if how == "dict":
        model = LlamaForCausalLM(ModelConfig.from_hf_dict(hf.config.to_dict()), tp)
        load_hf_state_dict(model, hf.state_dict())
        return model.eval()
    workdir.mkdir(parents=True, exist_ok=True)
    if how in ("Q8_0", "Q4_0"):
        from sgl.runtime.model.gguf_export import write_llama_gguf

        path = workdir / "model.gguf"
        if not path.exists():
            arch = "mixtral" if hf.config.model_type == "mixtral" else "llama"
            write_llama_gguf(path, hf.config.to_dict(), hf.state_dict().items(), how, arch=arch)
        return load_model(str(path), torch.float32, torch.device("cpu"), "auto", tp=tp)[0]
    if not (
        workdir / "config.json"
    ).exists():  # not save_pretrained: it writes on distributed rank 0 only
        from safetensors.torch import save_file

        save_file(
            {k: v.clone() for k, v in hf.state_dict().items()}, str(workdir / "model.safetensors")
        )
        (workdir / "config.json").write_text(json.dumps(hf.config.to_dict()))
    quantization = how if how in ("int8", "int4") else "none"
    dtype = torch.bfloat16 if how == "bf16" else torch.float32
    model = load_model(str(workdir), dtype, torch.device("cpu"), quantization, tp=tp)[0]
    if how == "bf16" and packing_applies(dtype, torch.device("cpu")):
        assert pack_dense_layers(model) > 0  # a shard packs whatever weight it holds
    return model


def _logits(model: LlamaForCausalLM, seqs: dict[int, list[int]], backend: str) -> torch.Tensor:
    """Every position's logits: uneven prefill chunks of two requests, then 3 batched decodes."""
    runner = TinyRunner(model, backend=backend, kv_dtype=model.norm.weight.dtype)
    got = prefill_in_chunks_then_decode(runner, seqs, random.Random(0), decode_steps=3)
    return torch.cat([got[i] for i in sorted(got)])


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    from sgl.runtime.model import quant_route

    # Quantized layers on their packed kernels at every row count, at both sizes: the route
    # (packed or dequantized) is chosen per layer shape, and shards have other shapes.
    quant_route.crossover_rows = lambda layer: 1 << 30
    tp = init_tp_group(rank, TP, f"file://{init_file}")
    results = {}
    try:
        for name, (hf_args, how) in CASES.items():
            hf = hf_tiny(seed=3, **hf_args)
            vocab = hf.config.vocab_size
            seqs = {
                0: [(7 * i + 3) % vocab for i in range(23)],
                1: [(5 * i + 1) % vocab for i in range(12)],
            }
            backend = "cpu" if name == "llama" else "torch_native"
            workdir = Path(out_dir) / f"rank{rank}" / name
            want = _logits(_load(hf, how, workdir, None), seqs, backend)
            got = _logits(_load(hf, how, workdir, tp), seqs, backend)
            results[name] = (
                (got - want).abs().max().item(),
                (want.max() - want.min()).item(),
                tuple(got.shape),
            )
    finally:
        tp.destroy()
    torch.save(results, Path(out_dir) / f"results{rank}.pt")


def _spawn(tmp_path: Path) -> list[dict]:
    """Run `_worker` on TP ranks; every process ends (terminated past the timeout or when one
    fails)."""
    import torch.multiprocessing as mp

    ctx = mp.start_processes(
        _worker,
        args=(str(tmp_path / "init"), str(tmp_path)),
        nprocs=TP,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + SPAWN_TIMEOUT_S
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                raise TimeoutError(f"tensor-parallel ranks still running after {SPAWN_TIMEOUT_S} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
            p.join(10)
    return [torch.load(tmp_path / f"results{rank}.pt") for rank in range(TP)]


def test_tp2_logits_equal_tp1(tmp_path):
    per_rank = _spawn(tmp_path)
    for rank, results in enumerate(per_rank):
        assert set(results) == set(CASES)
        for name, (diff, spread, shape) in results.items():
            quantized = CASES[name][1] not in ("dict", "safetensors")  # or bf16
            limit = QUANT_RTOL * spread if quantized else DENSE_ATOL
            assert shape[1] == 97, (name, shape)  # the whole vocabulary, padding dropped
            assert diff <= limit, f"rank {rank} {name}: max |tp2 - tp1| = {diff:.3g} > {limit:.3g}"


# ----------------------------------------------------------------------------- in one process


def _config(**changes) -> ModelConfig:
    base = dict(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
    )
    return ModelConfig(**{**base, **changes})


@pytest.mark.parametrize(
    "changes,size,field",
    [
        (dict(), 3, "num_attention_heads"),
        (dict(num_attention_heads=8, num_key_value_heads=3, head_dim=8), 4, "num_key_value_heads"),
        (dict(intermediate_size=90), 4, "intermediate_size"),
        (
            dict(
                num_experts=4,
                experts_per_token=2,
                moe_intermediate_size=30,
                sparse_layers=[True, True],
            ),
            4,
            "moe_intermediate_size",
        ),
        (
            dict(
                num_experts=4,
                experts_per_token=2,
                moe_intermediate_size=32,
                shared_expert_intermediate_size=42,
                sparse_layers=[True, True],
            ),
            4,
            "shared_expert_intermediate_size",
        ),
    ],
)
def test_configs_that_cannot_split_are_refused_naming_the_field(changes, size, field):
    with pytest.raises(ValueError, match=field):
        LlamaForCausalLM(_config(**changes), TPGroup(0, size))


def test_shards_hold_their_heads_and_vocabulary_and_rank0_the_row_biases():
    """No collectives: a rank's model is built and loaded alone (TPGroup without a group)."""
    hf = hf_tiny(arch="llama", kv_heads=1, seed=1, attention_bias=True, mlp_bias=True)
    state = hf.state_dict()
    config = ModelConfig.from_hf_dict(hf.config.to_dict())
    for rank in range(TP):
        model = LlamaForCausalLM(config, TPGroup(rank, TP))
        load_hf_state_dict(model, state)
        assert (model.local_num_heads, model.local_num_kv_heads) == (2, 1)
        attn = model.layers[0].self_attn
        qkv = attn.qkv_proj.weight_t.t()
        q, k = (
            state["model.layers.0.self_attn.q_proj.weight"],
            state["model.layers.0.self_attn.k_proj.weight"],
        )
        assert torch.equal(qkv[:32], q[32 * rank : 32 * rank + 32])  # query heads 2r, 2r + 1
        assert torch.equal(qkv[32:48], k)  # the one KV head, on both ranks
        assert (attn.o_proj.bias is not None) == (rank == 0)
        assert (model.layers[0].mlp.down_proj.bias is not None) == (rank == 0)
        rows = model.embed_tokens.weight
        assert rows.shape[0] == 49
        embed = state["model.embed_tokens.weight"]
        assert torch.equal(rows[: 97 - 49 * rank], embed[49 * rank : 49 * rank + 49])
        if rank == 1:
            assert not rows[48:].any()  # the padding row


def test_kv_heads_that_do_not_divide_are_cut_unevenly_with_their_query_heads():
    """9 query / 3 KV heads (SmolLM2-135M) at tp 2: rank 0 holds KV heads 0-1 and query heads
    0-5, rank 1 KV head 2 and query heads 6-8; o_proj takes the same query heads' inputs."""
    config = _config(num_attention_heads=9, num_key_value_heads=3, head_dim=8, hidden_size=72)
    held = []
    for rank in range(2):
        model = LlamaForCausalLM(config, TPGroup(rank, 2))
        attn = model.layers[0].self_attn
        held.append(
            (
                model.local_num_heads,
                model.local_num_kv_heads,
                tuple(attn.qkv_proj.weight_t.shape),
                tuple(attn.o_proj.weight_t.shape),
                model.shards.q_head_start,
                model.shards.kv_head_start,
            )
        )
    assert held == [
        (6, 2, (72, 48 + 2 * 16), (48, 72), 0, 0),
        (3, 1, (72, 24 + 2 * 8), (24, 72), 6, 2),
    ]


def test_dummy_shards_are_slices_of_the_whole_dummy_model(tmp_path):
    from sgl.runtime.model.dummy import load_dummy_model

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(hf_tiny(arch="qwen2_moe", seed=1).config.to_dict()))
    whole, _ = load_dummy_model(str(cfg), torch.float32, torch.device("cpu"), seed=4)
    full = dict(whole.named_parameters())
    for rank in range(TP):
        shard, _ = load_dummy_model(
            str(cfg), torch.float32, torch.device("cpu"), seed=4, tp=TPGroup(rank, TP)
        )
        params = dict(shard.named_parameters())
        assert set(params) <= set(full)
        down = "layers.0.mlp.experts.down_proj"
        assert torch.equal(params[down], full[down][:, :, 16 * rank : 16 * rank + 16])
        gu = "layers.0.mlp.experts.gate_up_proj"
        want = torch.cat(
            [full[gu][:, 16 * rank : 16 * rank + 16], full[gu][:, 32 + 16 * rank : 48 + 16 * rank]],
            1,
        )
        assert torch.equal(params[gu], want)
        assert torch.equal(
            params["layers.1.input_layernorm.weight"], full["layers.1.input_layernorm.weight"]
        )


def test_int4_row_parallel_layer_splitting_a_group_is_refused(tmp_path):
    hf = hf_tiny(
        arch="llama", seed=2
    )  # intermediate 96: 48 inputs of down_proj per rank, groups of 32
    hf.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"mlp\.down_proj.*int4 group size 32"):
        load_model(str(tmp_path), torch.float32, torch.device("cpu"), "int4", tp=TPGroup(0, TP))


def test_gguf_codes_split_across_a_group_are_refused(tmp_path):
    from sgl.runtime.model.gguf_export import write_llama_gguf

    hf = hf_tiny(arch="llama", seed=2)
    path = tmp_path / "q4.gguf"
    write_llama_gguf(path, hf.config.to_dict(), hf.state_dict().items(), "Q4_0")
    with pytest.raises(ValueError, match=r"down_proj.*\[64, 96\].*groups of 32"):
        load_model(str(path), torch.float32, torch.device("cpu"), "auto", tp=TPGroup(0, TP))


def test_low_precision_sums_fall_back_to_float32_where_the_backend_refuses_them(monkeypatch):
    import torch.distributed as dist

    def all_reduce(
        x, group=None
    ):  # two ranks holding the same values; bf16 refused, as old gloo does
        if x.dtype == torch.bfloat16:
            raise RuntimeError("gloo: unsupported dtype for sum")
        x.mul_(2)

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    tp = TPGroup(0, TP)
    x = torch.tensor([1.5, -3.0], dtype=torch.bfloat16)
    assert tp.all_reduce(x) is x and x.dtype == torch.bfloat16 and x.tolist() == [3.0, -6.0]
    assert tp.all_reduce(x).tolist() == [6.0, -12.0]  # the float32 route from then on


def test_safetensors_slices_are_read_alone(tmp_path):
    """A rank's slices come from the file's bytes into their own memory: equal to the whole
    tensor's pieces, and holding no more than themselves (safetensors' `get_slice` returns a
    view of the whole tensor)."""
    from safetensors.torch import save_file

    from sgl.runtime.model.weight_sources import read_safetensors_slices

    g = torch.Generator().manual_seed(0)
    tensors = {
        "a": torch.randn(40, 24, generator=g),
        "b": torch.randn(3, 16, 8, generator=g).to(torch.bfloat16),
        "c": torch.randn(10, generator=g),
    }
    save_file(tensors, tmp_path / "w.safetensors")
    for name, dim, ranges in [
        ("a", 0, [(10, 20)]),
        ("a", 1, [(0, 8), (16, 24)]),
        ("b", 1, [(4, 12)]),
        ("b", 2, [(2, 6)]),
        ("b", 0, [(1, 3)]),
        ("c", 0, [(5, 10)]),
    ]:
        got = read_safetensors_slices(tmp_path / "w.safetensors", name, dim, ranges)
        want = torch.cat([tensors[name].narrow(dim, a, b - a) for a, b in ranges], dim)
        assert torch.equal(got, want), (name, dim, ranges)
        assert got.untyped_storage().nbytes() == got.numel() * got.element_size()
