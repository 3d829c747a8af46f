"""Sessions: a client's multi-turn history kept by the engine, its KV pinned in the radix cache.

A session records each of its finished requests ("turns") by rid, as the token ids the
model saw and produced (prompt + output, SGLang's semantics: stop tokens included). A
request with `session_params={"id": sid, "rid": earlier}` sends only its new input; the
engine prepends that turn's tokens. Every finished turn's KV stays locked in the radix
tree until the session closes or sits idle past its timeout, so the next turn recomputes
nothing even while other traffic evicts the cache. A request with no `rid` starts from
its own input and still gets its KV pinned: that is how program states use sessions.

Only the scheduler thread touches sessions: callers open and close them with messages
(runtime/messages.py), and a turn's history is prepended when the scheduler receives the
request, which it then checks for fit like any other prompt.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from sgl.runtime.errors import InvalidRequestError, NotFoundError

DEFAULT_SESSION_TIMEOUT = 600.0  # seconds a session may sit idle before it closes itself
MAX_SESSION_TIMEOUT = 86400.0
# Open sessions may pin at most this share of the KV pool; past it, the least recently used
# ones are unpinned (they stay open), so idle sessions cannot starve new traffic.
MAX_PINNED_SHARE = 0.5


@dataclass
class SessionParams:
    """Which session a request belongs to and which earlier turn (rid) it continues.

    `offset` keeps only that many tokens of the history (Python slice semantics) before the
    new input; `drop_previous_output` continues from the earlier turn's prompt alone.
    """

    id: str
    rid: str | None = None
    offset: int | None = None
    drop_previous_output: bool = False

    @classmethod
    def from_any(cls, value: Any) -> SessionParams:
        if isinstance(value, SessionParams):
            return value
        if not isinstance(value, dict):
            raise InvalidRequestError(
                "session_params must be an object {id, rid?, offset?, drop_previous_output?}",
                "session_params",
            )
        unknown = sorted(set(value) - {"id", "rid", "offset", "drop_previous_output", "replace"})
        if unknown:
            raise InvalidRequestError(
                f"session_params has unknown field(s) {unknown}; valid: id, rid, offset, "
                "drop_previous_output",
                "session_params",
            )
        if value.get("replace") not in (None, False):  # SGLang clients send replace: false
            raise InvalidRequestError(
                "session_params.replace is not supported; send false or leave it out",
                "session_params.replace",
            )
        sid = value.get("id")
        if not isinstance(sid, str) or not sid:
            raise InvalidRequestError(
                "session_params.id must be the id /open_session returned", "session_params.id"
            )
        rid = value.get("rid")
        if rid is not None and not isinstance(rid, str):
            raise InvalidRequestError(
                "session_params.rid must be a request id (string) or null", "session_params.rid"
            )
        offset = value.get("offset")
        if offset is not None and (not isinstance(offset, int) or isinstance(offset, bool)):
            raise InvalidRequestError(
                "session_params.offset must be an integer", "session_params.offset"
            )
        drop = value.get("drop_previous_output", False)
        if not isinstance(drop, bool):
            raise InvalidRequestError(
                "session_params.drop_previous_output must be true or false",
                "session_params.drop_previous_output",
            )
        return cls(sid, rid, offset or None, drop)  # offset 0 keeps the whole history, as SGLang


@dataclass
class _Turn:
    prompt_ids: list[int]
    output_ids: list[int]


@dataclass
class Session:
    id: str
    capacity: (
        int | None
    )  # most tokens (history + input + max_new_tokens) one turn may use; None: the context
    timeout: float
    last_used: float = field(default_factory=time.monotonic)
    turns: dict[str, _Turn] = field(default_factory=dict)


class SessionRegistry:
    """The open sessions and their finished turns (scheduler thread only)."""

    def __init__(self, context_len: int) -> None:
        self.context_len = context_len
        self._sessions: dict[str, Session] = {}

    def open(
        self,
        capacity_tokens: int | None = None,
        session_id: str | None = None,
        timeout: float | None = None,
    ) -> str:
        if capacity_tokens is not None and (
            not isinstance(capacity_tokens, int)
            or isinstance(capacity_tokens, bool)
            or capacity_tokens < 1
        ):
            raise InvalidRequestError(
                f"capacity_tokens must be a positive integer, got {capacity_tokens!r}",
                "capacity_tokens",
            )
        if timeout is not None and (
            not isinstance(timeout, (int, float))
            or isinstance(timeout, bool)
            or not 0 < timeout <= MAX_SESSION_TIMEOUT
        ):
            raise InvalidRequestError(
                f"timeout must be a number of seconds in (0, {MAX_SESSION_TIMEOUT:.0f}], got "
                f"{timeout!r}",
                "timeout",
            )
        if session_id is not None and (not isinstance(session_id, str) or not session_id):
            raise InvalidRequestError("session_id must be a non-empty string", "session_id")
        sid = session_id or uuid.uuid4().hex
        if capacity_tokens is not None and capacity_tokens > self.context_len:
            raise InvalidRequestError(
                f"capacity_tokens {capacity_tokens} exceeds the context length {self.context_len}",
                "capacity_tokens",
            )
        if sid in self._sessions:
            raise InvalidRequestError(
                f"session {sid!r} is already open; close it or pick another id", "session_id"
            )
        self._sessions[sid] = Session(
            sid, capacity_tokens, float(timeout or DEFAULT_SESSION_TIMEOUT)
        )
        return sid

    def close(self, sid: str) -> bool:
        """Forget the session; False if no such session is open. The scheduler then aborts its
        unfinished turns and drops its radix locks."""
        return self._sessions.pop(sid, None) is not None

    def resolve(
        self,
        params: SessionParams,
        new_ids: list[int],
        max_new_tokens: int,
        bos_token_id: int | None,
    ) -> list[int]:
        """The full prompt of a request in a session: the continued turn's tokens + `new_ids`."""
        s = self._sessions.get(params.id)
        if s is None:
            raise NotFoundError(
                f"no open session {params.id!r} (closed, timed out, never opened, or lost in a "
                "server restart); "
                "call /open_session",
                "session_params.id",
            )
        s.last_used = time.monotonic()
        history: list[int] = []
        if params.rid is not None:
            turn = s.turns.get(params.rid)
            if turn is None:
                raise InvalidRequestError(
                    f"session {params.id!r} has no finished request {params.rid!r}; a request can "
                    "be continued "
                    "once it has finished",
                    "session_params.rid",
                )
            history = (
                list(turn.prompt_ids)
                if params.drop_previous_output
                else turn.prompt_ids + turn.output_ids
            )
            if new_ids and bos_token_id is not None and new_ids[0] == bos_token_id:
                new_ids = new_ids[1:]  # the history already starts with it
        if params.offset is not None:
            if abs(params.offset) > len(history):
                raise InvalidRequestError(
                    f"session_params.offset {params.offset} is outside the history of "
                    f"{len(history)} tokens",
                    "session_params.offset",
                )
            history = history[: params.offset]
        ids = history + new_ids
        if s.capacity is not None and len(ids) + max_new_tokens > s.capacity:
            raise InvalidRequestError(
                f"session {params.id!r} was opened with capacity_tokens {s.capacity}; this turn "
                "needs "
                f"{len(ids)} tokens of history and input + max_new_tokens {max_new_tokens}; lower "
                "max_new_tokens "
                "or open the session with a larger capacity_tokens",
                "max_new_tokens",
            )
        return ids

    def record(self, sid: str, rid: str, prompt_ids: list[int], output_ids: list[int]) -> bool:
        """A turn finished: keep its tokens for continuation. False if the session is gone."""
        s = self._sessions.get(sid)
        if s is None:
            return False
        s.turns[rid] = _Turn(list(prompt_ids), list(output_ids))
        s.last_used = time.monotonic()
        return True

    def expire(self, busy: set[str], now: float | None = None) -> list[str]:
        """Close sessions idle past their timeout; returns their ids. A session with a turn
        queued or running (`busy`) is in use, not idle."""
        now = time.monotonic() if now is None else now
        for sid in busy:
            if sid in self._sessions:
                self._sessions[sid].last_used = now
        gone = [sid for sid, s in self._sessions.items() if now - s.last_used > s.timeout]
        for sid in gone:
            del self._sessions[sid]
        return gone

    def last_used(self, sid: str) -> float:
        s = self._sessions.get(sid)
        return s.last_used if s is not None else 0.0

    def __contains__(self, sid: str) -> bool:
        return sid in self._sessions

    def __len__(self) -> int:
        return len(self._sessions)


