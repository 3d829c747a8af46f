"""Each supported family at a toy size: a config shaped like the real one (with its features:
windows, soft-capping, experts, ...) but 2 layers of width 64, random weights
(`load_format="dummy"`), the embedded model's tokenizer. The engine reports what it loaded
and what its attention needs; then a config key sgl does not implement is refused by name.

    .venv/bin/python examples/model_families.py

With a real checkpoint, pass its directory (or .gguf file) as `model_path` instead.
"""

import json
import tempfile
from pathlib import Path

import sgl

TOY = {
    "vocab_size": 49152,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 2048,
}
FAMILIES = {  # architectures: what makes the family differ, at toy size
    "Qwen3ForCausalLM": {},
    "MistralForCausalLM": {"sliding_window": 32},
    "Gemma2ForCausalLM": {
        "sliding_window": 32,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
        "query_pre_attn_scalar": 16,
    },
    "Gemma3ForCausalLM": {
        "sliding_window": 32,
        "sliding_window_pattern": 2,
        "query_pre_attn_scalar": 16,
    },
    "Phi3ForCausalLM": {"sliding_window": 32, "partial_rotary_factor": 0.5},
    "MixtralForCausalLM": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "Qwen3MoeForCausalLM": {
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "norm_topk_prob": True,
    },
}


def write_config(directory: Path, architecture: str, extra: dict) -> str:
    path = directory / f"{architecture}.json"
    path.write_text(json.dumps({"architectures": [architecture], **TOY, **extra}))
    return str(path)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for architecture, extra in FAMILIES.items():
            config = write_config(Path(tmp), architecture, extra)
            with sgl.Engine(
                model_path=config, load_format="dummy", dtype="float32", max_total_tokens=4096
            ) as engine:
                info = engine.get_server_info()
                out = engine.generate(
                    "Hello", {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
                )
                print(
                    f"{architecture}: architecture={info['architecture']} "
                    f"features={info['attention_features']} "
                    f"experts={info['num_experts']} backend={info['attention_backend']} "
                    f"tokens={out['meta_info']['completion_tokens']}"
                )
        bad = write_config(Path(tmp), "LlamaForCausalLM", {"hidden_act": "relu"})
        try:
            sgl.Engine(model_path=bad, load_format="dummy", dtype="float32")
        except ValueError as e:
            print(f"refused: {e}")


if __name__ == "__main__":
    main()
