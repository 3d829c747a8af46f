"""A soak driver for the HTTP server: a deterministic mix of requests, with faults, whose every
outcome is classified, then checks that the server returned to idle with nothing leaked.

Used by `bench_soak.py` (a server subprocess, thousands of requests) and by
`tests/integration/test_server_soak.py` (an in-process server, a few hundred).

The mix (fixed by `seed`; which abort wins its race is up to timing):

* endpoints: /v1/chat/completions, /v1/completions and the native /generate, streamed or not;
* constraints: none, `regex` (sampling_params / the OpenAI extension field) or JSON schema
  (sampling_params `json_schema` / OpenAI `response_format`), on any endpoint;
* n = 1, 2 or 3; max tokens 4-24, except runs of `burst` consecutive unconstrained requests
  (8% of the mix) that decode 48-64 tokens with ignore_eos: admitted together, they outgrow
  the decode reservation of a small KV pool and get retracted; a fifth of the prompts long
  (100-350 tokens, each with its own head so the radix cache cannot share them);
* sessions opened with a short `timeout`, one or two /generate turns, never closed;
* client disconnects: a stream closed after its first event or two; a non-streamed request
  given up after a fraction of a second;
* aborts: /abort_request of a request in flight by its rid (a stream after its first event,
  a non-streamed request after a short delay);
* invalid constraints (a regex or schema that cannot compile): a 400 is the right answer.

Every HTTP generation is classified:

* `completed`: 2xx and a well-formed body, or a well-formed stream ending in a finish for
  every choice and `[DONE]`;
* `error`: a 4xx/5xx with the OpenAI-style body {"error": {"message", "type", "param", "code"}},
  or an SSE error event; `aborted`: finish_reason abort on a request we aborted;
* `disconnected`: we closed the connection on purpose;
* `broken`: anything else (a timeout, a connection error, a stream cut short without an error,
  a malformed body or event, an abort finish nobody asked for). It must be 0.

Counted besides: 5xx (must be 0), errors other than the 400s of the invalid constraints,
constrained outputs that finished 'stop' without matching their regex / schema's required
keys, aborts that came too late (the request had finished: completed), retractions.

After the mix: poll (with deadlines) until no request is running or waiting, until every
abandoned session has timed out, then flush the radix cache and check that every KV slot is
free again.

    from soak_driver import run_soak
    figures = run_soak("http://127.0.0.1:30000", requests=300, concurrency=16, seed=0,
                       pid=server_pid)
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

MODEL = "default"

# ---------------------------------------------------------------------------- the workload

SUBJECTS = [
    "photosynthesis",
    "the French Revolution",
    "black holes",
    "compound interest",
    "the water cycle",
    "volcanoes",
    "the Roman Empire",
    "vaccines",
    "jazz music",
    "honeybees",
    "plate tectonics",
    "the internet",
]
TEMPLATES = [
    "Explain {} in two sentences.",
    "What is the most surprising fact about {}?",
    "Give me three quick tips for learning about {}.",
    "Write a short headline about {}.",
]
LONG_TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
    "combined a "
    "screw press with movable metal type, oil-based ink and a mould for casting letters. Before "
    "that, books "
    "in Europe were copied by hand, and a single Bible could take years to finish. Printing "
    "changed the "
    "economics of knowledge: pamphlets, newspapers and journals spread ideas faster than any "
    "authority could "
    "control them, and literacy rose across the continent. "
)
FOLLOW_UPS = ["And why is that?", "Say it again, shorter.", "What else?", "Give one example."]

REGEXES = [
    r"(yes|no|maybe)",
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}",
    r"(red|green|blue)( (red|green|blue)){0,3}",
    r"[A-Z][a-z]{2,8} [0-9]{1,3}",
]
SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 10}, "ok": {"type": "boolean"}},
        "required": ["city", "ok"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}
        },
        "required": ["tags"],
        "additionalProperties": False,
    },
]
BAD_REGEX = "(unclosed"
BAD_SCHEMA = {"type": "object", "properties": {"x": {"type": "no-such-type"}}}


@dataclass
class Spec:
    """One unit of the mix: a generation (or a session's turns) and the fault to inject."""

    index: int
    endpoint: str  # chat | completions | generate | session
    stream: bool
    constraint: str  # none | regex | json_schema | bad_regex | bad_schema
    n: int
    max_tokens: int
    fault: str  # none | disconnect | abort
    prompt: str
    regex: str | None = None
    schema: dict | None = None
    temperature: float = 0.0
    include_usage: bool = False
    ignore_eos: bool = False
    turns: int = 1  # sessions: 1 or 2
    fault_after: int = 1  # events read before a disconnect / abort (streams)
    fault_delay: float = 0.1  # seconds before a non-streamed disconnect / abort
    rid: str = ""


def build_mix(
    count: int, seed: int, long_prompts: float = 0.2, long_outputs: float = 0.08, burst: int = 8
) -> list[Spec]:
    """`count` specs, the same for the same seed (and shares). `long_prompts`: the share of
    prompts 100-350 tokens long; `long_outputs`: the share of requests that decode 48-64
    tokens (ignore_eos, no constraint, no fault), in runs of `burst` consecutive specs (one
    run every burst / long_outputs specs, the first at the start) so that they are admitted
    together and outgrow the decode reservation: retractions."""
    rng = random.Random(seed)
    prompts = [t.format(s) for t in TEMPLATES for s in SUBJECTS]
    specs = []
    for i in range(count):
        r = rng.random()
        endpoint = (
            "chat"
            if r < 0.36
            else "completions"
            if r < 0.6
            else "generate"
            if r < 0.94
            else "session"
        )
        stream = rng.random() < 0.5
        r = rng.random()
        constraint = (
            "none"
            if r < 0.58
            else "regex"
            if r < 0.78
            else "json_schema"
            if r < 0.97
            else "bad_regex"
            if r < 0.985
            else "bad_schema"
        )
        r = rng.random()
        n = 1 if r < 0.8 else 2 if r < 0.95 else 3
        r = rng.random()
        fault = "none" if r < 0.8 else "disconnect" if r < 0.9 else "abort"
        prompt = rng.choice(prompts)
        if (
            rng.random() < long_prompts
        ):  # a long prompt (~100-350 tokens, no shared prefix): KV pressure, retractions
            prompt = f"Note {seed}-{i}. " + LONG_TEXT * rng.randint(1, 4) + prompt
        spec = Spec(
            index=i,
            endpoint=endpoint,
            stream=stream,
            constraint=constraint,
            n=n,
            max_tokens=rng.randint(4, 24),
            fault=fault,
            prompt=prompt,
            temperature=rng.choice([0.0, 0.0, 0.7]),
            include_usage=stream and endpoint in ("chat", "completions") and rng.random() < 0.5,
            fault_after=rng.randint(1, 2),
            fault_delay=rng.uniform(0.02, 0.5),
            rid=f"soak{seed}-{i}",
        )
        if constraint == "regex":
            spec.regex = rng.choice(REGEXES)
        elif constraint == "json_schema":
            spec.schema = rng.choice(SCHEMAS)
        if (
            endpoint == "session"
        ):  # n = 1 turns, no faults, no broken constraints: the session is the point
            spec.n, spec.fault, spec.turns = 1, "none", rng.randint(1, 2)
            if constraint.startswith("bad"):
                spec.constraint = "none"
        if constraint.startswith("bad"):
            spec.fault = "none"
        if long_outputs > 0 and i % max(burst, round(burst / long_outputs)) < burst:
            if spec.endpoint == "session":
                spec.endpoint = "generate"
            spec.constraint, spec.regex, spec.schema, spec.fault = "none", None, None, "none"
            spec.turns, spec.max_tokens, spec.ignore_eos = 1, rng.randint(48, 64), True
        specs.append(spec)
    return specs


# ---------------------------------------------------------------------------- one request


@dataclass
class Outcome:
    kind: str  # e.g. "chat/stream/json_schema"
    outcome: str  # completed | error | aborted | disconnected | broken
    status: int | None = None
    latency: float | None = None
    ttft: float | None = None
    detail: str = ""
    body: Any = None  # the request body (kept for the report when broken or unexpected)
    abort_sent: bool = False
    constraint_violation: bool = False
    finish_reasons: list = field(default_factory=list)


class Broken(Exception):
    """The response was not well formed."""


def _sampling(spec: Spec) -> dict[str, Any]:
    sp: dict[str, Any] = {"max_new_tokens": spec.max_tokens, "temperature": spec.temperature}
    if spec.n > 1:
        sp["n"] = spec.n
    if spec.ignore_eos:
        sp["ignore_eos"] = True
    if spec.constraint == "regex":
        sp["regex"] = spec.regex
    elif spec.constraint == "json_schema":
        sp["json_schema"] = json.dumps(spec.schema)
    elif spec.constraint == "bad_regex":
        sp["regex"] = BAD_REGEX
    elif spec.constraint == "bad_schema":
        sp["json_schema"] = json.dumps(BAD_SCHEMA)
    return sp


def request_body(
    spec: Spec, rid: str | None = None, text: str | None = None, session: dict | None = None
) -> tuple[str, dict[str, Any]]:
    """(path, JSON body) of one generation of `spec`."""
    rid = rid or spec.rid
    if spec.endpoint in ("generate", "session"):
        body: dict[str, Any] = {
            "text": text or spec.prompt,
            "sampling_params": _sampling(spec),
            "stream": spec.stream,
            "rid": rid,
        }
        if session is not None:
            body["session_params"] = session
        return "/generate", body
    body = {
        "model": MODEL,
        "max_tokens": spec.max_tokens,
        "temperature": spec.temperature,
        "n": spec.n,
        "stream": spec.stream,
        "rid": rid,
    }
    if spec.include_usage:
        body["stream_options"] = {"include_usage": True}
    if spec.ignore_eos:
        body["ignore_eos"] = True
    if spec.constraint in ("regex", "bad_regex"):
        body["regex"] = spec.regex if spec.constraint == "regex" else BAD_REGEX
    elif spec.constraint in ("json_schema", "bad_schema"):
        schema = spec.schema if spec.constraint == "json_schema" else BAD_SCHEMA
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "soak", "schema": schema},
        }
    if spec.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": spec.prompt}]
        return "/v1/chat/completions", body
    body["prompt"] = spec.prompt
    return "/v1/completions", body


