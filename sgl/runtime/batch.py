"""Which tokens the next forward step computes: continuous batching over the KV budget.

Each step (1) reserves one slot per pending token of every decoding request (evicting
cached prefixes, unpinning idle sessions, then retracting requests if memory runs out),
(2) continues a chunked prefill, (3) fills the rest of the token budget with waiting
requests in policy order (lpm: longest cached prefix first; fcfs; dfs-weight: depth first
through the prefix tree, heaviest subtree first). Admission leaves room for the running
requests' future decode tokens, estimated by `new_token_ratio`; a wrong estimate is
corrected by retraction, never by failing a request.
"""

from __future__ import annotations

from dataclasses import dataclass

from sgl.runtime.config import SchedulerConfig
from sgl.runtime.kv_manager import KVManager
from sgl.runtime.request import Req

# Requests sharing an uncached prefix at least this long are admitted one per step, so
# the others find it in the prefix cache on the next step instead of computing it again.
IN_BATCH_PREFIX_THRESHOLD = 32
# lpm/dfs-weight match every waiting request against the cache each step; past this queue
# length that costs more than it saves, and the policy falls back to fcfs.
POLICY_QUEUE_LIMIT = 128
# Under lpm / dfs-weight a request sharing nothing cached could be passed over for as long as
# requests with cached prefixes keep coming (the soak saw short prompts wait minutes). One that
# has seen this many admissions since it was first queued goes first, in arrival order.
MAX_OVERTAKES = 64
# Decode reservation per running request: remaining new tokens x ratio (clipped).
INIT_NEW_TOKEN_RATIO, MIN_NEW_TOKEN_RATIO, NEW_TOKEN_RATIO_DECAY = 0.7, 0.1, 0.001
RESERVE_CLIP = 4096


@dataclass
class BatchItem:
    req: Req
    extend_len: int  # new tokens this step computes for the request
    prefill: bool = False  # prompt tokens (vs. tokens the request generated or was forced to)


