"""STANDALONE speculation: a second, smaller (or more quantized) model with the same tokenizer
drafts each request's next tokens greedily, one forward per drafted token for the whole
batch, and the target verifies them (speculator.py says why greedy drafts keep it exact).

The draft model keeps its own KV pool and table (`DraftModel`): a request's draft K/V covers
the tokens the draft has read, its committed text plus what it drafted. After a verify step
only the prefix that still matches the request's tokens is kept (`_sync`); the rest is freed,
so the next step feeds the draft just the new tokens. Rows are given back when a request
stops decoding. The pool is capped (`DRAFT_POOL_TOKENS`): a request that does not fit does not
draft this step, nothing else waits on it.
"""

from __future__ import annotations

import torch

from sgl.runtime.memory import ReqToTokenPool, TokenToKVPool
from sgl.runtime.model_runner import ModelRunner, StepInput
from sgl.runtime.output import JUMP_FORWARD_RETOKENIZE
from sgl.runtime.request import Req

# Tokens the draft's KV pool holds at most (its memory on top of the target's plan).
DRAFT_POOL_TOKENS = 32768


class DraftSeq:
    """One request as the draft's ModelRunner reads it: the tokens it computes (`fill_ids`) and
    its K/V state in the draft pool."""

    def __init__(self, req: Req, pool_row: int) -> None:
        self.req = req
        self.pool_row = pool_row
        self.kv_len = 0
        self.fill_ids: list[int] = []  # the tokens read (and to read) by the draft
        self.output_ids: list[int] = []  # empty: ModelRunner.forward reads fill_ids
        self.draft_ids: list[int] = []
        self.synced = 0  # the request's length when last synced (its tokens before are settled)

    @property
    def seq_len(self) -> int:
        return len(self.fill_ids)


class DraftModel:
    """The draft model, its runner and its KV memory; `draft(reqs, lengths)` drafts a batch."""

    def __init__(self, runner: ModelRunner, max_requests: int, context_len: int, dtype) -> None:
        mc = runner.model.config
        self.runner = runner
        self.pool = TokenToKVPool(
            DRAFT_POOL_TOKENS,
            mc.num_hidden_layers,
            runner.num_kv_heads,
            mc.head_dim,
            dtype,
            runner.device,
        )
        self.table = ReqToTokenPool(
            max_requests + runner.padding_rows, context_len + 1, runner.device
        )
        runner.bind(self.pool, self.table)
        self.seqs: dict[Req, DraftSeq] = {}
        self.description: dict = {}  # what it is (path, weights), for the engine's info

    def info(self) -> dict:
        """What it is, and its KV pool now (whole again one loop turn after the last request
        stopped decoding)."""
        return {
            **self.description,
            "draft_kv_tokens": self.pool.capacity,
            "draft_kv_available": self.pool.available_size(),
        }

    def release_others(self, keep: set[Req]) -> None:
        """Give back the rows of requests no longer decoding (finished, retracted)."""
        for req in [r for r in self.seqs if r not in keep]:
            self._free(self.seqs.pop(req))

    def _free(self, seq: DraftSeq) -> None:
        self._truncate(seq, 0)
        self.table.free(seq.pool_row)

    def _truncate(self, seq: DraftSeq, length: int) -> None:
        if seq.kv_len > length:
            row = self.table.req_to_token[seq.pool_row]
            self.pool.free(row[length : seq.kv_len].clone())
            seq.kv_len = length
        del seq.fill_ids[length:]

    def _sync(self, req: Req) -> DraftSeq | None:
        """The request's draft state, its K/V cut to the prefix its tokens still share."""
        seq = self.seqs.get(req)
        if seq is None:
            row = self.table.alloc()
            if row is None:
                return None
            seq = self.seqs[req] = DraftSeq(req, row)
        tokens = req.fill_ids
        # the newest token is always read again: its logits give the first draft token
        limit = min(seq.kv_len, len(tokens) - 1)
        # a jump-forward re-tokenizes at most a few of the newest tokens
        keep = max(0, min(seq.synced - 2 * JUMP_FORWARD_RETOKENIZE, limit))
        while keep < limit and seq.fill_ids[keep] == tokens[keep]:
            keep += 1
        self._truncate(seq, keep)
        seq.fill_ids = tokens  # `req.fill_ids` is already a fresh list
        seq.synced = len(tokens)
        return seq

    def draft(self, reqs: list[Req], lengths: list[int]) -> list[list[int]]:
        """Greedy drafts of the given lengths (an empty one where the pool is short)."""
        seqs: list[DraftSeq | None] = [self._sync(r) for r in reqs]
        drafts: list[list[int]] = [[] for _ in reqs]
        active = [i for i, s in enumerate(seqs) if s is not None and lengths[i] > 0]
        for step in range(max(lengths, default=0)):
            active = [i for i in active if len(drafts[i]) < lengths[i]]
            if step > 0:
                for i in active:
                    seqs[i].fill_ids.append(drafts[i][-1])
            active = self._fits(active, seqs)
            if not active:
                break
            tokens = self._forward([seqs[i] for i in active])
            for i, t in zip(active, tokens):
                drafts[i].append(t)
        return drafts

    def _fits(self, active: list[int], seqs: list) -> list[int]:
        """The requests whose tokens to read fit in the pool now (the others stop drafting)."""
        room = self.pool.available_size()
        kept = []
        for i in active:
            need = seqs[i].seq_len - seqs[i].kv_len
            if need <= room:
                kept.append(i)
                room -= need
        return kept

    def _forward(self, seqs: list[DraftSeq]) -> list[int]:
        """Read each sequence's unread tokens; the draft's greedy next token for each."""
        exts = [s.seq_len - s.kv_len for s in seqs]
        slots = self.pool.alloc(sum(exts))
        rows, cols = [], []
        for s, n in zip(seqs, exts):
            rows.extend([s.pool_row] * n)
            cols.extend(range(s.kv_len, s.kv_len + n))
        table = self.table.req_to_token
        index = (torch.tensor(rows, dtype=torch.int64), torch.tensor(cols, dtype=torch.int64))
        table[index] = slots.to(table.device)
        hidden = self.runner.forward(StepInput(seqs, exts), slots)
        last, at = [], 0
        for s, n in zip(seqs, exts):
            at += n
            last.append(at - 1)
            s.kv_len += n
        logits = self.runner.logits(hidden, last)
        return logits.argmax(dim=-1).tolist()