def _check_error_body(data: Any, status: int) -> str:
    """The OpenAI-style error body's message; Broken if it is not one."""
    if not isinstance(data, dict) or not isinstance(data.get("error"), dict):
        raise Broken(f"HTTP {status} without an OpenAI-style error body: {str(data)[:300]}")
    err = data["error"]
    if (
        set(err) != {"message", "type", "param", "code"}
        or not isinstance(err["message"], str)
        or not err["message"]
    ):
        raise Broken(f"HTTP {status}: malformed error object: {str(err)[:300]}")
    if err["code"] != status:
        raise Broken(f"HTTP {status}: error code {err['code']!r} differs from the status")
    return err["message"]


def _violates(spec: Spec, text: str) -> bool:
    """A choice that finished with 'stop' under a constraint must match it whole."""
    if spec.constraint == "regex":
        return re.fullmatch(spec.regex, text) is None
    if spec.constraint == "json_schema":
        try:
            value = json.loads(text)
        except ValueError:
            return True
        return not isinstance(value, dict) or not set(spec.schema["required"]) <= set(value)
    return False


def _finish_type(reason: Any) -> str | None:
    """'stop' / 'length' / 'abort' of an OpenAI finish_reason or a native meta_info one."""
    if reason is None:
        return None
    if isinstance(reason, dict):
        return reason.get("type")
    return reason


