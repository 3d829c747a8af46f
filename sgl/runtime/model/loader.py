"""Load a model from an HF directory or a GGUF file: build it for its architecture
(registry.py, on the meta device), then put each checkpoint weight into it, in the layout the
`QuantPolicy` gives (quant_policy.py) and, under tensor parallelism, as this rank's shard
(`ShardedSource`). Weights are read one at a time from a source (weight_sources.py; a GGUF's:
gguf_model.py), so nothing is allocated twice.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sgl.runtime.distributed import TPGroup
from sgl.runtime.model.config import ModelConfig
from sgl.runtime.model.gguf_model import gguf_to_hf_dir, open_gguf
from sgl.runtime.model.llama import LlamaForCausalLM
from sgl.runtime.model.parallel import rule_for
from sgl.runtime.model.paths import resolve_model_path
from sgl.runtime.model.quant import int8_embedding, quantized_linear
from sgl.runtime.model.quant_policy import QuantPolicy, expert_layer
from sgl.runtime.model.quant_tensor import QuantizedTensor, cat_rows, dense_weight, per_row_int8
from sgl.runtime.model.registry import build_model
from sgl.runtime.model.weight_sources import (
    DictSource,
    RecordedSource,
    SafetensorsSource,
    ShardedSource,
)


def load_model(
    model_path: str,
    dtype: torch.dtype,
    device: torch.device,
    quantization: str = "none",
    group_size: int = 32,
    tp: TPGroup | None = None,
) -> tuple[LlamaForCausalLM, ModelConfig]:
    """The model at `model_path` in `dtype`, its linear layers per `quantization` (see
    `QuantPolicy`); with `tp`, this rank's shard of it (`ShardedSource`). A GGUF under any
    quantization but "none" is read tensor by tensor, kept quantized; under "none" it is
    dequantized once into the cache (`gguf_to_hf_dir`)."""
    path = Path(resolve_model_path(model_path))
    if path.suffix == ".gguf" and quantization != "none":
        hf_config, source = open_gguf(path)
    else:
        weights_dir = gguf_to_hf_dir(path) if path.suffix == ".gguf" else path
        hf_config = json.loads((weights_dir / "config.json").read_text())
        source = SafetensorsSource(weights_dir)
    config = ModelConfig.from_hf_dict(hf_config)
    if source.has("rope_freqs"):
        config.rope_freq_factors = source.get("rope_freqs").tolist()
    with torch.device("meta"):
        model = build_model(config, tp)
    with large_buffers_returned():
        load_weights(model, source, QuantPolicy(quantization, group_size), dtype, device)
    model.build_rotary(device)  # not in the checkpoint: build it for real (float32)
    left = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise KeyError(f"checkpoint is missing weights: {left[:5]}")
    return model.eval(), config


@contextlib.contextmanager
def large_buffers_returned():
    """While loading, buffers over 1 MB are mmapped by glibc, so each one freed (a tensor
    read, dequantized, repacked) goes back to the OS at once instead of staying in the heap:
    measured on a 1B Q4_1 GGUF (684 MiB), the load's peak RSS drops from ~2.1 GB to ~1.0 GB.
    Afterwards the threshold is set to glibc's own ceiling (32 MB), near what its dynamic
    threshold reaches anyway, and the heap is trimmed. A no-op off glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt, libc.malloc_trim  # noqa: B018 - glibc only
    except (OSError, AttributeError):
        yield
        return
    m_mmap_threshold = -3
    libc.mallopt(m_mmap_threshold, 1 << 20)
    try:
        yield
    finally:
        libc.mallopt(m_mmap_threshold, 32 << 20)
        libc.malloc_trim(0)


def load_hf_state_dict(model: LlamaForCausalLM, state: dict[str, torch.Tensor]) -> None:
    """Copy HF-named dense weights into a built model (every parameter must be covered); a
    model built for a tensor-parallel rank takes its shard of them."""
    dtype = next(model.parameters()).dtype
    device = next(model.parameters()).device
    load_weights(model, DictSource(state), QuantPolicy("none"), dtype, device)


