"""Structural tags: free text in which constrained segments may (or must) appear.

SGLang's `structural_tag` constraint (`{"type": "structural_tag", "structures": [{"begin",
"schema", "end"}], "triggers": [...]}`): the output is free text until it writes one of
the triggers; from there it must continue with the `begin` of a structure that starts
with that trigger, a JSON value valid against the structure's schema and its `end`, and
then it is free text again. This is how tool calls are made well-formed without forcing
the model to call: `<tool_call>` is the trigger, and what follows it is a call whose
arguments match the function's parameters. Free text can never contain a trigger except
as the start of a segment, so every trigger in the output opens a valid segment.

Extensions (sgl's, for `tool_choice` and reasoning models): `"free_text": false` makes the
output only segments (at least one, joined by `"separator"`); `"max_structures"` bounds how
many segments there are (1: no parallel calls), past it triggers cannot be written at all;
`"start_after": "</think>"` lets the output begin with free text that does not contain the
marker, then the marker and up to 8 whitespace characters, and only then the tag: a
reasoning model thinks unconstrained and its answer is constrained.

The whole thing is one EBNF grammar: each structure's schema becomes rules
(`json_schema_to_rules`, renamed per structure), and free text is a right-linear rule per
state of the automaton that matches the triggers (state = the longest suffix of the text
that is a proper prefix of a trigger), so no character sequence can complete a trigger
outside a segment.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sgl.constrained import ebnf_parse as ast
from sgl.constrained.errors import GrammarError

PARAM = "structural_tag"
MAX_STRUCTURES = 64  # structures in one tag (tools in one request)
MAX_TRIGGER_CHARS = 128  # all triggers together: the free-text automaton has that many states
MAX_COUNT = 32  # max_structures: free text is counted per segment written
MAX_FREE_STATES = (
    256  # (max_structures + 1) x the triggers' length: the free-text rules, one copy per count
)
MAX_GAP = 8  # whitespace allowed between start_after and what follows it


@dataclass(frozen=True)
class Structure:
    begin: str
    schema: Any
    end: str


@dataclass(frozen=True)
class StructuralTag:
    structures: tuple[Structure, ...]
    triggers: tuple[str, ...]
    free_text: bool = True
    max_structures: int | None = None
    separator: str = ""
    start_after: str | None = (
        None  # the tag starts after this marker (a reasoning model's "</think>")
    )


def parse_structural_tag(spec: Any) -> dict[str, Any]:
    """The tag's dict from its JSON text or dict; GrammarError if it is neither."""
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as e:
            raise GrammarError(f"structural_tag is not valid JSON: {e}", PARAM) from None
    if not isinstance(spec, dict):
        raise GrammarError("structural_tag must be an object {type, structures, triggers}", PARAM)
    return spec


def load_structural_tag(spec: Any) -> StructuralTag:
    """The tag from its JSON text or dict; GrammarError naming the field otherwise."""
    spec = parse_structural_tag(spec)
    unknown = sorted(
        set(spec)
        - {
            "type",
            "structures",
            "triggers",
            "free_text",
            "max_structures",
            "separator",
            "start_after",
        }
    )
    if unknown:
        raise GrammarError(
            f"structural_tag has an unknown field {unknown[0]!r}", f"{PARAM}.{unknown[0]}"
        )
    if spec.get("type", "structural_tag") != "structural_tag":
        raise GrammarError(
            "structural_tag.type must be 'structural_tag' (or sgl's 'pythonic_calls')",
            f"{PARAM}.type",
        )
    raw = spec.get("structures")
    if not isinstance(raw, list) or not raw or len(raw) > MAX_STRUCTURES:
        raise GrammarError(
            f"structural_tag.structures must be a list of 1 to {MAX_STRUCTURES} "
            "{begin, schema, end} objects",
            f"{PARAM}.structures",
        )
    structures = tuple(_structure(s, i) for i, s in enumerate(raw))
    free_text = spec.get("free_text", True)
    if not isinstance(free_text, bool):
        raise GrammarError("structural_tag.free_text must be true or false", f"{PARAM}.free_text")
    triggers = _triggers(spec.get("triggers"), structures, free_text)
    count = spec.get("max_structures")
    if count is not None and (
        not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_COUNT
    ):
        raise GrammarError(
            f"structural_tag.max_structures must be an integer from 1 to {MAX_COUNT}",
            f"{PARAM}.max_structures",
        )
    if (
        count is not None
        and free_text
        and (count + 1) * sum(len(t) for t in triggers) > MAX_FREE_STATES
    ):
        raise GrammarError(
            f"structural_tag: max_structures ({count}) x the triggers' length is too large for the "
            f"free-text automaton (at most {MAX_FREE_STATES} states); use fewer or shorter "
            "triggers",
            f"{PARAM}.max_structures",
        )
    separator = spec.get("separator", "")
    if not isinstance(separator, str):
        raise GrammarError("structural_tag.separator must be a string", f"{PARAM}.separator")
    start_after = spec.get("start_after")
    if start_after is not None and (
        not isinstance(start_after, str) or not start_after or len(start_after) > MAX_TRIGGER_CHARS
    ):
        raise GrammarError(
            "structural_tag.start_after must be a non-empty string", f"{PARAM}.start_after"
        )
    return StructuralTag(structures, triggers, free_text, count, separator, start_after)


