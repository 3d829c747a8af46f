"""SGLang's and vLLM's launch names: each parses to what our own name gives, and a name for
something we lack is refused naming what we have."""

from __future__ import annotations

import json

import pytest

from sgl.server.launch import build_parser, engine_kwargs, parse_args


def parsed(argv: list[str]):
    return parse_args(build_parser(), argv)


@pytest.mark.parametrize(
    "theirs,ours",
    [
        (["--enable-torch-compile"], ["--torch-compile"]),
        (["--tensor-parallel-size", "2"], ["--tp-size", "2"]),
        (["--tp", "2"], ["--tp-size", "2"]),
        (["--data-parallel-size", "3"], ["--dp-size", "3"]),
        (["--model", "m.gguf"], ["--model-path", "m.gguf"]),
        (["--dtype", "half"], ["--dtype", "float16"]),
        (["--dtype", "float"], ["--dtype", "float32"]),
        (["--tool-call-parser", "qwen25"], ["--tool-call-parser", "hermes"]),
        (["--tool-call-parser", "qwen"], ["--tool-call-parser", "hermes"]),
        (["--tool-call-parser", "llama3"], ["--tool-call-parser", "llama3_json"]),
    ],
)
def test_their_name_means_ours(theirs, ours):
    a, b = parsed(theirs), parsed(ours)
    assert vars(a) == vars(b)
    assert vars(a) != vars(parsed([]))  # the flag took effect
    assert engine_kwargs(a) == engine_kwargs(b)


@pytest.mark.parametrize(
    "flag,name,ours",
    [
        ("--tool-call-parser", "deepseekv3", ["hermes", "pythonic"]),
        ("--reasoning-parser", "kimi", ["qwen3", "deepseek-r1"]),
    ],
)
def test_a_parser_we_lack_is_refused_naming_ours(flag, name, ours, capsys):
    with pytest.raises(SystemExit):
        parsed([flag, name])
    err = capsys.readouterr().err
    assert name in err and all(o in err for o in ours)


def test_kv_cache_dtype_is_the_model_dtype(capsys):
    assert parsed(["--kv-cache-dtype", "auto"]).kv_cache_dtype == "auto"
    assert parsed(["--dtype", "bfloat16", "--kv-cache-dtype", "bf16"]).dtype == "bfloat16"
    for argv in (["--kv-cache-dtype", "bf16"], ["--dtype", "float32", "--kv-cache-dtype", "fp16"]):
        with pytest.raises(SystemExit):
            parsed(argv)
        assert "--dtype" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parsed(["--kv-cache-dtype", "fp8_e5m2"])
    assert "auto" in capsys.readouterr().err


@pytest.mark.parametrize(
    "suffix,text",
    [
        (
            ".yaml",
            "tp_size: 2\nenable-torch-compile: true\ndtype: half\ntool-call-parser: qwen25\nport: "
            "31000\n",
        ),
        (
            ".json",
            json.dumps(
                {
                    "tp-size": 2,
                    "enable_torch_compile": True,
                    "dtype": "half",
                    "tool_call_parser": "qwen25",
                    "port": 31000,
                }
            ),
        ),
    ],
)
def test_config_file_gives_flags_and_the_command_line_wins(tmp_path, suffix, text):
    path = tmp_path / ("cfg" + suffix)
    path.write_text(text)
    want = parsed(
        [
            "--tp-size",
            "2",
            "--torch-compile",
            "--dtype",
            "float16",
            "--tool-call-parser",
            "hermes",
            "--port",
            "31000",
        ]
    )
    got = parsed(["--config", str(path)])
    assert {**vars(got), "config": None} == vars(want)
    assert parsed(["--config", str(path), "--port", "32000", "--dtype", "bfloat16"]).port == 32000
    assert parsed(["--port", "32000", "--config", str(path)]).dtype == "float16"


@pytest.mark.parametrize(
    "text,named",
    [
        ("tp_size: 2\nno_such_flag: 1\n", "no_such_flag"),
        ("[1, 2]\n", "mapping"),
        ("dtype: fp8\n", "dtype"),
    ],
)
def test_a_bad_config_file_is_refused_naming_the_key(tmp_path, capsys, text, named):
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    with pytest.raises(SystemExit):
        parsed(["--config", str(path)])
    assert named in capsys.readouterr().err


def test_a_missing_config_file_or_template_name_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        parsed(["--config", str(tmp_path / "absent.yaml")])
    assert "absent.yaml" in capsys.readouterr().err
    from sgl.server.launch_compat import read_chat_template

    with pytest.raises(ValueError, match="chatml"):
        read_chat_template("chatml")
    (tmp_path / "t.jinja").write_text("{{ messages }}")
    assert read_chat_template(str(tmp_path / "t.jinja")) == "{{ messages }}"


def test_the_engine_takes_sglangs_option_names():
    """`sgl.Engine(enable_torch_compile=True)` as in SGLang; an unknown option is refused
    before anything loads, naming it alone."""
    import sgl

    with pytest.raises(TypeError) as e:
        sgl.Engine("default", enable_torch_compile=True, no_such_option=1)
    assert "['no_such_option']" in str(e.value)
