"""Per-token work after sampling: constraint accept, jump-forward, incremental
detokenization, stop tokens and strings, logprob entries, and the events callers receive.

The tokenizer here is the scheduler thread's own copy (the engine keeps another for its
callers), so detokenizing and jump-forward re-tokenizing need no lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from sgl.runtime.detokenizer import IncrementalDetokenizer
from sgl.runtime.kv_manager import KVManager
from sgl.runtime.messages import FinishReason, ReqEvent
from sgl.runtime.request import Req
from sgl.runtime.sampling.params import TOKEN_RESTRICTING
from sgl.runtime.stop_regex import StopRegexMatcher
from sgl.runtime.stop_strings import StopStringMatcher

# Jump-forward re-tokenizes this many trailing output tokens together with the forced text.
JUMP_FORWARD_RETOKENIZE = 4


@dataclass
class TokenOutput:
    """What one new token added to a request: the text and ids to send, and whether it ended."""

    text: str = ""
    ids: list[int] = field(default_factory=list)
    logprobs: list[tuple] = field(default_factory=list)
    top_logprobs: list = field(default_factory=list)
    finish: FinishReason | None = None


class OutputProcessor:
    """The per-token pipeline of every request the scheduler runs: set-up, prompt logprobs,
    then per sampled token grammar accept, jump-forward, detokenize, stop checks and the event.
    One class of ~330 lines on purpose: each step reads and updates the same request record
    with the same scheduler-owned tokenizer, in a fixed order a split would only scatter."""

    def __init__(
        self,
        tokenizer: Any,
        eos_token_ids: list[int],
        kv: KVManager,
        jump_forward_enabled: Any,
    ) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.kv = kv
        self._jump_forward_enabled = (
            jump_forward_enabled  # () -> bool: read each time (benchmarks toggle it)
        )
        self.jump_forward_tokens = 0

    # ------------------------------------------------------------------ a new request

    def init_request(self, req: Req, grammar: Any = None) -> None:
        """Set up a request's decoding state; `grammar` is its compiled constraint (or None)."""
        sp = req.sampling_params
        req.matcher = grammar.matcher() if grammar is not None else None
        req.detokenizer = self._detokenizer(req, req.origin_input_ids)
        req.stop_matcher = StopStringMatcher(sp.stop or [])
        req.stop_regex_matcher = (
            StopRegexMatcher(sp.stop_regex, sp.no_stop_trim) if sp.stop_regex else None
        )
        if not req.logprobs.enabled or req.logprobs.start_len < 0:
            req.input_logprobs_done = True
        if self._jump_forward_allowed(req):
            # Text the constraint forces from the start (e.g. '{"name":') is prefilled with the
            # prompt: no decode step samples it, and no extend step follows the first token.
            req.unsent_forced_ids, req.unsent_forced_text = self._jump_forward(req, reserve=1)

    def _detokenizer(self, req: Req, prompt_ids: list[int]) -> IncrementalDetokenizer:
        sp = req.sampling_params
        return IncrementalDetokenizer(
            self.tokenizer,
            prompt_ids=prompt_ids,
            skip_special_tokens=sp.skip_special_tokens,
            spaces_between_special_tokens=sp.spaces_between_special_tokens,
        )

    def _jump_forward_allowed(self, req: Req) -> bool:
        # forced text bypasses the sampler, so it would bypass a parameter restricting the tokens
        sp = req.sampling_params
        return (
            req.matcher is not None
            and not req.logprobs.enabled
            and all(getattr(sp, name) is None for name in TOKEN_RESTRICTING)
            and self._jump_forward_enabled()
        )

    # ------------------------------------------------------------------ prompt logprobs

    def input_logprobs(
        self, hidden: torch.Tensor, steps: list[tuple[Req, int, int]], score: Callable
    ) -> None:
        """Record the prompt logprobs this step's hidden states give: per (request, first
        position, new tokens), the rows whose logits score prompt tokens of that request.
        `score(hidden, rows, token_ids, top_n)` is the model runner's."""
        rows: list[int] = []
        targets: list[tuple[Req, int]] = []
        offset = 0
        for r, start, ext in steps:
            if not r.input_logprobs_done:
                first = r.logprobs.start_len
                if first == 0 and start == 0:
                    r.input_token_logprobs.append((None, r.origin_input_ids[0], None))
                    r.input_top_logprobs.append(None)
                for p in range(
                    max(start, first - 1, 0), min(start + ext, len(r.origin_input_ids) - 1)
                ):
                    rows.append(offset + p - start)  # position p's logits score token p + 1
                    targets.append((r, p + 1))
                if start + ext >= len(r.origin_input_ids):
                    r.input_logprobs_done = True
            offset += ext
        if rows:
            top_n = max(r.logprobs.top_n for r, _ in targets)
            chosen, vals, ids = score(
                hidden, rows, [r.origin_input_ids[t] for r, t in targets], top_n
            )
            self.record_input_logprobs(targets, chosen, vals, ids)

    def record_input_logprobs(
        self,
        targets: list[tuple[Req, int]],
        chosen: list[float],
        top_vals: list[list[float]] | None,
        top_ids: list[list[int]] | None,
    ) -> None:
        for i, (r, t) in enumerate(targets):
            tid = r.origin_input_ids[t]
            r.input_token_logprobs.append((chosen[i], tid, self._token_text(r, tid)))
            n = r.logprobs.top_n
            if n > 0 and top_vals is not None:
                r.input_top_logprobs.append(
                    [
                        (v, k, self._token_text(r, k))
                        for v, k in zip(top_vals[i][:n], top_ids[i][:n])
                    ]
                )
            else:
                r.input_top_logprobs.append(None)

    def _token_text(self, r: Req, tid: int) -> str | None:
        return self.tokenizer.decode([tid]) if r.logprobs.with_text else None

    # ------------------------------------------------------------------ a new token

    def process_token(
        self, r: Req, tid: int, logprob: float | None, top: list | None, now: float
    ) -> TokenOutput:
        if tid < 0:
            return TokenOutput(
                finish=FinishReason.abort("no token is allowed at this point (constraint dead end)")
            )
        if r.matcher is not None and not r.matcher.accept(tid):  # the mask makes this unreachable
            return TokenOutput(
                finish=FinishReason.abort(f"token {tid} was rejected by the constraint")
            )
        if r.first_token_at is None:
            r.first_token_at = now
        r.output_ids.append(tid)
        # Text forced before the first token (prefilled with the prompt) is emitted with it.
        out = TokenOutput(ids=r.unsent_forced_ids + [tid])
        forced_before, r.unsent_forced_ids, r.unsent_forced_text = r.unsent_forced_text, [], ""
        if r.logprobs.enabled:
            out.logprobs.append((logprob, tid, self._token_text(r, tid)))
            out.top_logprobs.append(
                [(v, k, self._token_text(r, k)) for k, v in top] if top else None
            )
            r.output_token_logprobs.extend(out.logprobs)
            r.output_top_logprobs.extend(out.top_logprobs)
        sp = r.sampling_params
        reason = None
        if tid in (sp.stop_token_ids or ()) or (tid in self.eos_token_ids and not sp.ignore_eos):
            reason = FinishReason.stop(tid)
        # A stop token stays in output_ids but its text is trimmed, like a stop string.
        new_text = forced_before + (
            r.detokenizer.feed([tid]) if reason is None or sp.no_stop_trim else ""
        )
        if reason is None and r.matcher is not None:
            if not r.matcher.is_done() and self._jump_forward_allowed(r):
                forced_ids, forced_text = self._jump_forward(r)
                out.ids += forced_ids
                new_text += forced_text
            if r.matcher.is_done():  # the output is a complete member of the language
                reason = FinishReason.stop(tid if tid in self.eos_token_ids else None)
        out.text, out.finish = self._stop_regex(r, *self._stop_strings(r, new_text, reason))
        r.text += out.text
        return out

    @staticmethod
    def _stop_regex(
        r: Req, text: str, reason: FinishReason | None
    ) -> tuple[str, FinishReason | None]:
        """Run the text the stop strings let through past `stop_regex` (a match there stops
        the request, earlier than any stop string); at the end, flush what it held back."""
        matcher = r.stop_regex_matcher
        if matcher is None:
            return text, reason
        piece, matched = matcher.feed(text)
        if matched:
            return piece, FinishReason.stop(matcher.matched_text)
        if reason is not None:
            piece += matcher.flush()
        return piece, reason

    def _stop_strings(
        self, r: Req, new_text: str, reason: FinishReason | None
    ) -> tuple[str, FinishReason | None]:
        """Run the new text through the stop strings; at the end, flush what they held back."""
        sp = r.sampling_params
        piece, matched = r.stop_matcher.feed(new_text)
        if matched:
            reason = FinishReason.stop(r.stop_matcher.matched_stop)
            return piece + (r.stop_matcher.matched_stop if sp.no_stop_trim else ""), reason
        if reason is None and len(r.output_ids) >= sp.max_new_tokens:
            cut = r.matcher is not None and not r.matcher.is_accepting()
            reason = FinishReason.of_length(sp.max_new_tokens, incomplete=cut)
        if reason is not None:
            tail, _ = r.stop_matcher.feed(r.detokenizer.flush())
            piece += tail + r.stop_matcher.flush()
            if r.stop_matcher.matched_stop is not None:  # a stop confirmed by the final text
                reason = FinishReason.stop(r.stop_matcher.matched_stop)
                if sp.no_stop_trim:
                    piece += r.stop_matcher.matched_stop
        return piece, reason

    def _jump_forward(self, r: Req, reserve: int = 0) -> tuple[list[int], str]:
        """Append the constraint's forced text as tokens, tokenized canonically.

        The last few output tokens are re-tokenized together with the forced text and the
        ones that change are rolled back (matcher, output ids and their KV slots), so the
        model never sees a token sequence its tokenizer would not produce. Returns the ids
        appended to the output and the new text to emit. The forced tokens get their K/V in
        the next step's extend, like any other tokens. `reserve` output tokens are left
        free of forced text (1 before the first token: one must still be sampled).
        """
        forced = r.matcher.forced_text()
        if not forced:
            return [], ""
        sp = r.sampling_params
        # Under budget_aware, a jump that fits now must still leave room to finish after it.
        budgeted = (
            sp.budget_aware
            and sp.max_new_tokens is not None
            and r.matcher.completion_fits(sp.max_new_tokens - len(r.output_ids))
        )
        plan = self._retokenize(r, forced, reserve)
        if plan is None:
            return [], ""
        tail_ids, common, added = plan
        roll = len(tail_ids) - common
        r.matcher.rollback(roll)
        accepted = 0
        for t in added:
            if not r.matcher.accept(t):
                break
            accepted += 1
        left = sp.max_new_tokens - (len(r.output_ids) - roll + len(added)) if budgeted else 0
        if accepted < len(added) or (budgeted and not r.matcher.completion_fits(left)):
            # Not in the language after all, or the forced text's canonical tokens leave no
            # room to finish (the budget masks planned with other tokens): restore and decode
            # it token by token, under those masks.
            r.matcher.rollback(accepted)
            for t in tail_ids[common:]:
                r.matcher.accept(t)
            return [], ""
        # Commit: drop the rolled-back tokens (and the K/V of those that had any).
        held_text = r.detokenizer.flush()
        if roll:
            del r.output_ids[len(r.output_ids) - roll :]
            self.kv.truncate(r, r.seq_len)
            if r.spec is not None:  # speculative decoding's lookup index of these tokens
                r.spec.index.truncate(r.seq_len)
        r.output_ids.extend(added)
        r.detokenizer = self._detokenizer(r, r.fill_ids)
        self.jump_forward_tokens += len(added)
        return added, held_text + forced

    def _retokenize(
        self, r: Req, forced: str, reserve: int
    ) -> tuple[list[int], int, list[int]] | None:
        """(the re-tokenized output tail, how many of its tokens stay, the tokens to add), or
        None when the forced text cannot be appended cleanly now."""
        owned_from = max(r.prefix_len, len(r.origin_input_ids))  # earlier slots belong to the cache
        k = min(JUMP_FORWARD_RETOKENIZE, r.seq_len - owned_from)
        tail_ids = r.output_ids[len(r.output_ids) - k :] if k > 0 else []
        tail_text = self.tokenizer.decode(tail_ids) if tail_ids else ""
        if "\ufffd" in tail_text:  # mid-character: the text boundary is not clean yet
            return None
        if (
            tail_ids
            and self.tokenizer.decode(r.output_ids)
            != self.tokenizer.decode(r.output_ids[:-k]) + tail_text
        ):
            return None  # the tail decodes differently alone (e.g. a SentencePiece leading space)
        new_ids = list(self.tokenizer(tail_text + forced, add_special_tokens=False).input_ids)
        if (
            self.tokenizer.decode(new_ids) != tail_text + forced
        ):  # the tokenizer would not round-trip
            return None
        common = 0
        while common < min(len(tail_ids), len(new_ids)) and tail_ids[common] == new_ids[common]:
            common += 1
        added = new_ids[common:]
        roll = len(tail_ids) - common
        if (
            not added
            or len(r.output_ids) - roll + len(added) > r.sampling_params.max_new_tokens - reserve
        ):
            return None
        return tail_ids, common, added

    # ------------------------------------------------------------------ events

    def stream_event(self, r: Req, out: TokenOutput) -> ReqEvent | None:
        """The event for a streamed token, or None while `stream_interval` holds it back
        (its text, ids and logprobs then go out with the next event)."""
        held = r.unsent_stream
        if held is not None:
            out = TokenOutput(
                held.text + out.text,
                held.ids + out.ids,
                held.logprobs + out.logprobs,
                held.top_logprobs + out.top_logprobs,
            )
        interval = r.sampling_params.stream_interval or 1
        r.tokens_held += 1
        if r.tokens_held < interval:
            r.unsent_stream = out
            return None
        r.unsent_stream, r.tokens_held = None, 0
        event = ReqEvent(
            r.rid,
            out.text,
            out.ids,
            r.stats(),
            output_token_logprobs=out.logprobs,
            output_top_logprobs=out.top_logprobs,
        )
        self._attach_logprobs(r, event)
        return event

    @staticmethod
    def _attach_logprobs(r: Req, event: ReqEvent) -> None:
        """Mark an event of a request that asked for logprobs; the prompt's entries go with
        its first event (streamed: each event carries its own tokens' entries, in order)."""
        if not r.logprobs.enabled:
            return
        event.logprob_top_n = r.logprobs.top_n
        if not r.input_logprobs_sent:
            r.input_logprobs_sent = True
            event.input_token_logprobs = r.input_token_logprobs
            if r.logprobs.top_n > 0:
                event.input_top_logprobs = r.input_top_logprobs

    def final_event(
        self, r: Req, delta: TokenOutput | None, error: BaseException | None = None
    ) -> ReqEvent:
        """The last event: a streamed request gets its last delta (with what `stream_interval`
        held back) of text, ids and logprob entries; others everything at once."""
        if r.stream:
            held, delta = r.unsent_stream or TokenOutput(), delta or TokenOutput()
            text, ids = held.text + delta.text, held.ids + delta.ids
            logprobs, tops = held.logprobs + delta.logprobs, held.top_logprobs + delta.top_logprobs
        else:
            text, ids = r.text, list(r.output_ids)
            logprobs, tops = list(r.output_token_logprobs), list(r.output_top_logprobs)
        event = ReqEvent(
            r.rid, text, ids, r.stats(time.monotonic()), r.finish, error, logprobs, tops
        )
        self._attach_logprobs(r, event)
        return event
