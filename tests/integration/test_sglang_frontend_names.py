"""SGLang's frontend names, on the embedded model (in process and through the server): what a
program written for SGLang reads and calls runs unchanged. Oracles: `re.fullmatch` for the
REGEX_* patterns, the gens' own meta info for token usage and streamed meta."""

from __future__ import annotations

import asyncio
import re

import pytest
from server_helpers import ServerThread

import sgl
from sgl.server import create_app

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def backend(engine):
    return sgl.as_backend(engine)


def test_regex_constants_constrain_gens(backend):
    @sgl.function
    def typed(s):
        s += "Age of the universe in billions of years: " + sgl.gen(
            "i", regex=sgl.lang.ir.REGEX_INT, max_tokens=8
        )
        s += "\nPi: " + sgl.gen("f", regex=sgl.lang.ir.REGEX_FLOAT, max_tokens=10)
        s += "\nIs water wet? " + sgl.gen("b", regex=sgl.lang.ir.REGEX_BOOL, max_tokens=4)
        s += "\nA color: " + sgl.gen("s", regex=sgl.lang.ir.REGEX_STR, max_tokens=12)

    state = typed.run(backend=backend, temperature=0)
    ir = sgl.lang.ir
    for name, pattern in (
        ("i", ir.REGEX_INT),
        ("f", ir.REGEX_FLOAT),
        ("b", ir.REGEX_BOOL),
        ("s", ir.REGEX_STR),
    ):
        # complete even if cut by max_tokens (budget-aware constraints finish inside the budget)
        assert re.fullmatch(pattern, state[name]), (name, state[name], state.get_meta_info(name))


def test_setitem_sets_a_variable_in_order(backend):
    @sgl.function
    def prog(s):
        s += "Say hi: " + sgl.gen("a", max_tokens=3, temperature=0)
        s["note"] = "set after a"
        s += sgl.gen("b", max_tokens=2, temperature=0)

    state = prog.run(backend=backend)
    assert state["note"] == "set after a" and "note" in state
    assert prog.trace() is not None  # the tracer takes s[...] = too


def test_text_async_iter_with_meta_data_gives_the_meta_so_far(backend):
    @sgl.function
    def prog(s):
        s += "Write a sentence about rivers:" + sgl.gen(
            "out", max_tokens=16, temperature=0, ignore_eos=True, return_logprob=True
        )

    async def collect(state):
        return [item async for item in state.text_async_iter("out", return_meta_data=True)]

    state = prog.run(backend=backend, stream=True)
    items = asyncio.run(collect(state))
    assert "".join(text for text, _ in items) == state["out"]
    counts = [meta["completion_tokens"] for _, meta in items]
    assert counts == sorted(counts) and counts[-1] == 16
    for _text, meta in items:  # the logprob entries of every token so far
        assert len(meta["output_token_logprobs"]) == meta["completion_tokens"]
    assert items[-1][1]["finish_reason"] is not None
    plain = asyncio.run(_texts(prog.run(backend=backend, stream=True)))
    assert all(isinstance(p, str) for p in plain)


async def _texts(state):
    return [t async for t in state.text_async_iter("out")]


def test_global_config_default_backend_and_model_name_and_token_usage(backend, engine):
    @sgl.function
    def two(s):
        s += "Q: 2+2?\nA:" + sgl.gen("x", max_tokens=4, temperature=0)
        s += "\nQ: 3+3?\nA:" + sgl.gen("y", max_tokens=4, temperature=0)

    assert sgl.global_config.default_backend is None or isinstance(
        sgl.global_config.default_backend, sgl.Backend
    )
    before = sgl.global_config.default_backend
    sgl.global_config.default_backend = backend
    try:
        backend.token_usage.reset()
        state = two.run()  # no backend given: the global one
        metas = [state.get_meta_info("x"), state.get_meta_info("y")]
        assert backend.token_usage.prompt_tokens == sum(m["prompt_tokens"] for m in metas)
        assert backend.token_usage.completion_tokens == sum(m["completion_tokens"] for m in metas)
    finally:
        sgl.global_config.default_backend = before
    assert backend.get_model_name() == "default"
    with ServerThread(create_app(engine, "served-name")) as url:
        assert sgl.RuntimeEndpoint(url).get_model_name() == "served-name"


def test_variables_are_settable_on_a_finished_state(backend, engine):
    """SGLang's `state["x"] = int(state["x"])` on the state run() returned (it raised "this
    program state has ended"); the program is not reopened: its text stays as it was."""

    @sgl.function
    def prog(s):
        s += "Count: " + sgl.gen("n", regex=r"[0-9]{2}", max_tokens=4, temperature=0)

    state = prog.run(backend=backend)
    text = state.text()
    state["n"] = int(state["n"])
    assert state["n"] == int(text[len("Count: ") :]) and state.text() == text
    with pytest.raises(sgl.ProgramError, match="ended"):
        state += "more"
    with ServerThread(create_app(engine, "default")) as url:
        shipped = prog.run(backend=sgl.RuntimeEndpoint(url), ship=True)
        shipped["n"] = int(shipped["n"])
        assert isinstance(shipped["n"], int)