def _structure(s: Any, i: int) -> Structure:
    where = f"{PARAM}.structures[{i}]"
    if not isinstance(s, dict):
        raise GrammarError(f"{where} must be an object {{begin, schema, end}}", where)
    for key in ("begin", "end"):
        if not isinstance(s.get(key), str):
            raise GrammarError(f"{where}.{key} must be a string", f"{where}.{key}")
    schema = s.get("schema", {})
    if not isinstance(schema, (dict, bool)):
        raise GrammarError(f"{where}.schema must be a JSON schema object", f"{where}.schema")
    return Structure(s["begin"], schema, s["end"])


def _triggers(raw: Any, structures: tuple[Structure, ...], free_text: bool) -> tuple[str, ...]:
    if not free_text and raw is None:
        return ()
    if not isinstance(raw, list) or not raw or not all(isinstance(t, str) and t for t in raw):
        raise GrammarError(
            "structural_tag.triggers must be a list of non-empty strings", f"{PARAM}.triggers"
        )
    if sum(len(t) for t in raw) > MAX_TRIGGER_CHARS:
        raise GrammarError(
            f"structural_tag.triggers are longer than {MAX_TRIGGER_CHARS} characters together",
            f"{PARAM}.triggers",
        )
    for i, s in enumerate(structures):
        if free_text and not any(s.begin.startswith(t) for t in raw):
            raise GrammarError(
                f"structural_tag.structures[{i}].begin {s.begin!r} starts with none of the "
                "triggers",
                f"{PARAM}.structures[{i}].begin",
            )
    return tuple(dict.fromkeys(raw))


# ---------------------------------------------------------------------- the grammar


def structural_tag_rules(tag: StructuralTag) -> dict[str, ast.RuleDef]:
    """The tag as EBNF rules, `root` first."""
    from sgl.constrained.json_schema import json_schema_to_rules

    rules: dict[str, ast.RuleDef] = {}
    values = []
    for i, s in enumerate(tag.structures):
        try:
            schema_rules = json_schema_to_rules(s.schema)
        except GrammarError as e:
            raise GrammarError(
                f"structural_tag.structures[{i}].schema: {e.message}",
                f"{PARAM}.structures[{i}].schema",
            ) from None
        prefix = f"s{i}_"
        for name, rule in schema_rules.items():
            rules[prefix + name] = ast.RuleDef(prefix + name, renamed(rule.expr, prefix), 0, 0)
        values.append(_ref(prefix + "root"))
    body = {}
    if tag.free_text:
        body.update(_free_text_rules(tag, values))
    else:
        segment = ast.Alt(
            tuple(
                ast.Seq((ast.Lit(s.begin), v, ast.Lit(s.end)))
                for s, v in zip(tag.structures, values)
            )
        )
        body["segment"] = segment
        more = ast.Repeat(
            ast.Seq((ast.Lit(tag.separator), _ref("segment"))),
            0,
            None if tag.max_structures is None else tag.max_structures - 1,
        )
        body["root"] = ast.Seq((_ref("segment"), more))
    if tag.start_after is not None:  # before it: free text without the marker (the reasoning)
        after_marker(body, tag.start_after)
    defs = {name: ast.RuleDef(name, expr, 0, 0) for name, expr in body.items()}
    return {"root": defs.pop("root"), **defs, **rules}


