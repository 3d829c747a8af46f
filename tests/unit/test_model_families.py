"""Each supported family against HF transformers (eager attention) on the same random weights,
fp32, with the features that make it differ switched on: q/k norms (Qwen3, Gemma 3), sliding
windows shorter than the prompts (Mistral, Ministral, Qwen3, Gemma 2/3), logit soft-capping
and sandwich norms (Gemma 2), per-layer RoPE bases (Gemma 3). Both CPU attention backends.

Tolerance: 2e-4 absolute on logits, as for the Llama tests (float32 end to end; what is left
is summation order).
"""

from __future__ import annotations

import copy
import random

import pytest
import torch
from tiny_models import (
    FAMILY_CONFIGS,
    TinyRunner,
    hf_tiny,
    ours_from_hf,
    prefill_in_chunks_then_decode,
)

from sgl.runtime.model.config import ModelConfig, UnsupportedConfigError

ATOL = 2e-4
FAMILIES = sorted(FAMILY_CONFIGS)
BACKENDS = ["torch_native", "cpu"]


def hf_logits(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float()


@pytest.fixture(scope="module")
def models():
    cache: dict[str, object] = {}

    def get(arch: str):
        if arch not in cache:
            cache[arch] = hf_tiny(arch=arch, tie=arch.startswith("gemma"), seed=5)
        return cache[arch]

    return get


def test_each_family_reads_its_features(models):
    """The config fields the decoder acts on, so the oracle tests below exercise them."""
    cfg = {arch: ModelConfig.from_hf_dict(models(arch).config.to_dict()) for arch in FAMILIES}
    assert cfg["qwen3"].qk_norm and not cfg["qwen3"].qkv_bias and cfg["qwen3"].layer_windows == []
    assert cfg["qwen3-sliding"].layer_windows == [0, 8]
    assert cfg["mistral-sliding"].layer_windows == [8, 8]
    assert cfg["ministral"].layer_windows == [8, 0]
    g2 = cfg["gemma2"]
    assert (g2.layer_windows, g2.attn_logit_cap, g2.final_logit_cap) == ([8, 0], 0.5, 2.0)
    assert (
        g2.sandwich_norms
        and g2.norm_offset == 1.0
        and g2.hidden_act == "gelu_tanh"
        and g2.attn_scale == 24**-0.5
    )
    g3 = cfg["gemma3"]
    assert (
        g3.qk_norm
        and g3.layer_windows == [8, 0]
        and g3.local_rope_theta == 1e4
        and g3.rope_theta == 1e6
    )
    assert g3.rope_scaling["rope_type"] == "linear"
    assert cfg["gemma2"].attention_features == {"sliding_window", "logit_cap"}
    assert cfg["phi3"].rotary_dim == 8 and cfg["phi3"].layer_windows == [8, 8]
    assert cfg["qwen3-yarn"].rope_scaling["original_max_position_embeddings"] == 32
    assert cfg["phi3-longrope"].rope_scaling["original_max_position_embeddings"] == 160
    assert (
        cfg["mixtral"].num_experts,
        cfg["mixtral"].experts_per_token,
        cfg["mixtral"].norm_topk_prob,
    ) == (4, 2, True)
    q2 = cfg["qwen2_moe"]
    assert (
        q2.sparse_layers == [True, False]
        and q2.shared_expert_intermediate_size == 48
        and not q2.norm_topk_prob
    )
    assert q2.qkv_bias and cfg["qwen3_moe"].qk_norm and cfg["qwen3_moe"].norm_topk_prob


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", FAMILIES)
def test_prefill_logits_match_hf(models, arch, backend):
    hf = models(arch)
    runner = TinyRunner(ours_from_hf(hf), backend=backend)
    rng = random.Random(1)
    seqs = {
        i: [rng.randrange(97) for _ in range(n)] for i, n in enumerate((3, 9, 40, 70))
    }  # windows are 8
    out = runner.step(
        seqs
    )  # four prompts in one flat batch (the 70-token one past the cpu kernel's 64)
    for i, ids in seqs.items():
        torch.testing.assert_close(out[i], hf_logits(hf, ids), atol=ATOL, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", FAMILIES)
def test_chunked_prefill_and_batched_decode_match_hf(models, arch, backend):
    hf = models(arch)
    runner = TinyRunner(ours_from_hf(hf), backend=backend)
    rng = random.Random(2)
    seqs = {i: [rng.randrange(97) for _ in range(rng.randint(5, 60))] for i in range(5)}
    got = prefill_in_chunks_then_decode(runner, seqs, rng, decode_steps=4)  # mixed-length decodes
    for i, ids in seqs.items():
        torch.testing.assert_close(got[i], hf_logits(hf, ids), atol=ATOL, rtol=0)


def test_loaded_families_reject_what_they_do_not_implement():
    base = dict(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
    )
    cases = [
        (dict(architectures=["PhiMoEForCausalLM"]), "'architectures'"),
        (dict(architectures=["LlamaForCausalLM"], sliding_window=8), "'sliding_window'"),
        (
            dict(
                architectures=["MistralForCausalLM"],
                layer_types=["sliding_attention", "chunked_attention"],
                sliding_window=8,
            ),
            "'layer_types'",
        ),
        (
            dict(architectures=["LlamaForCausalLM"], partial_rotary_factor=0.1),
            "'partial_rotary_factor'",
        ),
        (
            dict(
                architectures=["LlamaForCausalLM"],
                rope_scaling={"rope_type": "dynamic", "factor": 0.5},
            ),
            "factor",
        ),
        (
            dict(
                architectures=["LlamaForCausalLM"],
                rope_scaling={"rope_type": "mrope", "factor": 2.0},
            ),
            "mrope",
        ),
        (
            dict(
                architectures=["Phi3ForCausalLM"],
                rope_scaling={
                    "rope_type": "longrope",
                    "short_factor": [1.0] * 8,
                    "long_factor": [2.0] * 7,
                },
            ),
            "long_factor",
        ),
        (dict(architectures=["LlamaForCausalLM"], hidden_act="relu"), "'hidden_act'"),
        (
            dict(architectures=["Gemma3ForCausalLM"], use_bidirectional_attention=True),
            "use_bidirectional_attention",
        ),
    ]
    for extra, key in cases:
        with pytest.raises(UnsupportedConfigError, match=key):
            ModelConfig.from_hf_dict({**base, **extra})


def test_qwen_window_applies_only_with_use_sliding_window():
    """Qwen2.5 configs carry `sliding_window` with use_sliding_window false: HF ignores it, so do
    we."""
    base = dict(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
    )
    off = ModelConfig.from_hf_dict(
        {
            **base,
            "architectures": ["Qwen2ForCausalLM"],
            "sliding_window": 32768,
            "use_sliding_window": False,
            "max_window_layers": 2,
        }
    )
    on = ModelConfig.from_hf_dict(
        {
            **base,
            "architectures": ["Qwen2ForCausalLM"],
            "sliding_window": 16,
            "use_sliding_window": True,
            "max_window_layers": 2,
        }
    )
    assert off.layer_windows == [] and on.layer_windows == [0, 0, 16, 16]


def test_backend_without_the_features_is_refused_with_the_alternatives():
    from sgl.runtime.attention import REGISTRY, create_attention_backend, missing_features

    needs = frozenset({"sliding_window", "logit_cap"})
    msg = missing_features(REGISTRY["flashinfer"], needs)
    assert (
        "sliding-window" in msg
        and "soft-capping" in msg
        and "'triton'" in msg
        and "'torch_native'" in msg
    )
    assert create_attention_backend("auto", "cpu", torch.float32, needs=needs).features >= needs


CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
ENGINE_FAMILIES = [
    "qwen3-sliding",
    "mistral-sliding",
    "gemma2",
    "gemma3",
    "phi3",
    "mixtral",
    "qwen2_moe",
]


@pytest.fixture(scope="module", params=ENGINE_FAMILIES)
def family_engine(request, tmp_path_factory):
    from tiny_models import save_tiny_engine_dir

    import sgl

    path, hf = save_tiny_engine_dir(
        tmp_path_factory.mktemp(request.param), 320, arch=request.param, chat_template=CHAT_TEMPLATE
    )
    with sgl.Engine(
        model_path=str(path), dtype="float32", max_total_tokens=4096, chunked_prefill_size=48
    ) as engine:
        yield engine, hf


def test_engine_greedy_tokens_equal_hf_generate(family_engine):
    """Several prompts submitted together, longer than the windows, one sharing a cached
    prefix (the radix cache keeps every token's KV; windows are masks, so reuse stays exact),
    prefills chunked: 32 greedy tokens each equal HF generate's."""
    engine, hf = family_engine
    rng = random.Random(3)
    shared = [rng.randrange(1, 320) for _ in range(20)]
    batch = [shared + [rng.randrange(1, 320) for _ in range(n)] for n in (4, 70)]
    batch += [[rng.randrange(1, 320) for _ in range(n)] for n in (2, 13, 100)]
    params = {"max_new_tokens": 32, "temperature": 0, "ignore_eos": True}
    engine.generate(input_ids=batch[:1], sampling_params=params)  # the shared prefix is now cached
    outs = engine.generate(input_ids=batch, sampling_params=params)
    assert outs[1]["meta_info"]["cached_tokens"] >= len(shared)
    info = engine.get_server_info()
    assert info["architecture"] == engine.model_config.arch and info["attention_backend"] == "cpu"
    assert info["attention_features"] == sorted(engine.model_config.attention_features)
    for ids, out in zip(batch, outs):
        with torch.no_grad():
            want = hf.generate(
                torch.tensor([ids]), max_new_tokens=32, do_sample=False, pad_token_id=0
            )
        assert out["output_ids"] == want[0, len(ids) :].tolist()


def test_program_with_roles_gen_select_regex_and_fork(family_engine):
    """A DSL program runs on each family with its chat template; oracles: the template itself,
    re.fullmatch, and the choices offered."""
    import re

    import sgl

    engine, _ = family_engine

    @sgl.function
    def program(s):
        s += sgl.system("You answer briefly.")
        s += sgl.user("Pick a color and a number.")
        with s.assistant():
            s += "Color: " + sgl.select("color", ["red", "green", "blue"])
            s += " Number: " + sgl.gen("num", regex=r"[0-9]{1,3}", max_tokens=8)
        forks = s.fork(2)
        forks += lambda i: (
            sgl.user(f"Variant {i}?") + sgl.assistant(sgl.gen("v", max_tokens=6, temperature=0))
        )
        forks.join()

    state = program.run(backend=sgl.as_backend(engine), temperature=0)
    assert state["color"] in ("red", "green", "blue") and re.fullmatch(r"[0-9]{1,3}", state["num"])
    msgs = state.messages()
    assert [m["role"] for m in msgs] == ["system", "user", "assistant"]
    assert state.text() == engine.tokenizer.apply_chat_template(msgs, tokenize=False)


def test_qwen3_gguf_roundtrip_matches_hf(tmp_path, models):
    """A Qwen3 GGUF as llama.cpp's converter writes it (q/k norms as attn_q_norm / attn_k_norm,
    no Q/K permutation): loaded dense, logits equal HF's; loaded quantized (Q8_0 kept as int8),
    equal to HF run on the weights our kernels hold (tolerance as for the Llama GGUF test:
    3e-2 of the logits' range, activations enter the int kernels rounded to bf16)."""
    from sgl.runtime.model.gguf_export import write_llama_gguf
    from sgl.runtime.model.gguf_model import read_gguf
    from sgl.runtime.model.held_weights import held_hf_state_dict
    from sgl.runtime.model.llama import LlamaForCausalLM
    from sgl.runtime.model.loader import load_hf_state_dict, load_model

    hf = models("qwen3")
    ids = list(range(3, 50))
    dense_path, q8_path = tmp_path / "qwen3-f32.gguf", tmp_path / "qwen3-q8.gguf"
    write_llama_gguf(dense_path, hf.config.to_dict(), hf.state_dict().items(), "F32", arch="qwen3")
    hf_config, state = read_gguf(dense_path)
    ours = LlamaForCausalLM(ModelConfig.from_hf_dict(hf_config))
    load_hf_state_dict(ours, state)
    assert ours.config.qk_norm
    torch.testing.assert_close(
        TinyRunner(ours.eval()).step({0: ids})[0], hf_logits(hf, ids), atol=ATOL, rtol=0
    )

    write_llama_gguf(q8_path, hf.config.to_dict(), hf.state_dict().items(), "Q8_0", arch="qwen3")
    quantized, _ = load_model(str(q8_path), torch.float32, torch.device("cpu"), quantization="auto")
    oracle = copy.deepcopy(hf)
    missing, unexpected = oracle.load_state_dict(held_hf_state_dict(quantized), strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    got, want = TinyRunner(quantized).step({0: ids})[0], hf_logits(oracle, ids)
    assert (got - want).abs().max() <= 3e-2 * (want.max() - want.min())


def test_moe_routes_each_token_to_its_top_k_experts():
    """The grouped expert compute against a per-token loop over the chosen experts (the
    definition), on a block with many experts and uneven loads, some experts unused."""
    from sgl.runtime.model.moe import StackedExperts

    torch.manual_seed(0)
    experts = StackedExperts(16, 32, 24, "silu")
    with torch.no_grad():
        experts.gate_up_proj.normal_(0, 0.2)
        experts.down_proj.normal_(0, 0.2)
    x = torch.randn(37, 32)
    chosen = torch.randint(0, 6, (37, 3))  # experts 6..15 get nothing
    weights = torch.rand(37, 3)
    want = torch.zeros_like(x)
    for t in range(37):
        for j in range(3):
            e = int(chosen[t, j])
            gate, up = (experts.gate_up_proj[e] @ x[t]).split(24)
            want[t] += weights[t, j] * (
                experts.down_proj[e] @ (torch.nn.functional.silu(gate) * up)
            )
    torch.testing.assert_close(
        experts(x, chosen, weights).detach(), want.detach(), atol=1e-5, rtol=1e-5
    )


def test_moe_expert_matmuls_run_on_the_row_grid(monkeypatch):
    """Prefill gives an expert any number of rows; each expert's matmuls see a row count on
    `row_grid` (a bounded set of oneDNN primitives) and the result still equals the per-token
    definition (padding rows are zeros, sliced off)."""
    import torch.nn.functional as F

    from sgl.runtime.model import moe
    from sgl.runtime.model.row_grid import padded_rows

    torch.manual_seed(1)
    experts = moe.StackedExperts(4, 16, 8, "silu")
    with torch.no_grad():
        experts.gate_up_proj.normal_(0, 0.2)
        experts.down_proj.normal_(0, 0.2)
    x = torch.randn(300, 16)
    t = torch.arange(300)
    chosen = torch.stack(
        [t % 2, 2 + (t < 99).long()], dim=1
    )  # experts 0, 1: 150 rows; 2: 201; 3: 99
    weights = torch.rand(300, 2)
    seen_rows = []
    real_linear = F.linear
    monkeypatch.setattr(
        moe.F, "linear", lambda a, w: seen_rows.append(a.shape[0]) or real_linear(a, w)
    )
    got = experts(x, chosen, weights).detach()
    assert sorted(set(seen_rows)) == [100, 152, 208]  # 99, 150, 201 rows padded up to the grid
    assert all(padded_rows(n) == n for n in seen_rows)
    monkeypatch.setattr(moe.F, "linear", real_linear)
    want = torch.zeros_like(x)
    for t in range(300):
        for j in range(2):
            e = int(chosen[t, j])
            gate, up = (experts.gate_up_proj[e] @ x[t]).split(8)
            want[t] += weights[t, j] * (experts.down_proj[e] @ (F.silu(gate) * up))
    torch.testing.assert_close(got, want.detach(), atol=1e-5, rtol=1e-5)


def test_moe_loads_hub_checkpoint_names(tmp_path, models):
    """Checkpoints on the Hub name each expert (Mixtral: block_sparse_moe.experts.{e}.w1/w3/w2;
    Qwen-MoE: mlp.experts.{e}.gate_proj/up_proj/down_proj): stacked on load, same logits as HF."""
    from sgl.runtime.model.llama import LlamaForCausalLM
    from sgl.runtime.model.loader import load_hf_state_dict

    for arch, old in (
        ("mixtral", "block_sparse_moe.experts.{e}.{w}"),
        ("qwen3_moe", "mlp.experts.{e}.{w}"),
    ):
        hf = models(arch)
        names = (
            {"gate": "w1", "up": "w3", "down": "w2"}
            if arch == "mixtral"
            else {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}
        )
        state = {}
        for key, value in hf.state_dict().items():
            prefix, _, rest = key.partition("mlp.")
            if rest == "gate.weight" and arch == "mixtral":
                state[prefix + "block_sparse_moe.gate.weight"] = value
            elif rest == "experts.gate_up_proj":
                size = value.shape[1] // 2
                for e in range(value.shape[0]):
                    state[prefix + old.format(e=e, w=names["gate"]) + ".weight"] = value[e, :size]
                    state[prefix + old.format(e=e, w=names["up"]) + ".weight"] = value[e, size:]
            elif rest == "experts.down_proj":
                for e in range(value.shape[0]):
                    state[prefix + old.format(e=e, w=names["down"]) + ".weight"] = value[e]
            else:
                state[key] = value
        ours = LlamaForCausalLM(ModelConfig.from_hf_dict(hf.config.to_dict()))
        load_hf_state_dict(ours, state)
        ids = list(range(5, 40))
        got = TinyRunner(ours.eval()).step({0: ids})[0]
        torch.testing.assert_close(got, hf_logits(hf, ids), atol=ATOL, rtol=0)


def _expert_layouts(model) -> set[str]:
    from sgl.runtime.model.moe import StackedExperts

    blocks = [m for m in model.modules() if isinstance(m, StackedExperts)]
    assert blocks and all(
        b.per_expert is not None and not list(b.parameters(recurse=False)) for b in blocks
    )
    return {
        getattr(layer, "layout", type(layer).__name__)
        for b in blocks
        for pair in b.per_expert
        for layer in pair
    }


@pytest.mark.parametrize("quantization", ["int8", "int4"])
@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe", "qwen3_moe"])
@pytest.mark.parametrize("path", ["loaded", "built"])
def test_quantized_experts_match_hf_on_held_weights(tmp_path, arch, quantization, path):
    """Under quantization=int8 / int4 each expert is a pair of quantized layers (the stacked
    dense weights are gone), whether loaded so from a checkpoint or quantized after building
    (random-weight models): logits equal HF run on the weights our kernels hold."""
    from sgl.runtime.model.held_weights import held_hf_state_dict
    from sgl.runtime.model.loader import load_model
    from sgl.runtime.model.quant_policy import QuantPolicy, quantize_model

    hf = hf_tiny(arch=arch, seed=4)
    if path == "loaded":
        hf.save_pretrained(tmp_path)
        ours, _ = load_model(
            str(tmp_path), torch.float32, torch.device("cpu"), quantization=quantization
        )
    else:
        ours = ours_from_hf(hf)
        quantize_model(ours, QuantPolicy(quantization))
    assert all(quantization in layout for layout in _expert_layouts(ours)), _expert_layouts(ours)
    oracle = copy.deepcopy(hf)
    missing, unexpected = oracle.load_state_dict(held_hf_state_dict(ours), strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    ids = list(range(3, 70))
    got, want = TinyRunner(ours).step({0: ids})[0], hf_logits(oracle, ids)
    assert (got - want).abs().max() <= 3e-2 * (want.max() - want.min())


@pytest.mark.parametrize("qtype,layout", [("Q8_0", "int8"), ("Q4_0", "int4")])
@pytest.mark.parametrize("arch,file_arch", [("mixtral", "mixtral"), ("qwen3_moe", "qwen3moe")])
def test_quantized_moe_gguf_keeps_its_expert_codes(tmp_path, arch, file_arch, qtype, layout):
    """A MoE GGUF with quantized stacked experts (as llama.cpp's quantizer writes them) loads
    under quantization="auto" with each expert on the int kernels, its weights the file's
    (the dequantized file within the bf16 rounding of the kernels' scales), and logits equal
    HF run on those weights."""
    from sgl.runtime.model.gguf_export import write_llama_gguf
    from sgl.runtime.model.gguf_model import read_gguf
    from sgl.runtime.model.held_weights import held_hf_state_dict
    from sgl.runtime.model.loader import load_model

    hf = hf_tiny(
        arch=arch, seed=6, hidden_size=128
    )  # Qwen3: head_dim 16 != 128 / 4 heads (key_length)
    path = tmp_path / f"{arch}-{qtype}.gguf"
    write_llama_gguf(path, hf.config.to_dict(), hf.state_dict().items(), qtype, arch=file_arch)
    ours, _ = load_model(str(path), torch.float32, torch.device("cpu"), quantization="auto")
    assert all(layout in x for x in _expert_layouts(ours)), _expert_layouts(ours)
    _, file_weights = read_gguf(path)
    held = held_hf_state_dict(ours)
    for i in range(hf.config.num_hidden_layers):
        p = f"model.layers.{i}.mlp.experts."
        gate_up, down = held[p + "gate_up_proj"], held[p + "down_proj"]
        size = gate_up.shape[1] // 2
        for got, want in (
            (gate_up[:, :size], file_weights[p + "gate_proj.weight"]),
            (gate_up[:, size:], file_weights[p + "up_proj.weight"]),
            (down, file_weights[p + "down_proj.weight"]),
        ):
            assert got.shape == want.shape
            assert (got - want).abs().max() <= 2**-7 * want.abs().max()
    oracle = copy.deepcopy(hf)
    missing, unexpected = oracle.load_state_dict(held, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    ids = list(range(3, 70))
    got, want = TinyRunner(ours).step({0: ids})[0], hf_logits(oracle, ids)
    assert (got - want).abs().max() <= 3e-2 * (want.max() - want.min())


def test_longrope_takes_the_long_factors_from_the_pretraining_length_on(models):
    """Past `original_max_position_embeddings` (160 here) positions are rotated with the long
    factors: the tables equal cos/sin of position x the long inverse frequencies there, scaled
    by the attention factor (HF switches a whole forward instead; see model/rope.py)."""
    import math

    from sgl.runtime.model.rope import RotaryEmbedding, rope_attention_factor

    config = ModelConfig.from_hf_dict(models("phi3-longrope").config.to_dict())
    rope = RotaryEmbedding(config)
    base = 10000.0 ** (torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    factor = rope_attention_factor(config)
    assert factor == pytest.approx(math.sqrt(1 + math.log(256 / 160) / math.log(160)))
    for pos, key in ((159, "short_factor"), (160, "long_factor"), (255, "long_factor")):
        inv = 1.0 / (torch.tensor(config.rope_scaling[key], dtype=torch.float64) * base)
        torch.testing.assert_close(
            rope.cos[pos].double(), (pos * inv).cos() * factor, atol=1e-6, rtol=0
        )
        torch.testing.assert_close(
            rope.sin[pos].double(), (pos * inv).sin() * factor, atol=1e-6, rtol=0
        )


def test_dynamic_ntk_rope_equals_hf_decoding_past_the_pretraining_context():
    """Dynamic NTK (pre-training context 24, factor 4): the model serves 4x the positions;
    prompts within the context give HF's logits, and each step of greedy decoding across the
    boundary gives HF generate's logits (HF rescales the base per step from the newest position, as
    sgl does per position; see model/rope.py)."""
    hf = hf_tiny(
        seed=11, max_position_embeddings=24, rope_scaling={"rope_type": "dynamic", "factor": 4.0}
    )
    ours = ours_from_hf(hf)
    assert ours.config.max_position_embeddings == 96
    ids = [5, 17, 33, 2, 64, 8, 41, 90, 12, 7, 3, 55, 28, 71, 19, 44, 6, 81, 30, 9]
    runner = TinyRunner(ours)
    logits = runner.step({0: ids})[0]
    torch.testing.assert_close(logits, hf_logits(hf, ids), atol=ATOL, rtol=0)
    with torch.no_grad():
        want = hf.generate(
            torch.tensor([ids]),
            max_new_tokens=40,
            do_sample=False,
            pad_token_id=0,
            return_dict_in_generate=True,
            output_logits=True,
        )
    tokens = want.sequences[0, len(ids) :].tolist()
    torch.testing.assert_close(logits[-1], want.logits[0][0].float(), atol=ATOL, rtol=0)
    for step, token in enumerate(
        tokens[:-1], start=1
    ):  # each decode step to position 59, well past 24
        logits = runner.step({0: [token]})[0]
        torch.testing.assert_close(logits[-1], want.logits[step][0].float(), atol=ATOL, rtol=0)


@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
def test_gemma_gguf_roundtrip_matches_hf(tmp_path, arch):
    """A Gemma GGUF laid out as llama.cpp's converter writes it (norms stored as 1 + w, its
    norm names, window and caps as keys, no query_pre_attn_scalar: the head size, as
    llama.cpp assumes), read back: logits equal HF's on prompts longer than the window."""
    from sgl.runtime.model.gguf_export import write_llama_gguf
    from sgl.runtime.model.gguf_model import read_gguf
    from sgl.runtime.model.llama import LlamaForCausalLM
    from sgl.runtime.model.loader import load_hf_state_dict

    hf = hf_tiny(arch=arch, tie=True, seed=6, query_pre_attn_scalar=16)
    path = tmp_path / f"{arch}.gguf"
    write_llama_gguf(path, hf.config.to_dict(), hf.state_dict().items(), "F32", arch=arch)
    hf_config, state = read_gguf(path)
    ours = LlamaForCausalLM(ModelConfig.from_hf_dict(hf_config))
    load_hf_state_dict(ours, state)
    assert ours.config.layer_windows == [8, 0] and ours.config.norm_offset == 1.0
    ids = list(range(3, 50))
    torch.testing.assert_close(
        TinyRunner(ours.eval()).step({0: ids})[0], hf_logits(hf, ids), atol=ATOL, rtol=0
    )


@pytest.mark.parametrize("arch", ["phi3", "phi3-longrope"])
def test_phi3_gguf_roundtrip_matches_hf(tmp_path, arch):
    """Phi-3 as llama.cpp's converter writes it: attn_qkv and ffn_up (gate and up) fused, the
    rotary dims, the window, LongRoPE's factors as two tensors and its context / attention
    factor as keys; read back, logits equal HF's."""
    from sgl.runtime.model.gguf_export import write_llama_gguf
    from sgl.runtime.model.gguf_model import read_gguf
    from sgl.runtime.model.llama import LlamaForCausalLM
    from sgl.runtime.model.loader import load_hf_state_dict

    hf = hf_tiny(arch=arch, seed=8)
    path = tmp_path / f"{arch}.gguf"
    write_llama_gguf(path, hf.config.to_dict(), hf.state_dict().items(), "F32", arch="phi3")
    hf_config, state = read_gguf(path)
    ours = LlamaForCausalLM(ModelConfig.from_hf_dict(hf_config))
    load_hf_state_dict(ours, state)
    want = ModelConfig.from_hf_dict(hf.config.to_dict())
    assert (ours.config.rotary_dim, ours.config.layer_windows) == (
        want.rotary_dim,
        want.layer_windows,
    )
    ids = list(range(3, 60))
    torch.testing.assert_close(
        TinyRunner(ours.eval()).step({0: ids})[0], hf_logits(hf, ids), atol=ATOL, rtol=0
    )


@pytest.mark.parametrize(
    "arch,file_arch", [("mixtral", "mixtral"), ("qwen2_moe", "qwen2moe"), ("qwen3_moe", "qwen3moe")]
)
def test_moe_gguf_roundtrip_matches_hf(tmp_path, arch, file_arch):
    """MoE GGUF as llama.cpp lays it out (experts stacked as ffn_gate_exps / ffn_up_exps /
    ffn_down_exps, router ffn_gate_inp, Qwen2-MoE's shared expert and its gate vector; Mixtral
    as `llama` with an expert count): read back, logits equal HF's."""
    from sgl.runtime.model.gguf_export import write_llama_gguf
    from sgl.runtime.model.gguf_model import read_gguf
    from sgl.runtime.model.llama import LlamaForCausalLM
    from sgl.runtime.model.loader import load_hf_state_dict

    hf = hf_tiny(arch=arch, seed=9)
    path = tmp_path / f"{arch}.gguf"
    write_llama_gguf(path, hf.config.to_dict(), hf.state_dict().items(), "F32", arch=file_arch)
    hf_config, state = read_gguf(path)
    ours = LlamaForCausalLM(ModelConfig.from_hf_dict(hf_config))
    load_hf_state_dict(ours, state)
    want = ModelConfig.from_hf_dict(hf.config.to_dict())
    got = ours.config
    assert (
        got.arch,
        got.num_experts,
        got.experts_per_token,
        got.norm_topk_prob,
        got.sparse_layers,
    ) == (
        want.arch,
        want.num_experts,
        want.experts_per_token,
        want.norm_topk_prob,
        want.sparse_layers,
    )
    ids = list(range(3, 50))
    torch.testing.assert_close(
        TinyRunner(ours.eval()).step({0: ids})[0], hf_logits(hf, ids), atol=ATOL, rtol=0
    )
