"""Sessions over HTTP: /open_session, /generate with session_params, /close_session, and the
remote backend running each program state in a session that keeps its prefix cached while
other traffic evicts everything else. Oracles: the same tokens sent whole without a
session (greedy), and the engine's own accounting (cached tokens, pinned tokens, free KV)."""

from __future__ import annotations

import pytest
import requests
from oracle_helpers import kv_all_returned, wait_until
from server_helpers import ServerThread, assert_error, metric, parse_metrics

import sgl
from sgl.server import create_app

pytestmark = pytest.mark.integration

GREEDY = {"max_new_tokens": 8, "temperature": 0}
STORY = (
    "The lighthouse keeper wrote in her log every evening: the weather, the ships that passed, "
    "the birds on the rocks, and the colour of the sea at dusk. "
) * 4


@pytest.fixture(scope="module")
def url(engine):
    with ServerThread(create_app(engine, "default")) as u:
        yield u


@pytest.fixture(scope="module")
def small_url(tiny_engine):
    """A server whose KV pool (400 tokens) holds little more than one long prompt."""
    with ServerThread(create_app(tiny_engine, "default")) as u:
        yield u


def post(url: str, path: str, body: dict) -> requests.Response:
    return requests.post(url + path, json=body, timeout=120)


def server_info(url: str) -> dict:
    return requests.get(url + "/get_server_info", timeout=30).json()


def test_turns_continue_history_like_the_whole_tokens_sent_at_once(url, engine):
    sid = post(url, "/open_session", {}).json()
    assert isinstance(sid, str) and sid
    t1 = post(
        url,
        "/generate",
        {
            "text": STORY + "Q: What did she write about?\nA:",
            "sampling_params": GREEDY,
            "session_params": {"id": sid},
        },
    ).json()
    follow = "\nQ: And at dawn?\nA:"
    t2 = post(
        url,
        "/generate",
        {
            "text": follow,
            "sampling_params": GREEDY,
            "session_params": {"id": sid, "rid": t1["meta_info"]["id"]},
        },
    ).json()
    history = engine.encode(STORY + "Q: What did she write about?\nA:") + t1["output_ids"]
    whole = post(
        url, "/generate", {"input_ids": history + engine.encode(follow), "sampling_params": GREEDY}
    ).json()
    assert t2["output_ids"] == whole["output_ids"] and t2["text"] == whole["text"]
    assert t2["meta_info"]["prompt_tokens"] == whole["meta_info"]["prompt_tokens"]
    assert t2["meta_info"]["cached_tokens"] >= len(history) - 1

    samples = parse_metrics(requests.get(url + "/metrics", timeout=30).text)
    assert metric(samples, "sgl:num_open_sessions") >= 1
    assert metric(samples, "sgl:session_locked_tokens") >= len(history) - 1

    assert post(url, "/close_session", {"session_id": sid}).json() == {"success": True}
    assert_error(post(url, "/close_session", {"session_id": sid}), 404, "session_id")
    assert_error(
        post(
            url,
            "/generate",
            {
                "text": follow,
                "sampling_params": GREEDY,
                "session_params": {"id": sid, "rid": t1["meta_info"]["id"]},
            },
        ),
        404,
        "session_params.id",
    )  # closed: not found
    assert wait_until(lambda: kv_all_returned(engine))


def test_session_bad_input_is_a_400_naming_the_field(url):
    sid = post(url, "/open_session", {"capacity_tokens": 64, "timeout": 30}).json()
    cases = [
        (
            {"text": "Hi", "session_params": {"id": sid, "rid": "no-such-turn"}},
            "session_params.rid",
        ),
        ({"text": "Hi", "session_params": {"id": sid, "replace": True}}, "session_params.replace"),
        ({"text": "Hi", "session_params": {"id": sid, "colour": 1}}, None),  # unknown field
        ({"text": "Hi " * 80, "session_params": {"id": sid}}, "max_new_tokens"),  # over capacity
        ({"text": ["a", "b"], "session_params": {"id": sid}}, "session_params"),  # a batch
    ]
    for body, param in cases:
        err = assert_error(post(url, "/generate", {"sampling_params": GREEDY, **body}), 400)
        if param is not None:
            assert err["param"] == param, err
    assert_error(post(url, "/open_session", {"session_id": sid}), 400, "session_id")  # already open
    assert_error(post(url, "/open_session", {"capacity_tokens": "many"}), 400)
    assert post(url, "/close_session", {"session_id": sid}).status_code == 200


@sgl.function
def long_program(s, flood):
    s += STORY + "Q: Name one thing she wrote about.\nA:" + sgl.gen("a", max_tokens=6, stop="\n")
    s["a"]  # wait for the first answer, then let other traffic evict whatever it can
    flood()
    s += "\nQ: Name another.\nA:" + sgl.gen("b", max_tokens=6, stop="\n")


def test_remote_program_keeps_its_prefix_cached_under_memory_pressure(small_url, tiny_engine):
    def flood() -> None:
        for i in range(
            3
        ):  # ~200 tokens each: beside the ~150 pinned, a 400-token pool keeps nothing else
            text = f"Unrelated request {i}: " + " ".join(f"word{i}x{j}" for j in range(40))
            assert post(
                small_url, "/generate", {"text": text, "sampling_params": {"max_new_tokens": 1}}
            ).ok

    remote = sgl.RuntimeEndpoint(small_url)
    state = long_program.run(flood=flood, temperature=0, backend=remote)
    first_prompt = len(tiny_engine.encode(STORY + "Q: Name one thing she wrote about.\nA:"))
    assert state.get_meta_info("b")["cached_tokens"] >= first_prompt

    # Without sessions (an older server), the same traffic evicts the program's prefix.
    plain = sgl.RuntimeEndpoint(small_url)
    plain.model_info = {**plain.model_info, "supports_sessions": False}
    state = long_program.run(flood=flood, temperature=0, backend=plain)
    assert state.get_meta_info("b")["cached_tokens"] < first_prompt // 2

    # The program's session closed when it ended: nothing stays pinned or held.
    info = server_info(small_url)
    assert info["num_open_sessions"] == 0 and info["session_locked_tokens"] == 0
    assert wait_until(lambda: kv_all_returned(tiny_engine))
