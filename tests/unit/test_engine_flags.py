"""The launch flags against their sources: every `EngineConfig` field has a flag whose default is
the field's (or the server's own, listed in `SERVER_DEFAULTS`), a flag's choices are the names
the field's validation accepts, and the parser flags take exactly their registries' names."""

from __future__ import annotations

import dataclasses

import pytest

from sgl.constrained.backends import BACKENDS
from sgl.runtime.attention import ATTENTION_BACKENDS
from sgl.runtime.config import DTYPES, LOAD_FORMATS, SCHEDULE_POLICIES, EngineConfig
from sgl.runtime.model.dense_copy import DENSE_COPY_MODES
from sgl.runtime.model.quant import INT4_GROUP_SIZES, QUANTIZATIONS
from sgl.runtime.speculative import SPECULATIVE_ALGORITHMS
from sgl.server.engine_flags import ENGINE_FLAGS, SERVER_DEFAULTS
from sgl.server.launch import build_parser, engine_kwargs, parse_args
from sgl.tool_calls import FORMATS, REASONING_STYLES, ReasoningParser, get_parser

FIELDS = [f.name for f in dataclasses.fields(EngineConfig)]
# field -> the registry `EngineConfig.validate` checks it against
SOURCES = {
    "dtype": DTYPES,
    "quantization": QUANTIZATIONS,
    "int4_group_size": INT4_GROUP_SIZES,
    "dense_copy": DENSE_COPY_MODES,
    "schedule_policy": SCHEDULE_POLICIES,
    "grammar_backend": BACKENDS,
    "attention_backend": ATTENTION_BACKENDS,
    "load_format": LOAD_FORMATS,
    "speculative_algorithm": SPECULATIVE_ALGORITHMS,
    "speculative_draft_model_quantization": QUANTIZATIONS,
}


def engine_actions() -> dict[str, object]:
    fields = {field for field, _ in ENGINE_FLAGS.values()}
    return {a.dest: a for a in build_parser()._actions if a.dest in fields}


def name_refused(field: str, value: object) -> bool:
    """Whether `EngineConfig.validate` refuses `value` for `field` as a name it does not know (a
    grammar backend it knows but that is not installed is a known name)."""
    try:
        EngineConfig(**{field: value}).validate()
    except ValueError as e:
        return str(e).startswith(f"{field} must be")
    return False


def test_every_engine_option_has_one_flag() -> None:
    assert sorted(field for field, _ in ENGINE_FLAGS.values()) == sorted(FIELDS)


@pytest.mark.parametrize("field", FIELDS)
def test_a_flag_default_is_the_fields(field: str) -> None:
    want = SERVER_DEFAULTS.get(field, getattr(EngineConfig(), field))
    assert build_parser().get_default(field) == want


def test_the_servers_own_defaults_differ_from_the_engines() -> None:
    cfg = EngineConfig()
    assert SERVER_DEFAULTS and all(getattr(cfg, f) != v for f, v in SERVER_DEFAULTS.items())
    no_flags = EngineConfig(**engine_kwargs(parse_args(build_parser(), [])))
    assert no_flags == dataclasses.replace(cfg, **SERVER_DEFAULTS)


def test_every_flag_with_choices_has_its_source_listed() -> None:
    assert sorted(dest for dest, a in engine_actions().items() if a.choices) == sorted(SOURCES)


@pytest.mark.parametrize("field", sorted(SOURCES))
def test_choices_are_what_validation_accepts(field: str) -> None:
    choices = engine_actions()[field].choices
    assert tuple(choices) == tuple(SOURCES[field])
    assert [c for c in choices if name_refused(field, c)] == []
    assert name_refused(field, 7 if field == "int4_group_size" else "no-such-name")


def test_parser_flags_take_the_registries_names(capsys) -> None:
    parser = build_parser()
    for fmt in FORMATS.values():
        for name in (fmt.name, *fmt.aliases):
            got = parse_args(parser, ["--tool-call-parser", name]).tool_call_parser
            assert got == fmt.name and get_parser(got).name == fmt.name
    for style in REASONING_STYLES:
        assert (
            ReasoningParser(
                parse_args(parser, ["--reasoning-parser", style]).reasoning_parser
            ).style
            == style
        )
    with pytest.raises(SystemExit):
        parse_args(parser, ["--tool-call-parser", "no-such-format"])
    err = capsys.readouterr().err
    assert all(name in err for fmt in FORMATS.values() for name in (fmt.name, *fmt.aliases))
