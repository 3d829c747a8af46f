"""Sampling: the parameter table and `SamplingParams` (params.py) with their validation
(validation.py), the per-step batch tensors (batch.py) and the token sampler (sampler.py).

Importing this package does not import torch: the DSL and the server read the table. The
sampler's names are re-exported lazily for code that imports them from here.
"""

from __future__ import annotations

from typing import Any

from sgl.runtime.sampling.params import PARAMS, PARAMS_BY_NAME, Param, SamplingParams

__all__ = [
    "PARAMS",
    "PARAMS_BY_NAME",
    "Param",
    "SamplingParams",
    "SamplingBatch",
    "SampleOutput",
    "make_generator",
    "sample",
]
_LAZY = {
    "SamplingBatch": "batch",
    "SampleOutput": "sampler",
    "make_generator": "sampler",
    "sample": "sampler",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