FUSED_CHECKPOINT_ARCHS = ("phi3",)  # checkpoints with qkv_proj / gate_up_proj, as our layers are
# Per-layer norms under their HF names (which a family has: `DecoderLayer`).
LAYER_NORMS = (
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
    "self_attn.q_norm",
    "self_attn.k_norm",
)
_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def load_weights(
    model: LlamaForCausalLM, source, policy: QuantPolicy, dtype: torch.dtype, device: torch.device
) -> None:
    """Put HF-named weights from `source` into `model` (built on any device, meta included): dense
    parameters are replaced by tensors in `dtype` on `device`, linear layers the policy quantizes by
    quantized modules. Nothing is allocated twice; every parameter must be covered. A model built
    for a tensor-parallel rank (`registry.build_model(config, tp)`) gets its shards."""
    config = model.config
    modules = dict(model.named_modules())
    loaded: set[str] = set()
    if model.shards.sharded:
        source = ShardedSource(source, model.shards)
    source = RecordedSource(source)

    def set_param(qual: str, tensor: torch.Tensor) -> None:
        owner, _, attr = qual.rpartition(".")
        module = modules.get(owner)
        if module is None or attr not in module._parameters:
            raise KeyError(f"unexpected weight {qual} (not a part of {config.arch}'s layers)")
        want = module._parameters[attr].shape
        if tuple(tensor.shape) != tuple(want):
            raise ValueError(
                f"weight {qual} has shape {tuple(tensor.shape)} but the model's config gives "
                f"{tuple(want)}: the checkpoint and config.json disagree"
            )
        module._parameters[attr] = nn.Parameter(
            tensor.to(device=device, dtype=dtype).contiguous(), requires_grad=False
        )
        loaded.add(qual)

    def put_linear(qual: str, parts: list[str]) -> None:
        """Module `qual` from the HF weights `parts` (stacked on the output dim) and their
        biases."""
        family = source.family(parts[0])
        weights = [
            policy.linear_weight(
                w, family, model.shards.whole_inputs(rule_for(qual), w.shape[1]), p
            )
            for w, p in ((source.get(p), p) for p in parts)
        ]
        biases = [
            source.get(b) for b in (p[: -len("weight")] + "bias" for p in parts) if source.has(b)
        ]
        bias = torch.cat(biases) if biases else None
        if isinstance(weights[0], QuantizedTensor):
            if (
                len({w.group for w in weights}) > 1
            ):  # int8 in a file's groups fused with one per row
                weights = [per_row_int8(w) for w in weights]
            owner, _, attr = qual.rpartition(".")
            setattr(modules[owner], attr, quantized_linear(cat_rows(weights), bias))
            loaded.update(f"{qual}.{x}" for x in ("weight_t", "weight", "bias"))
            return
        w = torch.cat([x.float() for x in weights])
        module = modules[qual]
        set_param(
            f"{qual}.weight_t" if "weight_t" in module._parameters else f"{qual}.weight",
            w.t() if "weight_t" in module._parameters else w,
        )
        if bias is not None:
            set_param(f"{qual}.bias", bias)

    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        for sub, mod in (
            ("self_attn", "qkv_proj"),
            ("mlp", "gate_up_proj"),
            ("self_attn", "o_proj"),
            ("mlp", "down_proj"),
        ):
            fused = f"{p}{sub}.{mod}.weight"  # Phi-3 checkpoints hold qkv and gate/up fused already
            parts = (
                [fused]
                if source.has(fused)
                else [f"{p}{sub}.{x}.weight" for x in _FUSED.get(mod, (mod,))]
            )
            if all(source.has(x) for x in parts):
                put_linear(f"layers.{i}.{sub}.{mod}", parts)
        for norm in LAYER_NORMS:
            if source.has(f"{p}{norm}.weight"):
                set_param(
                    f"layers.{i}.{norm}.weight", dense_weight(source.get(f"{p}{norm}.weight"))
                )
        if config.is_sparse(i):
            load_moe_layer(i, source, set_param, put_linear, modules, dtype, device, loaded, policy)
    if source.has("model.norm.weight"):
        set_param("norm.weight", dense_weight(source.get("model.norm.weight")))

    def put_vocab_table(
        hf_name: str, attr: str, make: Callable[[QuantizedTensor, bool], nn.Module]
    ) -> None:
        """The embeddings or the LM head: int8 rows when the model is quantized, else dense.
        `make` may rearrange the codes in place when nothing else holds them (`consume`)."""
        raw = source.get(hf_name)
        value = policy.embedding(raw, source.family(hf_name))
        if isinstance(value, QuantizedTensor):
            setattr(model, attr, make(value, value is not raw or source.fresh_reads))
            loaded.add(f"{attr}.weight")
        else:
            set_param(f"{attr}.weight", value)

    if source.has("model.embed_tokens.weight"):
        put_vocab_table(
            "model.embed_tokens.weight",
            "embed_tokens",
            lambda q, consume: int8_embedding(q, dtype, consume),
        )
    if not config.tie_word_embeddings and source.has("lm_head.weight"):
        put_vocab_table("lm_head.weight", "lm_head", lambda q, consume: quantized_linear(q, None))
    unexpected = {
        n
        for n in set(source.names()) - source.read - {"rope_freqs", "lm_head.weight"}
        if "rotary_emb" not in n
    }
    if unexpected:
        raise KeyError(
            f"unexpected weights {sorted(unexpected)[:5]} (not a part of {type(model).__name__})"
        )
    missing = {n for n, _ in model.named_parameters()} - loaded
    if missing:
        raise KeyError(f"checkpoint is missing weights: {sorted(missing)[:5]}")
    model.requires_grad_(
        False
    )  # inference only: logits computed outside inference_mode build no graph


