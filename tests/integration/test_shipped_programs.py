"""Static programs shipped to the server (`POST /run_program`) against the same programs
interpreted client-side through the same server (greedy, float32 engine): the oracle is the
client-side run, which test_remote_backend holds to the in-process one. Also: dynamic
programs are never shipped under ship="auto", malformed IR is a 400 naming the node path, and
a client that leaves mid-program gets its KV freed."""

from __future__ import annotations

import json

import jsonschema
import pytest
import requests
from server_helpers import ServerThread, assert_error, kv_whole, sse_events, wait_until
from state_compare import same_state

import sgl
from sgl.lang.ir_json import program_to_json
from sgl.lang.shipping import ShippedState
from sgl.lang.tracer import DynamicProgramError, trace_static
from sgl.server import create_app

pytestmark = pytest.mark.integration
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def url(engine):
    with ServerThread(create_app(engine, "default")) as u:
        yield u


@pytest.fixture(scope="module")
def remote(url):
    return sgl.RuntimeEndpoint(url)


@sgl.function
def chat_then_reuse(s, question):
    s += sgl.system("You are brief.")
    s += sgl.user("Q: " + question)
    s += sgl.assistant(sgl.gen("a", max_tokens=12))
    s += sgl.user(f"You said: {s['a']} Is that right?")
    s += sgl.assistant(sgl.select("yn", ["Yes", "No"]) + ". " + sgl.gen("why", max_tokens=8))


@sgl.function
def constrained(s):
    s += "A phone number: " + sgl.gen("phone", regex=r"[0-9]{3}-[0-9]{4}", max_tokens=10)
    s += "\nA person as JSON: " + sgl.gen("person", json_schema=PERSON, max_tokens=40)
    s += "\nAn integer: " + sgl.gen("n", dtype=int, max_tokens=5)
    s["source"] = "generated"
    with s.var_scope("tail"):
        s += "\nDone: " + sgl.gen(max_tokens=3)


@sgl.function
def forks_both_modes(s, topic):
    s += f"Three facts about {topic}.\n"
    facts = s.fork(3)
    facts += lambda i: f"Fact {i + 1}:" + sgl.gen("fact", max_tokens=8, stop="\n")
    inner = facts[0].fork(2)  # nested
    inner += lambda i: f" (detail {i})" + sgl.gen("d", max_tokens=4)
    inner.join("concate_and_append")
    facts.join()
    s += "First: " + facts[0]["fact"] + "\nSummary:" + sgl.gen("summary", max_tokens=10)
    two = s.fork(2)
    two += lambda i: f"\nVariant {i}:" + sgl.gen("v", max_tokens=5)
    two.join("concate_and_append")


def _weather(city: str, days: int = 1) -> str:
    """The forecast for a city."""
    return "sunny"


@sgl.function
def calls_a_tool(s, city):
    s += sgl.system(sgl.tools_prompt([_weather]))
    s += sgl.user(f"The weather in {city}?")
    s += sgl.assistant(sgl.gen("call", tools=[_weather], tool_choice="required", max_tokens=60))


PROGRAMS = [
    (chat_then_reuse, {"question": "Name a planet."}),
    (constrained, {}),
    (forks_both_modes, {"topic": "the moon"}),
    (calls_a_tool, {"city": "Rome"}),
]


@pytest.mark.parametrize("program,args", PROGRAMS, ids=lambda x: getattr(x, "__name__", ""))
def test_shipped_equals_client_side(remote, program, args):
    remote.token_usage.reset()
    local = program.run(backend=remote, temperature=0, ship=False, **args)
    client_side_usage = remote.token_usage.snapshot()
    remote.token_usage.reset()
    shipped = program.run(backend=remote, temperature=0, ship=True, **args)
    same_state(shipped, local)
    shipped_usage = (
        remote.token_usage.snapshot()
    )  # the server counted every gen, unnamed and in branches too
    assert (shipped_usage["calls"], shipped_usage["completion_tokens"]) == (
        client_side_usage["calls"],
        client_side_usage["completion_tokens"],
    )
    if program is constrained:
        jsonschema.validate(json.loads(shipped["person"]), PERSON)
    if program is calls_a_tool:  # the calls, parsed on the server: one, valid
        (call,) = shipped["call"]
        assert call["name"] == "_weather" and isinstance(call["arguments"]["city"], str)
        assert shipped.get_meta_info("call")["tool_calls"] == [call]


