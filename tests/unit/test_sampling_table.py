"""The sampling parameter table (sgl.runtime.sampling.params) and what is derived from it: each
derived list is checked against the table by an independent route (a signature, a model's
fields, a round trip through validation), so a parameter added in one place and missed in
another fails here."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

import sgl
from sgl.lang import ir
from sgl.lang.backends import openai_compat, openai_dialects
from sgl.runtime.errors import InvalidRequestError
from sgl.runtime.sampling import PARAMS, SamplingParams
from sgl.server import openai_api
from sgl.server.protocol import ChatCompletionRequest, CompletionRequest, SamplingParamsSpec

# gen() keywords that are not sampling parameters, and its SGLang aliases of two that are.
_GEN_OTHER = {
    "name",
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "return_text_in_logprobs",
    "dtype",
    "choices",
    "choices_method",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
}
_GEN_ALIASES = {"max_tokens": "max_new_tokens", "min_tokens": "min_new_tokens"}


def test_gen_signature_lists_exactly_the_gen_params_of_the_table() -> None:
    """sgl.gen keeps an explicit signature (SGLang's, for IDEs): it must name every `dsl="gen"`
    parameter and no sampling parameter the table does not expose to gen."""
    names = set(inspect.signature(sgl.gen).parameters) - _GEN_OTHER
    sampling = {_GEN_ALIASES.get(n, n) for n in names}
    assert sampling == {p.name for p in PARAMS if p.dsl == "gen"}


@pytest.mark.parametrize("p", [p for p in PARAMS if p.dsl == "gen"], ids=lambda p: p.name)
def test_every_gen_param_reaches_the_ir(p) -> None:
    """Passing the parameter to gen() puts it in the Gen node's sampling dict, under its engine
    name."""
    value = (
        p.default
        if p.default is not None
        else {
            "stop": "x",
            "stop_regex": "x",
            "regex": "a",
            "ebnf": "r",
            "json_schema": {},
            "seed": 1,
        }.get(p.name, [1])
    )
    node = sgl.gen("v", **{p.name: value})
    assert node.sampling == {p.name: value}
    assert p.name in ir.SAMPLING_KEYS


def test_ir_keys_are_the_dsl_rows() -> None:
    assert set(ir.SAMPLING_KEYS) == {p.name for p in PARAMS if p.dsl} and len(
        ir.SAMPLING_KEYS
    ) == len(set(ir.SAMPLING_KEYS))


def test_spec_fields_defaults_and_bounds_are_the_table() -> None:
    fields = SamplingParamsSpec.model_fields
    assert list(fields) == [p.name for p in PARAMS] == SamplingParams.field_names()
    schema = SamplingParamsSpec.model_json_schema()["properties"]
    for p in PARAMS:
        assert fields[p.name].default == p.default == getattr(SamplingParams(), p.name)
        prop = schema[p.name]
        typed = next(
            (s for s in prop.get("anyOf", [prop]) if s.get("type") in ("integer", "number")), {}
        )
        assert (
            typed.get("minimum") == p.ge
            and typed.get("exclusiveMinimum") == p.gt
            and typed.get("maximum") == p.le
        )


@pytest.mark.parametrize(
    "p", [p for p in PARAMS if p.ge is not None or p.gt is not None], ids=lambda p: p.name
)
def test_runtime_refuses_what_the_schema_bounds_refuse(p) -> None:
    """One step below the lower bound (in the parameter's own type) is a 400 naming the field."""
    below = (p.ge - 1) if p.ge is not None else p.gt
    if p.kind == "number":
        below = float(below)
    with pytest.raises(InvalidRequestError) as e:
        SamplingParams.from_dict(
            {p.name: below, **({"max_new_tokens": None} if p.name == "min_new_tokens" else {})}
        )
    assert e.value.param == p.name


def test_v1_fields_are_the_table_rows_with_a_v1_name() -> None:
    v1 = {p.v1 for p in PARAMS if p.v1}
    for model in (ChatCompletionRequest, CompletionRequest):
        assert v1 <= set(model.model_fields)
    assert set(openai_api._PASSTHROUGH) == v1 - {"max_tokens", "n"}
    assert {
        openai_api._PASSTHROUGH[p.v1] for p in PARAMS if p.v1 in openai_api._PASSTHROUGH
    } <= set(SamplingParams.field_names())


def test_openai_backend_maps_every_dialect_field() -> None:
    """Each non-default extra reaches the body under the kind's own field name."""
    for p in PARAMS:
        for kind, field in p.dialects.items():
            value = {"stop_token_ids": [3]}.get(
                p.name, 5 if p.kind == "int" else 0.5 if p.kind == "number" else True
            )
            assert openai_dialects.extra_sampling_fields(kind, {p.name: value}) == {field: value}
            assert p.name in openai_compat._HANDLED


def test_params_import_leaves_torch_out() -> None:
    code = (
        "import sys, sgl.runtime.sampling.params, sgl.runtime.sampling, sgl.lang.ir; "
        "assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_token_restricting_params_are_off_when_none() -> None:
    """Jump-forward defers to a request that sets a token-restricting parameter, read as
    "not None": each such row must be nullable with None as its default."""
    from sgl.runtime.sampling.params import PARAMS_BY_NAME, TOKEN_RESTRICTING

    assert "allowed_token_ids" in TOKEN_RESTRICTING
    for name in TOKEN_RESTRICTING:
        assert PARAMS_BY_NAME[name].nullable and PARAMS_BY_NAME[name].default is None, name