def _check_whole(spec: Spec, path: str, data: Any) -> list[tuple[str | None, str]]:
    """(finish type, text) of each choice of a non-streamed 200 body; Broken if malformed."""
    out = []
    if path == "/generate":
        items = data if isinstance(data, list) else [data]
        if spec.n > 1 and (not isinstance(data, list) or len(data) != spec.n):
            raise Broken(
                f"/generate n={spec.n}: expected a list of {spec.n} results, got {str(data)[:300]}"
            )
        for item in items:
            if not (
                isinstance(item, dict)
                and isinstance(item.get("text"), str)
                and isinstance(item.get("output_ids"), list)
                and isinstance(item.get("meta_info"), dict)
            ):
                raise Broken(f"/generate: malformed result {str(item)[:300]}")
            out.append((_finish_type(item["meta_info"].get("finish_reason")), item["text"]))
    else:
        choices = data.get("choices") if isinstance(data, dict) else None
        if (
            not isinstance(choices, list)
            or len(choices) != spec.n
            or not isinstance(data.get("usage"), dict)
        ):
            raise Broken(f"{path}: expected {spec.n} choices and usage, got {str(data)[:300]}")
        for k, ch in enumerate(sorted(choices, key=lambda c: c.get("index", -1))):
            if ch.get("index") != k:
                raise Broken(f"{path}: choice indices {[c.get('index') for c in choices]}")
            text = (
                (ch.get("message") or {}).get("content")
                if path.endswith("chat/completions")
                else ch.get("text")
            )
            if not isinstance(text, str):
                raise Broken(f"{path}: choice without text: {str(ch)[:300]}")
            out.append((ch.get("finish_reason"), text))
    for reason, _text in out:
        if reason not in ("stop", "length", "abort"):
            raise Broken(f"{path}: a choice without a finish reason ({reason!r})")
    return out


