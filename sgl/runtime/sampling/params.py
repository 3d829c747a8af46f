"""THE table of sampling parameters, and `SamplingParams` built from it.

Each parameter is declared once, as a `Param` below: its name (SGLang's), type, default,
range, one-line doc, and where it is exposed (the DSL, the `/v1` APIs, OpenAI-compatible
servers behind the DSL's OpenAI backend). The runtime's validation (`validation.py`), the
server's request models and OpenAPI schema (`sgl.server.protocol`), the DSL's keys
(`sgl.lang.ir.SAMPLING_KEYS`) and the OpenAI backend's mappings are all derived from it, so
adding a parameter means adding a row here and applying it (batch / sampler).

Separate from the sampler so that the DSL and the server can read it without torch.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sgl.runtime.errors import InvalidRequestError

# Python types of the kinds (the dataclass annotations); validation.py says how each is checked.
KIND_TYPES: dict[str, str] = {
    "int": "int",
    "int_or_null": "int",
    "number": "float",
    "bool": "bool",
    "str": "str",
    "stop": "str | list[str]",
    "stop_regex": "str | list[str]",
    "token_ids": "list[int]",
    "logit_bias": "dict[int, float]",
    "schema": "str | dict",
    "tag": "str | dict",
    "object": "dict",
}


@dataclass(frozen=True)
class Param:
    """One sampling parameter. `dsl`: "gen" (a `sgl.gen` keyword and a program default),
    "program" (a program default only), None (not in the DSL). `v1`: its field on `/v1/*`
    requests (None: not there); `openai`: one of OpenAI's own fields. `dialects`: for the
    DSL's OpenAI backend, the field per OpenAI-compatible server kind (beyond OpenAI's own).
    `restricts_tokens`: set, it limits which ids may be sampled, so jump-forward (forced text
    inserted without the sampler) is off for the request."""

    name: str
    kind: str
    default: Any
    doc: str
    nullable: bool = False
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    range_text: str | None = None  # the range as errors word it, where not derived from the bounds
    dsl: str | None = None
    v1: str | None = None
    openai: bool = False
    dialects: Mapping[str, str] = field(default_factory=dict)
    restricts_tokens: bool = False

    @property
    def bounds_text(self) -> str | None:
        """The range as an error states it: '>= 0', 'in (0, 1]', '> 0 (1 = off)'."""
        if self.range_text is not None:
            return self.range_text
        low = (
            ("[", self.ge)
            if self.ge is not None
            else ("(", self.gt)
            if self.gt is not None
            else None
        )
        if low is None:
            return None
        if self.le is not None:
            return f"in {low[0]}{low[1]:g}, {self.le:g}]"
        return f"{'>=' if low[0] == '[' else '>'} {low[1]:g}"


def _same_field(name: str, kinds: str) -> dict[str, str]:
    """`name` is the field on each of these server kinds."""
    return {k: name for k in kinds.split()}


_SERVERS = "sgl sglang vllm"
PARAMS: tuple[Param, ...] = (
    Param(
        "max_new_tokens",
        "int",
        128,
        "Null: as many as fit in the context.",
        nullable=True,
        ge=0,
        dsl="gen",
        v1="max_tokens",
        openai=True,
    ),
    Param(
        "min_new_tokens",
        "int",
        0,
        "At most max_new_tokens.",
        ge=0,
        dsl="gen",
        v1="min_tokens",
        dialects={"sgl": "min_tokens", "sglang": "min_tokens", "vllm": "min_tokens"},
    ),
    Param(
        "stop",
        "stop",
        None,
        "A string or a list of strings that end the output.",
        nullable=True,
        dsl="gen",
        v1="stop",
        openai=True,
    ),
    Param(
        "stop_token_ids",
        "token_ids",
        None,
        "Token ids below the vocabulary size.",
        nullable=True,
        dsl="gen",
        v1="stop_token_ids",
        dialects=_same_field("stop_token_ids", _SERVERS),
    ),
    Param(
        "temperature",
        "number",
        1.0,
        "0: greedy.",
        ge=0,
        range_text=">= 0 (0 = greedy)",
        dsl="gen",
        v1="temperature",
        openai=True,
    ),
    Param(
        "top_p",
        "number",
        1.0,
        "Nucleus sampling: the smallest set of tokens with this mass.",
        gt=0,
        le=1,
        dsl="gen",
        v1="top_p",
        openai=True,
    ),
    Param(
        "top_k",
        "int",
        -1,
        "-1 or 0: off.",
        ge=-1,
        range_text="-1 (disabled) or >= 1",
        dsl="gen",
        v1="top_k",
        dialects=_same_field("top_k", _SERVERS + " llama.cpp"),
    ),
    Param(
        "min_p",
        "number",
        0.0,
        "Drop tokens below min_p times the top token's probability.",
        ge=0,
        le=1,
        dsl="gen",
        v1="min_p",
        dialects=_same_field("min_p", _SERVERS + " llama.cpp"),
    ),
    Param(
        "frequency_penalty",
        "number",
        0.0,
        "OpenAI's: minus this times each output token's count.",
        ge=-2,
        le=2,
        dsl="gen",
        v1="frequency_penalty",
        openai=True,
    ),
    Param(
        "presence_penalty",
        "number",
        0.0,
        "OpenAI's: minus this for each token already in the output.",
        ge=-2,
        le=2,
        dsl="gen",
        v1="presence_penalty",
        openai=True,
    ),
    Param(
        "repetition_penalty",
        "number",
        1.0,
        "1: off.",
        gt=0,
        range_text="> 0 (1 = off)",
        dsl="gen",
        v1="repetition_penalty",
        dialects=_same_field("repetition_penalty", _SERVERS) | {"llama.cpp": "repeat_penalty"},
    ),
    Param(
        "ignore_eos",
        "bool",
        False,
        "Keep generating past the end-of-sequence token.",
        dsl="gen",
        v1="ignore_eos",
        dialects=_same_field("ignore_eos", _SERVERS + " llama.cpp"),
    ),
    Param(
        "skip_special_tokens",
        "bool",
        True,
        "Leave special tokens out of the text.",
        dsl="program",
        v1="skip_special_tokens",
    ),
    Param(
        "spaces_between_special_tokens",
        "bool",
        True,
        "Spaces between special tokens in the text.",
        dsl="program",
    ),
    Param(
        "no_stop_trim",
        "bool",
        False,
        "Keep the matched stop string at the end of the text.",
        dsl="program",
        v1="no_stop_trim",
    ),
    Param(
        "logit_bias",
        "logit_bias",
        None,
        "Token id (below the vocabulary size) -> a bias added to its logit.",
        nullable=True,
        v1="logit_bias",
        openai=True,
    ),
    Param(
        "allowed_token_ids",
        "token_ids",
        None,
        "Only these token ids may be sampled (vLLM's); with a constraint, only the ids both allow.",
        nullable=True,
        dsl="gen",
        v1="allowed_token_ids",
        dialects=_same_field("allowed_token_ids", "sgl vllm"),
        restricts_tokens=True,
    ),
    Param(
        "seed",
        "int_or_null",
        None,
        "Seeds the request's own generator.",
        nullable=True,
        dsl="gen",
        v1="seed",
        openai=True,
    ),
    Param("n", "int", 1, "Samples per prompt.", ge=1, v1="n", openai=True),
    Param(
        "regex",
        "str",
        None,
        "At most one of regex, json_schema, ebnf and structural_tag.",
        nullable=True,
        dsl="gen",
        v1="regex",
    ),
    Param(
        "json_schema", "schema", None, "A JSON schema (or its JSON text).", nullable=True, dsl="gen"
    ),
    Param(
        "ebnf",
        "str",
        None,
        "A grammar in EBNF (GBNF) the output must match.",
        nullable=True,
        dsl="gen",
        v1="ebnf",
    ),
    Param("json_object", "bool", False, "Any JSON object (OpenAI's response_format json_object)."),
    Param(
        "budget_aware",
        "bool",
        True,
        "Constrained output: finish a complete member within max_new_tokens when one fits.",
        v1="budget_aware",
    ),
    # SGLang 0.5's other names, accepted so its clients run unchanged
    Param(
        "stop_regex",
        "stop_regex",
        None,
        "Stop where the output first matches; trimmed like stop.",
        nullable=True,
        dsl="gen",
    ),
    Param("sampling_seed", "int_or_null", None, "SGLang's name for seed.", nullable=True),
    Param(
        "stream_interval",
        "int_or_null",
        None,
        "Streamed: a chunk every this many tokens.",
        nullable=True,
        ge=1,
    ),
    Param(
        "structural_tag",
        "tag",
        None,
        "Free text with constrained segments (sgl.constrained.structural).",
        nullable=True,
        dsl="program",
    ),  # sgl.gen sets it from tools=
    Param("custom_params", "object", None, "SGLang's; ignored.", nullable=True),
)
PARAMS_BY_NAME: dict[str, Param] = {p.name: p for p in PARAMS}
# Parameters that limit which ids may be sampled (jump-forward defers to them).
TOKEN_RESTRICTING: tuple[str, ...] = tuple(p.name for p in PARAMS if p.restricts_tokens)
# Constraints: at most one per request.
CONSTRAINTS = ("regex", "json_schema", "ebnf", "structural_tag")


def _type_name(v: Any) -> str:
    return "null" if v is None else type(v).__name__


class _SamplingParamsMethods:
    """The methods of `SamplingParams`; its fields come from PARAMS."""

    @classmethod
    def field_names(cls) -> list[str]:
        """All accepted keys, in declaration order (used for 'did you mean' hints)."""
        return [p.name for p in PARAMS]

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> SamplingParams:
        """Build from a JSON-like dict, rejecting unknown keys and bad types/ranges.

        The result is normalized and passes `validate()` without a vocab size; callers
        that know the vocab size should call `validate(vocab_size)` again for id ranges.
        """
        if d is None:
            d = {}
        if not isinstance(d, dict):
            raise InvalidRequestError(
                f"sampling_params must be a JSON object, got {_type_name(d)}",
                param="sampling_params",
            )
        names = cls.field_names()
        for key in d:
            if key not in PARAMS_BY_NAME:
                raise InvalidRequestError(_unknown_key_message(key, names), param=str(key))
        params = cls(**d)
        params.validate()
        return params

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (deep-copied) that `from_dict` accepts back, also after a JSON round-trip."""
        return dataclasses.asdict(self)

    @property
    def is_greedy(self) -> bool:
        """True when sampling reduces to argmax (temperature 0, or only one candidate)."""
        return self.temperature == 0 or self.top_k == 1

    def validate(self, vocab_size: int | None = None) -> SamplingParams:
        """Check types and ranges, normalizing in place (stop -> list, top_k 0 -> -1,
        logit_bias keys -> int). Raises InvalidRequestError naming the bad field. Idempotent."""
        from sgl.runtime.sampling.validation import validate

        validate(self, vocab_size)
        return self


def _unknown_key_message(key: Any, names: list[str]) -> str:
    close = difflib.get_close_matches(str(key), names, n=3, cutoff=0.6)
    if close:
        hint = "did you mean " + " or ".join(repr(c) for c in close) + "?"
    else:
        hint = "valid names are: " + ", ".join(names)
    return f"unknown sampling parameter {key!r}; {hint}"


SamplingParams = dataclasses.make_dataclass(
    "SamplingParams",
    [
        (p.name, KIND_TYPES[p.kind] + (" | None" if p.nullable else ""), field(default=p.default))
        for p in PARAMS
    ],
    bases=(_SamplingParamsMethods,),
    namespace={
        "__doc__": "Per-request sampling settings; names and defaults follow SGLang's "
        "`sampling_params` (the fields are PARAMS, in order)."
    },
)
SamplingParams.__module__ = __name__  # so pickling finds it here
