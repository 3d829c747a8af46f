"""Backends programs run against: the in-process engine, or a server over HTTP."""

from sgl.lang.backends.base import Backend

__all__ = ["Backend"]
