"""Errors raised for what a caller sent or asked at the wrong time. The server maps each to its
HTTP `status` with `param` (the engine raises them; nothing here knows HTTP beyond the number)."""

from __future__ import annotations

import uuid


def new_incident_id() -> str:
    """A short id that ties an error a client sees to the log entry with its traceback."""
    return uuid.uuid4().hex[:12]


def _rebuilt(cls: type, message: str, state: dict) -> BaseException:
    """An error of `cls` from its message and attributes, without calling its `__init__`
    (whose arguments differ from what `Exception.args` holds)."""
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.__dict__.update(state)
    return error


class _PlainDataError(Exception):
    """Pickles as (class, message, attributes): errors cross from the scheduler process to
    its callers unchanged (the default pickling calls `__init__(*args)` with the formatted
    message, which doubles it or drops `param`)."""

    def __reduce__(self) -> tuple:
        return _rebuilt, (type(self), str(self), dict(self.__dict__))


class InvalidRequestError(_PlainDataError, ValueError):
    """A request field is invalid. `param` names the field; the message says how to fix it."""

    status = 400

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class NotFoundError(InvalidRequestError):
    """The request names something that does not exist (a session closed, expired, or lost in a
    restart)."""

    status = 404


class RequestTooLargeError(InvalidRequestError):
    """The request is over a configured size limit (prompt tokens, max_new_tokens, n, top
    logprobs)."""

    status = 413


class EngineOverloadedError(InvalidRequestError):
    """Too many requests are waiting: retry after `retry_after` seconds."""

    status = 429

    def __init__(self, message: str, param: str | None = None, retry_after: int = 1) -> None:
        super().__init__(message, param)
        self.retry_after = retry_after


class EngineUnavailableError(InvalidRequestError):
    """The engine takes no new requests: it failed (see `incident`) or is shutting down."""

    status = 503

    def __init__(self, message: str, incident: str | None = None, retry_after: int = 5) -> None:
        super().__init__(message, None)
        self.incident = incident
        self.retry_after = retry_after


class EngineFault(_PlainDataError, RuntimeError):
    """An internal error inside the scheduler loop; `incident` names its log entry."""

    def __init__(self, incident: str) -> None:
        super().__init__(f"engine step failed (incident {incident})")
        self.incident = incident


class EngineDeadError(_PlainDataError, RuntimeError):
    """A scheduler process exited while the engine was running: every waiting and later call
    fails with it (`incident` names the log entry with the exit code)."""

    def __init__(self, message: str, incident: str) -> None:
        super().__init__(f"{message} (incident {incident})")
        self.incident = incident
