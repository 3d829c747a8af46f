"""Which model class serves each architecture family (`ModelConfig.arch`: config.py maps HF
`architectures` / GGUF `general.architecture` names to families).

Today one class, the Llama-style decoder of llama.py, serves every family through its config
(norm placement, soft caps, sliding windows, fused checkpoints, MoE blocks). A family that
needs modules of its own registers its class here; the loader, the dummy loader and the
tensor-parallel shards then build it (`build_model`). A class takes `(config, tp)` and has
`config`, `tp`, `shards`, `local_num_heads`, `local_num_kv_heads`, `build_rotary`,
`compute_logits` and the HF-named parameters the loader fills (llama.py's is the reference);
its modules that hold dense weights pack themselves for the CPU (cpu_packed.CpuPackable).
"""

from __future__ import annotations

from torch import nn

from sgl.runtime.distributed import TPGroup
from sgl.runtime.model.config import SUPPORTED_ARCHITECTURES, ModelConfig
from sgl.runtime.model.llama import LlamaForCausalLM

MODEL_CLASSES: dict[str, type[nn.Module]] = {
    family: LlamaForCausalLM for family in sorted(set(SUPPORTED_ARCHITECTURES.values()))
}


def model_class(config: ModelConfig) -> type[nn.Module]:
    try:
        return MODEL_CLASSES[config.arch]
    except KeyError:
        raise ValueError(
            f"no model class is registered for the architecture family {config.arch!r} "
            f"(registered: {sorted(MODEL_CLASSES)}): add one to registry.MODEL_CLASSES"
        ) from None


def build_model(config: ModelConfig, tp: TPGroup | None = None) -> nn.Module:
    """The model for `config` (this rank's shard under `tp`), on the current default device
    (the loaders build on "meta" and fill the weights in after)."""
    return model_class(config)(config, tp)
