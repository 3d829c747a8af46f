"""Tiny random-weight HF models built in memory, and a one-request-at-a-time runner of ours."""

from __future__ import annotations

from typing import Any

import torch

from sgl.runtime.attention import ForwardBatch, create_attention_backend
from sgl.runtime.memory import ReqToTokenPool, TokenToKVPool
from sgl.runtime.model.config import ModelConfig
from sgl.runtime.model.llama import LlamaForCausalLM
from sgl.runtime.model.loader import load_hf_state_dict

# Tiny configs of each family, with the features that make it differ switched on (windows
# shorter than the test prompts, caps small enough that tanh bends random-weight scores).
FAMILY_CONFIGS = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=16)),
    "qwen3-sliding": (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        dict(head_dim=16, use_sliding_window=True, sliding_window=8, max_window_layers=1),
    ),
    "mistral-sliding": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=8)),
    "ministral": (
        "MinistralConfig",
        "MinistralForCausalLM",
        dict(head_dim=16, sliding_window=8, layer_types=["sliding_attention", "full_attention"]),
    ),
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        dict(
            head_dim=16,
            query_pre_attn_scalar=24,
            sliding_window=8,
            attn_logit_softcapping=0.5,
            final_logit_softcapping=2.0,
        ),
    ),
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(
            head_dim=16,
            query_pre_attn_scalar=16,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention"],
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
        ),
    ),
    "phi3": (
        "Phi3Config",
        "Phi3ForCausalLM",
        dict(pad_token_id=0, sliding_window=8, partial_rotary_factor=0.5),
    ),
    "qwen3-yarn": (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        dict(
            head_dim=16,
            rope_parameters={
                "rope_type": "yarn",
                "factor": 4.0,
                "rope_theta": 10000.0,
                "original_max_position_embeddings": 32,
            },
        ),
    ),
    "phi3-longrope": (
        "Phi3Config",
        "Phi3ForCausalLM",
        dict(
            pad_token_id=0,
            original_max_position_embeddings=160,
            rope_scaling={
                "type": "longrope",
                "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0, 4.0],
                "long_factor": [1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0],
            },
        ),
    ),
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        dict(num_local_experts=4, num_experts_per_tok=2),
    ),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        dict(
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            norm_topk_prob=False,
            shared_expert_intermediate_size=48,
            mlp_only_layers=[1],
        ),
    ),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(
            head_dim=16,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            norm_topk_prob=True,
        ),
    ),
}


def hf_tiny(arch: str = "llama", tie: bool = False, kv_heads: int = 2, seed: int = 0, **extra):
    import transformers

    torch.manual_seed(seed)
    common = dict(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        max_position_embeddings=256,
        tie_word_embeddings=tie,
        rms_norm_eps=1e-5,
    )
    common.update(extra)
    if arch in FAMILY_CONFIGS:
        config_cls, model_cls, features = FAMILY_CONFIGS[arch]
        cfg = getattr(transformers, config_cls)(
            **{**common, **features, **extra}
        )  # the caller's keys win
        cfg._attn_implementation = "eager"  # the reference math, soft-capping included
        model = getattr(transformers, model_cls)(cfg)
    elif arch == "qwen2":
        cfg = transformers.Qwen2Config(**common)
        model = transformers.Qwen2ForCausalLM(cfg)
    elif arch == "mistral":
        cfg = transformers.MistralConfig(sliding_window=None, **common)
        model = transformers.MistralForCausalLM(cfg)
    else:
        cfg = transformers.LlamaConfig(**common)
        model = transformers.LlamaForCausalLM(cfg)
    # Random init leaves biases at zero and norms at one (Gemma's at zero); make them matter.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model.float().eval()


def ours_from_hf(hf_model) -> LlamaForCausalLM:
    cfg = ModelConfig.from_hf_dict(hf_model.config.to_dict())
    model = LlamaForCausalLM(cfg)
    load_hf_state_dict(model, hf_model.state_dict())
    return model.eval()


