"""Request fields of the sampling parameters, derived from the runtime's table
(`sgl.runtime.sampling.params.PARAMS`), so the server's models and /openapi.json cannot drift
from what the engine accepts.

`SamplingParamsSpec` is /generate's `sampling_params` object (for the schema only: the engine
checks the dict itself, naming the field); `v1_extension_fields()` gives the `/v1` requests'
fields beyond OpenAI's, and `V1_TO_ENGINE` maps every `/v1` field to its engine name.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, create_model

from sgl.runtime.sampling.params import PARAMS, Param

# The JSON types of the table's kinds (bounds and descriptions are added per parameter).
_KIND_ANNOTATIONS: dict[str, Any] = {
    "int": int,
    "int_or_null": int,
    "number": float,
    "bool": bool,
    "str": str,
    "stop": Union[str, list[str]],  # noqa: UP007 (runtime value)
    "stop_regex": Union[str, list[str]],  # noqa: UP007 (runtime value)
    "token_ids": list[Annotated[int, Field(ge=0)]],
    "logit_bias": dict[Annotated[str, Field(pattern=r"^[0-9]+$")], float],
    "schema": Union[str, dict[str, Any]],  # noqa: UP007 (runtime value)
    "tag": Union[str, dict[str, Any]],  # noqa: UP007 (runtime value)
    "object": dict[str, Any],
}
# Looser on /v1 as before: OpenAI's own clients send logit_bias keys and ids as they are.
_V1_ANNOTATIONS: dict[str, Any] = {
    **_KIND_ANNOTATIONS,
    "token_ids": list[int],
    "logit_bias": dict[str, float],
}


def _annotation(p: Param, kinds: dict[str, Any]) -> Any:
    base = kinds[p.kind]
    return Union[base, None] if p.nullable else base  # noqa: UP007 (runtime value)


def _spec_field(p: Param) -> tuple[Any, Any]:
    bounds = {k: v for k, v in (("ge", p.ge), ("gt", p.gt), ("le", p.le)) if v is not None}
    return _annotation(p, _KIND_ANNOTATIONS), Field(p.default, description=p.doc, **bounds)


class _SpecBase(BaseModel):
    model_config = ConfigDict(extra="forbid")


SamplingParamsSpec = create_model(
    "SamplingParamsSpec",
    __base__=_SpecBase,
    __doc__="/generate's sampling parameters (SGLang's names); unknown keys are refused.",
    __module__=__name__,
    **{p.name: _spec_field(p) for p in PARAMS},
)

_SAMPLING_SPEC = TypeAdapter(SamplingParamsSpec).json_schema()
SAMPLING_PARAMS_SCHEMA = {
    "anyOf": [_SAMPLING_SPEC, {"type": "array", "items": _SAMPLING_SPEC}, {"type": "null"}],
    "description": "Engine sampling parameters; one object for all prompts or one per prompt.",
}

# `/v1` field -> engine name, for every parameter a `/v1` request can set. (max_tokens and n
# are read by hand: max_completion_tokens is another name for max_tokens, and n has a cap.)
V1_TO_ENGINE: dict[str, str] = {p.v1: p.name for p in PARAMS if p.v1 is not None}


def v1_extension_fields() -> dict[str, tuple[Any, Any]]:
    """The `/v1` request fields beyond OpenAI's (SGLang's / vLLM's extensions): each optional,
    null meaning the engine's default, for `create_model`."""
    return {
        p.v1: (
            Union[_V1_ANNOTATIONS[p.kind], None],  # noqa: UP007 (runtime value)
            Field(None, description=f"{p.doc} Default: {json.dumps(p.default)}."),
        )
        for p in PARAMS
        if p.v1 is not None and not p.openai
    }
