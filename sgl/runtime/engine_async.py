"""The Engine's awaitable surface (`async_generate`), a mixin of `Engine`: the same calls as
`generate`, with tokenizing and rendering moved off the event loop and results awaited from an
`AsyncSink`. Kept apart so the facade's sync and async halves each read in one sitting."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from sgl.runtime.generate_call import GenerateCall
from sgl.runtime.results import AsyncSink

if TYPE_CHECKING:
    from sgl.runtime.sampling import SamplingParams
    from sgl.runtime.session import SessionParams


class EngineAsync:
    """`async_generate` for `Engine` (which provides `_check_admission` and `_build_requests`)."""

    async def async_generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict | SamplingParams | list | None = None,
        *,
        messages: list[dict] | list[list[dict]] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        return_logprob: bool = False,
        logprob_start_len: int = -1,
        top_logprobs_num: int = 0,
        stream: bool = False,
        rid: str | list[str] | None = None,
        return_text_in_logprobs: bool = False,
        session_params: dict | SessionParams | None = None,
    ) -> dict | list[dict] | AsyncIterator[dict]:
        """Like `generate`, awaitable; with stream=True returns an async iterator of chunks.

        Tokenizing and rendering run in a worker thread, off the event loop. If the caller is
        cancelled meanwhile, nothing is submitted."""
        # refuse on the event loop at once, not after a worker thread frees up
        self._check_admission()
        call = await asyncio.to_thread(
            self._build_requests,
            prompt,
            messages,
            input_ids,
            sampling_params,
            return_logprob,
            logprob_start_len,
            top_logprobs_num,
            stream,
            rid,
            return_text_in_logprobs,
            session_params,
        )
        sink = AsyncSink(asyncio.get_running_loop())
        call.submit(sink)
        if stream:
            if call.errors_come_late:  # raise them here, before the stream starts
                first = await self._first_event(call, sink)
                return self._astream(call, sink, first)
            return self._astream(call, sink, None)
        try:
            while not call.done:
                call.take(await sink.get())
        except BaseException:  # cancelled: free what is still running
            call.abort_rest()
            raise
        return call.output()

    @staticmethod
    async def _first_event(call: GenerateCall, sink: AsyncSink) -> dict:
        try:
            return call.take(await sink.get())
        except BaseException:
            call.abort_rest()
            raise

    @staticmethod
    async def _astream(
        call: GenerateCall, sink: AsyncSink, first: dict | None
    ) -> AsyncIterator[dict]:
        try:
            if first is not None:
                yield first
            while not call.done:
                yield call.take(await sink.get())
        finally:
            call.abort_rest()