class TinyRunner:
    """Drives our model over explicit (request, chunk) steps with a real KV pool."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        capacity: int = 4096,
        max_reqs: int = 16,
        use_mirror: bool = True,
        kv_dtype: torch.dtype = torch.float32,
        backend: str = "torch_native",
    ) -> None:
        c = model.config
        self.model = model
        # A tensor-parallel rank's pool and backend hold its heads only (all of them at tp size 1).
        self.pool = TokenToKVPool(
            capacity, c.num_hidden_layers, model.local_num_kv_heads, c.head_dim, kv_dtype, "cpu"
        )
        self.table = ReqToTokenPool(max_reqs, c.max_position_embeddings, "cpu")
        self.backend = create_attention_backend(
            backend, "cpu", kv_dtype, needs=c.attention_features
        )
        self.backend.use_mirror = use_mirror
        self.backend.bind(self.pool, self.table, model.local_num_heads)
        self.rows: dict[int, int] = {}
        self.lens: dict[int, int] = {}

    def step(self, chunks: dict[int, list[int]]) -> dict[int, torch.Tensor]:
        """Run one forward with `chunks[req] = new token ids`; logits [len, V] per request."""
        ids, pos, rows, prefix, ext = [], [], [], [], []
        slots_all = []
        for req, toks in chunks.items():
            if req not in self.rows:
                self.rows[req] = self.table.alloc()
                self.lens[req] = 0
            start = self.lens[req]
            slots = self.pool.alloc(len(toks))
            self.table.write(self.rows[req], start, slots)
            slots_all.append(slots)
            ids.extend(toks)
            pos.extend(range(start, start + len(toks)))
            rows.append(self.rows[req])
            prefix.append(start)
            ext.append(len(toks))
            self.lens[req] = start + len(toks)
        batch = ForwardBatch(
            torch.tensor(ids),
            torch.tensor(pos),
            torch.cat(slots_all),
            rows,
            prefix,
            ext,
            self.pool,
            self.table,
            self.backend,
            row_epochs=[self.table.epochs[r] for r in rows],
        )
        self.backend.init_forward_metadata(batch)
        with torch.inference_mode():
            logits = self.model.compute_logits(self.model(batch.input_ids, batch.positions, batch))
        out, off = {}, 0
        for req, n in zip(chunks, ext):
            out[req] = logits[off : off + n]
            off += n
        return out

    def rollback(self, req: int, n: int) -> None:
        """Forget the request's last `n` tokens (as jump-forward does), freeing their slots."""
        end = self.lens[req]
        self.pool.free(self.table.req_to_token[self.rows[req], end - n : end].clone())
        self.lens[req] = end - n

    def finish(self, req: int) -> None:
        """Free the request's row and slots; the row can be reused by a new request."""
        self.rollback(req, self.lens[req])
        self.table.free(self.rows.pop(req))
        del self.lens[req]


def prefill_in_chunks_then_decode(
    runner: TinyRunner, seqs: dict[int, list[int]], rng, decode_steps: int
) -> dict[int, torch.Tensor]:
    """Each sequence but its last `decode_steps` tokens prefilled in uneven chunks (1-17
    tokens, several requests a step), then those tokens decoded by everyone together; the
    logits of every position, per request, to compare with HF's on the whole sequence."""
    got: dict[int, list[torch.Tensor]] = {i: [] for i in seqs}
    cursor = {i: 0 for i in seqs}
    while any(cursor[i] < len(s) - decode_steps for i, s in seqs.items()):
        step = {}
        for i, s in seqs.items():
            end = min(len(s) - decode_steps, cursor[i] + rng.randint(1, 17))
            if end > cursor[i]:
                step[i] = s[cursor[i] : end]
                cursor[i] = end
        for i, lg in runner.step(step).items():
            got[i].append(lg)
    for k in range(decode_steps):
        for i, lg in runner.step(
            {i: [s[len(s) - decode_steps + k]] for i, s in seqs.items()}
        ).items():
            got[i].append(lg)
    return {i: torch.cat(parts) for i, parts in got.items()}


def save_tiny_engine_dir(
    path, vocab: int = 320, arch: str = "llama", chat_template: str | None = None, **config: Any
):
    """A tiny random model of `arch` (Llama by default) saved as an HF directory (sharded
    safetensors + an index) with a byte-level BPE tokenizer (and `chat_template`), as
    `Engine(model_path=...)` loads it; `config` overrides hf_tiny's; returns (path, hf model)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [
        "the quick brown fox jumps over the lazy dog " * 3,
        "hello world, structured programs! 0123456789",
    ] * 20
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")
    if chat_template is not None:
        fast.chat_template = chat_template
    fast.save_pretrained(path)
    hf = hf_tiny(arch=arch, tie=False, kv_heads=2, seed=7, initializer_range=0.15, **config)
    hf.config.vocab_size = vocab
    hf.resize_token_embeddings(vocab)
    with torch.no_grad():
        hf.lm_head.weight.normal_(0, 0.15)
        hf.model.embed_tokens.weight.normal_(0, 0.15)
    hf.config.eos_token_id = fast.eos_token_id
    hf.save_pretrained(path, max_shard_size="100KB")  # several shards + an index
    # The oracle never stops early (the engine runs with ignore_eos) and bans nothing.
    hf.generation_config.eos_token_id = None
    assert (path / "model.safetensors.index.json").exists()
    return path, hf
