"""Sessions on the tiny engine: continuation against HF greedy on the full token history,
KV pinned against eviction until close or idle timeout, the memory valve, and bad input."""

from __future__ import annotations

import random
import time

import pytest
import torch
from tiny_models import save_tiny_engine_dir

import sgl
from sgl.runtime.errors import InvalidRequestError

VOCAB = 320
GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_engine_dir(tmp_path_factory.mktemp("tiny-llama-sessions"), VOCAB)


def ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, VOCAB) for _ in range(n)]


def hf_greedy(hf, prompt: list[int], new: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt]), max_new_tokens=new, do_sample=False, pad_token_id=0
        )
    return out[0, len(prompt) :].tolist()


def gen(engine, prompt: list[int], new: int, **session) -> dict:
    return engine.generate(
        input_ids=prompt,
        sampling_params={"max_new_tokens": new, **GREEDY},
        session_params=session or None,
    )


def info(engine) -> dict:
    return engine.get_server_info()


def test_turns_continue_the_history_like_hf_on_the_full_tokens(tiny_dir):
    path, hf = tiny_dir
    a, b, c = ids(30, 1), ids(12, 2), ids(9, 3)
    with sgl.Engine(model_path=str(path), max_total_tokens=4096) as engine:
        sid = engine.open_session()
        t1 = gen(engine, a, 8, id=sid)
        assert t1["output_ids"] == hf_greedy(hf, a, 8)
        t2 = gen(engine, b, 8, id=sid, rid=t1["meta_info"]["id"])
        history = a + t1["output_ids"] + b
        assert t2["output_ids"] == hf_greedy(hf, history, 8)
        assert t2["meta_info"]["prompt_tokens"] == len(history)
        # Everything but the last sampled token of turn 1 was cached (it never had K/V).
        assert t2["meta_info"]["cached_tokens"] == len(a) + len(t1["output_ids"]) - 1
        # A third turn branching from turn 1 again, keeping only its prompt.
        t3 = gen(engine, c, 6, id=sid, rid=t1["meta_info"]["id"], drop_previous_output=True)
        assert t3["output_ids"] == hf_greedy(hf, a + c, 6)
        # offset: keep the first 10 tokens of turn 2's history, then the new input.
        t2_history = history + t2["output_ids"]
        t4 = gen(engine, c, 5, id=sid, rid=t2["meta_info"]["id"], offset=10)
        assert t4["output_ids"] == hf_greedy(hf, t2_history[:10] + c, 5)
        # offset 0 keeps the whole history (SGLang's meaning); replace: false is accepted.
        t5 = gen(engine, c, 5, id=sid, rid=t2["meta_info"]["id"], offset=0, replace=False)
        assert t5["output_ids"] == hf_greedy(hf, t2_history + c, 5)
        assert engine.close_session(sid)
        assert info(engine)["session_locked_tokens"] == 0


def test_session_kv_survives_eviction_until_close(tiny_dir):
    path, _ = tiny_dir
    a = ids(60, 10)
    with sgl.Engine(model_path=str(path), max_total_tokens=400, chunked_prefill_size=64) as engine:
        sid = engine.open_session()
        t1 = gen(engine, a, 8, id=sid)
        pinned = info(engine)["session_locked_tokens"]
        assert pinned == len(a) + 8 - 1
        # Unrelated traffic that needs far more than the free memory: the tree must evict.
        for seed in range(6):
            gen(engine, ids(150, 100 + seed), 4)
        t2 = gen(engine, ids(5, 4), 4, id=sid, rid=t1["meta_info"]["id"])
        assert t2["meta_info"]["cached_tokens"] == pinned  # nothing of the session was evicted

        # Control: the same prompt without a session is evicted by the same traffic.
        gen(engine, ids(60, 11), 8)
        for seed in range(6):
            gen(engine, ids(150, 200 + seed), 4)
        again = gen(engine, ids(60, 11), 8)
        assert again["meta_info"]["cached_tokens"] < 60

        assert engine.close_session(sid)
        assert not engine.close_session(sid)  # already closed
        s = info(engine)
        assert s["session_locked_tokens"] == 0 and s["num_open_sessions"] == 0
        with pytest.raises(InvalidRequestError, match="no open session"):
            gen(engine, ids(3, 5), 2, id=sid, rid=t1["meta_info"]["id"])
        # No KV leaked: with the cache flushed, the whole pool is free again.
        assert engine.flush_cache()
        assert info(engine)["available_kv_tokens"] == 400


