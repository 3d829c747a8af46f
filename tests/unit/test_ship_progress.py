"""A shipped run_batch with progress_bar=True advances its bar as each item finishes."""

from __future__ import annotations

import threading

import pytest
import tqdm.auto
from lang_fakes import FakeBackend

import sgl


@sgl.function
def qa(s, question):
    s += sgl.user("Question: " + question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=8))


class _RecordingBar(tqdm.auto.tqdm):
    instances: list[_RecordingBar] = []

    def __init__(self, *a, **k):
        super().__init__(*a, disable=True, **k)
        self.count = 0
        self.all_but_first = threading.Event()
        _RecordingBar.instances.append(self)

    def update(self, n=1):
        self.count += n
        if self.count == self.total - 1:
            self.all_but_first.set()


class _ShippingBackend(FakeBackend):
    """Serves run_program: item 0 finishes only once the bar has counted every other item."""

    def run_program(self, programs, defaults, stream=False, arguments=None):
        self.requests.append((programs, arguments))
        question = programs[0]
        if "q0" in str(question):
            assert _RecordingBar.instances[-1].all_but_first.wait(10), (
                "bar did not advance before item 0 finished"
            )
        return [str(question)]


@pytest.fixture
def backend(monkeypatch):
    monkeypatch.setattr(tqdm.auto, "tqdm", _RecordingBar)
    be = _ShippingBackend()
    be.requests = []
    return be


def test_shipped_batch_bar_advances_per_item(backend):
    n = 6
    results = qa.run_batch(
        [{"question": f"q{i}"} for i in range(n)], backend=backend, ship=True, progress_bar=True
    )
    bar = _RecordingBar.instances[-1]
    assert bar.count == n and bar.total == n
    assert len(backend.requests) == n  # one request per item
    assert all(
        f"q{i}" in results[i] and all(f"q{j}" not in results[i] for j in range(n) if j != i)
        for i in range(n)
    )


def test_shipped_batch_without_bar_is_one_request(backend):
    qa.run_batch([{"question": f"q{i}"} for i in range(3)], backend=backend, ship=True)
    assert len(backend.requests) == 1
