"""Grammar mode's sharing: a piece used in many places (a constrained string, a large member
value, the rest of an object, the JSON string and number tokens) as one rule that every use
calls, so the grammar holds one copy; in regex mode the same methods return the piece inline.

A mixin of :class:`~sgl.constrained.json_schema.converter.Converter`: the rules it makes are
the converter's.
"""

from __future__ import annotations

from typing import Any

from sgl.constrained.json_schema.containers import _free_value
from sgl.constrained.json_schema.lexical import _SHARED, _VALUE_RULE, _string_not_in
from sgl.constrained.json_schema.proofs import _ONEOF_PROOF_LIMIT
from sgl.constrained.regex import Rx, rx_ref

_SHARE_TEXT = 16384  # grammar mode: a repeated piece with more regex text than this becomes a rule


class SharingMixin:
    """The grammar-mode rule sharing of the converter."""

    def string_not_in(self, values: Any) -> Rx | None:
        """The body of a string that is none of ``values`` (memoized: the keys of undeclared
        members exclude the same declared names in every case of a condition)."""
        key = tuple(sorted(set(values)))
        if key not in self.not_in:
            self.not_in[key] = _string_not_in(
                list(key), self.shared("json_chars"), self.shared("json_high_char")
            )
        return self.not_in[key]

    def shared(self, name: str) -> Rx:
        """A common piece (``json_string``, ...): inline in a regex; in a grammar one rule
        that every use calls (its regex text kept, for oneOf proofs), not a copy per use."""
        rx = _SHARED[name]
        if not self.grammar:
            return rx
        return Rx(rx.text, atom=rx.atom, alt=rx.alt, size=rx.size, node=rx_ref(name).node)

    def share(self, rx: Rx | None, always: bool = False) -> Rx | None:
        """Grammar mode: a large piece used in several places (the rest of an object after
        a member) as one rule, so the grammar holds one copy, not one per use. Only pieces
        too large for a oneOf proof anyway lose their regex text, unless ``always`` (a
        piece no proof reads: the undeclared members of an open object)."""
        small = rx is not None and rx.size <= _ONEOF_PROOF_LIMIT and len(rx.text) <= _SHARE_TEXT
        if not self.grammar or rx is None or (small and not always):
            return rx
        name = self.part_of.get(
            rx.text
        )  # the same piece again (the cases of a condition): the same rule
        if name is None:
            name = self.part_of[rx.text] = f"part{len(self.rules)}"
            self.rules[name] = rx
        return Rx(f"\x00{name}\x00", atom=True, size=rx.size, node=rx_ref(name).node, ref=True)

    def free(self, depth: int) -> Rx | None:
        """Any JSON value (``depth`` containers deep; unbounded in grammar mode)."""
        if self.grammar:
            return rx_ref(_VALUE_RULE)
        return _free_value(depth)

    def string_rule(self, rx: Rx | None) -> Rx | None:
        """Grammar mode: a constrained string as one rule per distinct regex, called by every
        use (its text kept, for oneOf proofs). The same ``maxLength: 256`` string in thirty
        properties is then one automaton, and a parse state inside it is the same kernel in
        all of them: its mask walks are made once per grammar, not once per property."""
        return self.rule_of_text(rx, "string")

    def rule_of_text(self, rx: Rx | None, kind: str) -> Rx | None:
        """Grammar mode: ``rx`` as a call of one rule per distinct regex text (the text kept,
        for oneOf proofs). A member's value is written once per place the member can come
        (with and without a comma, after each subset of optional members): as a rule, its
        automaton is in the grammar once, not once per place."""
        if not self.grammar or rx is None:
            return rx
        name = self.text_rules.get(rx.text)
        if name is None:
            name = self.text_rules[rx.text] = f"{kind}{len(self.text_rules)}"
            self.rules[name] = rx
        return Rx(rx.text, atom=rx.atom, alt=rx.alt, size=rx.size, node=rx_ref(name).node)