class _Stream:
    """Reads one SSE response event by event and keeps what a finish check needs."""

    def __init__(self, spec: Spec, path: str) -> None:
        self.spec, self.path = spec, path
        self.events = 0
        self.done = False
        self.error: str | None = None
        self.finish: dict[int, str] = {}
        self.texts: dict[int, str] = {}
        self.usage = False
        self.first_at: float | None = None

    def feed(self, payload: str) -> None:
        if self.done:
            raise Broken("an event after [DONE]")
        if payload == "[DONE]":
            self.done = True
            return
        try:
            ev = json.loads(payload)
        except ValueError:
            raise Broken(f"an event that is not JSON: {payload[:200]!r}") from None
        self.events += 1
        if self.first_at is None:
            self.first_at = time.perf_counter()
        if isinstance(ev, dict) and "error" in ev:
            err = ev["error"]
            if (
                not isinstance(err, dict)
                or not isinstance(err.get("message"), str)
                or "code" not in err
            ):
                raise Broken(f"a malformed SSE error event: {payload[:300]}")
            self.error = f"SSE error event {err.get('code')}: {err['message'][:200]}"
            return
        if self.path == "/generate":
            if not (
                isinstance(ev, dict)
                and isinstance(ev.get("text"), str)
                and isinstance(ev.get("meta_info"), dict)
            ):
                raise Broken(f"a malformed /generate event: {payload[:300]}")
            i = ev.get("index", 0)
            if not isinstance(i, int) or not 0 <= i < self.spec.n:
                raise Broken(
                    f"an event whose index is not in range(n={self.spec.n}): {payload[:300]}"
                )
            if i in self.finish:
                raise Broken(f"an event for index {i} after its finish")
            self.texts[i] = ev["text"]  # cumulative
            reason = _finish_type(ev["meta_info"].get("finish_reason"))
            if reason is not None:
                self.finish[i] = reason
            return
        if not isinstance(ev, dict) or not isinstance(ev.get("choices"), list):
            raise Broken(f"a malformed chunk: {payload[:300]}")
        if not ev["choices"]:
            if not isinstance(ev.get("usage"), dict):
                raise Broken(f"a chunk with no choices and no usage: {payload[:300]}")
            self.usage = True
            return
        for ch in ev["choices"]:
            i = ch.get("index") if isinstance(ch, dict) else None
            if not isinstance(i, int) or not 0 <= i < self.spec.n:
                raise Broken(
                    f"a chunk whose choice index is not in range(n={self.spec.n}): {payload[:300]}"
                )
            if i in self.finish:
                raise Broken(f"a chunk for choice {i} after its finish")
            piece = (
                (ch.get("delta") or {}).get("content")
                if self.path.endswith("chat/completions")
                else ch.get("text")
            )
            self.texts[i] = self.texts.get(i, "") + (piece or "")
            if ch.get("finish_reason") is not None:
                self.finish[i] = ch["finish_reason"]

    def check_complete(self) -> None:
        if not self.done:
            raise Broken(
                f"the stream ended without [DONE] after {self.events} events (no error event)"
            )
        if self.error is not None:
            return
        if sorted(self.finish) != list(range(self.spec.n)):
            raise Broken(f"[DONE] with finishes for {sorted(self.finish)} of n={self.spec.n}")
        if self.spec.include_usage and not self.usage:
            raise Broken("stream_options.include_usage without a usage chunk")


async def _sse_lines(resp: aiohttp.ClientResponse):
    """The `data:` payloads of an SSE body; Broken on any other non-blank line."""
    async for raw in resp.content:
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line:
            continue
        if not line.startswith("data: "):
            raise Broken(f"not an SSE data line: {line[:200]!r}")
        yield line[len("data: ") :]


