"""What programs are written with: @function, gen, select, roles, and the default backend."""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from sgl.lang import ir
from sgl.lang.backends.base import Backend, ProgramsNotServed
from sgl.lang.choices import ChoicesMethod
from sgl.lang.errors import ProgramError
from sgl.lang.generation import DTYPE_REGEX
from sgl.lang.global_config import global_config
from sgl.lang.interpreter import run_program, run_program_batch
from sgl.lang.program_state import ProgramState

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------- expressions


def gen(
    name: str | None = None,
    max_tokens: int | None = None,
    min_tokens: int | None = None,
    stop: str | list[str] | None = None,
    stop_token_ids: list[int] | None = None,
    stop_regex: str | list[str] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    repetition_penalty: float | None = None,
    ignore_eos: bool | None = None,
    return_logprob: bool | None = None,
    logprob_start_len: int | None = None,
    top_logprobs_num: int | None = None,
    return_text_in_logprobs: bool | None = None,
    dtype: type | str | None = None,
    choices: list[str] | None = None,
    choices_method: ChoicesMethod | None = None,
    regex: str | None = None,
    json_schema: str | dict | None = None,
    ebnf: str | None = None,
    seed: int | None = None,
    max_new_tokens: int | None = None,
    min_new_tokens: int | None = None,
    allowed_token_ids: list[int] | None = None,
    tools: list[Any] | None = None,
    tool_choice: str = "auto",
    parallel_tool_calls: bool = False,
) -> ir.Gen | ir.Select:
    """Generate into variable `name`. Unset parameters take the program's defaults.

    `choices=[...]` makes it a `select`; `dtype` (int, float, bool, str) constrains the
    output to a number, True/False or a double-quoted string. `tools` (Python functions or
    OpenAI tool dicts) lets the model call them in Hermes syntax (`<tool_call>{...}</tool_call>`,
    described to it by `sgl.tools_prompt(tools)`): every call is constrained to a declared
    function with arguments valid against its parameters, and the variable holds the calls,
    `[{"name": ..., "arguments": {...}}]` ([] if it answered in text). `tool_choice` "auto"
    (text or calls), "required" (calls only) or a function's name; `parallel_tool_calls`
    allows several calls.
    """
    if choices is not None:
        return select(name, choices, temperature=temperature or 0.0, choices_method=choices_method)
    if max_tokens is not None and max_new_tokens is not None and max_tokens != max_new_tokens:
        raise ValueError("give max_tokens or max_new_tokens, not both")
    sampling = {
        "max_new_tokens": max_new_tokens if max_new_tokens is not None else max_tokens,
        "min_new_tokens": min_new_tokens if min_new_tokens is not None else min_tokens,
        "stop": stop,
        "stop_token_ids": stop_token_ids,
        "stop_regex": stop_regex,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "min_p": min_p,
        "frequency_penalty": frequency_penalty,
        "presence_penalty": presence_penalty,
        "repetition_penalty": repetition_penalty,
        "ignore_eos": ignore_eos,
        "regex": regex,
        "json_schema": json_schema,
        "ebnf": ebnf,
        "seed": seed,
        "allowed_token_ids": allowed_token_ids,
        "structural_tag": _tools_constraint(tools, tool_choice, parallel_tool_calls)
        if tools
        else None,
    }
    logprobs = {
        "return_logprob": return_logprob,
        "logprob_start_len": logprob_start_len,
        "top_logprobs_num": top_logprobs_num,
        "return_text_in_logprobs": return_text_in_logprobs,
    }
    return ir.Gen(
        name,
        {k: v for k, v in sampling.items() if v is not None},
        {k: v for k, v in logprobs.items() if v is not None},
        _dtype_name(dtype),
        "hermes" if tools else None,
    )


