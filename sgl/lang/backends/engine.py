"""The in-process backend: programs call an `sgl.Engine` directly."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from sgl.lang.backends.scoring import TokenScoringBackend, logprobs_of
from sgl.lang.chat_template import ChatTemplate
from sgl.runtime.results import merge_logprobs


class EngineBackend(TokenScoringBackend):
    """Sessions: each program state's KV is pinned while it runs. The whole program text is
    sent each time (it equals the program state exactly), so a turn never continues an
    earlier one by rid and results never depend on the session."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._template: ChatTemplate | None = None
        self._lock = threading.Lock()

    def generate(
        self,
        text: str,
        sampling: dict[str, Any],
        logprobs: dict[str, Any],
        session: str | None = None,
    ) -> tuple[str, dict[str, Any]]:
        out = self.engine.generate(
            text, sampling, session_params=_session_params(session), **logprobs
        )
        return out["text"], out["meta_info"]

    def generate_stream(
        self,
        text: str,
        sampling: dict[str, Any],
        logprobs: dict[str, Any],
        session: str | None = None,
    ) -> Iterator[tuple[str, dict[str, Any] | None]]:
        chunks = self.engine.generate(
            text, sampling, stream=True, session_params=_session_params(session), **logprobs
        )
        so_far: dict[str, list] = {}
        for chunk in chunks:
            meta = chunk["meta_info"]
            if "output_token_logprobs" in meta:  # the engine streams each chunk's own entries
                merge_logprobs(so_far, meta)
                meta = {**meta, **{k: list(v) for k, v in so_far.items()}}
            yield chunk["text"], meta

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.engine.encode(t) for t in texts]

    def score_tokens(self, id_lists: list[list[int]], start: int) -> list[list[float]]:
        outs = self.engine.generate(
            input_ids=id_lists,
            sampling_params={"max_new_tokens": 0},
            return_logprob=True,
            logprob_start_len=start,
        )
        return [logprobs_of(o["meta_info"]) for o in outs]

    def bos_token_id(self) -> int | None:
        return getattr(self.engine.tokenizer, "bos_token_id", None)

    def cache_prefix(self, text: str) -> None:
        if text:
            self.engine.generate(text, {"max_new_tokens": 0})

    def chat_template(self) -> ChatTemplate:
        with self._lock:
            if self._template is None:
                self._template = ChatTemplate.from_hf_tokenizer(self.engine.tokenizer)
            return self._template

    def open_session(self) -> str | None:
        return self.engine.open_session()

    def close_session(self, session: str) -> None:
        self.engine.close_session(session)

    def flush_cache(self) -> bool:
        return self.engine.flush_cache()

    def get_server_info(self) -> dict[str, Any]:
        return self.engine.get_server_info()

    def get_model_name(self) -> str:
        return self.engine.config.model_path

    def shutdown(self) -> None:
        self.engine.shutdown()


def _session_params(session: str | None) -> dict[str, Any] | None:
    return {"id": session} if session is not None else None