class Driver:
    """Sends specs to one server (one aiohttp session) and classifies every generation."""

    def __init__(
        self,
        url: str,
        session: aiohttp.ClientSession,
        request_timeout: float,
        session_timeout: float,
    ) -> None:
        self.url = url.rstrip("/")
        self.http = session
        self.session_timeout = session_timeout
        self.timeout = aiohttp.ClientTimeout(total=request_timeout)
        self.sessions_opened = 0

    async def abort(self, rid: str) -> None:
        async with self.http.post(
            self.url + "/abort_request", json={"rid": rid}, timeout=self.timeout
        ) as resp:
            if resp.status != 200:
                raise Broken(f"/abort_request answered {resp.status}: {(await resp.text())[:200]}")
            await resp.read()

    async def generation(self, spec: Spec, path: str, body: dict[str, Any], kind: str) -> Outcome:
        """Send one generation with the spec's fault; classify what came back."""
        o = Outcome(kind=kind, outcome="broken", body={"path": path, **body})
        start = time.perf_counter()
        try:
            if spec.fault == "disconnect" and not spec.stream:
                task = asyncio.ensure_future(self._send(spec, path, body, o, start))
                done, _ = await asyncio.wait({task}, timeout=spec.fault_delay)
                if done:
                    return task.result()
                task.cancel()  # aiohttp closes the connection: the server sees the client leave
                await asyncio.wait(
                    {task}
                )  # (not `await task`: our own cancellation must propagate)
                if not task.cancelled():  # it finished while being cancelled
                    return task.result()
                o.outcome = "disconnected"
                return o
            abort_task = None
            if spec.fault == "abort" and not spec.stream:
                abort_task = asyncio.ensure_future(self._abort_later(spec.rid, spec.fault_delay, o))
            try:
                return await self._send(spec, path, body, o, start)
            finally:
                if abort_task is not None:
                    if not o.abort_sent:  # the answer came first: nothing to abort
                        abort_task.cancel()
                    await asyncio.wait({abort_task})
                    if not abort_task.cancelled():
                        abort_task.result()  # a failed /abort_request is Broken
        except Broken as e:
            o.outcome, o.detail = "broken", str(e)
        except TimeoutError:
            o.outcome, o.detail = "broken", f"timed out after {time.perf_counter() - start:.1f}s"
        except aiohttp.ClientError as e:
            o.outcome, o.detail = "broken", f"{type(e).__name__}: {e}"
        return o

    async def _abort_later(self, rid: str, delay: float, o: Outcome) -> None:
        await asyncio.sleep(delay)  # a fault injected at a random moment, not a synchronization
        o.abort_sent = True
        await self.abort(rid)

    async def _send(
        self, spec: Spec, path: str, body: dict[str, Any], o: Outcome, start: float
    ) -> Outcome:
        async with self.http.post(self.url + path, json=body, timeout=self.timeout) as resp:
            o.status = resp.status
            if resp.status >= 400:
                raw = await resp.read()
                try:
                    data = json.loads(raw)
                except ValueError:
                    raise Broken(
                        f"HTTP {resp.status} with a body that is not JSON: {raw[:200]!r}"
                    ) from None
                o.detail = _check_error_body(data, resp.status)
                o.outcome, o.latency = "error", time.perf_counter() - start
                return o
            if resp.status != 200:
                raise Broken(f"HTTP {resp.status}: {(await resp.read())[:200]!r}")
            if not spec.stream:
                raw = await resp.read()
                try:
                    data = json.loads(raw)
                except ValueError:
                    raise Broken(f"a 200 body that is not JSON: {raw[:200]!r}") from None
                return self._finish(spec, o, _check_whole(spec, path, data), start)
            if not resp.headers.get("Content-Type", "").startswith("text/event-stream"):
                raise Broken(
                    f"a stream answered with Content-Type {resp.headers.get('Content-Type')!r}"
                )
            st = _Stream(spec, path)
            async for payload in _sse_lines(resp):
                st.feed(payload)
                if st.done or st.error:
                    continue
                if spec.fault == "disconnect" and st.events >= spec.fault_after:
                    resp.close()  # drop the connection mid-stream
                    o.outcome = "disconnected"
                    return o
                if spec.fault == "abort" and not o.abort_sent and st.events >= spec.fault_after:
                    o.abort_sent = True
                    await self.abort(spec.rid)
            st.check_complete()
            if st.first_at is not None:
                o.ttft = st.first_at - start
            if st.error is not None:
                o.outcome, o.detail, o.latency = "error", st.error, time.perf_counter() - start
                return o
            return self._finish(
                spec, o, [(st.finish[i], st.texts.get(i, "")) for i in range(spec.n)], start
            )

    def _finish(
        self, spec: Spec, o: Outcome, choices: list[tuple[str | None, str]], start: float
    ) -> Outcome:
        o.latency = time.perf_counter() - start
        o.finish_reasons = [r for r, _ in choices]
        if any(r == "abort" for r, _ in choices):
            if not o.abort_sent:
                raise Broken(f"finish_reason abort on a request nobody aborted: {o.finish_reasons}")
            o.outcome = "aborted"
            return o
        o.constraint_violation = any(r == "stop" and _violates(spec, text) for r, text in choices)
        if o.constraint_violation:
            o.detail = f"constrained output does not match: {[t for _, t in choices]!r}"
        o.outcome = "completed"
        return o

    async def run_spec(self, spec: Spec) -> list[Outcome]:
        constraint = spec.constraint if spec.constraint != "none" else "plain"
        mode = "stream" if spec.stream else "whole"
        if spec.endpoint != "session":
            path, body = request_body(spec)
            return [await self.generation(spec, path, body, f"{spec.endpoint}/{mode}/{constraint}")]
        return await self._session(spec, f"session/{mode}/{constraint}")

    async def _session(self, spec: Spec, kind: str) -> list[Outcome]:
        """Open a session with a short timeout, run a turn or two in it, never close it."""
        body = {"capacity_tokens": 1024, "timeout": self.session_timeout}
        async with self.http.post(
            self.url + "/open_session", json=body, timeout=self.timeout
        ) as resp:
            raw = await resp.read()
            if resp.status != 200:
                o = Outcome(
                    kind="session/open",
                    outcome="broken",
                    status=resp.status,
                    body={"path": "/open_session", **body},
                )
                try:
                    o.detail = _check_error_body(json.loads(raw), resp.status)
                    o.outcome = "error"
                except (ValueError, Broken) as e:
                    o.detail = str(e)
                return [o]
            sid = json.loads(raw)
        if not isinstance(sid, str):
            return [
                Outcome(
                    kind="session/open",
                    outcome="broken",
                    detail=f"/open_session returned {sid!r}",
                    body={"path": "/open_session", **body},
                )
            ]
        self.sessions_opened += 1
        outs: list[Outcome] = []
        prev: str | None = None
        for turn in range(spec.turns):
            rid = f"{spec.rid}-t{turn}"
            text = spec.prompt if turn == 0 else " " + FOLLOW_UPS[spec.index % len(FOLLOW_UPS)]
            sess = {"id": sid} if prev is None else {"id": sid, "rid": prev}
            path, body = request_body(spec, rid=rid, text=text, session=sess)
            o = await self.generation(spec, path, body, kind)
            outs.append(o)
            if o.outcome != "completed":
                break
            prev = rid
        return outs


# ---------------------------------------------------------------------------- the server's state


