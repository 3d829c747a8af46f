"""The benchmark's program workloads (benchmarks/programs/) send the same text either way: each
sgl program and its plain `/v1/completions` form, run against recorders that answer at once
with text derived from the prompt, make the same calls: the same prompts, lengths, stops,
constraints and select choices (a fork's branches in any order)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from programs.plain_client import Recorder, RecordingBackend  # noqa: E402
from programs.workloads import WORKLOADS  # noqa: E402

from sgl.lang import ChatTemplate  # noqa: E402

CHATML = ChatTemplate(
    prefix={r: f"<|im_start|>{r}\n" for r in ("system", "user", "assistant")},
    suffix={r: "<|im_end|>\n" for r in ("system", "user", "assistant")},
    default_system="<|im_start|>system\nYou are helpful.<|im_end|>\n",
    name="chatml",
)


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_the_program_and_the_plain_calls_send_the_same_text(name):
    workload = WORKLOADS[name]
    items = workload.items(3, seed=0)
    assert items == workload.items(3, seed=0) and items != workload.items(3, seed=1)  # seeded
    backend, recorder = RecordingBackend(CHATML), Recorder(CHATML)
    for item in items:
        workload.program.run(**item, backend=backend)
        workload.plain(recorder, **item)
    assert backend.calls, "the program made no call"
    assert sorted(backend.calls) == sorted(recorder.calls)