class BatchBuilder:
    """Owns the waiting queue, the running set and the chunked request."""

    def __init__(self, config: SchedulerConfig, kv: KVManager) -> None:
        self.config = config
        self.kv = kv
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.chunked_req: Req | None = None
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self.retractions = 0
        self.cached_tokens = 0
        self.admissions = 0  # requests admitted so far (the clock of MAX_OVERTAKES)

    # ------------------------------------------------------------------ membership

    def is_generating(self, req: Req) -> bool:
        """Prefill done: the next step feeds its newest tokens (one sampled token, or a
        jump-forward's forced tokens) to get the next logits."""
        return req.pool_row is not None and bool(req.output_ids) and req is not self.chunked_req

    def remove(self, req: Req) -> None:
        """The request ended: release its KV and forget it."""
        req.draft_ids = []
        self.kv.release(req)
        if req is self.chunked_req:
            self.chunked_req = None
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)

    def retract(self, req: Req) -> None:
        """Preempt a decoding request: keep its tokens, drop its KV row, queue it first."""
        self.remove(req)
        req.num_retractions += 1
        self.retractions += 1
        self.waiting.insert(0, req)
        self.new_token_ratio = min(1.0, self.new_token_ratio + 0.1)

    # ------------------------------------------------------------------ the next batch

    def next_batch(self) -> list[BatchItem]:
        items = self._decodes()
        budget = self.config.engine.chunk_size or self.config.engine.max_prefill_tokens
        committed = sum(it.extend_len for it in items)  # slots this step will take
        if self.chunked_req is not None:
            req = self.chunked_req
            ext = min(req.seq_len - req.kv_len, budget)
            if not self.kv.make_room(committed + ext):
                ext = max(0, self.kv.reclaimable() - committed)
            if ext > 0:
                items.append(BatchItem(req, ext, prefill=True))
                budget -= ext
                committed += ext
        if budget > 0 and self.waiting and self.chunked_req is None:
            admitted = self._admit(budget, committed, first=not items)
            while not admitted and not items and not self.running and self.kv.unpin_lru_session():
                # Nothing runs and nothing fits: idle sessions hold the memory the queue needs.
                admitted = self._admit(budget, committed, first=True)
            items.extend(admitted)
        self.kv.assign_step_slots([(it.req, it.extend_len) for it in items])
        return items

    def _decodes(self) -> list[BatchItem]:
        """Every generating request, with a slot per pending token; retract while short."""
        decodes = [r for r in self.running if self.is_generating(r)]
        if not decodes:
            return []
        need = sum(r.pending_tokens + len(r.draft_ids) for r in decodes)
        if not self.kv.make_room(need) and any(r.draft_ids for r in decodes):
            for r in decodes:  # drafts are the first thing short memory gives up
                r.draft_ids = []
            need = sum(r.pending_tokens for r in decodes)
            self.kv.make_room(need)
        while decodes and self.kv.reclaimable() < need:
            victim = max(decodes, key=lambda r: (-len(r.output_ids), len(r.origin_input_ids)))
            decodes.remove(victim)
            need -= victim.pending_tokens + len(victim.draft_ids)
            self.retract(victim)
        self.new_token_ratio = max(
            MIN_NEW_TOKEN_RATIO, self.new_token_ratio - NEW_TOKEN_RATIO_DECAY
        )
        return [BatchItem(r, r.pending_tokens + len(r.draft_ids)) for r in decodes]

    def _reserved_tokens(self) -> int:
        total = 0
        for req in self.running:
            left = req.sampling_params.max_new_tokens - len(req.output_ids)
            total += int(min(max(left, 0), RESERVE_CLIP) * self.new_token_ratio)
            if not self.is_generating(req):  # a chunked prefill still to finish
                total += req.pending_tokens
        return total

    def _admit(self, budget: int, committed: int, first: bool) -> list[BatchItem]:
        """Move waiting requests into the batch while the token budget and KV memory allow."""
        items: list[BatchItem] = []
        admitted_keys: set[tuple[int, ...]] = set()
        cache = self.kv.cache
        for req in self.policy_order():
            if budget <= 0 or len(self.running) >= self.config.engine.max_running_requests:
                break
            if self.kv.req_to_token.available_size() == 0:
                break
            ids = req.fill_ids
            limit = len(ids) - 1  # at least one token must run to produce the next logits
            if not req.input_logprobs_done:
                limit = min(limit, max(req.logprobs.start_len - 1, 0))
            prefix_slots, node = cache.match_prefix(ids[:limit])
            prefix = len(prefix_slots)
            remaining = len(ids) - prefix
            if cache.shares_prefixes and remaining > IN_BATCH_PREFIX_THRESHOLD:
                key = tuple(ids[: prefix + IN_BATCH_PREFIX_THRESHOLD])
                if key in admitted_keys:
                    continue  # a request admitted this step computes this prefix; wait for it
                admitted_keys.add(key)
            if self.config.engine.chunk_size:
                ext = min(remaining, budget)
            elif remaining > budget and not (first and not items):
                break  # too long for this step's prefill budget; it goes first next step
            else:
                ext = remaining
            if not self._fits(req, ext, committed, node, crowded=bool(self.running or items)):
                break
            self.waiting.remove(req)
            self.kv.admit(req, prefix_slots, node)
            if req.cached_tokens is None:
                req.cached_tokens = prefix
                self.cached_tokens += prefix
            self.running.append(req)
            self.admissions += 1
            items.append(BatchItem(req, ext, prefill=True))
            budget -= ext
            committed += ext
            if ext < remaining:
                self.chunked_req = req
                break
        return items

    def _fits(self, req: Req, ext: int, committed: int, node: object, crowded: bool) -> bool:
        """Lock the request's prefix and check its step fits now (hard) and, when others run,
        with the decode reservation (soft). On False the lock is dropped again."""
        cache = self.kv.cache
        cache.inc_lock_ref(node)  # so eviction for this step cannot take the prefix we count on
        memory = self.kv.reclaimable()
        future = int(min(req.sampling_params.max_new_tokens, RESERVE_CLIP) * self.new_token_ratio)
        fits_now = committed + ext <= memory
        fits_later = committed + ext + future + self._reserved_tokens() <= memory
        if not fits_now or (not fits_later and crowded):
            cache.dec_lock_ref(node)
            return False
        return True

    def policy_order(self) -> list[Req]:
        policy = self.config.engine.schedule_policy
        cache = self.kv.cache
        if policy == "fcfs" or not cache.shares_prefixes or len(self.waiting) > POLICY_QUEUE_LIMIT:
            return list(self.waiting)
        aged, rest = [], []
        for r in self.waiting:
            if r.queued_at_admission is None:
                r.queued_at_admission = self.admissions
            (aged if self.admissions - r.queued_at_admission >= MAX_OVERTAKES else rest).append(r)
        return aged + self._prefix_order(policy, rest)

    def _prefix_order(self, policy: str, waiting: list[Req]) -> list[Req]:
        """`waiting` by lpm (longest cached prefix first) or dfs-weight."""
        cache = self.kv.cache
        matches = {id(r): cache.match_prefix(r.fill_ids) for r in waiting}
        if policy == "lpm":
            return sorted(waiting, key=lambda r: -len(matches[id(r)][0]))
        # dfs-weight: visit the tree depth first, heaviest subtree (most waiting requests) first.
        by_node: dict[int, list[Req]] = {}
        weight: dict[int, int] = {}
        for r in waiting:
            node = matches[id(r)][1]
            by_node.setdefault(id(node), []).append(r)
            while node is not None:
                weight[id(node)] = weight.get(id(node), 0) + 1
                node = node.parent
        order: list[Req] = []
        stack = [cache.root]
        while stack:
            node = stack.pop()
            order.extend(by_node.get(id(node), []))
            kids = [c for c in node.children.values() if weight.get(id(c), 0) > 0]
            kids.sort(key=lambda c: weight[id(c)])  # heaviest popped first
            stack.extend(kids)
        return order

    # ------------------------------------------------------------------ after the forward

    def advance(self, items: list[BatchItem]) -> list[tuple[BatchItem, int]]:
        """The step's K/V is in the pool: move each request's kv_len on and share finished
        prefill chunks through the prefix cache. Returns the items that get a new token (all
        their tokens now have K/V), each with the row of its last token in the step's output
        (of its last draft token when it drafted: the rows before it are the verify rows)."""
        self.kv.take_step_slots()
        ready: list[tuple[BatchItem, int]] = []
        offset = 0
        for it in items:
            r = it.req
            offset += it.extend_len
            r.kv_len += it.extend_len
            if r is self.chunked_req and r.kv_len == r.seq_len:
                self.chunked_req = None
            if r.kv_len == r.seq_len + len(r.draft_ids):
                ready.append((it, offset - 1))
        for it in items:
            if it.prefill and it.extend_len > 1:
                # A chunk boundary or a finished prefill: share it through the cache now.
                # (Generated and forced tokens enter the cache when the request ends.)
                self.kv.cache_unfinished(it.req)
        return ready

    def fail_all(self) -> list[Req]:
        """After an internal error: drop every request, returning all their KV; returns them."""
        self.kv.free_step_slots()
        reqs = list(self.running) + list(self.waiting)
        for req in list(self.running):
            try:
                self.remove(req)
            except Exception:  # pragma: no cover - best effort on a broken state
                if req in self.running:
                    self.running.remove(req)
        self.waiting.clear()
        self.chunked_req = None
        return reqs
