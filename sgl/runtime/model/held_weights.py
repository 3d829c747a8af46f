"""A built model's weights back under HF names, exactly as it computes with them: run
through HF transformers, they are the tests' oracle, leaving only our kernels' error."""

from __future__ import annotations

import torch
from torch import nn

from sgl.runtime.model.llama import LlamaForCausalLM
from sgl.runtime.model.loader import FUSED_CHECKPOINT_ARCHS, LAYER_NORMS


def held_hf_state_dict(model: LlamaForCausalLM) -> dict[str, torch.Tensor]:
    """HF-named float32 weights equal to what the model computes with (a quantized layer's
    codes times its scales, exactly): run through HF transformers, they are the oracle that
    leaves only our kernels' error (fused layers are split back). Whole models only."""
    if model.shards.sharded:
        raise NotImplementedError(
            "held_hf_state_dict of a tensor-parallel shard: build the model at tp size 1"
        )
    weight = _held_weight
    c = model.config
    state = {
        "model.embed_tokens.weight": weight(model.embed_tokens),
        "model.norm.weight": model.norm.weight.float(),
    }
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
            names = (
                ("q_proj", "k_proj", "v_proj") if name == "self_attn" else ("gate_proj", "up_proj")
            )
            if c.arch in FUSED_CHECKPOINT_ARCHS:  # kept fused, as the family's checkpoints are
                names, sizes = (
                    (("qkv_proj",) if name == "self_attn" else ("gate_up_proj",)),
                    (sum(sizes),),
                )
            for part, w in zip(names, weight(module).split(sizes)):
                state[f"{p}{name}.{part}.weight"] = w
            if module.bias is not None:
                for part, b in zip(names, module.bias.float().split(sizes)):
                    state[f"{p}{name}.{part}.bias"] = b
        for name, module in [("self_attn.o_proj", attn.o_proj)] + (
            [] if c.is_sparse(i) else [("mlp.down_proj", mlp.down_proj)]
        ):
            state[f"{p}{name}.weight"] = weight(module)
            if module.bias is not None:
                state[f"{p}{name}.bias"] = module.bias.float()
        for norm in LAYER_NORMS:
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
    state = {
        f"{p}mlp.gate.weight": moe.gate.weight.float(),
        f"{p}mlp.experts.gate_up_proj": gate_up,
        f"{p}mlp.experts.down_proj": down,
    }
    if hasattr(moe, "shared_expert"):
        shared = moe.shared_expert
        gate, up = _held_weight(shared.gate_up_proj).split(shared.intermediate_size)
        state.update(
            {
                f"{p}mlp.shared_expert.gate_proj.weight": gate,
                f"{p}mlp.shared_expert.up_proj.weight": up,
                f"{p}mlp.shared_expert.down_proj.weight": _held_weight(shared.down_proj),
                f"{p}mlp.shared_expert_gate.weight": moe.shared_expert_gate.weight.float(),
            }
        )
    return state


def _has_submodule(module: nn.Module, name: str) -> bool:
    try:
        module.get_submodule(name)
        return True
    except AttributeError:
        return False
