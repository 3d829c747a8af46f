"""Which layout each weight is kept in (`QuantPolicy`), and the layers built from it: a loaded
weight's (loader.py) or a built dense model's (`quantize_model`, random-weight models)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from sgl.runtime.model.llama import Linear, LlamaForCausalLM
from sgl.runtime.model.moe import StackedExperts
from sgl.runtime.model.parallel import rule_for
from sgl.runtime.model.quant import int8_embedding, quantized_linear
from sgl.runtime.model.quant_tensor import (
    QuantizedTensor,
    cat_rows,
    dense_weight,
    int4_group_for,
    per_row_int8,
    quantize,
    quantize_int8,
)

logger = logging.getLogger(__name__)


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

    def linear_weight(
        self, value: Any, family: str | None, whole_in: int | None = None, name: str = "a weight"
    ) -> torch.Tensor | QuantizedTensor:
        """A linear layer's [out, in] weight in the kernel's layout (or dense). `whole_in`: the
        layer's inputs at tp size 1 where `value` is one rank's slice of a row-parallel layer's;
        its int4 groups are the whole layer's (as at tp size 1), so the slice must hold whole
        groups (`TPShards.whole_inputs`)."""
        kind = self.target(family)
        k = value.shape[1]
        group = int4_group_for(whole_in or k, self.group_size) if kind == "int4" else k
        if kind == "int4" and group is not None and k % group:
            raise ValueError(
                f"tensor parallelism: {name} gives a rank {k} of its {whole_in} inputs, not a "
                f"multiple of its int4 group size {group}; choose a tp_size that cuts it on "
                f"{group}-input boundaries, or quantization int8"
            )
        if kind is None or group is None:
            if kind is not None:
                logger.warning(
                    "a layer with %d inputs cannot be int4 (groups of 32): kept dense", k
                )
            return dense_weight(value)
        if (
            isinstance(value, QuantizedTensor)
            and value.kind == kind
            and (value.group == group or kind == "int8")
        ):
            # exact: the file's blocks are the kernel's groups (int8: any group; quantized_linear)
            return value
        return quantize(value, kind, group)

    def embedding(self, value: Any, family: str | None) -> torch.Tensor | QuantizedTensor:
        """Token embeddings / LM head: int8 rows whenever the model is quantized, else dense."""
        if self.target(family) is None:
            return dense_weight(value)
        if isinstance(value, QuantizedTensor) and value.kind == "int8":
            return value  # in its groups where the kernel takes them (int8_embedding)
        return quantize(value, "int8", value.shape[1])


def quantize_model(model: LlamaForCausalLM, policy: QuantPolicy) -> None:
    """Quantize a built dense model in place (random-weight models under int8 / int4)."""
    if policy.target(None) is None:
        return
    for qual, module in list(model.named_modules()):
        if isinstance(module, Linear):
            w = module.weight_t.detach().t().float()
            weight = policy.linear_weight(
                w, None, model.shards.whole_inputs(rule_for(qual), w.shape[1]), qual
            )
            if isinstance(weight, QuantizedTensor):
                owner, _, attr = qual.rpartition(".")
                bias = None if module.bias is None else module.bias.detach().float()
                setattr(model.get_submodule(owner), attr, quantized_linear(weight, bias))
        elif isinstance(module, StackedExperts):
            dtype, device = module.gate_up_proj.dtype, module.gate_up_proj.device
            module.use_per_expert_layers(
                [
                    tuple(
                        expert_layer(
                            [w.detach()], [None], policy, dtype, device, w.shape[1] * split, qual
                        )
                        for w, split in zip(pair, (1, model.tp.size))
                    )
                    for pair in zip(module.gate_up_proj, module.down_proj)
                ]
            )
    model.embed_tokens = int8_embedding(
        quantize_int8(model.embed_tokens.weight.detach()), model.norm.weight.dtype
    )
    if not model.config.tie_word_embeddings:
        model.lm_head = quantized_linear(quantize_int8(model.lm_head.weight.detach()), None)


def expert_layer(
    parts: list[Any],
    families: list[str | None],
    policy: QuantPolicy,
    dtype: torch.dtype,
    device: torch.device,
    whole_in: int | None = None,
    name: str = "",
) -> nn.Module:
    """One expert's layer from its weights stacked on the output dim: quantized where the
    policy says, else dense (`whole_in`: see `QuantPolicy.linear_weight`)."""
    weights = [
        policy.linear_weight(w, family, whole_in, name) for w, family in zip(parts, families)
    ]
    if all(isinstance(w, QuantizedTensor) for w in weights):
        if len({w.group for w in weights}) > 1:
            weights = [per_row_int8(w) for w in weights]
        return quantized_linear(cat_rows(weights), None)
    w = torch.cat([dense_weight(x).float() for x in weights])
    dense = Linear(w.shape[1], w.shape[0], bias=False)
    dense.weight_t = nn.Parameter(
        w.t().to(device=device, dtype=dtype).contiguous(), requires_grad=False
    )
    return dense