def proc_status(pid: int) -> dict[str, int]:
    """Threads and resident memory (kB) of a process, from /proc/<pid>/status."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key == "Threads":
            out["threads"] = int(value)
        elif key == "VmRSS":
            out["rss_kb"] = int(value.split()[0])
    return out


async def server_info(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(url + "/get_server_info", timeout=aiohttp.ClientTimeout(total=60)) as resp:
        resp.raise_for_status()
        return await resp.json()


async def poll(what: str, check, timeout: float, interval: float = 0.2) -> tuple[bool, float, Any]:
    """Call the async `check()` until it returns (True, value) or `timeout` seconds pass:
    (ok, seconds taken, the last value)."""
    t0 = time.monotonic()
    while True:
        ok, value = await check()
        if ok or time.monotonic() - t0 > timeout:
            return ok, time.monotonic() - t0, value
        await asyncio.sleep(interval)


async def flush(http: aiohttp.ClientSession, url: str, timeout: float = 60.0) -> bool:
    async def once():
        async with http.post(url + "/flush_cache", timeout=aiohttp.ClientTimeout(total=60)) as resp:
            resp.raise_for_status()
            return bool((await resp.json())["success"]), None

    ok, _, _ = await poll("flush", once, timeout)
    return ok


# ---------------------------------------------------------------------------- the run


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


async def drive(
    url: str,
    requests: int,
    concurrency: int,
    seed: int,
    session_timeout: float = 3.0,
    max_seconds: float | None = None,
    request_timeout: float = 1200.0,
    settle_timeout: float = 120.0,
    samples: int = 20,
    long_prompts: float = 0.2,
    long_outputs: float = 0.08,
    burst: int = 8,
    pid: int | None = None,
    sample_every: float = 30.0,
    progress: bool = False,
) -> dict[str, Any]:
    """The mix, then the settle checks; the figures (see the module docstring). With `pid`,
    the server process's RSS and threads every `sample_every` seconds of the mix."""
    url = url.rstrip("/")
    specs = build_mix(requests, seed, long_prompts, long_outputs, burst)
    trend: list[dict[str, Any]] = []
    outcomes: list[Outcome] = []
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as http:
        flushed_before = await flush(http, url, settle_timeout)  # start from an empty radix cache
        before = await server_info(http, url)
        driver = Driver(url, http, request_timeout, session_timeout)
        queue: asyncio.Queue[Spec] = asyncio.Queue()
        for s in specs:
            queue.put_nowait(s)
        t0 = time.perf_counter()
        deadline = None if max_seconds is None else t0 + max_seconds
        sent = 0

        async def worker() -> None:
            nonlocal sent
            while True:
                if deadline is not None and time.perf_counter() > deadline:
                    return
                try:
                    spec = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                sent += 1
                outcomes.extend(await driver.run_spec(spec))

        async def monitor() -> None:
            while True:
                await asyncio.sleep(sample_every)  # a sampling period, not a synchronization
                st = proc_status(pid) if pid is not None else {}
                point = {
                    "t_s": round(time.perf_counter() - t0, 1),
                    "generations": len(outcomes),
                    "broken": sum(o.outcome == "broken" for o in outcomes),
                }
                if st:
                    point.update(rss_mb=round(st["rss_kb"] / 1024, 1), threads=st["threads"])
                trend.append(point)
                if progress:
                    print("  " + ", ".join(f"{k} {v}" for k, v in point.items()), flush=True)

        watcher = asyncio.ensure_future(monitor())
        try:
            await asyncio.gather(*(worker() for _ in range(concurrency)))
        finally:
            watcher.cancel()
        duration = time.perf_counter() - t0

        # -- settle: idle, sessions gone, pool whole after a flush
        async def idle():
            info = await server_info(http, url)
            return info["num_running_reqs"] == 0 and info["num_waiting_reqs"] == 0, info

        idle_ok, idle_s, info = await poll("idle", idle, settle_timeout)
        open_after_mix = info["num_open_sessions"]
        locked_after_mix = info.get("session_locked_tokens")

        async def no_sessions():
            info = await server_info(http, url)
            return info["num_open_sessions"] == 0, info

        sess_ok, sess_s, info = await poll(
            "sessions", no_sessions, session_timeout + settle_timeout
        )
        flushed = await flush(http, url)
        after = await server_info(http, url)

    counts: dict[str, int] = {
        k: 0 for k in ("completed", "error", "aborted", "disconnected", "broken")
    }
    by_kind: dict[str, dict[str, int]] = {}
    errors_by_status: dict[str, int] = {}
    for o in outcomes:
        counts[o.outcome] += 1
        by_kind.setdefault(o.kind, {}).setdefault(o.outcome, 0)
        by_kind[o.kind][o.outcome] += 1
        if o.outcome == "error":
            key = str(o.status) if o.status and o.status >= 400 else "sse_error_event"
            errors_by_status[key] = errors_by_status.get(key, 0) + 1
    expected_error = [o for o in outcomes if o.outcome == "error" and "/bad_" in o.kind]
    unexpected_errors = [o for o in outcomes if o.outcome == "error" and "/bad_" not in o.kind]
    bad_kinds_not_400 = [
        o for o in outcomes if "/bad_" in o.kind and not (o.outcome == "error" and o.status == 400)
    ]
    done = [o for o in outcomes if o.outcome == "completed"]
    ttft = [o.ttft for o in done if o.ttft is not None]
    lat = [o.latency for o in done if o.latency is not None]
    abort_sent = [o for o in outcomes if o.abort_sent]

    def sample(o: Outcome) -> dict[str, Any]:
        return {
            "kind": o.kind,
            "outcome": o.outcome,
            "status": o.status,
            "detail": o.detail,
            "request": o.body,
        }

    ms = lambda x: None if x is None else round(1000 * x, 1)  # noqa: E731
    figures: dict[str, Any] = {
        "config": {
            "requests": requests,
            "concurrency": concurrency,
            "seed": seed,
            "session_timeout_s": session_timeout,
            "max_seconds": max_seconds,
            "request_timeout_s": request_timeout,
            "long_prompts": long_prompts,
            "long_outputs": long_outputs,
            "burst": burst,
        },
        "specs_sent": sent,
        "stopped_early": sent < len(specs),
        "generations": len(outcomes),
        "duration_s": round(duration, 2),
        "generations_per_s": round(len(outcomes) / duration, 2) if duration else None,
        "outcomes": counts,
        "vanished_or_broken": counts["broken"],
        "broken_client_timeouts": sum(
            1 for o in outcomes if o.outcome == "broken" and o.detail.startswith("timed out")
        ),
        "by_kind": dict(sorted(by_kind.items())),
        "errors_by_status": errors_by_status,
        "expected_errors": len(expected_error),  # invalid constraints answered 400
        "unexpected_errors": len(unexpected_errors),
        "invalid_not_400": len(bad_kinds_not_400),
        "server_errors_5xx": sum(1 for o in outcomes if o.status is not None and o.status >= 500)
        + sum(1 for o in outcomes if o.outcome == "error" and " 500:" in o.detail),
        "aborts_sent": len(abort_sent),
        "aborts_finished_abort": sum(1 for o in abort_sent if o.outcome == "aborted"),
        "aborts_too_late": sum(1 for o in abort_sent if o.outcome == "completed"),
        "sessions_opened": driver.sessions_opened,
        "constraint_violations": sum(1 for o in outcomes if o.constraint_violation),
        "latency_ms": {
            "e2e_p50": ms(_pct(lat, 50)),
            "e2e_p99": ms(_pct(lat, 99)),
            "ttft_p50": ms(_pct(ttft, 50)),
            "ttft_p99": ms(_pct(ttft, 99)),
        },
        "retractions": after["retractions"] - before["retractions"],
        "max_total_tokens": after["max_total_tokens"],
        "kv_free_before": before["available_kv_tokens"],  # after a flush
        "flush_before_ok": flushed_before,
        "kv_free_after_flush": after["available_kv_tokens"],
        "idle_after_mix": idle_ok,
        "idle_wait_s": round(idle_s, 2),
        "open_sessions_after_mix": open_after_mix,
        "session_locked_tokens_after_mix": locked_after_mix,
        "open_sessions_final": after["num_open_sessions"],
        "sessions_expired_wait_s": round(sess_s, 2),
        "flush_ok": flushed,
        "checks": {
            "no_vanished_or_broken": counts["broken"] == 0,
            "idle_after_mix": idle_ok,
            "no_open_sessions_after_timeout": sess_ok and after["num_open_sessions"] == 0,
            "kv_pool_full_after_flush": flushed
            and after["available_kv_tokens"] == after["max_total_tokens"],
        },
        "broken_samples": [sample(o) for o in outcomes if o.outcome == "broken"][:samples],
        "unexpected_error_samples": [sample(o) for o in unexpected_errors][:samples],
        "constraint_violation_samples": [sample(o) for o in outcomes if o.constraint_violation][
            :samples
        ],
        "trend": trend,
    }
    return figures


