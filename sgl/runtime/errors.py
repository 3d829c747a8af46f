"""Errors raised for bad user input. The server maps them to HTTP 400 with `param`."""

from __future__ import annotations


class InvalidRequestError(ValueError):
    """A request field is invalid. `param` names the field; the message says how to fix it."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
