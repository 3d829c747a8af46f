"""torch.compile'd (inductor, C++) forwards for decode steps on CPU: one graph for batch 1,
one for every batch of 2 or more rows.

Why: a decode step of a small model is mostly per-op overhead, not matmuls: ~40 small torch ops
per layer (norms, RoPE, SwiGLU, residuals, casts), each a dispatch and a pass over memory.
Inductor fuses them into a few generated C++ loops around the matmul and attention calls
(measured on SmolLM2 int4 at batch 1: 14.0 -> 10.6-12 ms per forward; bf16 at 48 rows: 82 ->
55-68 ms). Where the fused layer ops are built (`model/layer_ops`), the norms, RoPE and the
gated activation are those ops inside the graphs, so that a row's result is the same in every
graph (a speculative verify row equals the decode step it stands for); inductor fuses what is
left and the graphs' gain is the calls they save. Only pure decode steps on the `cpu` attention
kernel take them; prefill and mixed steps run eagerly. The batch-1 graph is static (one shape,
guards never change); the batched one is compiled once with the row count symbolic
(`mark_dynamic`), so every batch size from 2 up runs it without recompiling. A quantized
layer's packed-or-dequantize choice, which depends on the row count, is made at run time inside
one C++ op per layer (model/csrc/linear_ops_cpu.cpp), so the graph neither guards on it nor
recompiles. Both are compiled at start-up (`warm`, on padding rows), timed and reported;
inductor caches the generated code on disk, so a restart pays a fraction (SmolLM2 bf16 batched:
52 s cold, 8 s warm). Inductor's C++ wrapper (`cpp_wrapper`) calls the generated kernels from
C++ instead of a Python function: at batch 1 that cuts ~0.4 ms of a ~4.8 ms SmolLM2 int4 step,
at 48 rows ~7% of the step. A graph the C++ wrapper cannot build is compiled with the Python
one; any other failure leaves the eager path for that graph, with the reason reported.

Guards: before each call dynamo checks that what the graph was traced from still holds; by
default that includes every attribute of every submodule and every weight's shape (~0.7 ms
of a ~5 ms SmolLM2 batch-1 step on 2 Zen 4 cores). A model's modules do not change once
compiled here (weights, dense copies and crossovers are set before `CompiledDecode`), so the
guards on them are skipped (torch's `skip_guard_on_all_nn_modules_unsafe`: ~0.1 ms left). What
makes that safe with several engines in one process (tests, a draft model) is that each
compiles its own copy of the forward's code object (`own_forward`): dynamo keeps compiled
graphs per code object, and without the module guards two models of one class would
otherwise share one graph.
"""

from __future__ import annotations

import itertools
import logging
import time
import types
from collections.abc import Callable

import torch

from sgl.runtime.attention.base import ForwardBatch
from sgl.runtime.model.layer_ops import layer_ops_built
from sgl.runtime.model.quant_route import prepare_for_compile

logger = logging.getLogger(__name__)

_fake_registered = False
WRAPPERS = ("cpp", "python")  # inductor wrappers, tried in this order
_forward_copies = itertools.count()


def own_forward(model: torch.nn.Module) -> Callable:
    """`model.forward` bound to a fresh copy of its code object: dynamo's compiled graphs (and
    their guards) are kept per code object, so this model's never serve another model."""
    fn = type(model).forward
    code = fn.__code__.replace(co_name=f"{fn.__name__}_compiled_{next(_forward_copies)}")
    copy = types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    return types.MethodType(copy, model)


def _options(wrapper: str) -> dict:
    return {
        "cpp_wrapper": wrapper == "cpp",
        "guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe,
    }


def _register_attention_fake() -> None:
    """Shapes of our attention op for the compiler (the output is shaped like q)."""
    global _fake_registered
    if not _fake_registered:
        torch.library.register_fake("sgl_cpu::paged_attention")(
            lambda q, k_buf, v_buf, table, rows, scale, window=0, logit_cap=0.0: torch.empty_like(q)
        )
        _fake_registered = True


