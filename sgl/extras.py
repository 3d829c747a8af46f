"""Which optional extra a part of sgl needs, and the error that says how to install it.

The bare package (`pip install sgl`) is the frontend and its clients: programs run against a
server (`RuntimeEndpoint`) or an OpenAI-compatible API with only `requests` and `tqdm`. The
in-process engine needs `sgl[runtime]` (torch, transformers, the constraint compilers), the
server `sgl[server]`. A missing one is named with the command that installs it, not left as
a bare ModuleNotFoundError from deep inside an import.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class MissingExtraError(ImportError):
    """A part of sgl was asked for whose optional dependencies are not installed."""


@contextlib.contextmanager
def needs_extra(extra: str, what: str) -> Iterator[None]:
    """Re-raise a third-party ModuleNotFoundError inside the block as a MissingExtraError that
    names ``extra``; a missing module of sgl itself is a bug and passes through unchanged."""
    try:
        yield
    except ModuleNotFoundError as exc:
        root = (exc.name or "").split(".")[0]
        if not root or root == "sgl":
            raise
        raise MissingExtraError(
            f"{what} needs the Python package {root!r}, which sgl installs with its {extra!r} "
            "extra: "
            f"pip install 'sgl[{extra}]'"
        ) from exc