def _sent(remote, monkeypatch) -> list[tuple[str, object]]:
    """(path, JSON body) of each HTTP request the backend sends from now on, seen where every
    request leaves the process: `requests.Session.request` (the backend's sessions are of it)."""
    sent, request = [], requests.Session.request

    def recording_request(session, method, url, *args, **kwargs):
        if url.startswith(remote.base_url):
            sent.append((url[len(remote.base_url) :], kwargs.get("json")))
        return request(session, method, url, *args, **kwargs)

    monkeypatch.setattr(requests.Session, "request", recording_request)
    return sent


def test_run_batch_ships_in_one_request(remote, monkeypatch):
    items = [{"question": q} for q in ("Name a fruit.", "Name a river.", "Name a color.")]
    local = chat_then_reuse.run_batch(items, backend=remote, temperature=0, ship=False)
    sent = _sent(remote, monkeypatch)
    shipped = chat_then_reuse.run_batch(items, backend=remote, temperature=0)
    assert [path for path, _ in sent] == ["/run_program"] and all(
        isinstance(s, ShippedState) for s in shipped
    )
    for a, b in zip(shipped, local):
        same_state(a, b)


def _bodies(sent) -> list:
    """The /run_program bodies among the requests sent."""
    return [body for path, body in sent if path == "/run_program"]


@sgl.function
def numbered_question(s, question, n):
    s += sgl.user(f"Question {n}: {question}")
    s += sgl.assistant(sgl.gen("a", max_tokens=10))
    two = s.fork(2)
    two += lambda i: f"\nAbout {question} ({i}):" + sgl.gen("b", max_tokens=4)
    two.join()


@sgl.function
def greets_by_language(s, lang, name):
    s += ("Bonjour " if lang == "fr" else "Hello ") + name + "." + sgl.gen("a", max_tokens=6)


def test_run_batch_ships_one_program_with_argument_sets(remote, monkeypatch):
    items = [
        {"question": q, "n": n}
        for n, q in enumerate(("Name a fruit.", "Name a river.", "Name a color."))
    ]
    local = numbered_question.run_batch(items, backend=remote, temperature=0, ship=False)
    sent = _sent(remote, monkeypatch)
    shipped = numbered_question.run_batch(items, backend=remote, temperature=0)
    bodies = _bodies(sent)
    assert len(bodies) == 1 and "programs" not in bodies[0]
    assert bodies[0]["arguments"] == [{"n": i["n"], "question": i["question"]} for i in items]
    for a, b in zip(shipped, local):
        same_state(a, b)
    # a program whose text depends on an argument's value is shipped one program per item
    items = [{"lang": "fr", "name": "Ada"}, {"lang": "en", "name": "Bob"}]
    local = greets_by_language.run_batch(items, backend=remote, temperature=0, ship=False)
    shipped = greets_by_language.run_batch(items, backend=remote, temperature=0)
    bodies = _bodies(sent)
    assert len(bodies) == 2 and len(bodies[1]["programs"]) == 2 and "Bonjour" in shipped[0].text()
    for a, b in zip(shipped, local):
        same_state(a, b)


def test_batch_form_edges(url):
    program = {
        "format_version": 1,
        "nodes": [
            {"type": "text", "text": "Say "},
            {"type": "argument", "name": "w"},
            {"type": "gen", "name": "a", "sampling": {"max_new_tokens": 2}},
        ],
    }
    for body in ({"programs": []}, {"program": program, "arguments": []}):
        r = requests.post(url + "/run_program", json=body, timeout=30)
        assert r.status_code == 200 and r.json() == []
    r = requests.post(
        url + "/run_program",
        json={"program": program, "arguments": [{"w": "hi"}, {"w": 3}, {}]},
        timeout=60,
    )
    assert r.status_code == 200
    first, second, third = r.json()
    assert first["text"].startswith("Say hi") and second["text"].startswith("Say 3")
    assert third["error"]["code"] == 400 and "'w'" in third["error"]["message"]
    assert_error(
        requests.post(
            url + "/run_program",
            json={"program": program, "arguments": [{"w": "x"}] * 1025},
            timeout=30,
        ),
        400,
        "arguments",
    )
    assert_error(
        requests.post(
            url + "/run_program",
            json={"program": program, "arguments": [{"w": "x"}], "stream": True},
            timeout=30,
        ),
        400,
        "stream",
    )


