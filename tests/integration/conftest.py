"""Session-wide fixtures for the integration tests: the HF oracle and the shared engines.

Loading costs seconds (HF ~13 s, each engine ~5 s), so the HF model, the default engine and
the tiny-pool engine are built once per session; other configurations live in
module-scoped fixtures next to the tests that need them.
"""

from __future__ import annotations

import dataclasses

import pytest
from oracle_helpers import (
    GREEDY_MAX_NEW,
    ORACLE_EXACT,
    TINY_POOL,
    greedy_prompts,
    hf_greedy,
    load_hf_model,
)


@pytest.fixture(scope="session")
def hf_model():
    return load_hf_model()


def _engine(**kwargs):
    """An engine whose greedy tokens must equal HF's float32 ones: dense float32 weights
    (the default on a bf16-capable CPU is bf16 with the GGUF kept int4; test_cpu_fidelity
    holds those to HF with tolerances)."""
    import sgl

    return sgl.Engine(**{**ORACLE_EXACT, **kwargs})


@pytest.fixture(scope="session")
def engine():
    """Default configuration (radix cache on, chunk 2048, lpm)."""
    e = _engine()
    yield e
    e.shutdown()


@pytest.fixture(scope="session")
def tiny_engine():
    e = _engine(max_total_tokens=TINY_POOL)
    yield e
    e.shutdown()


@dataclasses.dataclass
class GreedyRefs:
    prompts: list[str]
    prompt_ids: list[list[int]]
    hf_outputs: list[list[int]]  # HF greedy, each prompt alone, up to and including EOS
    tokenizer: object


@pytest.fixture(scope="session")
def greedy_refs(hf_model, engine) -> GreedyRefs:
    prompts = greedy_prompts(engine.tokenizer)
    ids = [engine.encode(p) for p in prompts]
    outs = [hf_greedy(hf_model, x, GREEDY_MAX_NEW) for x in ids]
    return GreedyRefs(prompts, ids, outs, engine.tokenizer)