def test_idle_session_closes_itself_and_unpins(tiny_dir):
    path, _ = tiny_dir
    with sgl.Engine(model_path=str(path), max_total_tokens=1024) as engine:
        sid = engine.open_session(timeout=0.3)
        gen(engine, ids(20, 20), 4, id=sid)
        assert info(engine)["session_locked_tokens"] > 0
        deadline = time.monotonic() + 10
        while info(engine)["num_open_sessions"] and time.monotonic() < deadline:
            time.sleep(0.2)
        s = info(engine)
        assert s["num_open_sessions"] == 0 and s["session_locked_tokens"] == 0
        assert not engine.close_session(sid)


def test_pinned_sessions_give_way_when_nothing_else_fits(tiny_dir):
    path, hf = tiny_dir
    with sgl.Engine(model_path=str(path), max_total_tokens=300, chunked_prefill_size=64) as engine:
        sids = [engine.open_session() for _ in range(3)]
        for i, sid in enumerate(sids):
            gen(engine, ids(60, 30 + i), 4, id=sid)
        # Together they would pin 189 tokens: past half the pool, the oldest was unpinned.
        assert 100 < info(engine)["session_locked_tokens"] <= 150
        big = ids(200, 40)
        out = gen(engine, big, 8)  # cannot fit beside the pins: the oldest sessions are unpinned
        assert out["output_ids"] == hf_greedy(hf, big, 8)
        assert info(engine)["num_open_sessions"] == 3  # unpinned, not closed
        for sid in sids:
            assert engine.close_session(sid)
        assert engine.flush_cache()
        assert info(engine)["available_kv_tokens"] == 300


def test_session_errors_name_the_field(tiny_dir):
    path, _ = tiny_dir
    with sgl.Engine(model_path=str(path), max_total_tokens=1024) as engine:
        sid = engine.open_session(capacity_tokens=40)
        cases = [
            ({"id": "nope"}, "session_params.id", "no open session"),
            ({"id": sid, "rid": "never-ran"}, "session_params.rid", "no finished request"),
            ({"id": sid, "colour": 1}, "session_params", "unknown field"),
            ({"id": 5}, "session_params.id", "must be the id"),
            ({"id": sid, "rid": None, "offset": 3}, "session_params.offset", "outside the history"),
        ]
        for params, field, message in cases:
            with pytest.raises(InvalidRequestError, match=message) as e:
                gen(engine, ids(5, 50), 2, **params)
            assert e.value.param == field
        with pytest.raises(InvalidRequestError, match="capacity_tokens 40") as e:
            gen(engine, ids(35, 51), 10, id=sid)
        assert e.value.param == "max_new_tokens"
        with pytest.raises(InvalidRequestError, match="replace is not supported") as e:
            gen(engine, ids(5, 50), 2, id=sid, replace=True)
        with pytest.raises(InvalidRequestError, match="one prompt") as e:
            engine.generate(
                input_ids=[ids(3, 1), ids(3, 2)],
                sampling_params={"max_new_tokens": 2},
                session_params={"id": sid},
            )
        with pytest.raises(InvalidRequestError, match="already open"):
            engine.open_session(session_id=sid)
        for bad in (
            {"capacity_tokens": 0},
            {"capacity_tokens": 10**6},
            {"timeout": -1},
            {"timeout": float("nan")},
            {"timeout": float("inf")},
            {"session_id": ""},
        ):
            with pytest.raises(InvalidRequestError):
                engine.open_session(**bad)
        # The engine still serves, and nothing is pinned by the failed requests.
        assert gen(engine, ids(5, 52), 2, id=sid)["meta_info"]["completion_tokens"] == 2
        assert engine.close_session(sid)
        assert info(engine)["session_locked_tokens"] == 0