def run_soak(
    url: str, requests: int, concurrency: int, seed: int = 0, pid: int | None = None, **kwargs: Any
) -> dict[str, Any]:
    """`drive` in a fresh event loop; with `pid`, the server process's threads and RSS at the
    start and at the end (after the settle checks)."""
    start = proc_status(pid) if pid is not None else None
    figures = asyncio.run(drive(url, requests, concurrency, seed, pid=pid, **kwargs))
    if pid is not None:
        end = proc_status(pid)
        figures["process"] = {
            "pid": pid,
            "threads_start": start["threads"],
            "threads_end": end["threads"],
            "rss_mb_start": round(start["rss_kb"] / 1024, 1),
            "rss_mb_end": round(end["rss_kb"] / 1024, 1),
        }
    return figures


def summary_lines(f: dict[str, Any]) -> list[str]:
    """A few human-readable lines of a run's figures."""
    c = f["outcomes"]
    lines = [
        f"{f['generations']} generations from {f['specs_sent']} specs in {f['duration_s']:.1f}s "
        f"({f['generations_per_s']}/s)"
        f"{' (stopped early: --max-seconds)' if f['stopped_early'] else ''}",
        f"outcomes: completed {c['completed']}, error {c['error']} (expected "
        f"{f['expected_errors']}, "
        f"unexpected {f['unexpected_errors']}, 5xx {f['server_errors_5xx']}), aborted "
        f"{c['aborted']}, "
        f"disconnected {c['disconnected']}, vanished/broken {c['broken']} "
        f"(of which client timeouts {f['broken_client_timeouts']})",
        f"aborts sent {f['aborts_sent']} (finished abort {f['aborts_finished_abort']}, "
        f"too late {f['aborts_too_late']}); "
        f"sessions opened {f['sessions_opened']}; constraint violations "
        f"{f['constraint_violations']}; "
        f"retractions {f['retractions']}",
        f"latency ms: e2e p50 {f['latency_ms']['e2e_p50']} p99 {f['latency_ms']['e2e_p99']}, "
        f"TTFT p50 {f['latency_ms']['ttft_p50']} p99 {f['latency_ms']['ttft_p99']}",
        f"KV free: before {f['kv_free_before']}, after flush {f['kv_free_after_flush']} of "
        f"{f['max_total_tokens']}; "
        f"open sessions after the mix {f['open_sessions_after_mix']}, final "
        f"{f['open_sessions_final']} "
        f"(waited {f['sessions_expired_wait_s']}s)",
    ]
    if "process" in f:
        p = f["process"]
        lines.append(
            f"server process: threads {p['threads_start']} -> {p['threads_end']}, "
            f"RSS {p['rss_mb_start']} -> {p['rss_mb_end']} MB"
        )
    lines.append(
        "checks: " + ", ".join(f"{k} {'OK' if v else 'FAILED'}" for k, v in f["checks"].items())
    )
    return lines