def _tools_constraint(tools: list[Any], tool_choice: str, parallel: bool) -> dict[str, Any]:
    """The structural tag for a gen's tools (Hermes syntax)."""
    from sgl.tool_calls import function_tool, structural_tag

    fns = [function_tool(t)["function"] for t in tools]
    names = [f["name"] for f in fns]
    if tool_choice not in ("auto", "required", *names):
        raise ValueError(
            f"tool_choice must be 'auto', 'required' or one of the tools' names {names}; "
            f"got {tool_choice!r}"
        )
    chosen = [f for f in fns if tool_choice in ("auto", "required") or f["name"] == tool_choice]
    return structural_tag(
        [(f["name"], f.get("parameters", {"type": "object"})) for f in chosen],
        free_text=tool_choice == "auto",
        one_call=not parallel or tool_choice in names,
        parser="hermes",
    )


def tools_prompt(tools: list[Any]) -> str:
    """The system prompt text describing `tools` (functions or OpenAI tool dicts) and the
    call syntax that `gen(..., tools=...)` constrains to."""
    from sgl.tool_calls import function_tool
    from sgl.tool_calls import tools_prompt as describe

    return describe([function_tool(t) for t in tools], "hermes")


def _dtype_name(dtype: Any) -> str | None:
    if dtype is None:
        return None
    names = {int: "int", float: "float", bool: "bool", str: "str"}
    name = names.get(dtype, dtype if isinstance(dtype, str) else None)
    if name not in DTYPE_REGEX:
        raise ValueError(f"dtype must be one of int, float, bool, str; got {dtype!r}")
    return name


def gen_int(name: str | None = None, **kwargs: Any) -> ir.Gen:
    return gen(name, dtype=int, **kwargs)  # type: ignore[return-value]


def gen_string(name: str | None = None, **kwargs: Any) -> ir.Gen:
    return gen(name, dtype=str, **kwargs)  # type: ignore[return-value]


def select(
    name: str | None = None,
    choices: list[str] | None = None,
    temperature: float = 0.0,
    choices_method: ChoicesMethod | None = None,
) -> ir.Select:
    """Choose one of `choices` by likelihood (one batched scoring request) into `name`."""
    if not choices or not isinstance(choices, (list, tuple)):
        raise ValueError("select needs choices: a non-empty list of strings")
    for c in choices:
        if not isinstance(c, str) or not c:
            raise ValueError(f"select choices must be non-empty strings; got {c!r}")
    if not isinstance(temperature, (int, float)) or temperature < 0:
        raise ValueError(f"select temperature must be >= 0, got {temperature!r}")
    if choices_method is not None and not isinstance(choices_method, ChoicesMethod):
        raise ValueError(
            "choices_method must be sgl.token_length_normalized, sgl.greedy_token_selection or "
            "sgl.unconditional_likelihood_normalized"
        )
    return ir.Select(name, list(choices), float(temperature), choices_method)


def _role(role: str, expr: Any) -> ir.ExprList:
    if expr is None:
        raise ValueError(
            f"sgl.{role}(...) needs the role's content; for a block use `with s.{role}():`"
        )
    return ir.ExprList([ir.RoleBegin(role), ir.to_expr(expr), ir.RoleEnd(role)])


def system(expr: Any = None) -> ir.ExprList:
    return _role("system", expr)


def user(expr: Any = None) -> ir.ExprList:
    return _role("user", expr)


def assistant(expr: Any = None) -> ir.ExprList:
    return _role("assistant", expr)


def system_begin() -> ir.RoleBegin:
    return ir.RoleBegin("system")


def system_end() -> ir.RoleEnd:
    return ir.RoleEnd("system")


def user_begin() -> ir.RoleBegin:
    return ir.RoleBegin("user")


def user_end() -> ir.RoleEnd:
    return ir.RoleEnd("user")


def assistant_begin() -> ir.RoleBegin:
    return ir.RoleBegin("assistant")


def assistant_end() -> ir.RoleEnd:
    return ir.RoleEnd("assistant")


# ---------------------------------------------------------------------- the default backend

_backend_lock = threading.Lock()
_default_backend: Backend | None = None


