"""sgl: structured LLM programs on a radix-cached, constrained-decoding runtime."""

from __future__ import annotations

from typing import Any

from sgl.lang import *  # noqa: F401,F403  (the DSL is pure Python and cheap to import)
from sgl.lang import __all__ as _LANG_ALL

__version__ = "0.1.0"

# The runtime pulls in torch; import it only when it is asked for (and only then need the
# `runtime` extra: the bare package is the frontend and its clients).
_LAZY = {
    "Engine": "sgl.runtime.engine",
    "SamplingParams": "sgl.runtime.sampling",
    "InvalidRequestError": "sgl.runtime.errors",
    "EngineBackend": "sgl.lang.backends.engine",
    "RuntimeEndpoint": "sgl.lang.backends.runtime_endpoint",
    "Runtime": "sgl.lang.backends.runtime_endpoint",
    "OpenAI": "sgl.lang.backends.openai_compat",
    "OpenAICompatible": "sgl.lang.backends.openai_compat",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sgl' has no attribute {name!r}")
    import importlib

    from sgl.extras import needs_extra

    if module.startswith(("sgl.runtime", "sgl.lang.backends.engine")):
        with needs_extra("runtime", f"sgl.{name}"):
            return getattr(importlib.import_module(module), name)
    return getattr(importlib.import_module(module), name)


__all__ = [*_LANG_ALL, *_LAZY]