def _first_present(source, names: list[str]) -> str:
    for name in names:
        if source.has(name):
            return name
    raise KeyError(f"checkpoint is missing weights: {names[0]}")


def load_moe_layer(
    i: int,
    source,
    set_param,
    put_linear,
    modules: dict,
    dtype: torch.dtype,
    device: torch.device,
    loaded: set[str],
    policy: QuantPolicy,
) -> None:
    """Layer i's router, stacked experts and shared expert, from transformers >= 5 names
    (`mlp.experts.gate_up_proj` [E, 2I, H], `mlp.experts.down_proj` [E, H, I]) or the
    per-expert names of checkpoints on the Hub (Mixtral's `block_sparse_moe.experts.{e}.w1/w3/w2`,
    Qwen-MoE's `mlp.experts.{e}.gate_proj/up_proj/down_proj`), stacked in place. Where the
    policy quantizes them, each expert gets its own pair of quantized layers instead
    (`load_quantized_experts`)."""
    p, q = f"model.layers.{i}.", f"layers.{i}.mlp"
    config = modules[""].config
    set_param(
        f"{q}.gate.weight",
        dense_weight(
            source.get(
                _first_present(source, [f"{p}mlp.gate.weight", f"{p}block_sparse_moe.gate.weight"])
            )
        ),
    )
    names, stacked = _expert_weight_names(p, source, config.num_experts)
    if policy.target(source.family(names[0][0])) is not None:
        load_quantized_experts(
            names,
            stacked,
            source,
            modules[f"{q}.experts"],
            policy,
            dtype,
            device,
            modules[""].tp.size,
        )
        loaded.update({f"{q}.experts.gate_up_proj", f"{q}.experts.down_proj"})
    elif source.has(f"{p}mlp.experts.gate_up_proj"):
        set_param(
            f"{q}.experts.gate_up_proj", dense_weight(source.get(f"{p}mlp.experts.gate_up_proj"))
        )
        set_param(f"{q}.experts.down_proj", dense_weight(source.get(f"{p}mlp.experts.down_proj")))
    elif source.has(f"{p}mlp.experts.gate_proj.weight"):  # GGUF: gate and up stacked apart
        gate, up = (
            dense_weight(source.get(f"{p}mlp.experts.{x}_proj.weight")) for x in ("gate", "up")
        )
        set_param(f"{q}.experts.gate_up_proj", torch.cat([gate, up], dim=1))
        del gate, up
        set_param(
            f"{q}.experts.down_proj", dense_weight(source.get(f"{p}mlp.experts.down_proj.weight"))
        )
    else:
        experts: nn.Module = modules[f"{q}.experts"]
        size, hidden = (
            experts.intermediate,
            config.hidden_size,
        )  # this rank's slice, under tensor parallelism
        gate_up = torch.empty((config.num_experts, 2 * size, hidden), dtype=dtype, device=device)
        down = torch.empty((config.num_experts, hidden, size), dtype=dtype, device=device)
        for e in range(config.num_experts):
            mixtral = f"{p}block_sparse_moe.experts.{e}."
            names = (
                [mixtral + x for x in ("w1.weight", "w3.weight", "w2.weight")]
                if source.has(mixtral + "w1.weight")
                else [
                    f"{p}mlp.experts.{e}.{x}.weight" for x in ("gate_proj", "up_proj", "down_proj")
                ]
            )
            gate_up[e, :size].copy_(dense_weight(source.get(names[0])))
            gate_up[e, size:].copy_(dense_weight(source.get(names[1])))
            down[e].copy_(dense_weight(source.get(names[2])))
        experts._parameters["gate_up_proj"] = nn.Parameter(gate_up, requires_grad=False)
        experts._parameters["down_proj"] = nn.Parameter(down, requires_grad=False)
        loaded.update({f"{q}.experts.gate_up_proj", f"{q}.experts.down_proj"})
    if config.shared_expert_intermediate_size:
        shared = f"{p}mlp.shared_expert."
        put_linear(
            f"{q}.shared_expert.gate_up_proj",
            [shared + "gate_proj.weight", shared + "up_proj.weight"],
        )
        put_linear(f"{q}.shared_expert.down_proj", [shared + "down_proj.weight"])
        set_param(
            f"{q}.shared_expert_gate.weight",
            dense_weight(source.get(f"{p}mlp.shared_expert_gate.weight")),
        )