def as_backend(backend: Any) -> Backend:
    """A Backend, an sgl.Engine (wrapped in process) or an sgl.Runtime (its endpoint)."""
    if isinstance(backend, Backend):
        return backend
    endpoint = getattr(backend, "endpoint", None)
    if isinstance(endpoint, Backend):
        return endpoint
    engine_module = sys.modules.get("sgl.runtime.engine")  # loaded if any Engine exists
    if engine_module is not None and isinstance(backend, engine_module.Engine):
        from sgl.lang.backends.engine import EngineBackend

        return EngineBackend(backend)
    raise TypeError(
        "expected an sgl backend (sgl.Engine, sgl.RuntimeEndpoint, ...), got "
        f"{type(backend).__name__}"
    )


def set_default_backend(backend: Any) -> None:
    global _default_backend
    with _backend_lock:
        _default_backend = as_backend(backend)


def get_default_backend() -> Backend:
    """The backend set with set_default_backend; if none, the embedded default model in process."""
    global _default_backend
    with _backend_lock:
        if _default_backend is None:
            from sgl.extras import needs_extra

            with needs_extra(
                "runtime", "running a program without a backend (the embedded model in process)"
            ):
                from sgl.lang.backends.engine import EngineBackend
                from sgl.runtime.engine import Engine

            _default_backend = EngineBackend(Engine(model_path="default"))
        return _default_backend


@contextlib.contextmanager
def swapped_default_backend(backend: Any = None) -> Iterator[None]:
    """Test hook: inside the block the default backend is `backend` (None: none is set, so the
    first program without a backend builds the embedded model); after it, the one before."""
    global _default_backend
    with _backend_lock:
        saved, _default_backend = _default_backend, None if backend is None else as_backend(backend)
    try:
        yield
    finally:
        with _backend_lock:
            _default_backend = saved


def _resolve(backend: Any) -> Backend:
    return as_backend(backend) if backend is not None else get_default_backend()


def flush_cache(backend: Any = None) -> bool:
    return _resolve(backend).flush_cache()


def get_server_info(backend: Any = None) -> dict[str, Any]:
    return _resolve(backend).get_server_info()


# ---------------------------------------------------------------------- programs

_RUN_DEFAULTS: dict[str, Any] = {
    "max_new_tokens": 128,
    "stop": None,
    "stop_token_ids": None,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "ignore_eos": False,
    "return_logprob": False,
    "logprob_start_len": None,
    "top_logprobs_num": None,
    "return_text_in_logprobs": None,
}