class CompiledDecode:
    """The compiled decode forwards; `info` says which are in use and why."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.model_forward = own_forward(model)  # this model's own graphs and guards
        self.forward: Callable | None = None  # batch 1
        self.batched: Callable | None = None  # 2+ rows, the row count symbolic
        self.info: dict = {"enabled": False}

    def warm(self, make_batch: Callable[[int], ForwardBatch], attn_backend) -> None:
        """Compile on one-token steps of padding rows built by `make_batch(rows)`; on any error
        the eager path stays for that graph and the error is reported."""
        if not getattr(attn_backend, "uses_kernel", False):
            self.info = {"enabled": False, "reason": "needs the cpu attention kernel"}
            return
        _register_attention_fake()
        layer_ops_built()  # built (and its shapes registered) before tracing reaches it
        prepare_for_compile(self.model)
        seconds: dict[str, float] = {}
        errors: dict[str, str] = {}
        wrappers: dict[str, str] = {}
        logger.info(
            "compiling the decode graphs (batch 1, batch 2+) with torch.compile: minutes the "
            "first time "
            "on a small CPU, seconds once inductor's disk cache holds them"
        )
        self.forward = self._compile(
            "batch 1", self._batch1, make_batch(1), attn_backend, seconds, errors, wrappers
        )
        self.batched = self._compile(
            "batch 2+", self._batched, make_batch(2), attn_backend, seconds, errors, wrappers
        )
        self.info = {
            "enabled": self.forward is not None or self.batched is not None,
            "compile_seconds": round(sum(seconds.values()), 1),
            "graphs": seconds,
            "wrappers": wrappers,
        }
        logger.info(
            "compiled %d of 2 decode graphs in %.1f s", len(seconds), self.info["compile_seconds"]
        )
        if errors:
            self.info["errors"] = errors

    def _batch1(self, wrapper: str) -> Callable:
        """One static graph."""
        return torch.compile(self.model_forward, dynamic=False, options=_options(wrapper))

    def _batched(self, wrapper: str) -> Callable:
        """One graph with the row count symbolic."""
        batched = torch.compile(self.model_forward, dynamic=None, options=_options(wrapper))

        def run_batched(
            input_ids: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch
        ) -> torch.Tensor:
            for t in (input_ids, positions, batch.out_cache_loc, batch.metadata.rows):
                torch._dynamo.mark_dynamic(t, 0)
            return batched(input_ids, positions, batch)

        return run_batched

    def _compile(
        self,
        name: str,
        make: Callable[[str], Callable],
        batch: ForwardBatch,
        attn_backend,
        seconds: dict,
        errors: dict,
        wrappers: dict,
    ) -> Callable | None:
        """The graph compiled (and run once) with the first wrapper that works, else None
        (eager)."""
        t = time.perf_counter()
        for wrapper in WRAPPERS:
            logger.info("compiling the %s decode forward (%s wrapper)", name, wrapper)
            try:
                forward = make(wrapper)
                attn_backend.init_forward_metadata(batch)
                with torch.inference_mode():
                    forward(batch.input_ids, batch.positions, batch)
            except Exception as e:  # no compiler, an inductor bug: the next wrapper, then eager
                logger.warning(
                    "torch.compile (%s wrapper) of the %s decode forward failed: %s",
                    wrapper,
                    name,
                    e,
                )
                errors[f"{name} ({wrapper} wrapper)"] = f"{type(e).__name__}: {e}"[:300]
                continue
            seconds[name] = round(time.perf_counter() - t, 1)
            wrappers[name] = wrapper
            logger.info(
                "compiled the %s decode forward (%s wrapper) in %.1f s",
                name,
                wrapper,
                seconds[name],
            )
            return forward
        logger.warning("the %s decode forward runs eagerly", name)
        return None

    def pick(self, extend_lens: list[int]) -> Callable | None:
        """The compiled forward for a step of these rows, or None (eager)."""
        if len(extend_lens) == 1:
            return self.forward if extend_lens[0] == 1 else None
        return self.batched if all(e == 1 for e in extend_lens) else None
