"""Logprobs in OpenAI's shapes: chat's `{"content": [...]}` entries with their bytes and top
alternatives, and the legacy completions object (tokens, token_logprobs, top_logprobs,
text_offset; `echo` puts the prompt's first). Apart from the routes because they are pure
formatting of the engine's `(logprob, token id, text)` entries."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from itertools import repeat
from typing import Any


def chat_logprobs(meta: dict[str, Any]) -> dict[str, Any]:
    def entry(lp: float | None, text: str | None) -> dict[str, Any]:
        text = text or ""
        return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}

    content = []
    tops = meta.get("output_top_logprobs") or repeat(None)
    for (lp, _tid, text), top in zip(meta.get("output_token_logprobs") or [], tops):
        content.append(
            {**entry(lp, text), "top_logprobs": [entry(tlp, ttext) for tlp, _t, ttext in top or []]}
        )
    return {"content": content}


async def achat_logprobs(meta: dict[str, Any]) -> dict[str, Any]:
    """`chat_logprobs` as the awaitable the streaming path takes."""
    return chat_logprobs(meta)


def completion_logprobs(
    meta: dict[str, Any], echo: bool, top_k: int, texts: dict[int, str]
) -> dict[str, Any]:
    """OpenAI's legacy logprobs; `texts` has the text of the tokens whose entry lacks it."""
    entries = list(meta.get("output_token_logprobs") or [])
    tops = list(meta.get("output_top_logprobs") or [None] * len(entries))
    if echo:
        entries = list(meta.get("input_token_logprobs") or []) + entries
        tops = list(meta.get("input_top_logprobs") or [None] * (len(entries) - len(tops))) + tops
    tokens = [text if text is not None else texts[tid] for _lp, tid, text in entries]
    offsets, pos = [], 0
    for t in tokens:
        offsets.append(pos)
        pos += len(t)
    top_logprobs = None
    if top_k > 0:
        top_logprobs = [
            {(text or ""): lp for lp, _tid, text in top} if top else None for top in tops
        ]
    return {
        "tokens": tokens,
        "token_logprobs": [lp for lp, _tid, _text in entries],
        "top_logprobs": top_logprobs,
        "text_offset": offsets,
    }


def completion_logprobs_for(
    engine: Any, echo: bool, top_k: int
) -> Callable[[dict[str, Any]], Awaitable[Any]]:
    async def logprobs(meta: dict[str, Any]) -> dict[str, Any]:
        # The first prompt token has no logprob and comes without its text: decoded off the loop.
        entries = (meta.get("input_token_logprobs") or []) if echo else []
        missing = sorted(
            {
                tid
                for _lp, tid, text in [*entries, *(meta.get("output_token_logprobs") or [])]
                if text is None
            }
        )
        texts = (
            await asyncio.to_thread(lambda: {t: engine.decode([t]) for t in missing})
            if missing
            else {}
        )
        return completion_logprobs(meta, echo, top_k, texts)

    return logprobs
