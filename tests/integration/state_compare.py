"""Comparing a shipped program's result with a client-side run's: text, messages,
variables and meta info, without the fields that differ between any two runs."""

from __future__ import annotations

import json

import pytest

from sgl.lang.shipping import ShippedState

VOLATILE = {"id", "e2e_latency", "ttft", "cached_tokens"}  # differ between any two runs


def comparable(meta):
    """meta info without the per-run fields, as JSON data (tuples become lists)."""
    if isinstance(meta, list):
        return [comparable(m) for m in meta]
    if not isinstance(meta, dict):
        return meta
    return json.loads(json.dumps({k: v for k, v in meta.items() if k not in VOLATILE}))


def close(a, b, path="") -> None:
    """Equal, floats within 1e-4 (logprobs of a prefix computed in another batch round
    differently)."""
    if isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, abs=1e-4), path
    elif isinstance(a, dict) and isinstance(b, dict):
        assert set(a) == set(b), path
        for k in a:
            close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            close(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


def same_state(shipped, local) -> None:
    assert isinstance(shipped, ShippedState)
    assert shipped.text() == local.text()
    assert shipped.messages() == local.messages()
    ex = local.stream_executor
    assert shipped.stream_executor.variables == json.loads(json.dumps(ex.variables))
    for name in ex.meta_info:
        close(comparable(shipped.get_meta_info(name)), comparable(ex.meta_info[name]), name)
