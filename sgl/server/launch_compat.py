"""SGLang's and vLLM's launch names: value aliases, `--config`, `--chat-template`,
`--kv-cache-dtype`.

So a command line written for `sglang.launch_server` (or vLLM) runs here where we do the same
thing, and says what we lack where we do not.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

# SGLang's and vLLM's --dtype spellings
DTYPE_ALIASES = {
    "half": "float16",
    "float": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp32": "float32",
}

KV_CACHE_DTYPES = ("auto", "bfloat16", "bf16", "float16", "fp16", "float32")


def add_compat_flags(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("compatibility")
    group.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="a YAML or JSON mapping of flag names (without dashes, - or _) to values; flags "
        "on the command line override it",
    )
    group.add_argument(
        "--chat-template",
        default=None,
        metavar="FILE",
        help="a Jinja chat template file used instead of the tokenizer's, by /v1/chat/completions "
        "and the frontend's chat roles",
    )
    group.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=KV_CACHE_DTYPES,
        help="the KV cache is kept in the model's --dtype: auto, or that same dtype (no fp8)",
    )


def config_argv(parser: argparse.ArgumentParser, path: str) -> list[str]:
    """The flags of a --config file as command-line tokens (put before the real ones, which
    then win); ValueError naming an unknown key or an unreadable file."""
    import yaml  # the server extra's pyyaml; JSON is YAML too

    try:
        with open(path, encoding="utf-8") as f:
            table = yaml.safe_load(f)
    except OSError as e:
        raise ValueError(f"--config: cannot read {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ValueError(f"--config: {path} is not YAML or JSON: {e}") from None
    if table is None:
        return []
    if not isinstance(table, dict):
        raise ValueError(f"--config: {path} must hold a mapping of flag names to values")
    out: list[str] = []
    for key, value in table.items():
        flag = "--" + str(key).lstrip("-").replace("_", "-")
        action = parser._option_string_actions.get(flag)
        if action is None or flag == "--config":
            raise ValueError(
                f"--config: unknown key {key!r} in {path}: keys are this command's flags "
                "without the dashes (see --help)"
            )
        out += _tokens(action, flag, value)
    return out


def _tokens(action: argparse.Action, flag: str, value: Any) -> list[str]:
    if isinstance(action, argparse.BooleanOptionalAction):
        return [flag if value else "--no-" + action.option_strings[0][2:]]
    if isinstance(action, argparse._StoreTrueAction):
        return [flag] if value else []
    if isinstance(value, (list, tuple)):
        return [flag, *map(str, value)]
    return [flag, str(value)]


def check_kv_cache_dtype(args: argparse.Namespace) -> None:
    """ValueError unless --kv-cache-dtype is auto or names --dtype (the only layout of our KV
    pool)."""
    kv = DTYPE_ALIASES.get(args.kv_cache_dtype, args.kv_cache_dtype)
    if kv != "auto" and kv != args.dtype:
        raise ValueError(
            f"--kv-cache-dtype {args.kv_cache_dtype}: the KV cache is kept in the model dtype; "
            f"give --dtype {kv} (or --kv-cache-dtype auto)"
        )


def use_chat_template(tokenizer: Any, text: str) -> None:
    """Make `text` the template /v1/chat/completions renders with (Engine.render_messages reads
    the tokenizer's), the tool-call format is detected from and the chat roles come from: set
    before create_app."""
    tokenizer.chat_template = text


def read_chat_template(path: str) -> str:
    """The Jinja text of a --chat-template file; ValueError for a name (we ship no built-ins) or
    an unreadable file."""
    if not os.path.isfile(path):
        raise ValueError(
            f"--chat-template {path}: no such file; give a Jinja template file (built-in "
            "template names are not supported: the model's own template is the default)"
        )
    with open(path, encoding="utf-8") as f:
        return f.read()