def test_closing_a_session_aborts_its_unfinished_turns(tiny_dir):
    import threading

    path, _ = tiny_dir
    with sgl.Engine(model_path=str(path), max_total_tokens=4096) as engine:
        sid, other = engine.open_session(), engine.open_session()
        results: dict = {}
        # Hold the scheduler in its next step, so the close arrives while both turns are unfinished:
        # it is drained right after that one step (one token each, of 100).
        gate, entered = threading.Event(), threading.Event()

        def gated(real_step):
            def gated_step() -> bool:
                if engine.debug_state()["waiting"] and not gate.is_set():
                    entered.set()
                    gate.wait(60)
                return real_step()

            return gated_step

        def run(name: str, session: str) -> None:
            results[name] = gen(engine, ids(10, 60), 100, id=session)

        threads = [
            threading.Thread(target=run, args=("closed", sid)),
            threading.Thread(target=run, args=("kept", other)),
        ]
        with engine.debug_wrap("step", gated):
            for t in threads:
                t.start()
            assert entered.wait(60)
            deadline = (
                time.monotonic() + 60
            )  # both turns reached the scheduler (queued or still in its inbox)
            while engine.debug_state()["waiting"] + engine.debug_state()["inbox"] < 2:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            queued = engine.debug_state()["inbox"]
            closer = threading.Thread(
                target=lambda: results.__setitem__("close", engine.close_session(sid))
            )
            closer.start()
            while (
                engine.debug_state()["inbox"] == queued
            ):  # the close is in the inbox, behind the turns
                assert time.monotonic() < deadline
                time.sleep(0.01)
            gate.set()
            for t in threads + [closer]:
                t.join(timeout=60)
        assert results["close"] is True
        assert results["closed"]["meta_info"]["finish_reason"]["type"] == "abort"
        assert results["kept"]["meta_info"]["finish_reason"]["type"] == "length"
        assert engine.close_session(other)
        assert info(engine)["num_running_reqs"] == 0 and info(engine)["session_locked_tokens"] == 0


def test_a_turn_submitted_after_its_session_closed_is_refused(tiny_dir):
    """The session closes between the caller building the turn and the scheduler receiving it:
    the turn never runs and fails like any request naming a closed session."""
    from sgl.runtime.messages import SubmitRequest

    path, _ = tiny_dir
    with sgl.Engine(model_path=str(path), max_total_tokens=1024) as engine:
        sid = engine.open_session()

        def close_first(send):
            def send_after_close(msg):
                if isinstance(msg, SubmitRequest):
                    assert engine.close_session(sid)
                send(msg)

            return send_after_close

        with (
            engine.debug_wrap("send", close_first),
            pytest.raises(InvalidRequestError, match="no open session") as e,
        ):
            gen(engine, ids(10, 70), 20, id=sid)
        assert e.value.param == "session_params.id"
        assert info(engine)["num_running_reqs"] == 0 and info(engine)["session_locked_tokens"] == 0


def test_a_program_outlives_its_session(tiny_dir, monkeypatch):
    """A state whose session timed out (the program sat idle) runs on without it."""
    path, _ = tiny_dir
    with sgl.Engine(model_path=str(path), max_total_tokens=1024) as engine:
        opened: list[str] = []
        open_session = engine.open_session

        def recording_open(*args, **kwargs):
            opened.append(open_session(*args, **kwargs))
            return opened[-1]

        monkeypatch.setattr(engine, "open_session", recording_open)

        @sgl.function
        def two_gens(s):
            s += "the quick" + sgl.gen("a", max_tokens=3, temperature=0)
            s["a"]
            for sid in opened:  # as if it had timed out
                engine.close_session(sid)
            s += " brown" + sgl.gen("b", max_tokens=3, temperature=0)

        state = two_gens.run(backend=engine)
        assert state.get_meta_info("b")["completion_tokens"] == 3
        assert info(engine)["num_open_sessions"] == 0
