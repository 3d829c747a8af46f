"""The scheduler loop: continuous batching over a radix-cached, paged KV pool.

One thread owns every piece of mutable engine state (pools, radix tree, requests). Each
step it (1) drains the inbox (new requests, aborts, calls), (2) reserves one KV slot per
decoding request (evicting cached prefixes, then retracting requests if memory runs
out), (3) fills the remaining token budget with prefill chunks, taking waiting requests
in policy order, (4) runs one forward over all of those tokens together (a step of
decodes only replays a captured CUDA graph, when the engine captured them: cuda_graph.py),
(5) samples, detokenizes, checks stop conditions and sends events to the callers' sinks.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable

import torch

from sgl.runtime.attention import ForwardBatch, backend_name, create_attention_backend, supports_cuda_graph
from sgl.runtime.cuda_graph import CudaGraphRunner, DecodeInputs
from sgl.runtime.memory import ReqToTokenPool, TokenToKVPool
from sgl.runtime.radix_cache import RadixCache
from sgl.runtime.request import (
    GenerateRequest,
    Req,
    ReqEvent,
    ResultSink,
    finish_abort,
    finish_length,
    finish_stop,
)
from sgl.runtime.sampling import SamplingBatch, make_generator, sample
from sgl.runtime.session import MAX_PINNED_SHARE, SessionLocks, SessionRegistry
from sgl.runtime.tokenizer import IncrementalDetokenizer, StopStringMatcher

logger = logging.getLogger(__name__)

SCHEDULE_POLICIES = ("lpm", "fcfs", "dfs-weight")
# Requests sharing an uncached prefix at least this long are admitted one per step, so
# the others find it in the radix cache on the next step instead of computing it again.
IN_BATCH_PREFIX_THRESHOLD = 32
# lpm/dfs-weight match every waiting request against the tree each step; past this queue
# length that costs more than it saves, and the policy falls back to fcfs.
POLICY_QUEUE_LIMIT = 128
# Decode reservation per running request: remaining new tokens x ratio (clipped).
INIT_NEW_TOKEN_RATIO, MIN_NEW_TOKEN_RATIO, NEW_TOKEN_RATIO_DECAY = 0.7, 0.1, 0.001
RESERVE_CLIP = 4096
# Jump-forward re-tokenizes this many trailing output tokens together with the forced text.
JUMP_FORWARD_RETOKENIZE = 4


@dataclass
class SchedulerConfig:
    max_total_tokens: int
    max_running_requests: int
    max_context_len: int
    chunked_prefill_size: int | None
    max_prefill_tokens: int
    schedule_policy: str
    disable_radix_cache: bool
    attention_backend: str
    enable_jump_forward: bool
    device: torch.device
    dtype: torch.dtype
    cuda_graph_max_bs: int = 0  # decode steps of up to this many requests replay CUDA graphs; 0: off


@dataclass
class _Item:
    req: Req
    extend_len: int
    prefill: bool = False  # prompt tokens (vs. tokens the request generated or was forced to)


class Scheduler:
    def __init__(self, config: SchedulerConfig, model: torch.nn.Module, tokenizer: Any, eos_token_ids: list[int],
                 sessions: SessionRegistry | None = None):
        self.config = config
        self.model = model
        self.model_config = model.config
        self.tokenizer = tokenizer
        self.eos_token_ids = sorted(set(eos_token_ids))
        self.vocab_size = self.model_config.vocab_size
        mc = self.model_config
        self.kv_pool = TokenToKVPool(
            config.max_total_tokens, mc.num_hidden_layers, mc.num_key_value_heads, mc.head_dim, config.dtype, config.device
        )
        self.tree = RadixCache(self.kv_pool, disable=config.disable_radix_cache)
        self.attn_backend = create_attention_backend(config.attention_backend, str(config.device), config.dtype)
        use_graphs = config.cuda_graph_max_bs > 0 and supports_cuda_graph(self.attn_backend)
        # With CUDA graphs one more table row: a row of zeros that padding rows point at.
        rows = config.max_running_requests + (1 if use_graphs else 0)
        self.req_to_token = ReqToTokenPool(rows, config.max_context_len + 1, config.device)
        self.attn_backend.bind(self.kv_pool, self.req_to_token, mc.num_attention_heads)
        self.graph_runner: CudaGraphRunner | None = None
        if use_graphs:
            padding_row = self.req_to_token.alloc()  # never freed, never written: stays zeros
            self.graph_runner = CudaGraphRunner(
                model, self.attn_backend, self.kv_pool, self.req_to_token, config.cuda_graph_max_bs, padding_row
            )
        self.sessions = sessions if sessions is not None else SessionRegistry(config.max_context_len)
        self.session_locks = SessionLocks(self.tree)
        self._next_expiry_check = 0.0

        self.inbox: queue.Queue[tuple] = queue.Queue()
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.chunked_req: Req | None = None
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self.stats = {"forward_steps": 0, "decode_tokens": 0, "prefill_tokens": 0, "cached_tokens": 0,
                      "retractions": 0, "finished_requests": 0,
                      "jump_forward_tokens": 0, "cuda_graph_steps": 0}
        self._step_slots: torch.Tensor | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ thread API

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="sgl-scheduler", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        self.inbox.put(("wake",))
        if self._thread is not None:
            self._thread.join(timeout=30)

    def submit(self, request: GenerateRequest, sink: ResultSink) -> None:
        self.inbox.put(("req", request, sink))

    def abort(self, rid: str) -> None:
        self.inbox.put(("abort", rid))

    def close_session(self, sid: str) -> None:
        """After `SessionRegistry.close`: abort the session's unfinished turns and unpin its
        KV. Returns at once."""
        self.inbox.put(("close_session", sid))

    def call(self, fn: Callable[[], Any], timeout: float | None = 60) -> Any:
        """Run `fn` on the scheduler thread between steps and return its result."""
        fut: Future = Future()
        self.inbox.put(("call", fn, fut))
        return fut.result(timeout=timeout)

    def _loop(self) -> None:
        if self.config.device.type == "cuda" and self.config.device.index is not None:
            torch.cuda.set_device(self.config.device)  # this thread's kernels and graph replays go there
        while not self._stop.is_set():
            try:
                idle = not (self.waiting or self.running)
                self._drain_inbox(block=idle)
                if self._stop.is_set():
                    break
                self._expire_sessions()
                self.step()
            except Exception as e:  # never let one bad step kill the loop
                logger.exception("scheduler step failed")
                self._fail_all(e)
        self._fail_all(RuntimeError("engine shut down"))

    def _drain_inbox(self, block: bool) -> None:
        while True:
            try:
                msg = self.inbox.get(timeout=0.5) if block else self.inbox.get_nowait()
            except queue.Empty:
                return
            block = False
            kind = msg[0]
            if kind == "req":
                self._add_request(msg[1], msg[2])
            elif kind == "abort":
                self._abort(msg[1])
            elif kind == "close_session":
                self._close_session(msg[1])
            elif kind == "call":
                fn, fut = msg[1], msg[2]
                try:
                    fut.set_result(fn())
                except Exception as e:
                    fut.set_exception(e)

    # ------------------------------------------------------------------ requests

    def _add_request(self, r: GenerateRequest, sink: ResultSink) -> None:
        sp = r.sampling_params
        req = Req(
            rid=r.rid,
            origin_input_ids=list(r.input_ids),
            sampling_params=sp,
            sink=sink,
            return_logprob=r.return_logprob,
            logprob_start_len=r.logprob_start_len,
            top_logprobs_num=r.top_logprobs_num,
            stream=r.stream,
            return_text_in_logprobs=r.return_text_in_logprobs,
            parent_rid=r.parent_rid,
            grammar=r.grammar,
            session_id=r.session_id,
        )
        if r.grammar is not None:
            req.matcher = r.grammar.matcher()
        req.generator = make_generator(sp.seed, self.config.device) if sp.seed is not None else None
        req.detokenizer = IncrementalDetokenizer(
            self.tokenizer,
            prompt_ids=req.origin_input_ids,
            skip_special_tokens=sp.skip_special_tokens,
            spaces_between_special_tokens=sp.spaces_between_special_tokens,
        )
        req.stop_matcher = StopStringMatcher(sp.stop or [])
        if not r.return_logprob or r.logprob_start_len < 0:
            req.input_logprobs_done = True
        if req.matcher is not None and self.config.enable_jump_forward and not req.return_logprob:
            # Text the constraint forces from the start (e.g. '{"name":') is prefilled with the
            # prompt: no decode step samples it, and no extend step follows the first token.
            req.unsent_forced_ids, req.unsent_forced_text = self._jump_forward(req, reserve=1)
        if r.session_id is not None and r.session_id not in self.sessions:
            # Closed between the caller resolving it and this request arriving: as if it had
            # been queued when the session closed.
            self._finish(req, finish_abort("aborted: its session was closed"))
            return
        self.waiting.append(req)

    def _expire_sessions(self) -> None:
        """Close sessions idle past their timeout (checked about once a second)."""
        now = time.monotonic()
        if now < self._next_expiry_check:
            return
        self._next_expiry_check = now + 1.0
        busy = {r.session_id for r in self.waiting + self.running if r.session_id is not None}
        for sid in self.sessions.expire(busy, now):
            self.session_locks.release(sid)

    def _reclaimable(self) -> int:
        """KV slots this step can have: free ones plus what the tree can evict."""
        return self.kv_pool.available_size() + self.tree.evictable_size()

    def _unpin_lru_session(self) -> bool:
        """Memory valve: unpin the least recently used session's KV (it stays open; its next
        turn recomputes what gets evicted). False when no session holds a pin."""
        pinned = self.session_locks.sessions()
        if not pinned:
            return False
        self.session_locks.release(min(pinned, key=self.sessions.last_used))
        return True

    def _make_room(self, needed: int) -> bool:
        """Unpin sessions (least recently used first) until `needed` slots are reclaimable.
        Pins yield only here: to running requests that would otherwise stall or be
        retracted, and to a queue that cannot start while nothing runs."""
        while self._reclaimable() < needed:
            if not self._unpin_lru_session():
                return False
        return True

    def _abort(self, rid: str) -> None:
        self._abort_where(lambda req: rid in (req.rid, req.parent_rid), "aborted by request")

    def _close_session(self, sid: str) -> None:
        """A closed session: its unfinished turns are aborted (as SGLang does) and its KV unpinned."""
        self._abort_where(lambda req: req.session_id == sid, "aborted: its session was closed")
        self.session_locks.release(sid)

    def _abort_where(self, match: Callable[[Req], bool], message: str) -> None:
        for req in list(self.waiting):
            if match(req):
                self.waiting.remove(req)
                self._finish(req, finish_abort(message))
        for req in list(self.running):
            if match(req):
                self._release(req)
                self._finish(req, finish_abort(message))

    def _fail_all(self, error: BaseException) -> None:
        """After an internal error: end every request with it, returning all their KV."""
        if self._step_slots is not None:  # allocated for a step that never ran
            self.kv_pool.free(self._step_slots)
            self._step_slots = None
        for req in list(self.running):
            try:
                self._release(req)
            except Exception:  # pragma: no cover - best effort on a broken state
                logger.exception("releasing %s failed", req.rid)
                if req in self.running:
                    self.running.remove(req)
            self._finish(req, finish_abort(f"engine error: {error}"), error=error)
        for req in self.waiting:
            self._finish(req, finish_abort(f"engine error: {error}"), error=error)
        self.waiting.clear()
        self.chunked_req = None

    # ------------------------------------------------------------------ KV bookkeeping

    def _alloc_slots(self, n: int) -> torch.Tensor | None:
        if self.kv_pool.available_size() < n:
            self.tree.evict(n - self.kv_pool.available_size())
        return self.kv_pool.alloc(n)

    def _cache_kv(self, req: Req) -> None:
        """Give the request's computed K/V to the radix tree and re-lock the longer prefix."""
        row_slots = self.req_to_token.req_to_token[req.pool_row, : req.kv_len]
        ids = req.fill_ids[: req.kv_len]
        already = self.tree.insert(ids, row_slots.clone())
        if already > req.prefix_len:  # another request cached these meanwhile: ours are duplicates
            self.kv_pool.free(row_slots[req.prefix_len : already].clone())
        new_slots, new_node = self.tree.match_prefix(ids)
        self.req_to_token.write(req.pool_row, 0, new_slots)
        self.tree.inc_lock_ref(new_node)
        self.tree.dec_lock_ref(req.last_node)
        req.last_node, req.prefix_len = new_node, len(new_slots)

    def _release(self, req: Req) -> None:
        """Free the request's row; its computed K/V goes to the radix tree (or back to the pool)."""
        if req.pool_row is None:
            return
        row_slots = self.req_to_token.req_to_token[req.pool_row, : req.kv_len].clone()
        if self.config.disable_radix_cache:
            self.kv_pool.free(row_slots)
        else:
            already = self.tree.insert(req.fill_ids[: req.kv_len], row_slots)
            if already > req.prefix_len:
                self.kv_pool.free(row_slots[req.prefix_len : already])
            self.tree.dec_lock_ref(req.last_node)
        self.req_to_token.free(req.pool_row)
        req.pool_row, req.kv_len, req.prefix_len, req.last_node = None, 0, 0, None
        if req is self.chunked_req:
            self.chunked_req = None
        if req in self.running:
            self.running.remove(req)

    def _retract(self, req: Req) -> None:
        """Preempt a decoding request: keep its tokens, drop its row, queue it first."""
        self._release(req)
        req.num_retractions += 1
        self.stats["retractions"] += 1
        self.waiting.insert(0, req)

    # ------------------------------------------------------------------ scheduling

    def step(self) -> bool:
        items = self._schedule()
        if not items:
            return False
        self._run(items)
        return True

    def _reserved_tokens(self) -> int:
        total = 0
        for req in self.running:
            left = req.sampling_params.max_new_tokens - len(req.output_ids)
            total += int(min(max(left, 0), RESERVE_CLIP) * self.new_token_ratio)
            if not self._is_generating(req):  # a chunked prefill still to finish
                total += req.pending_tokens
        return total

    def _is_generating(self, req: Req) -> bool:
        """Prefill done: the next step feeds its newest tokens (one sampled token, or a
        jump-forward's forced tokens) to get the next logits."""
        return req.pool_row is not None and bool(req.output_ids) and req is not self.chunked_req

    def _schedule(self) -> list[_Item]:
        items: list[_Item] = []
        decodes = [r for r in self.running if self._is_generating(r)]
        if decodes:
            # Each decode needs a slot per pending token. Evict cached prefixes, unpin idle
            # sessions, then retract.
            need = sum(r.pending_tokens for r in decodes)
            self._make_room(need)
            while decodes and self._reclaimable() < need:
                victim = max(decodes, key=lambda r: (-len(r.output_ids), len(r.origin_input_ids)))
                decodes.remove(victim)
                need -= victim.pending_tokens
                self._retract(victim)
                self.new_token_ratio = min(1.0, self.new_token_ratio + 0.1)
            items.extend(_Item(r, r.pending_tokens) for r in decodes)
            self.new_token_ratio = max(MIN_NEW_TOKEN_RATIO, self.new_token_ratio - NEW_TOKEN_RATIO_DECAY)

        chunking = bool(self.config.chunked_prefill_size and self.config.chunked_prefill_size > 0)
        budget = self.config.chunked_prefill_size if chunking else self.config.max_prefill_tokens
        committed = sum(it.extend_len for it in items)  # slots this step will take
        if self.chunked_req is not None:
            req = self.chunked_req
            ext = min(req.seq_len - req.kv_len, budget)
            if not self._make_room(committed + ext):
                ext = max(0, self._reclaimable() - committed)
            if ext > 0:
                items.append(_Item(req, ext, prefill=True))
                budget -= ext
                committed += ext
        if budget > 0 and self.waiting and self.chunked_req is None:
            admitted = self._admit(budget, committed, chunking, first=not items)
            while not admitted and not items and not self.running and self._unpin_lru_session():
                # Nothing runs and nothing fits: idle sessions hold the memory the queue needs.
                admitted = self._admit(budget, committed, chunking, first=True)
            items.extend(admitted)
        self._assign_slots(items)
        return items

    def _policy_order(self) -> list[Req]:
        policy = self.config.schedule_policy
        if policy == "fcfs" or self.config.disable_radix_cache or len(self.waiting) > POLICY_QUEUE_LIMIT:
            return list(self.waiting)
        matches = {id(r): self.tree.match_prefix(r.fill_ids) for r in self.waiting}
        if policy == "lpm":
            return sorted(self.waiting, key=lambda r: -len(matches[id(r)][0]))
        # dfs-weight: visit the tree depth first, heaviest subtree (most waiting requests) first.
        by_node: dict[int, list[Req]] = {}
        weight: dict[int, int] = {}
        for r in self.waiting:
            node = matches[id(r)][1]
            by_node.setdefault(id(node), []).append(r)
            while node is not None:
                weight[id(node)] = weight.get(id(node), 0) + 1
                node = node.parent
        order: list[Req] = []
        stack = [self.tree.root]
        while stack:
            node = stack.pop()
            order.extend(by_node.get(id(node), []))
            kids = [c for c in node.children.values() if weight.get(id(c), 0) > 0]
            kids.sort(key=lambda c: weight[id(c)])  # heaviest popped first
            stack.extend(kids)
        return order

    def _admit(self, budget: int, committed: int, chunking: bool, first: bool) -> list[_Item]:
        """Move waiting requests into the batch while the token budget and KV memory allow.

        Hard limit: this step's slots fit in free + evictable memory. Soft limit: leave room
        for the running requests' future decode tokens (estimated by `new_token_ratio`);
        a wrong estimate is corrected by retraction, never by failing a request.
        """
        items: list[_Item] = []
        admitted_keys: set[tuple[int, ...]] = set()
        for req in self._policy_order():
            if budget <= 0:
                break
            if len(self.running) >= self.config.max_running_requests or self.req_to_token.available_size() == 0:
                break
            ids = req.fill_ids
            limit = len(ids) - 1  # at least one token must run to produce the next logits
            if not req.input_logprobs_done:
                limit = min(limit, max(req.logprob_start_len - 1, 0))
            prefix_slots, node = self.tree.match_prefix(ids[:limit])
            prefix = len(prefix_slots)
            remaining = len(ids) - prefix
            if not self.config.disable_radix_cache and remaining > IN_BATCH_PREFIX_THRESHOLD:
                key = tuple(ids[: prefix + IN_BATCH_PREFIX_THRESHOLD])
                if key in admitted_keys:
                    continue  # a request admitted this step computes this prefix; wait for it
                admitted_keys.add(key)
            if chunking:
                ext = min(remaining, budget)
            elif remaining > budget and not (first and not items):
                break  # too long for this step's prefill budget; it goes first next step
            else:
                ext = remaining
            self.tree.inc_lock_ref(node)
            memory = self._reclaimable()
            future = int(min(req.sampling_params.max_new_tokens, RESERVE_CLIP) * self.new_token_ratio)
            fits_now = committed + ext <= memory
            fits_later = committed + ext + future + self._reserved_tokens() <= memory
            if not fits_now or (not fits_later and (self.running or items)):
                self.tree.dec_lock_ref(node)
                break
            row = self.req_to_token.alloc()
            self.waiting.remove(req)
            req.pool_row, req.prefix_len, req.kv_len, req.last_node = row, prefix, prefix, node
            if prefix:
                self.req_to_token.write(row, 0, prefix_slots)
            if req.cached_tokens is None:
                req.cached_tokens = prefix
                self.stats["cached_tokens"] += prefix
            self.running.append(req)
            items.append(_Item(req, ext, prefill=True))
            budget -= ext
            committed += ext
            if ext < remaining:
                self.chunked_req = req
                break
        return items

    def _assign_slots(self, items: list[_Item]) -> None:
        total = sum(it.extend_len for it in items)
        if total == 0:
            return
        slots = self._alloc_slots(total)
        if slots is None:  # admission keeps this from happening; if it does, fail loudly
            raise RuntimeError(f"KV pool exhausted: need {total}, free {self.kv_pool.available_size()}")
        self._step_slots = slots
        table = self.req_to_token.req_to_token
        rows, cols = [], []
        for it in items:
            r = it.req
            rows.extend([r.pool_row] * it.extend_len)
            cols.extend(range(r.kv_len, r.kv_len + it.extend_len))
        table[torch.tensor(rows), torch.tensor(cols)] = slots.to(table.device)

    # ------------------------------------------------------------------ running a batch

    def _run(self, items: list[_Item]) -> None:
        device = self.config.device
        input_ids: list[int] = []
        positions: list[int] = []
        for it in items:
            r = it.req
            if it.extend_len == 1 and r.output_ids and r.kv_len == r.seq_len - 1:
                input_ids.append(r.output_ids[-1])
            else:
                input_ids.extend(r.fill_ids[r.kv_len : r.kv_len + it.extend_len])
            positions.extend(range(r.kv_len, r.kv_len + it.extend_len))
        runner = self.graph_runner
        if runner is not None and runner.can_run(len(items)) and all(it.extend_len == 1 for it in items):
            # Pure decode: replay the captured forward.
            hidden = runner.replay(DecodeInputs(
                input_ids, positions, self._step_slots.tolist(),
                [it.req.pool_row for it in items], [it.req.kv_len + 1 for it in items],
            ))
            self.stats["cuda_graph_steps"] += 1
        else:
            batch = ForwardBatch(
                input_ids=torch.tensor(input_ids, dtype=torch.int64, device=device),
                positions=torch.tensor(positions, dtype=torch.int64, device=device),
                out_cache_loc=self._step_slots.to(device),
                req_rows=[it.req.pool_row for it in items],
                prefix_lens=[it.req.kv_len for it in items],
                extend_lens=[it.extend_len for it in items],
                kv_pool=self.kv_pool,
                req_to_token=self.req_to_token,
                attn_backend=self.attn_backend,
                row_epochs=[self.req_to_token.epochs[it.req.pool_row] for it in items],
            )
            self.attn_backend.init_forward_metadata(batch)
            with torch.inference_mode():
                hidden = self.model(batch.input_ids, batch.positions, batch)
        self._step_slots = None  # from here on the slots are accounted by each request's kv_len
        self.stats["forward_steps"] += 1

        # Which rows of `hidden` need logits: each finishing request's last token, plus the
        # prompt positions whose next-token logprobs were asked for.
        sample_items: list[_Item] = []
        sample_rows: list[int] = []
        lp_rows: list[int] = []
        lp_targets: list[tuple[Req, int]] = []  # (req, index of the scored token)
        offset = 0
        for it in items:
            r = it.req
            start, end = r.kv_len, r.kv_len + it.extend_len
            if it.prefill:
                self.stats["prefill_tokens"] += it.extend_len
            else:
                self.stats["decode_tokens"] += 1
            r.kv_len = end
            if r is self.chunked_req and end == r.seq_len:
                self.chunked_req = None
            if not r.input_logprobs_done:
                self._plan_input_logprobs(r, start, end, offset, lp_rows, lp_targets)
            if end == r.seq_len:
                sample_items.append(it)
                sample_rows.append(offset + it.extend_len - 1)
            offset += it.extend_len

        if lp_rows:
            self._record_input_logprobs(hidden, lp_rows, lp_targets)
        for it in items:
            r = it.req
            if it.prefill and it.extend_len > 1 and not self.config.disable_radix_cache:
                # A chunk boundary or a finished prefill: share it through the tree now.
                # (Generated and forced tokens enter the tree when the request ends.)
                self._cache_kv(r)
            if r.kv_len >= len(r.origin_input_ids):
                r.input_logprobs_done = True

        if sample_items:
            self._sample_and_process(hidden, sample_items, sample_rows)

    def _plan_input_logprobs(self, r: Req, start: int, end: int, offset: int, rows: list[int], targets: list) -> None:
        n_prompt = len(r.origin_input_ids)
        first = r.logprob_start_len
        if first == 0 and start == 0:
            r.input_token_logprobs.append((None, r.origin_input_ids[0], None))
            r.input_top_logprobs.append(None)
        # Position p's logits score token p + 1.
        for p in range(max(start, first - 1, 0), min(end, n_prompt - 1)):
            rows.append(offset + p - start)
            targets.append((r, p + 1))

    def _record_input_logprobs(self, hidden: torch.Tensor, rows: list[int], targets: list) -> None:
        logits = self.model.compute_logits(hidden[torch.tensor(rows, device=hidden.device)])
        logp = torch.log_softmax(logits, dim=-1)
        token_ids = torch.tensor([r.origin_input_ids[t] for r, t in targets], device=logp.device)
        chosen = logp.gather(1, token_ids.unsqueeze(1)).squeeze(1).tolist()
        max_top = min(max(r.top_logprobs_num for r, _ in targets), logp.shape[-1])
        top_vals = top_ids = None
        if max_top > 0:
            top_vals, top_ids = logp.topk(max_top, dim=-1)
            top_vals, top_ids = top_vals.tolist(), top_ids.tolist()
        for i, (r, t) in enumerate(targets):
            tid = r.origin_input_ids[t]
            r.input_token_logprobs.append((chosen[i], tid, self._token_text(r, tid)))
            if r.top_logprobs_num > 0:
                n = r.top_logprobs_num
                r.input_top_logprobs.append(
                    [(v, k, self._token_text(r, k)) for v, k in zip(top_vals[i][:n], top_ids[i][:n])]
                )
            else:
                r.input_top_logprobs.append(None)

    def _token_text(self, r: Req, tid: int) -> str | None:
        return self.tokenizer.decode([tid]) if r.return_text_in_logprobs else None

    def _sample_and_process(self, hidden: torch.Tensor, items: list[_Item], rows: list[int]) -> None:
        now = time.monotonic()
        todo = [(it, row) for it, row in zip(items, rows)]
        # max_new_tokens == 0: scoring only (e.g. select); finish without sampling.
        zero = [it for it, _ in todo if it.req.sampling_params.max_new_tokens == 0]
        for it in zero:
            self._release(it.req)
            self._finish(it.req, finish_length(0))
        todo = [(it, row) for it, row in todo if it.req.sampling_params.max_new_tokens > 0]
        if not todo:
            return
        reqs = [it.req for it, _ in todo]
        logits = self.model.compute_logits(hidden[torch.tensor([row for _, row in todo], device=hidden.device)])
        allowed = self._grammar_mask(reqs, logits.device)
        sbatch = SamplingBatch.build([r.sampling_params for r in reqs], logits.device, self.vocab_size, self.eos_token_ids)
        need_prompt = bool(sbatch.repetition_rows)
        out = sample(
            logits,
            sbatch,
            output_ids=[r.output_ids for r in reqs],
            prompt_ids=[r.origin_input_ids for r in reqs] if need_prompt else [[] for _ in reqs],
            generators=[r.generator for r in reqs],
            top_logprobs_num=[r.top_logprobs_num if r.return_logprob else 0 for r in reqs],
            allowed_mask=allowed,
        )
        token_ids = out.token_ids.tolist()
        logprobs = out.logprobs.tolist() if any(r.return_logprob for r in reqs) else None
        for i, r in enumerate(reqs):
            self._process_token(r, token_ids[i], logprobs[i] if logprobs else None, out.top_logprobs[i], now)

    def _grammar_mask(self, reqs: list[Req], device: torch.device) -> torch.Tensor | None:
        """One bool [B, V] mask for the batch from the constrained rows' matchers (None if none)."""
        if all(r.matcher is None for r in reqs):
            return None
        from sgl.constrained.matcher import allocate_bitmask, bitmask_to_bool

        bits = allocate_bitmask(len(reqs), self.vocab_size)
        for i, r in enumerate(reqs):
            if r.matcher is None:
                bits[i] = -1  # every bit set: unconstrained
            else:
                r.matcher.fill_mask(bits[i])
        return bitmask_to_bool(bits, self.vocab_size).to(device)

    def _process_token(self, r: Req, tid: int, logprob: float | None, top: list | None, now: float) -> None:
        sp = r.sampling_params
        if tid < 0:
            self._release(r)
            self._finish(r, finish_abort("no token is allowed at this point (constraint dead end)"))
            return
        if r.matcher is not None and not r.matcher.accept(tid):  # the mask makes this unreachable
            self._release(r)
            self._finish(r, finish_abort(f"token {tid} was rejected by the constraint"))
            return
        if r.first_token_at is None:
            r.first_token_at = now
        r.output_ids.append(tid)
        # Text forced before the first token (prefilled with the prompt) is emitted with it.
        new_ids, forced_before = r.unsent_forced_ids + [tid], r.unsent_forced_text
        r.unsent_forced_ids, r.unsent_forced_text = [], ""
        new_lp: list[tuple] = []
        new_top: list = []
        if r.return_logprob:
            new_lp.append((logprob, tid, self._token_text(r, tid)))
            new_top.append([(v, k, self._token_text(r, k)) for k, v in top] if top else None)
            r.output_token_logprobs.extend(new_lp)
            r.output_top_logprobs.extend(new_top)

        reason = None
        if tid in (sp.stop_token_ids or ()):
            reason = finish_stop(tid)
        elif tid in self.eos_token_ids and not sp.ignore_eos:
            reason = finish_stop(tid)
        # A stop token stays in output_ids but its text is trimmed, like a stop string.
        new_text = forced_before + (r.detokenizer.feed([tid]) if reason is None or sp.no_stop_trim else "")
        if reason is None and r.matcher is not None:
            if not r.matcher.is_done() and self.config.enable_jump_forward and not r.return_logprob:
                forced_ids, forced_text = self._jump_forward(r)
                new_ids += forced_ids
                new_text += forced_text
            if r.matcher.is_done():  # the output is a complete member of the language
                reason = finish_stop(tid if tid in self.eos_token_ids else None)
        piece, matched = r.stop_matcher.feed(new_text)
        if matched:
            reason = finish_stop(r.stop_matcher.matched_stop)
            if sp.no_stop_trim:
                piece += r.stop_matcher.matched_stop
        elif reason is None and len(r.output_ids) >= sp.max_new_tokens:
            reason = finish_length(sp.max_new_tokens)
        if reason is not None and not matched:
            tail, _ = r.stop_matcher.feed(r.detokenizer.flush())
            piece += tail + r.stop_matcher.flush()
            if r.stop_matcher.matched_stop is not None:  # a stop confirmed by the final text
                reason = finish_stop(r.stop_matcher.matched_stop)
                if sp.no_stop_trim:
                    piece += r.stop_matcher.matched_stop
        r.text += piece
        if reason is not None:
            self._release(r)
            self._finish(r, reason, delta_text=piece, delta_ids=new_ids, delta_lp=new_lp, delta_top=new_top)
        elif r.stream:
            r.sink.put(ReqEvent(r.rid, piece, new_ids, meta_info=self._meta(r),
                                output_token_logprobs=new_lp, output_top_logprobs=new_top))

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
        owned_from = max(r.prefix_len, len(r.origin_input_ids))  # earlier slots belong to the tree
        k = min(JUMP_FORWARD_RETOKENIZE, r.seq_len - owned_from)
        tail_ids = r.output_ids[len(r.output_ids) - k :] if k > 0 else []
        tail_text = self.tokenizer.decode(tail_ids) if tail_ids else ""
        if "\ufffd" in tail_text:  # mid-character: the text boundary is not clean yet
            return [], ""
        if tail_ids and self.tokenizer.decode(r.output_ids) != self.tokenizer.decode(r.output_ids[:-k]) + tail_text:
            return [], ""  # the tail decodes differently alone (e.g. a SentencePiece leading space)
        new_ids = list(self.tokenizer(tail_text + forced, add_special_tokens=False).input_ids)
        if self.tokenizer.decode(new_ids) != tail_text + forced:  # the tokenizer would not round-trip
            return [], ""
        common = 0
        while common < min(len(tail_ids), len(new_ids)) and tail_ids[common] == new_ids[common]:
            common += 1
        roll, added = len(tail_ids) - common, new_ids[common:]
        if not added or len(r.output_ids) - roll + len(added) > sp.max_new_tokens - reserve:
            return [], ""
        r.matcher.rollback(roll)
        accepted = 0
        for t in added:
            if not r.matcher.accept(t):
                break
            accepted += 1
        if accepted < len(added):  # not in the language after all: restore and decode normally
            r.matcher.rollback(accepted)
            for t in tail_ids[common:]:
                r.matcher.accept(t)
            return [], ""
        # Commit: drop the rolled-back tokens (and the K/V of those that had any).
        held_text = r.detokenizer.flush()
        new_seq = r.seq_len - roll
        if roll:
            del r.output_ids[len(r.output_ids) - roll :]
            if r.kv_len > new_seq:
                row = self.req_to_token.req_to_token[r.pool_row]
                self.kv_pool.free(row[new_seq : r.kv_len].clone())
                r.kv_len = new_seq
        r.output_ids.extend(added)
        r.detokenizer = IncrementalDetokenizer(
            self.tokenizer,
            prompt_ids=r.fill_ids,
            skip_special_tokens=sp.skip_special_tokens,
            spaces_between_special_tokens=sp.spaces_between_special_tokens,
        )
        self.stats["jump_forward_tokens"] += len(added)
        return added, held_text + forced

    def _meta(self, r: Req) -> dict[str, Any]:
        now = time.monotonic()
        meta: dict[str, Any] = {
            "id": r.rid,
            "prompt_tokens": len(r.origin_input_ids),
            "completion_tokens": len(r.output_ids),
            "cached_tokens": r.cached_tokens or 0,
            "finish_reason": r.finished_reason,
            "e2e_latency": now - r.created_at,
        }
        if r.first_token_at is not None:
            meta["ttft"] = r.first_token_at - r.created_at
        if r.num_retractions:
            meta["num_retractions"] = r.num_retractions
        if r.return_logprob and r.finished_reason is not None:
            meta["input_token_logprobs"] = r.input_token_logprobs
            meta["output_token_logprobs"] = r.output_token_logprobs
            if r.top_logprobs_num > 0:
                meta["input_top_logprobs"] = r.input_top_logprobs
                meta["output_top_logprobs"] = r.output_top_logprobs
        return meta

    def _finish(self, r: Req, reason: dict[str, Any], error: BaseException | None = None, delta_text: str = "",
                delta_ids: list[int] | None = None, delta_lp: list | None = None, delta_top: list | None = None) -> None:
        r.finished_reason = reason
        self.stats["finished_requests"] += 1
        if r.session_id is not None and error is None and reason["type"] != "abort":
            # A finished turn: remember its tokens, and pin their KV (inserted into the tree
            # by _release just before) until the session ends.
            if self.sessions.record(r.session_id, r.rid, r.origin_input_ids, r.output_ids):
                self.session_locks.pin(r.session_id, r.fill_ids)
                limit = int(MAX_PINNED_SHARE * self.kv_pool.capacity)
                # Pins are a subset of the tree's locked tokens: only count them when that could matter.
                while (self.tree.protected_size() > limit and self.session_locks.locked_tokens() > limit
                       and self._unpin_lru_session()):
                    pass
        if r.stream:
            event = ReqEvent(r.rid, delta_text, delta_ids or [], True, self._meta(r), error,
                             delta_lp or [], delta_top or [])
        else:
            event = ReqEvent(r.rid, r.text, list(r.output_ids), True, self._meta(r), error,
                             list(r.output_token_logprobs), list(r.output_top_logprobs))
        r.sink.put(event)

    # ------------------------------------------------------------------ introspection

    def flush_cache(self) -> bool:
        """Empty the radix cache, open sessions' pinned KV included (their histories stay)."""
        if self.running or self.waiting:
            return False
        self.session_locks.release_all()
        return self.tree.flush()

    def info(self) -> dict[str, Any]:
        return {
            "max_total_tokens": self.kv_pool.capacity,
            "kv_bytes_per_token": self.kv_pool.bytes_per_token,
            "available_kv_tokens": self.kv_pool.available_size(),
            "radix_cache_tokens": self.tree.total_size(),
            "evictable_tokens": self.tree.evictable_size(),
            "num_running_reqs": len(self.running),
            "num_waiting_reqs": len(self.waiting),
            "num_open_sessions": len(self.sessions),
            "session_locked_tokens": self.session_locks.locked_tokens(),
            "new_token_ratio": self.new_token_ratio,
            "attention_backend": backend_name(self.attn_backend),
            "cuda_graph_batch_sizes": self.graph_runner.capture_sizes if self.graph_runner else [],
            **self.stats,
        }