class SessionLocks:
    """The radix-tree locks that pin each open session's turns (scheduler thread only)."""

    def __init__(self, tree: Any) -> None:
        self.tree = tree
        self._locks: dict[str, list[Any]] = {}  # session id -> locked tree nodes, one per turn

    def pin(self, sid: str, token_ids: list[int]) -> None:
        """Lock the cached prefix of `token_ids` (a finished turn, just inserted into the tree)."""
        if not self.tree.shares_prefixes:
            return
        _, node = self.tree.match_prefix(token_ids)
        if node is self.tree.root:
            return
        self.tree.inc_lock_ref(node)
        self._locks.setdefault(sid, []).append(node)

    def release(self, sid: str) -> None:
        for node in self._locks.pop(sid, []):
            self.tree.dec_lock_ref(node)

    def release_all(self) -> None:
        for sid in list(self._locks):
            self.release(sid)

    def sessions(self) -> list[str]:
        return list(self._locks)

    def locked_tokens(self) -> int:
        """Tokens pinned by sessions (each tree node counted once)."""
        seen: set[int] = set()
        total = 0
        for nodes in self._locks.values():
            for node in nodes:
                cur = node
                while cur is not None and cur is not self.tree.root and id(cur) not in seen:
                    seen.add(id(cur))
                    total += len(cur.key)
                    cur = cur.parent
        return total
