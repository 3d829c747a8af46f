"""`EngineControl`: the engine's control surface, i.e. the queries a caller sends the scheduler
and waits on for a `Reply` (sessions, profiling, cache flush, server info, live options) and
`abort`. A mixin of `Engine`, apart from generation because each is one message and one reply."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from sgl.runtime.errors import EngineDeadError
from sgl.runtime.messages import (
    AbortRequest,
    CloseSession,
    FlushCache,
    GetInfo,
    OpenSession,
    Profile,
    UpdateOptions,
)

QUERY_TIMEOUT_S = 60.0


class EngineControl:
    """`Engine`'s queries (it provides `_send`, `_router`, `_check_open`, `config` and the model
    info)."""

    def _query(self, make: Any) -> Any:
        self._check_open()
        reply_id = uuid.uuid4().hex
        fut = self._router.expect_reply(reply_id)
        self._send(make(reply_id))
        return fut

    def open_session(
        self,
        capacity_tokens: int | None = None,
        session_id: str | None = None,
        timeout: float | None = None,
    ) -> str:
        """Open a session and return its id. Requests with `session_params={"id": ...}` are
        its turns: each finished turn's KV stays pinned in the radix cache (safe from
        eviction) until `close_session` or `timeout` seconds without use (default 600).
        `capacity_tokens` caps one turn's history + input + max_new_tokens (default: the
        context length). Sessions pin at most half the KV pool together: past that, and when
        running requests would otherwise stall, the least recently used are unpinned (they
        stay open; their next turn recomputes what was evicted)."""
        session_id = (
            uuid.uuid4().hex if session_id is None else session_id
        )  # the same on every rank
        return self._query(
            lambda rid: OpenSession(rid, capacity_tokens, session_id, timeout)
        ).result(QUERY_TIMEOUT_S)

    def close_session(self, session_id: str) -> bool:
        """Close a session: its unfinished turns are aborted and its KV unpinned. False if it
        was not open (closed or timed out)."""
        return self._query(lambda rid: CloseSession(rid, session_id)).result(QUERY_TIMEOUT_S)

    async def async_open_session(
        self,
        capacity_tokens: int | None = None,
        session_id: str | None = None,
        timeout: float | None = None,
    ) -> str:
        session_id = uuid.uuid4().hex if session_id is None else session_id
        return await asyncio.wrap_future(
            self._query(lambda rid: OpenSession(rid, capacity_tokens, session_id, timeout))
        )

    async def async_close_session(self, session_id: str) -> bool:
        return await asyncio.wrap_future(self._query(lambda rid: CloseSession(rid, session_id)))

    def abort(self, rid: str) -> None:
        """Abort a request by id (with n > 1, all its samples); it finishes with finish_reason
        type 'abort' and frees its KV. On a dead scheduler process there is nothing to abort."""
        try:
            self._send(AbortRequest(rid))
        except EngineDeadError:
            pass

    def start_profile(
        self,
        output_dir: str,
        num_steps: int | None = None,
        activities: list[str] | None = None,
        record_shapes: bool = False,
        with_stack: bool = False,
    ) -> str:
        """Record the scheduler's forward steps with the torch profiler until `stop_profile`
        (or `num_steps` steps); `activities` from "CPU", "GPU". The trace goes to `output_dir`."""
        options = dict(
            output_dir=output_dir,
            num_steps=num_steps,
            activities=activities,
            record_shapes=record_shapes,
            with_stack=with_stack,
        )
        return self._query(lambda rid: Profile(rid, options)).result(QUERY_TIMEOUT_S)

    def stop_profile(self) -> str:
        """End the running profile; returns the Chrome trace file it wrote."""
        return self._query(lambda rid: Profile(rid, None)).result(QUERY_TIMEOUT_S)

    def flush_cache(self) -> bool:
        """Drop the radix cache. Refused (False) while requests are in flight."""
        return self._query(FlushCache).result(QUERY_TIMEOUT_S)

    def get_server_info(self) -> dict[str, Any]:
        info = self._query(GetInfo).result(QUERY_TIMEOUT_S)
        mc, cfg = self.model_config, self.config
        info.update(
            {
                # as given (clients pick chat templates by it)
                "model_path": self.config.model_path,
                "resolved_model_path": str(self.model_path),
                "architecture": mc.arch,
                "attention_features": sorted(mc.attention_features),
                "num_experts": mc.num_experts,
                "device": str(self.device),
                "dtype": str(self.dtype).replace("torch.", ""),
                "dtype_reason": self.dtype_reason,
                "quantization": cfg.quantization,
                "weight_layouts": self.model_info.weight_layouts,
                "dense_copy": cfg.dense_copy,
                "dense_copy_bytes": self.model_info.dense_copy_bytes,
                "scheduler_process": cfg.in_processes,
                "tp_size": cfg.tp_size,
                "scheduler_pids": self.scheduler_pids,
                "context_length": self.context_len,
                "vocab_size": mc.vocab_size,
                "num_layers": mc.num_hidden_layers,
                "num_kv_heads": mc.num_key_value_heads,
                "head_dim": mc.head_dim,
                "schedule_policy": cfg.schedule_policy,
                "chunked_prefill_size": cfg.chunked_prefill_size,
                "disable_radix_cache": cfg.disable_radix_cache,
                "max_running_requests": cfg.max_running_requests,
                "load_format": cfg.load_format,
                "grammar_backend": cfg.grammar_backend,
                "memory_plan": dict(self.memory_plan),
                "rank_memory": [
                    {
                        "rank": rank,
                        "weight_bytes": r.weight_bytes,
                        "kv_pool_bytes": r.memory_plan["kv_bytes_per_token"]
                        * r.memory_plan["max_total_tokens"],
                    }
                    for rank, r in enumerate(
                        getattr(self._transport, "rank_infos", None) or [self.model_info]
                    )
                ],
            }
        )
        return info

    def update_options(self, **values: Any) -> dict[str, Any]:
        """Change options the scheduler allows to change while running (`messages.LIVE_OPTIONS`,
        e.g. `disable_jump_forward`); returns their values now. `engine.config` is the caller's
        record and follows."""
        result = self._query(lambda rid: UpdateOptions(rid, dict(values))).result(QUERY_TIMEOUT_S)
        for name, value in result.items():
            setattr(self.config, name, value)
        return result