def _expert_weight_names(
    p: str, source, num_experts: int
) -> tuple[list[tuple[str, str, str]], bool]:
    """Where layer `p`'s experts are: per expert the names of its (gate, up, down) weights, and
    whether they are stacked tensors (then the same names for every expert)."""
    if source.has(f"{p}mlp.experts.gate_up_proj"):  # transformers 5: gate and up in one tensor
        return [
            (f"{p}mlp.experts.gate_up_proj",) * 2 + (f"{p}mlp.experts.down_proj",)
        ] * num_experts, True
    if source.has(f"{p}mlp.experts.gate_proj.weight"):  # GGUF: gate, up and down stacked apart
        return [
            tuple(f"{p}mlp.experts.{x}_proj.weight" for x in ("gate", "up", "down"))
        ] * num_experts, True
    names = []
    for e in range(num_experts):
        mixtral = f"{p}block_sparse_moe.experts.{e}."
        names.append(
            tuple(mixtral + x for x in ("w1.weight", "w3.weight", "w2.weight"))
            if source.has(mixtral + "w1.weight")
            else tuple(
                f"{p}mlp.experts.{e}.{x}.weight" for x in ("gate_proj", "up_proj", "down_proj")
            )
        )
    return names, False


def load_quantized_experts(
    names: list[tuple[str, str, str]],
    stacked: bool,
    source,
    experts: nn.Module,
    policy: QuantPolicy,
    dtype: torch.dtype,
    device: torch.device,
    tp_size: int = 1,
) -> None:
    """Each expert as a (gate_up, down) layer pair on the int8 / int4 kernels; a GGUF's Q4_0 /
    Q4_1 / Q4_K / Q8_0 expert codes are used as they are (exact). A weight the policy keeps
    dense (int4 needs inputs in groups of 32) becomes a dense layer. `tp_size`: the down
    weights are this rank's input slice of that many (groups chosen for the whole input)."""
    if stacked:  # read each tensor once, split by expert
        split = {name: source.get_experts(name) for name in dict.fromkeys(names[0])}
        per_expert = [tuple(split[name][e] for name in names[0]) for e in range(len(names))]
        if names[0][0] == names[0][1]:  # transformers 5's [2I, H] gate_up: split it in halves
            per_expert = [
                (gu[: gu.shape[0] // 2], gu[gu.shape[0] // 2 :], d) for gu, _, d in per_expert
            ]
    else:
        per_expert = [tuple(source.get(name) for name in expert) for expert in names]

    def layer(parts: list[Any], part_names: tuple[str, ...], split: int = 1) -> nn.Module:
        return expert_layer(
            parts,
            [source.family(n) for n in part_names],
            policy,
            dtype,
            device,
            parts[0].shape[1] * split,
            part_names[0],
        )

    experts.use_per_expert_layers(
        [
            (layer([gate, up], expert_names[:2]), layer([down], expert_names[2:], tp_size))
            for (gate, up, down), expert_names in zip(per_expert, names)
        ]
    )