def _free_text_rules(tag: StructuralTag, values: list[ast.Expr]) -> dict[str, ast.Expr]:
    """free_<k>_<state>: free text after k segments; after_<k>_<t>: trigger t was just
    written, a segment that begins with it follows."""
    opens = {
        ti: [(s, v) for s, v in zip(tag.structures, values) if s.begin.startswith(t)]
        for ti, t in enumerate(tag.triggers)
    }
    counts = range(tag.max_structures + 1) if tag.max_structures is not None else [0]
    out: dict[str, ast.Expr] = {}
    for k in counts:
        next_k = k + 1 if tag.max_structures is not None else 0
        can_open = (
            tag.max_structures is None or k < tag.max_structures
        )  # else no trigger can be written

        def on_trigger(ti: int, k: int = k, can_open: bool = can_open) -> ast.Expr | None:
            return _ref(f"after_{k}_{ti}") if opens[ti] and can_open else None

        out.update(_avoiding(f"free_{k}", tag.triggers, on_trigger, may_end=True))
        if can_open:
            for ti, t in enumerate(tag.triggers):
                if opens[ti]:
                    out[f"after_{k}_{ti}"] = ast.Alt(
                        tuple(
                            ast.Seq(
                                (
                                    ast.Lit(s.begin[len(t) :]),
                                    v,
                                    ast.Lit(s.end),
                                    _ref(f"free_{next_k}_0"),
                                )
                            )
                            for s, v in opens[ti]
                        )
                    )
    return {"root": _ref("free_0_0"), **out}


def _avoiding(
    name: str, triggers: tuple[str, ...], on_trigger: Any, may_end: bool
) -> dict[str, ast.Expr]:
    """Rules `<name>_<state>` for text in which no trigger occurs, except that writing
    trigger t continues with `on_trigger(t's index)` (None: t cannot be written). A state is
    the longest suffix of the text that is a proper prefix of a trigger; `may_end`: the text
    may end in any state."""
    prefixes = sorted({t[:j] for t in triggers for j in range(len(t))}, key=lambda p: (len(p), p))
    index = {p: i for i, p in enumerate(prefixes)}
    alphabet = sorted({c for t in triggers for c in t})
    other = ast.CharSet(
        ast.complement_ranges(ast.normalize_ranges(tuple((ord(c), ord(c)) for c in alphabet)))
    )
    by_length = sorted(range(len(triggers)), key=lambda i: -len(triggers[i]))
    out: dict[str, ast.Expr] = {}
    for p in prefixes:
        options: list[ast.Expr] = [ast.Lit("")] if may_end else []
        options.append(ast.Seq((other, _ref(f"{name}_0"))))
        for c in alphabet:
            text = p + c
            done = next((ti for ti in by_length if text.endswith(triggers[ti])), None)
            if done is not None:
                then = on_trigger(done)
                if then is not None:
                    options.append(ast.Seq((ast.Lit(c), then)))
                continue
            state = next(q for q in (text[j:] for j in range(len(text) + 1)) if q in index)
            options.append(ast.Seq((ast.Lit(c), _ref(f"{name}_{index[state]}"))))
        out[f"{name}_{index[p]}"] = ast.Alt(tuple(options))
    return out


def _ref(name: str) -> ast.Ref:
    return ast.Ref(name, 0, 0)


def renamed(expr: ast.Expr, prefix: str, literal: Any = None) -> ast.Expr:
    """`expr` with its rule references prefixed (a rule set moved into a namespace) and,
    with `literal`, each literal's text mapped by it."""
    if isinstance(expr, ast.Lit):
        return ast.Lit(literal(expr.text)) if literal is not None else expr
    if isinstance(expr, ast.Ref):
        return ast.Ref(prefix + expr.name, expr.line, expr.column)
    if isinstance(expr, ast.Seq):
        return ast.Seq(tuple(renamed(e, prefix, literal) for e in expr.items))
    if isinstance(expr, ast.Alt):
        return ast.Alt(tuple(renamed(e, prefix, literal) for e in expr.options))
    if isinstance(expr, ast.Repeat):
        return ast.Repeat(renamed(expr.item, prefix, literal), expr.min, expr.max)
    return expr


def after_marker(body: dict[str, ast.Expr], marker: str) -> None:
    """Make the rules in `body` (its `root` is moved to `content`) start after `marker`:
    first free text without it, then it and a little whitespace."""
    body["content"] = body.pop("root")
    then = ast.Seq(
        (ast.Repeat(ast.CharSet(((9, 10), (13, 13), (32, 32))), 0, MAX_GAP), _ref("content"))
    )
    body.update(_avoiding("pre", (marker,), lambda _ti: then, may_end=False))
    body["root"] = _ref("pre_0")
