"""What one scheduler is built from: the model, the KV plan, the scheduler itself, and the
facts about them that the engine's caller side needs (`ModelInfo`, plain data).

Used in both modes: the engine builds it on a thread of its own process (thread mode), or
the scheduler process builds it (scheduler_process.py) and sends the `ModelInfo` back.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from sgl.runtime.config import EngineConfig, SchedulerConfig
from sgl.runtime.model.config import ModelConfig

logger = logging.getLogger(__name__)


@dataclass
class ModelInfo:
    """What callers know of a built scheduler (sent by a scheduler process when it is ready)."""

    model_config: ModelConfig
    model_path: str  # resolved (the GGUF file for "default")
    tokenizer_path: str | None  # None: the byte-level tokenizer of a dummy model without one
    context_len: int
    memory_plan: dict[str, Any]
    eos_token_ids: list[int]
    weight_layouts: dict[str, Any]
    weight_bytes: int = 0  # what this rank's model holds (its shard under tensor parallelism)
    dense_copy_bytes: int = 0  # of which dense copies of quantized layers (dense_copy.py)


def on_fresh_thread(fn: Callable[[], Any]) -> Any:
    """Run fn on a thread that then exits; returns its result or re-raises its exception here.

    Loading the weights and allocating the KV pool run parallel torch ops. On the caller's
    thread they would give it a lasting OpenMP thread pool; with the scheduler thread's own
    pool, libgomp then sees more threads than cores and stops spinning between parallel
    regions, so every op of every step pays a thread wake-up (measured on 2 cores: small
    parallel ops 5-16x slower in the scheduler thread). A thread's pool is freed when it exits.
    """
    result: list[Any] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(fn())
        except BaseException as e:  # re-raised on the caller's thread
            error.append(e)

    t = threading.Thread(target=run, name="sgl-engine-init", daemon=True)  # Ctrl-C can still exit
    t.start()
    t.join()
    if error:
        raise error[0]
    return result[0]


def build_scheduler(
    cfg: EngineConfig, emit: Callable[[list], None], tp: Any = None, ranks: Any = None
) -> tuple[Any, ModelInfo, Any]:
    """Load the model (this rank's shard under `tp`, a `distributed.TPGroup`) and tokenizer,
    plan the KV pool and build the scheduler (not started). Returns (scheduler, its ModelInfo,
    the tokenizer). `cfg` becomes the scheduler's own: the caller passes a copy (options change
    only through `UpdateOptions` messages). `ranks` keeps tensor-parallel ranks in step."""
    from sgl.runtime.memory_plan import plan_kv_pool
    from sgl.runtime.model.dense_copy import held_copy_bytes
    from sgl.runtime.model.quant import quantization_summary
    from sgl.runtime.model_runner import ModelRunner
    from sgl.runtime.scheduler import Scheduler

    if cfg.random_seed is not None:
        torch.manual_seed(cfg.random_seed)
    device = cfg.resolve_device()
    dtype, _ = cfg.resolve_dtype(device)
    model, mc, path, tok_path = load_engine_model(cfg, dtype, device, tp)
    tokenizer = load_engine_tokenizer(tok_path)
    context_len = cfg.context_length or mc.max_position_embeddings
    if context_len > mc.max_position_embeddings:
        raise ValueError(
            f"context_length {context_len} exceeds the model's max_position_embeddings "
            f"{mc.max_position_embeddings}"
        )
    runner = ModelRunner(model, cfg, device, dtype)
    sharers = cfg.tp_size if device.type == "cpu" else 1  # CPU ranks plan from the same host memory
    memory_plan = plan_kv_pool(
        cfg,
        mc,
        device,
        dtype,
        lambda tokens: runner.backend_reserved_bytes(tokens, dtype),
        runner.num_kv_heads,
        sharers,
    )
    if ranks is not None:  # every rank runs the same pool (the same batches)
        memory_plan["max_total_tokens"] = ranks.agree_min(memory_plan["max_total_tokens"])
    eos = set(mc.eos_token_ids)
    if tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    info = ModelInfo(
        mc,
        str(path),
        tok_path,
        context_len,
        dict(memory_plan),
        sorted(eos),
        quantization_summary(model),
        model_bytes(model),
        held_copy_bytes(model),
    )
    sched_cfg = SchedulerConfig(cfg, memory_plan["max_total_tokens"], context_len, device, dtype)
    draft = None
    if cfg.speculative_algorithm == "STANDALONE":
        draft = build_draft_model(cfg, mc, str(path), dtype, device, context_len)
    scheduler = Scheduler(
        sched_cfg, runner, copy.deepcopy(tokenizer), info.eos_token_ids, emit, ranks, draft
    )
    return scheduler, info, tokenizer


def build_draft_model(
    cfg: EngineConfig,
    target: ModelConfig,
    target_path: str,
    dtype: torch.dtype,
    device: torch.device,
    context_len: int,
) -> Any:
    """STANDALONE speculation's draft model (speculative/draft_model.py): the given checkpoint,
    or the target's own weights (int4 unless said otherwise); it must share the target's
    vocabulary."""
    from sgl.runtime.model_runner import ModelRunner
    from sgl.runtime.speculative.draft_model import DraftModel

    path = cfg.speculative_draft_model_path
    quantization = cfg.speculative_draft_model_quantization or ("auto" if path else "int4")
    dcfg = dataclasses.replace(
        cfg,
        model_path=path or target_path,
        quantization=quantization,
        dense_copy="off",  # the draft runs small batches: bf16 copies would only cost memory
        load_format="auto" if path else cfg.load_format,
    )
    logger.info("loading the draft model (%s)", quantization)
    model, mc, dpath, _ = load_engine_model(dcfg, dtype, device)
    if mc.vocab_size != target.vocab_size:
        raise ValueError(
            f"speculative_draft_model_path: the draft model's vocabulary ({mc.vocab_size} "
            f"tokens) is not the target's ({target.vocab_size}); the draft must share its tokenizer"
        )
    runner = ModelRunner(model, dcfg, device, dtype)
    draft = DraftModel(runner, cfg.max_running_requests, context_len, dtype)
    draft.description = {
        "draft_model_path": str(dpath),
        "draft_quantization": quantization,
        "draft_weight_bytes": model_bytes(model),
    }
    return draft


def model_bytes(model: torch.nn.Module) -> int:
    """Bytes of the tensors a model holds: parameters, buffers and tensors kept as attributes
    (packed or quantized weights), each storage counted once."""
    seen: set[int] = set()
    total = 0
    for module in model.modules():
        tensors = [
            *module._parameters.values(),
            *module._buffers.values(),
            *(v for v in vars(module).values() if isinstance(v, torch.Tensor)),
        ]
        for t in tensors:
            if t is None or t.is_meta:
                continue
            if (
                t.is_mkldnn
            ):  # oneDNN's packed layout (bf16 on AVX512-BF16 / AMX): no storage to share
                total += t.numel() * t.element_size()
                continue
            storage = t.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
    return total


def private_config(cfg: EngineConfig) -> EngineConfig:
    """The scheduler's own copy of the options: the caller's object is never read across threads."""
    return dataclasses.replace(cfg)


def effective_quantization(quantization: str, device: torch.device) -> str:
    """The weight layout policy on this device: the int8 / int4 kernels are torch's packed CPU
    matmuls, so off the CPU "auto" loads dense weights and int8 / int4 are refused."""
    if device.type == "cpu":
        return quantization
    if quantization in ("int8", "int4"):
        raise ValueError(
            f"quantization={quantization!r} runs on the CPU only (torch's packed CPU matmuls); "
            f"on {device.type} use quantization='none' or 'auto' (dense weights)"
        )
    return "none"


def load_engine_model(
    cfg: EngineConfig, dtype: torch.dtype, device: torch.device, tp: Any = None
) -> tuple:
    """(model, model config, resolved model path, tokenizer path or None); under `tp` this
    rank's shard, read from the checkpoint without the whole tensors (loader.py)."""
    shard = {} if tp is None else {"tp": tp}
    quantization = effective_quantization(cfg.quantization, device)
    from sgl.runtime.model.cpu_packed import pack_dense_layers, packing_applies
    from sgl.runtime.model.dense_copy import add_dense_copies
    from sgl.runtime.model.loader import load_model
    from sgl.runtime.model.paths import resolve_model_path
    from sgl.runtime.model.quant_policy import QuantPolicy, quantize_model

    if cfg.load_format == "dummy":
        from sgl.runtime.model.dummy import dummy_tokenizer_source, load_dummy_model

        path = cfg.model_path
        model, mc = load_dummy_model(
            cfg.model_path, dtype, device, seed=cfg.random_seed or 0, **shard
        )
        quantize_model(model, QuantPolicy(quantization, cfg.int4_group_size))
        tok_path = cfg.tokenizer_path or dummy_tokenizer_source(cfg.model_path)
    else:
        path = resolve_model_path(cfg.model_path)
        logger.info("loading the weights of %s", path)
        start = time.perf_counter()
        model, mc = load_model(path, dtype, device, quantization, cfg.int4_group_size, **shard)
        logger.info("loaded the weights in %.1f s", time.perf_counter() - start)
        tok_path = cfg.tokenizer_path or path
    if packing_applies(dtype, device):
        logger.info("packing the dense layers for the CPU")
        start = time.perf_counter()
        pack_dense_layers(model)
        add_dense_copies(model, lambda: dense_copy_budget(cfg.dense_copy, device, tp))
        logger.info("packed the dense layers in %.1f s", time.perf_counter() - start)
    elif cfg.dense_copy == "on" and device.type == "cpu":
        logger.warning(
            "dense_copy='on' keeps no copies here: they are bf16 matmuls, kept only for a bfloat16 "
            "model on a CPU with AMX or AVX512-BF16 (this model: %s)",
            str(dtype).removeprefix("torch."),
        )
    if device.type == "cpu":  # build (or load) the fused layer ops now, not inside the first step
        from sgl.runtime.model.layer_ops import layer_ops_built

        layer_ops_built()
    return model, mc, path, tok_path


def dense_copy_budget(mode: str, device: torch.device, tp: Any = None) -> int:
    """Bytes this rank may spend on dense copies of its quantized layers (dense_copy.py): the
    ranks of one host share its memory."""
    from sgl.runtime.memory_plan import available_memory_bytes
    from sgl.runtime.model.dense_copy import budget_bytes

    return budget_bytes(mode, available_memory_bytes(device)) // (1 if tp is None else tp.size)


def load_engine_tokenizer(tok_path: str | None) -> Any:
    """The tokenizer at `tok_path` (an HF directory or a GGUF file); None: byte-level."""
    from sgl.runtime.tokenizer import load_tokenizer

    if tok_path is None:
        from sgl.runtime.model.dummy import byte_level_tokenizer

        logger.warning("no tokenizer found for the dummy model: using a byte-level one")
        return byte_level_tokenizer()
    if str(tok_path).endswith(".gguf"):
        return load_tokenizer(os.path.dirname(tok_path), gguf_file=os.path.basename(tok_path))
    return load_tokenizer(tok_path)
