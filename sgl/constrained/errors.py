"""The one error type of constrained decoding.

A bad regex, JSON schema or grammar is bad *user input*: it must reach the client as a
400 that names the sampling parameter and says what to change, and it must never get
as far as the scheduler loop. Subclassing ValueError keeps it inside the project's
"bad input -> ValueError with .param" convention without importing the runtime.
"""

from __future__ import annotations

__all__ = ["GrammarError", "ConstraintTooLarge"]


class GrammarError(ValueError):
    """A constraint cannot be compiled, or uses a feature that cannot be enforced exactly.

    ``param`` is the sampling parameter at fault: ``"regex"``, ``"json_schema"`` or
    ``"ebnf"``. The message names the offending keyword or construct and the fix.
    """

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def __reduce__(self):  # keep ``param`` across pickling (process pools, futures)
        return (type(self), (self.message, self.param))


class ConstraintTooLarge(GrammarError):
    """A constraint past a size, time or memory limit of one compilation route (the regex
    automaton); the compiler may try another route (a grammar) before giving up."""