# ---------------------------------------------------------------------------- results


RELIABILITY = Path(__file__).resolve().parent / "results" / "reliability.json"


def write_reliability(key: str, data: dict[str, Any], path: Path | None = None) -> Path:
    """Merge `{key: data}` into benchmarks/results/reliability.json (or `path`): the other
    keys of an existing file are kept; `data` gets the machine info of this run."""
    from common import machine_info

    path = Path(path) if path is not None else RELIABILITY
    existing: dict[str, Any] = {}
    if path.exists():
        try:
            existing = json.loads(path.read_text())
        except ValueError:
            existing = {}
    existing["benchmark"] = "reliability"
    existing[key] = {"machine": machine_info(), **data}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(existing, indent=2))
    os.replace(tmp, path)
    print(f"\nwrote {path} (key {key!r})")
    return path


# ---------------------------------------------------------------------------- a server subprocess


def server_env() -> dict[str, str]:
    """The environment variables that change the server's speed or memory (threads, allocator)."""
    keys = (
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "OMP_WAIT_POLICY",
        "ONEDNN_PRIMITIVE_CACHE_CAPACITY",
        "MALLOC_ARENA_MAX",
        "MALLOC_MMAP_THRESHOLD_",
        "MALLOC_TRIM_THRESHOLD_",
        "LD_PRELOAD",
    )
    return {k: os.environ[k] for k in keys if k in os.environ}


class ServerProcess:
    """`python -m sgl.launch_server ARGS --host 127.0.0.1 --port <free>`, its output in a log
    file; `start()` waits for /health (with a deadline), `stop()` sends SIGTERM (then SIGKILL)."""

    def __init__(
        self, args: list[str], log_path: str | Path, env: dict[str, str] | None = None
    ) -> None:
        self.args = list(args)
        self.log_path = Path(log_path)
        self.env = {**os.environ, **(env or {})}
        self.proc: Any = None
        self.url = ""

    @staticmethod
    def supports(flag: str) -> bool:
        """Whether this checkout's launch_server knows `flag` (from its --help)."""
        import subprocess
        import sys

        out = subprocess.run(
            [sys.executable, "-m", "sgl.launch_server", "--help"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        return flag in out.stdout

    def start(self, timeout: float = 600.0) -> str:
        import socket
        import subprocess
        import sys
        import urllib.request

        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "w")
        cmd = [
            sys.executable,
            "-m",
            "sgl.launch_server",
            *self.args,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        print("starting: " + " ".join(cmd), flush=True)
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the server exited with {self.proc.returncode} before it was healthy; "
                    f"its log:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return self.url
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"the server was not healthy within {timeout:.0f}s; its log:\n{self.log_tail()}"
                )
            time.sleep(0.5)  # polling /health with a deadline

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout: float = 90.0) -> int | None:
        """SIGTERM and wait (the server drains, then exits 0); SIGKILL past `timeout`. The exit
        code."""
        import signal
        import subprocess

        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def log_problems(self, limit: int = 20) -> tuple[int, list[str]]:
        """Lines of the server's log at ERROR/CRITICAL, or tracebacks: (count, the first
        `limit`)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return 0, []
        hits = [
            ln
            for ln in text.splitlines()
            if " ERROR " in ln
            or " CRITICAL " in ln
            or ln.startswith("Traceback")
            or "incident" in ln
        ]
        return len(hits), hits[:limit]