class SglFunction:
    """A program: a Python function whose first parameter is the state `s`."""

    def __init__(
        self,
        func: Callable[..., Any],
        num_api_spec_tokens: int | None = None,
        bind_arguments: dict[str, Any] | None = None,
    ) -> None:
        self.func = func
        if num_api_spec_tokens is not None and (
            not isinstance(num_api_spec_tokens, int) or num_api_spec_tokens < 1
        ):
            raise ValueError(
                f"num_api_spec_tokens must be a positive integer, got {num_api_spec_tokens!r}"
            )
        # Speculative execution on completion APIs (sgl.OpenAI(is_chat_model=False)); others ignore
        # it.
        self.num_api_spec_tokens = num_api_spec_tokens
        self.bind_arguments = dict(bind_arguments or {})
        params = list(inspect.signature(func).parameters.values())
        if not params:
            raise TypeError(
                f"@sgl.function {func.__name__}: the first parameter must be the state `s`"
            )
        self.arg_names = [p.name for p in params[1:]]
        functools.update_wrapper(self, func)

    def bind(self, **kwargs: Any) -> SglFunction:
        unknown = [k for k in kwargs if k not in self.arg_names]
        if unknown:
            raise TypeError(f"{self.func.__name__} has no parameter(s) {', '.join(unknown)}")
        return SglFunction(self.func, self.num_api_spec_tokens, {**self.bind_arguments, **kwargs})

    @staticmethod
    def _defaults(sampling: dict[str, Any]) -> dict[str, Any]:
        return {**_RUN_DEFAULTS, **{k: v for k, v in sampling.items() if k in _RUN_DEFAULTS}}

    def run(
        self,
        *args: Any,
        max_new_tokens: int = 128,
        stop: str | list[str] | None = None,
        stop_token_ids: list[int] | None = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
        min_p: float = 0.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        ignore_eos: bool = False,
        return_logprob: bool = False,
        logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None,
        return_text_in_logprobs: bool | None = None,
        stream: bool = False,
        backend: Any = None,
        ship: bool | str = "auto",
        **kwargs: Any,
    ) -> ProgramState:
        """Run the program; the keyword sampling parameters are defaults for its gen calls.

        `ship`: with a backend that runs programs server-side (`RuntimeEndpoint`), "auto"
        sends a static program's IR in one request and runs a dynamic one (its structure
        depends on generated values) here; True requires shipping (an error names the line
        that makes it dynamic); False always runs here. See `sgl.lang.shipping`."""
        defaults = dict(
            max_new_tokens=max_new_tokens,
            stop=stop,
            stop_token_ids=stop_token_ids,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            min_p=min_p,
            frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty,
            ignore_eos=ignore_eos,
            return_logprob=return_logprob,
            logprob_start_len=logprob_start_len,
            top_logprobs_num=top_logprobs_num,
            return_text_in_logprobs=return_text_in_logprobs,
        )
        kwargs = {**self.bind_arguments, **kwargs}
        be = _resolve(backend)
        shipped = self._ship(be, [(args, kwargs)], defaults, stream, ship)
        if shipped is not None:
            return shipped[0]
        return run_program(
            self.func,
            be,
            args,
            kwargs,
            defaults,
            stream=stream,
            spec_tokens=self.num_api_spec_tokens,
        )

    def _ship(
        self,
        backend: Backend,
        items: list[tuple[tuple, dict[str, Any]]],
        defaults: dict[str, Any],
        stream: bool,
        ship: bool | str,
        progress_bar: bool = False,
    ) -> list | None:
        """The shipped states of `items`, or None to run them here (see `run`)."""
        if ship not in ("auto", True, False):
            raise ValueError(f"ship must be 'auto', True or False, got {ship!r}")
        runner = getattr(backend, "run_program", None)
        # (auto keeps streamed runs client-side: there each piece comes with its gen's meta so far)
        if ship is False or (ship == "auto" and (runner is None or stream)):
            return None
        if runner is None:
            raise ValueError(
                f"ship=True: the {type(backend).__name__} backend cannot run programs server-side "
                "(RuntimeEndpoint can)"
            )
        from sgl.lang.ir_json import IRFormatError, program_to_json
        from sgl.lang.tracer import DynamicProgramError, trace_static

        try:
            programs = [program_to_json(trace_static(self, a, k)) for a, k in items]
        except (DynamicProgramError, IRFormatError) as e:
            if ship is True:
                raise
            logger.info("%s runs client-side: %s", self.func.__name__, e)
            return None
        from sgl.lang.shipping import batch_template

        template = batch_template(self, items, programs) if len(items) > 1 else None
        try:
            if (
                progress_bar and len(programs) > 1
            ):  # one request per item, so the bar moves as each finishes
                return _ship_with_progress(runner, programs, defaults)
            if template is not None:  # one program and each item's argument values
                return runner([template[0]], defaults, stream, arguments=template[1])
            return runner(programs, defaults, stream)
        except ProgramsNotServed as e:  # nothing ran: a router in front, say
            if ship is True:
                raise ProgramError(
                    f"{self.func.__name__}: ship=True, but the server cannot run programs ({e}); "
                    "use ship='auto' to run them client-side"
                ) from e
            return None
        except ValueError as e:  # the server refused it (a 400 names the field)
            raise ProgramError(f"{self.func.__name__}: {e}") from e

    def __call__(self, *args: Any, **kwargs: Any) -> ProgramState:
        return self.run(*args, **kwargs)

    def run_batch(
        self,
        batch_kwargs: list[dict[str, Any] | tuple | list],
        *,
        num_threads: int | str = "auto",
        progress_bar: bool = False,
        backend: Any = None,
        ship: bool | str = "auto",
        **sampling: Any,
    ) -> list[ProgramState]:
        """Run once per item (a dict of arguments or a tuple of positional ones), concurrently.

        The program's constant prefix (found by tracing) is computed once before the batch,
        so every item starts with a cache hit. Results keep input order; a failing item's
        state holds its error. `ship` as in `run`: a static program's batch goes to the
        server in one request.
        """
        unknown = [k for k in sampling if k not in _RUN_DEFAULTS]
        if unknown:
            raise TypeError(f"run_batch got unexpected keyword argument(s) {', '.join(unknown)}")
        if not isinstance(batch_kwargs, (list, tuple)):
            raise TypeError("run_batch takes a list of argument dicts or tuples")
        items: list[tuple[tuple, dict[str, Any]]] = []
        for i, item in enumerate(batch_kwargs):
            if isinstance(item, dict):
                items.append(((), {**self.bind_arguments, **item}))
            elif isinstance(item, (tuple, list)):
                items.append((tuple(item), dict(self.bind_arguments)))
            else:
                raise TypeError(
                    f"run_batch item {i} must be a dict of arguments or a tuple; got "
                    f"{type(item).__name__}"
                )
        be = _resolve(backend)
        shipped = (
            self._ship(be, items, self._defaults(sampling), False, ship, progress_bar)
            if items
            else None
        )
        if (
            shipped is not None
        ):  # one request for the whole batch (the server caches the shared prefix)
            return shipped
        if items and global_config.enable_precache_with_tracing:
            try:
                self.cache(be)
            except Exception as e:  # only an optimisation: the items still run (and report errors)
                logger.warning("run_batch: caching the constant prefix failed: %s", e)
        return run_program_batch(
            self.func,
            be,
            items,
            self._defaults(sampling),
            num_threads,
            progress_bar,
            spec_tokens=self.num_api_spec_tokens,
        )

    def trace(self, **kwargs: Any):
        """Run the program on placeholder arguments (or the given ones) and return its IR
        graph (printable); nothing is generated."""
        from sgl.lang.tracer import trace_program

        return trace_program(self, kwargs)

    def cache(self, backend: Any = None) -> str:
        """Compute the program's constant prefix into the backend's cache; returns it."""
        from sgl.lang.tracer import constant_prefix

        be = _resolve(backend)
        prefix = constant_prefix(self, be)
        if prefix:
            be.cache_prefix(prefix)
        return prefix


def function(func: Callable[..., Any] | None = None, *, num_api_spec_tokens: int | None = None):
    """Decorator: `@sgl.function` or `@sgl.function(num_api_spec_tokens=64)`."""
    if func is None:
        return lambda f: SglFunction(f, num_api_spec_tokens=num_api_spec_tokens)
    return SglFunction(func, num_api_spec_tokens=num_api_spec_tokens)


def _ship_with_progress(
    runner: Callable[..., list], programs: list[dict[str, Any]], defaults: dict[str, Any]
) -> list:
    """Ship each program as its own concurrent request and advance a tqdm bar as each
    completes (the server batches them together, and its prefix cache shares the prefix);
    results keep input order."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    from tqdm.auto import tqdm

    results: list = [None] * len(programs)
    with (
        tqdm(total=len(programs), desc="run_batch") as bar,
        ThreadPoolExecutor(
            max_workers=min(64, len(programs)), thread_name_prefix="sgl-ship"
        ) as pool,
    ):
        futures = {
            pool.submit(runner, [program], defaults, False): i for i, program in enumerate(programs)
        }
        for fut in as_completed(futures):
            results[futures[fut]] = fut.result()[0]
            bar.update(1)
    return results
