"""Our Llama-family model against HF transformers on the same random weights (fp32)."""

from __future__ import annotations

import random

import pytest
import torch
from tiny_models import TinyRunner, hf_tiny, ours_from_hf, prefill_in_chunks_then_decode

ATOL = 2e-4

CONFIGS = [
    pytest.param(dict(arch="llama", tie=False, kv_heads=2), id="llama-gqa-untied"),
    pytest.param(dict(arch="llama", tie=True, kv_heads=4), id="llama-mha-tied"),
    pytest.param(
        dict(arch="llama", tie=True, kv_heads=1, attention_bias=True), id="llama-mqa-bias"
    ),
    pytest.param(dict(arch="qwen2", tie=False, kv_heads=2), id="qwen2-gqa-qkv-bias"),
    pytest.param(dict(arch="qwen2", tie=True, kv_heads=2), id="qwen2-tied"),
    pytest.param(dict(arch="mistral", tie=False, kv_heads=2), id="mistral"),
    pytest.param(
        dict(
            arch="llama",
            tie=False,
            kv_heads=2,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
            rope_theta=500000.0,
        ),
        id="llama3-rope-scaling",
    ),
]


def hf_logits(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float()


@pytest.mark.parametrize("spec", CONFIGS)
def test_prefill_logits_match_hf(spec):
    hf = hf_tiny(**spec)
    runner = TinyRunner(ours_from_hf(hf))
    rng = random.Random(1)
    seqs = {i: [rng.randrange(97) for _ in range(rng.randint(1, 40))] for i in range(4)}
    out = runner.step(seqs)  # four prompts in one flat batch
    for i, ids in seqs.items():
        torch.testing.assert_close(out[i], hf_logits(hf, ids), atol=ATOL, rtol=0)


@pytest.mark.parametrize("spec", CONFIGS)
def test_chunked_prefill_and_batched_decode_match_hf(spec):
    hf = hf_tiny(**spec)
    runner = TinyRunner(ours_from_hf(hf))
    rng = random.Random(2)
    seqs = {i: [rng.randrange(97) for _ in range(rng.randint(5, 60))] for i in range(5)}
    got = prefill_in_chunks_then_decode(runner, seqs, rng, decode_steps=3)
    for i, ids in seqs.items():
        torch.testing.assert_close(got[i], hf_logits(hf, ids), atol=ATOL, rtol=0)


@pytest.mark.parametrize("use_mirror", [True, False], ids=["mirror", "gather"])
@pytest.mark.parametrize("seed", range(3))
def test_mixed_schedule_with_rollback_and_row_reuse_matches_hf(seed, use_mirror):
    """Each step mixes decodes, short extends (batched path), long extends (per-row path),
    rollbacks of recent tokens, requests sitting steps out (holes in the mirror, and its
    compaction when most rows sit out) and finished requests whose rows new requests reuse;
    the logits of every new token must equal HF's on the request's current sequence."""
    hf = hf_tiny(arch="llama", tie=False, kv_heads=2, seed=seed)
    runner = TinyRunner(ours_from_hf(hf), max_reqs=12, use_mirror=use_mirror)
    rng = random.Random(seed)
    seqs: dict[int, list[int]] = {}
    next_id = 0
    checked = 0
    for _ in range(40):
        while len(seqs) < 10:
            seqs[next_id] = []
            next_id += 1
        step: dict[int, list[int]] = {}
        thin = rng.random() < 0.15  # most requests sit this step out
        for i, s in list(seqs.items()):
            if s and rng.random() < 0.1:
                runner.finish(i)
                del seqs[i]
                continue
            if len(s) > 2 and rng.random() < 0.2:
                n = rng.randint(1, min(4, len(s) - 1))
                runner.rollback(i, n)
                del s[len(s) - n :]
            kind = rng.random()
            if kind < 0.5:
                n = 1
            elif kind < 0.85:
                n = rng.randint(2, 16)  # padded into the batched call, or a call of its own
            elif kind < 0.95:
                n = rng.randint(17, 30)  # mirrored, a call of its own
            else:
                n = rng.randint(65, 80)  # a long extend: context read from the pool
            if not s:
                n = rng.randint(1, 30)
            n = min(n, 250 - len(s))
            if n > 0 and rng.random() < (
                0.2 if thin else 0.9
            ):  # sometimes a request sits a step out
                step[i] = [rng.randrange(97) for _ in range(n)]
        if not step:
            continue
        out = runner.step(step)
        for i, toks in step.items():
            seqs[i].extend(toks)
            want = hf_logits(hf, seqs[i])[-len(toks) :]
            torch.testing.assert_close(out[i], want, atol=ATOL, rtol=0)
            checked += 1
    assert checked > 100


def test_gguf_file_roundtrip_matches_hf(tmp_path):
    """Write a GGUF the way llama.cpp's converter does (Q/K permuted) and load it back."""
    import gguf
    import numpy as np

    from sgl.runtime.model.gguf_model import read_gguf

    hf = hf_tiny(arch="llama", tie=False, kv_heads=2, seed=3)
    c = hf.config
    path = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(c.vocab_size)

    def permute(t: np.ndarray, n_head: int) -> np.ndarray:  # llama.cpp convert_hf_to_gguf's permute
        return (
            t.reshape(n_head, 2, t.shape[0] // n_head // 2, *t.shape[1:])
            .swapaxes(1, 2)
            .reshape(t.shape)
        )

    names = {
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
    }
    for name, t in hf.state_dict().items():
        arr = t.numpy().astype(np.float32)
        if name == "model.embed_tokens.weight":
            out = "token_embd.weight"
        elif name == "model.norm.weight":
            out = "output_norm.weight"
        elif name == "lm_head.weight":
            out = "output.weight"
        else:
            _, _, layer, rest = name.split(".", 3)
            mod, kind = rest.rsplit(".", 1)
            out = f"blk.{layer}.{names[mod]}.{kind}"
            if mod == "self_attn.q_proj":
                arr = permute(arr, c.num_attention_heads)
            elif mod == "self_attn.k_proj":
                arr = permute(arr, c.num_key_value_heads)
        w.add_tensor(out, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    hf_config, state = read_gguf(path)
    from sgl.runtime.model.config import ModelConfig
    from sgl.runtime.model.llama import LlamaForCausalLM
    from sgl.runtime.model.loader import load_hf_state_dict

    ours = LlamaForCausalLM(ModelConfig.from_hf_dict(hf_config))
    load_hf_state_dict(ours, state)
    runner = TinyRunner(ours.eval())
    ids = list(range(3, 40))
    torch.testing.assert_close(runner.step({0: ids})[0], hf_logits(hf, ids), atol=ATOL, rtol=0)


def test_bfloat16_model_tracks_float32():
    """bf16 weights and KV: logits close to fp32 (loose: bf16 has 8 bits of mantissa)."""
    hf = hf_tiny(arch="llama", tie=False, kv_heads=2, seed=4)
    ours32 = ours_from_hf(hf)
    ours16 = ours_from_hf(hf).to(torch.bfloat16)
    ours16.rotary.float()
    ids = list(range(5, 50))
    ref = TinyRunner(ours32).step({0: ids})[0]
    runner16 = TinyRunner(ours16)
    runner16.pool = type(runner16.pool)(4096, 2, 2, 16, torch.bfloat16, "cpu")
    got = runner16.step({0: ids})[0]
    rel = (got - ref).norm() / ref.norm()
    assert rel < 3e-2, rel
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9