def test_streamed_shipped_program(remote):
    local = chat_then_reuse.run(backend=remote, temperature=0, question="Name a tree.", ship=False)
    state = chat_then_reuse.run(
        backend=remote, temperature=0, question="Name a tree.", stream=True, ship=True
    )
    pieces = list(state.text_iter("a"))
    assert isinstance(state, ShippedState)
    assert "".join(pieces) == state["a"] == local["a"] and len(pieces) > 1
    auto = chat_then_reuse.run(backend=remote, temperature=0, question="Name a tree.", stream=True)
    assert not isinstance(
        auto, ShippedState
    )  # streamed runs stay client-side unless asked: meta per piece


def test_streamed_program_carries_each_fork_branch_text(url):
    """A shipped stream tags fork branches' text with their place in the fork tree; each
    branch's pieces add up to what its state produced (its gathered variable, or the text
    the join appended), and the untagged pieces to the program's text."""
    program = program_to_json(trace_static(forks_both_modes, (), {"topic": "owls"}))
    r = requests.post(
        url + "/run_program",
        json={"program": program, "stream": True, "sampling": {"temperature": 0}},
        stream=True,
        timeout=300,
    )
    events = [e for e in sse_events(r) if isinstance(e, dict)]
    result = events[-1]["result"]
    branch_text: dict[tuple, str] = {}
    branch_var: dict[tuple, str] = {}
    for e in events[:-1]:
        if "branch" in e:
            path = tuple(tuple(level) for level in e["branch"])
            branch_text[path] = branch_text.get(path, "") + e["text"]
            if e["var"] is not None:
                branch_var[path] = branch_var.get(path, "") + e["text"]
    assert "".join(e["text"] for e in events[:-1] if "branch" not in e) == result["text"]
    assert set(branch_text) == {
        ((0, 0),),
        ((0, 1),),
        ((0, 2),),
        ((0, 0), (0, 0)),
        ((0, 0), (0, 1)),
        ((1, 0),),
        ((1, 1),),
    }
    assert [branch_var[((0, i),)] for i in range(3)] == result["variables"][
        "fact"
    ]  # gathered into the root
    for j in range(2):  # the nested fork's branches, appended to facts[0]'s text by their join
        inner = branch_text[((0, 0), (0, j))]
        assert inner.startswith(f" (detail {j})") and inner in branch_text[((0, 0),)]
    for i in range(2):  # the second fork's branches, appended to the program's text
        assert (
            branch_text[((1, i),)].startswith(f"\nVariant {i}:")
            and branch_text[((1, i),)] in result["text"]
        )
    shipped = forks_both_modes.run(
        backend=sgl.RuntimeEndpoint(url), topic="owls", temperature=0, stream=True, ship=True
    )
    assert (
        "".join(shipped.text_iter()) == shipped.text() == result["text"]
    )  # text_iter: the program's own text


@sgl.function
def branches_on_answer(s):
    s += "Is water wet? Answer yes or no:" + sgl.gen("x", max_tokens=3)
    if s["x"].strip().lower().startswith("yes"):
        s += " Good."
    s += sgl.gen("more", max_tokens=3)


def test_dynamic_program_runs_client_side_and_cannot_be_forced(remote):
    state = branches_on_answer.run(backend=remote, temperature=0)
    assert not isinstance(state, ShippedState) and "more" in state
    with pytest.raises(
        DynamicProgramError, match=r"calls \.strip\(\) on the generated value 'x'"
    ) as e:
        branches_on_answer.run(backend=remote, temperature=0, ship=True)
    assert "test_shipped_programs.py" in e.value.where and "startswith" in e.value.where


def test_malformed_programs_and_bad_sampling_are_400_with_the_path(url):
    bad = {
        "format_version": 1,
        "nodes": [
            {"type": "text", "text": "Hi"},
            {
                "type": "fork",
                "fork_id": 1,
                "branches": [[{"type": "gen", "name": "a", "dtype": "complex"}]],
            },
        ],
    }
    assert_error(
        requests.post(url + "/run_program", json={"program": bad}, timeout=30),
        400,
        "program.nodes[1].branches[0][0].dtype",
    )
    wrong_temp = {
        "format_version": 1,
        "nodes": [{"type": "gen", "name": "a", "sampling": {"temperature": -1}}],
    }
    assert_error(
        requests.post(url + "/run_program", json={"programs": [wrong_temp]}, timeout=30),
        400,
        "programs[0].nodes[0].sampling.temperature",
    )
    assert_error(
        requests.post(
            url + "/run_program", json={"program": {"format_version": 9, "nodes": []}}, timeout=30
        ),
        400,
        "program.format_version",
    )


