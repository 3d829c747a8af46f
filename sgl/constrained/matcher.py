"""The contract between a compiled constraint and the engine, and the bitmask helpers.

A :class:`Grammar` is compiled once, is immutable and is shared by every request that
uses the same constraint; each request gets its own :class:`Matcher`. The engine only
ever talks to these two shapes, so regex/JSON-schema grammars
(:mod:`sgl.constrained.regex`) and EBNF grammars (:mod:`sgl.constrained.ebnf`) are
interchangeable. They are Protocols rather than base classes so that either side can
be written without importing the other.

Masks are packed bitmasks: row ``[ceil(V/32)]`` of int32, bit ``id % 32`` of word
``id // 32`` set for an allowed token. One word covers 32 tokens, so a 49k vocabulary
costs 6 KB a row and a batch can be expanded to booleans in one vectorised op.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

__all__ = ["Grammar", "Matcher", "allocate_bitmask", "bitmask_to_bool", "apply_bitmask_"]


@runtime_checkable
class Matcher(Protocol):
    """Per-request constraint state."""

    def fill_mask(self, row: torch.Tensor, budget: int | None = None) -> None:
        """Set bit (id % 32) of word (id // 32) of ``row`` for every allowed id.

        ``row`` is zeroed by the caller. EOS ids are allowed exactly in accepting
        states; tokens without bytes (specials) never are. ``budget`` (tokens left,
        this one included): a matcher that knows its distances to acceptance allows
        only tokens after which a complete member still fits, when one does; others
        may ignore it.
        """

    def accept(self, token_id: int) -> bool:
        """Advance by one token; False, with the state unchanged, if it is not allowed."""

    def is_accepting(self) -> bool:
        """The text so far is a complete member of the language."""

    def is_done(self) -> bool:
        """EOS was accepted, or the text is accepting and no non-EOS token is allowed."""

    def forced_text(self) -> str:
        """Jump-forward text: what every continuation must start with ("" if nothing)."""

    def completion_fits(self, budget: int) -> bool:
        """Whether a complete member (EOS included where one is needed) still fits in
        ``budget`` more tokens from here, as far as the matcher knows its distances (those
        that do not always say True). Jump-forward checks it under ``budget_aware``: the
        forced text's canonical tokens may be more than the budget masks planned for."""

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` accepted tokens."""

    def copy(self) -> Matcher:
        """An independent matcher at the same position."""


@runtime_checkable
class Grammar(Protocol):
    """A compiled constraint: ``kind`` is "regex", "json_schema", "json_object" or "ebnf"."""

    kind: str
    spec: str

    def matcher(self) -> Matcher:
        """A fresh matcher at the start of the language."""


def allocate_bitmask(batch: int, vocab_size: int) -> torch.Tensor:
    """A zeroed ``[batch, ceil(vocab_size / 32)]`` int32 bitmask."""
    return torch.zeros(batch, (vocab_size + 31) // 32, dtype=torch.int32)


def bitmask_to_bool(mask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``[B, W]`` int32 bitmask -> ``[B, vocab_size]`` bool (True = allowed), vectorised."""
    if mask.dtype != torch.int32:
        raise TypeError(f"bitmask must be int32, got {mask.dtype}")
    squeeze = mask.dim() == 1
    if squeeze:
        mask = mask.unsqueeze(0)
    if mask.shape[1] * 32 < vocab_size:
        raise ValueError(
            f"bitmask has {mask.shape[1]} words; vocab_size {vocab_size} needs "
            f"{(vocab_size + 31) // 32}"
        )
    shifts = torch.arange(32, dtype=torch.int32, device=mask.device)
    bits = (
        mask.unsqueeze(-1) >> shifts
    ) & 1  # arithmetic shift: the sign bit is bit 31, & 1 picks it
    out = bits.reshape(mask.shape[0], -1)[:, :vocab_size].bool()
    return out[0] if squeeze else out


def apply_bitmask_(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Set disallowed logits to -inf in place (``logits [B, V]``, ``mask [B, W]``)."""
    allowed = bitmask_to_bool(mask.to(logits.device), logits.shape[-1])
    return logits.masked_fill_(~allowed, float("-inf"))
