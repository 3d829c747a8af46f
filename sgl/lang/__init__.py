"""The frontend DSL: @function programs with gen / select / roles / fork, and their interpreter.

Pure Python: the runtime (torch) is imported only when a program first runs on the
in-process engine.
"""

from sgl.lang.api import (
    SglFunction,
    as_backend,
    assistant,
    assistant_begin,
    assistant_end,
    flush_cache,
    function,
    gen,
    gen_int,
    gen_string,
    get_default_backend,
    get_server_info,
    select,
    set_default_backend,
    system,
    system_begin,
    system_end,
    tools_prompt,
    user,
    user_begin,
    user_end,
)
from sgl.lang.backends.base import Backend
from sgl.lang.chat_template import ChatTemplate
from sgl.lang.choices import (
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)
from sgl.lang.errors import ProgramError
from sgl.lang.global_config import global_config
from sgl.lang.program_state import ProgramState, ProgramStateGroup

__all__ = [
    "Backend",
    "ChatTemplate",
    "ProgramError",
    "ProgramState",
    "ProgramStateGroup",
    "SglFunction",
    "as_backend",
    "assistant",
    "assistant_begin",
    "assistant_end",
    "flush_cache",
    "function",
    "gen",
    "gen_int",
    "gen_string",
    "tools_prompt",
    "get_default_backend",
    "global_config",
    "get_server_info",
    "greedy_token_selection",
    "select",
    "set_default_backend",
    "system",
    "system_begin",
    "system_end",
    "token_length_normalized",
    "unconditional_likelihood_normalized",
    "user",
    "user_begin",
    "user_end",
]