def test_client_leaving_mid_program_frees_its_kv(url, engine):
    program = {
        "format_version": 1,
        "nodes": [
            {"type": "text", "text": "Count slowly:"},
            {
                "type": "fork",
                "fork_id": 1,
                "branches": [
                    [
                        {
                            "type": "gen",
                            "name": "c",
                            "sampling": {"max_new_tokens": 4000, "ignore_eos": True},
                        }
                    ]
                ]
                * 2,
            },
            {"type": "join", "mode": "gather_variable"},
        ],
    }
    r = requests.post(
        url + "/run_program", json={"program": program, "stream": True}, stream=True, timeout=120
    )
    assert r.status_code == 200
    assert wait_until(
        lambda: engine.get_server_info()["num_running_reqs"] >= 2, timeout=60
    )  # both branches decode
    r.close()  # the client leaves long before 4000 tokens
    assert wait_until(lambda: kv_whole(url), timeout=60), requests.get(
        url + "/get_server_info", timeout=30
    ).json()


def test_programs_beyond_the_limits_are_refused(url):
    wide = {"format_version": 1, "nodes": [{"type": "fork", "fork_id": 1, "branches": [[]] * 257}]}
    assert_error(
        requests.post(url + "/run_program", json={"program": wide}, timeout=30),
        400,
        "program.nodes[0].branches",
    )
    assert_error(
        requests.post(
            url + "/run_program",
            json={"programs": [{"format_version": 1, "nodes": []}] * 1025},
            timeout=30,
        ),
        400,
        "programs",
    )


LONG_OPENING = "Notes on the harbour town, kept by the lighthouse keeper over one winter. " * 12


@sgl.function
def fork_over_notes(s, n):
    s += LONG_OPENING
    branches = s.fork(n)
    branches += lambda i: f"\nQuestion {i}: what is kept?\nAnswer:" + sgl.gen("a", max_tokens=3)
    branches.join()


@sgl.function
def question_on_notes(s, q):
    s += LONG_OPENING + f"\nQuestion {q}:" + sgl.gen("a", max_tokens=3)


def _computed(engine, run) -> tuple[int, int]:
    """(prompt tokens the engine computed, prompt tokens it found cached) while `run` ran."""
    before = engine.get_server_info()
    run()
    after = engine.get_server_info()
    return after["prefill_tokens"] - before["prefill_tokens"], after["cached_tokens"] - before[
        "cached_tokens"
    ]


def test_shared_prefixes_are_computed_once(url, engine, remote):
    """The cache plan: a shipped fork's prefix and a shipped batch's shared opening are
    computed once; the other branches and items find them in the prefix cache."""
    opening = len(engine.encode(LONG_OPENING))
    assert wait_until(
        lambda: kv_whole(url), timeout=60
    )  # an empty cache: nothing is found from earlier tests
    computed, cached = _computed(
        engine, lambda: fork_over_notes.run(n=4, backend=remote, temperature=0, ship=True).sync()
    )
    assert computed < 2 * opening and cached >= 3 * (opening - 2), (computed, cached, opening)
    assert wait_until(lambda: kv_whole(url), timeout=60)
    items = [{"q": q} for q in range(6)]
    computed, cached = _computed(
        engine,
        lambda: [
            s.sync()
            for s in question_on_notes.run_batch(items, backend=remote, temperature=0, ship=True)
        ],
    )
    assert computed < 2 * opening and cached >= 6 * (opening - 2), (computed, cached, opening)


SEPARATED = "a\u2028b\u0085c"  # str.splitlines breaks at both; SSE does not


@sgl.function
def separated(s):
    s += "Write it: " + sgl.gen("x", regex=SEPARATED, max_tokens=16)


def test_streamed_shipped_text_with_unicode_line_separators_arrives_whole(remote):
    state = separated.run(backend=remote, temperature=0, stream=True, ship=True)
    assert isinstance(state, ShippedState)
    pieces = list(state.text_iter("x"))
    assert "".join(pieces) == state["x"] == SEPARATED
