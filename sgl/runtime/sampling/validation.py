"""Validation of `SamplingParams`: generic per kind and range (from the PARAMS table), then the
few rules across fields kept by hand (seed / sampling_seed, min <= max, one constraint, token id
ranges). Every error is an `InvalidRequestError` naming the field, so the server answers 400.

Separate from params.py so that the table reads as a table.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from sgl.runtime.errors import InvalidRequestError
from sgl.runtime.sampling.params import CONSTRAINTS, PARAMS, Param, _type_name


def _is_int(v: Any) -> bool:
    # bool is an int subclass, but `max_new_tokens: true` is a client bug, not 1.
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def validate(params: Any, vocab_size: int | None = None) -> None:
    """Check and normalize `params` in place: types of every field first (in table order), so
    range checks never compare a str with an int, then ranges, then the rules across fields."""
    for p in PARAMS:
        value = getattr(params, p.name)
        if value is None and p.nullable:
            continue
        setattr(params, p.name, _CHECK_KIND[p.kind](p, value))
    if params.top_k == 0:
        params.top_k = -1
    for p in PARAMS:
        _check_range(p, getattr(params, p.name))
    _check_across_fields(params, vocab_size)


def _check_range(p: Param, value: Any) -> None:
    if value is None or p.bounds_text is None:
        return
    ok = (
        (p.ge is None or value >= p.ge)
        and (p.gt is None or value > p.gt)
        and (p.le is None or value <= p.le)
    )
    if ok:
        return
    if p.kind == "int_or_null":
        raise InvalidRequestError(
            f"{p.name} must be an integer {p.bounds_text} or null, got {value!r}", param=p.name
        )
    shown = f"{value:g}" if p.kind == "number" else f"{value}"
    raise InvalidRequestError(f"{p.name} must be {p.bounds_text}, got {shown}", param=p.name)


def _check_across_fields(params: Any, vocab_size: int | None) -> None:
    """sampling_seed folds into seed; min_new_tokens <= max_new_tokens; one constraint; ids in
    range."""
    if params.sampling_seed is not None:
        if params.seed is not None and params.seed != params.sampling_seed:
            raise InvalidRequestError(
                f"seed ({params.seed}) and sampling_seed ({params.sampling_seed}) differ; give one",
                param="sampling_seed",
            )
        params.seed = params.sampling_seed
    if params.max_new_tokens is not None and params.min_new_tokens > params.max_new_tokens:
        raise InvalidRequestError(
            f"min_new_tokens must be <= max_new_tokens ({params.max_new_tokens}), "
            f"got {params.min_new_tokens}",
            param="min_new_tokens",
        )
    constraints = [name for name in CONSTRAINTS if getattr(params, name) is not None]
    if len(constraints) > 1:
        raise InvalidRequestError(
            "only one of regex, json_schema, ebnf, structural_tag may be set; got "
            + " and ".join(constraints),
            param=constraints[1],
        )
    id_range = f"[0, {'vocab_size' if vocab_size is None else vocab_size})"
    for p in PARAMS:
        if p.kind not in ("token_ids", "logit_bias"):
            continue
        for tid in getattr(params, p.name) or ():
            if tid < 0 or (vocab_size is not None and tid >= vocab_size):
                raise InvalidRequestError(
                    f"{p.name} token ids must be in {id_range}, got {tid}", param=p.name
                )


# ---------------------------------------------------------------------------- one check per kind
# Each takes the field and a non-null value, and returns the value normalized or raises.


def _int(p: Param, value: Any) -> int:
    if not _is_int(value):
        if p.kind == "int_or_null" and p.bounds_text is not None:
            raise InvalidRequestError(
                f"{p.name} must be an integer {p.bounds_text} or null, got {value!r}", param=p.name
            )
        null = " or null" if p.kind == "int_or_null" else ""
        raise InvalidRequestError(
            f"{p.name} must be an integer{null}, got {_type_name(value)} {value!r}", param=p.name
        )
    return value


def _number(p: Param, value: Any) -> float:
    if not _is_number(value) or not math.isfinite(value):
        raise InvalidRequestError(
            f"{p.name} must be a finite number, got {_type_name(value)} {value!r}", param=p.name
        )
    return float(value)


def _bool(p: Param, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidRequestError(
            f"{p.name} must be true or false, got {_type_name(value)} {value!r}", param=p.name
        )
    return value


def _str(p: Param, value: Any) -> str:
    if not isinstance(value, str):
        raise InvalidRequestError(
            f"{p.name} must be a string, got {_type_name(value)}", param=p.name
        )
    return value


def _schema(p: Param, value: Any) -> str | dict:
    if not isinstance(value, (str, dict)):
        raise InvalidRequestError(
            f"{p.name} must be a JSON schema object or its JSON string, got {_type_name(value)}",
            param=p.name,
        )
    return value


def _tag(p: Param, value: Any) -> str | dict:
    if not isinstance(value, (str, dict)):
        raise InvalidRequestError(
            f"{p.name} must be an object or its JSON text, got {_type_name(value)}", param=p.name
        )
    return value


def _object(p: Param, value: Any) -> dict:
    if not isinstance(value, dict):
        raise InvalidRequestError(
            f"{p.name} must be an object or null, got {_type_name(value)}", param=p.name
        )
    return value


def _token_ids(p: Param, value: Any) -> list[int]:
    if not isinstance(value, (list, tuple)) or not all(_is_int(t) for t in value):
        raise InvalidRequestError(
            f"{p.name} must be a list of integer token ids, got {value!r}", param=p.name
        )
    return list(value)


def _stop(p: Param, stop: Any) -> list[str]:
    """A str or list of str -> list of non-empty str (an empty stop would match everywhere)."""
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, (list, tuple)) or not all(isinstance(s, str) for s in items):
        raise InvalidRequestError(
            f"stop must be a string or a list of strings, got {stop!r}", param="stop"
        )
    if any(s == "" for s in items):
        raise InvalidRequestError(
            "stop strings must be non-empty; remove the empty string from stop", param="stop"
        )
    return list(items)


def _stop_regex(p: Param, stop_regex: Any) -> list[str] | None:
    """A pattern or a list of them -> a list (None when empty, as SGLang's frontend sends []),
    each one checked to compile the way the stop matcher runs it (an error names the pattern)."""
    items = [stop_regex] if isinstance(stop_regex, str) else stop_regex
    if not isinstance(items, (list, tuple)) or not all(isinstance(p, str) for p in items):
        raise InvalidRequestError(
            f"stop_regex must be a regex string or a list of them, got {stop_regex!r}",
            param="stop_regex",
        )
    if any(p == "" for p in items):
        raise InvalidRequestError("stop_regex patterns must be non-empty", param="stop_regex")
    from sgl.runtime.stop_regex import check_stop_regex

    for pattern in items:
        check_stop_regex(pattern)
    return list(items) or None


def _logit_bias(p: Param, bias: Any) -> dict[int, float]:
    """JSON object keys are strings: accept "123" as token id 123; values must be finite."""
    if not isinstance(bias, dict):
        raise InvalidRequestError(
            f"logit_bias must be an object mapping token id to bias, got {_type_name(bias)}",
            param="logit_bias",
        )
    out: dict[int, float] = {}
    for key, value in bias.items():
        if _is_int(key):
            tid = key
        elif isinstance(key, str):
            try:
                tid = int(key.strip())
            except ValueError:
                raise InvalidRequestError(
                    f"logit_bias keys must be integer token ids, got {key!r}",
                    param="logit_bias",
                ) from None
        else:
            raise InvalidRequestError(
                f"logit_bias keys must be integer token ids, got {key!r}", param="logit_bias"
            )
        if not _is_number(value) or not math.isfinite(value):
            raise InvalidRequestError(
                f"logit_bias values must be finite numbers, got {value!r} for token {key!r}",
                param="logit_bias",
            )
        out[tid] = float(value)
    return out


_CHECK_KIND: dict[str, Callable[[Param, Any], Any]] = {
    "int": _int,
    "int_or_null": _int,
    "number": _number,
    "bool": _bool,
    "str": _str,
    "schema": _schema,
    "tag": _tag,
    "object": _object,
    "token_ids": _token_ids,
    "stop": _stop,
    "stop_regex": _stop_regex,
    "logit_bias": _logit_bias,
}
