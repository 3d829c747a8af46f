"""One forward step: batch -> model (eager, or a replayed CUDA graph) -> logits -> tokens.

This is the seam where the model's execution lives: the attention backend, the CUDA-graph
runner, the logits and the batched sampler. A compiled or quantized forward plugs in here;
nothing above it knows how the hidden states were computed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from sgl.runtime.attention import ForwardBatch, create_attention_backend, supports_cuda_graph
from sgl.runtime.config import EngineConfig, cuda_graph_max_bs
from sgl.runtime.cpu_compile import CompiledDecode
from sgl.runtime.cuda_graph import CudaGraphRunner, DecodeInputs
from sgl.runtime.memory import ReqToTokenPool, TokenToKVPool
from sgl.runtime.request import Req
from sgl.runtime.sampling.batch import SamplingBatch
from sgl.runtime.sampling.sampler import position_generator, sample
from sgl.runtime.speculative import expand_rows


@dataclass
class StepInput:
    """The flat token list of one step: per request, `extend_len` new tokens on `kv_len` cached."""

    reqs: list[Req]
    extend_lens: list[int]


@dataclass
class Sampled:
    token_ids: list[int]  # -1: no token was allowed (constraint dead end)
    logprobs: list[float] | None  # only when some request asked for logprobs
    top_logprobs: list[list[tuple[int, float]] | None]

    def picks(self, start: int, n: int) -> list[tuple]:
        """(token, logprob, top logprobs) of rows start .. start + n - 1 (one request's)."""
        lps = self.logprobs
        return [
            (self.token_ids[i], lps[i] if lps else None, self.top_logprobs[i])
            for i in range(start, start + n)
        ]


class ModelRunner:
    def __init__(
        self, model: torch.nn.Module, cfg: EngineConfig, device: torch.device, dtype: torch.dtype
    ) -> None:
        self.model = model
        self.device = device
        self.vocab_size = model.config.vocab_size
        self.attn_backend = create_attention_backend(
            cfg.attention_backend, str(device), dtype, needs=model.config.attention_features
        )
        max_bs = cuda_graph_max_bs(cfg, device)
        self.graph_max_bs = max_bs if max_bs > 0 and supports_cuda_graph(self.attn_backend) else 0
        self.graph_runner: CudaGraphRunner | None = None
        self.cuda_graph_steps = 0
        self.compiled_decode = (
            CompiledDecode(model) if cfg.torch_compile and device.type == "cpu" else None
        )
        self.compiled_steps = {"batch 1": 0, "batch 2+": 0}  # steps each compiled graph ran

    @property
    def padding_rows(self) -> int:
        """Table rows the runner keeps for itself: CUDA graphs pad with a row of zeros, and the
        CPU compile warms up on one."""
        return 1 if self.graph_max_bs or self.compiled_decode is not None else 0

    @property
    def num_heads(self) -> int:
        """Query heads this rank computes (all of them without tensor parallelism)."""
        return getattr(self.model, "local_num_heads", self.model.config.num_attention_heads)

    @property
    def num_kv_heads(self) -> int:
        """KV heads this rank keeps in its pool."""
        return getattr(self.model, "local_num_kv_heads", self.model.config.num_key_value_heads)

    def backend_reserved_bytes(self, max_total_tokens: int, dtype: torch.dtype) -> int:
        """What the attention backend may allocate beyond a pool of this size (memory plan)."""
        mc = self.model.config
        return self.attn_backend.reserved_memory_bytes(
            max_total_tokens, self.num_kv_heads, mc.head_dim, mc.num_hidden_layers, dtype
        )

    def bind(self, kv_pool: TokenToKVPool, req_to_token: ReqToTokenPool) -> None:
        """Attach the KV memory; captures the CUDA graphs (when used) on it."""
        self.kv_pool, self.req_to_token = kv_pool, req_to_token
        self.attn_backend.bind(kv_pool, req_to_token, self.num_heads)
        if self.graph_max_bs:
            padding_row = req_to_token.alloc()  # never freed, never written: stays zeros
            self.graph_runner = CudaGraphRunner(
                self.model, self.attn_backend, kv_pool, req_to_token, self.graph_max_bs, padding_row
            )
        if self.compiled_decode is not None:
            padding_row = req_to_token.alloc()  # never freed; its one key is slot 0 (padding)
            self.compiled_decode.warm(
                lambda n: self._batch(
                    [0] * n,
                    [0] * n,
                    torch.zeros(n, dtype=torch.int64),
                    [padding_row] * n,
                    [0] * n,
                    [1] * n,
                ),
                self.attn_backend,
            )

    def _batch(
        self,
        input_ids: list[int],
        positions: list[int],
        slots: torch.Tensor,
        rows: list[int],
        prefix_lens: list[int],
        extend_lens: list[int],
    ) -> ForwardBatch:
        return ForwardBatch(
            input_ids=torch.tensor(input_ids, dtype=torch.int64, device=self.device),
            positions=torch.tensor(positions, dtype=torch.int64, device=self.device),
            out_cache_loc=slots.to(self.device),
            req_rows=rows,
            prefix_lens=prefix_lens,
            extend_lens=extend_lens,
            kv_pool=self.kv_pool,
            req_to_token=self.req_to_token,
            attn_backend=self.attn_backend,
            row_epochs=[self.req_to_token.epochs[row] for row in rows],
        )

    # ------------------------------------------------------------------ forward

    def forward(self, step: StepInput, slots: torch.Tensor) -> torch.Tensor:
        """Hidden states [T, hidden] of the step's tokens; their K/V is written to `slots`."""
        input_ids: list[int] = []
        positions: list[int] = []
        for r, ext in zip(step.reqs, step.extend_lens):
            if ext == 1 and r.output_ids and r.kv_len == r.seq_len - 1:
                input_ids.append(r.output_ids[-1])
            else:  # a prompt chunk, forced tokens, or the newest token and its draft
                ids = r.fill_ids + r.draft_ids if r.draft_ids else r.fill_ids
                input_ids.extend(ids[r.kv_len : r.kv_len + ext])
            positions.extend(range(r.kv_len, r.kv_len + ext))
        rows, prefix_lens, extend_lens = self._layout(step)
        runner = self.graph_runner
        if runner is not None and runner.can_run(len(rows)) and all(e == 1 for e in extend_lens):
            self.cuda_graph_steps += 1  # pure decode: replay the captured forward
            return runner.replay(
                DecodeInputs(
                    input_ids, positions, slots.tolist(), rows, [p + 1 for p in prefix_lens]
                )
            )
        batch = self._batch(input_ids, positions, slots, rows, prefix_lens, extend_lens)
        self.attn_backend.init_forward_metadata(batch)
        forward = self.model
        compiled = (
            self.compiled_decode.pick(batch.extend_lens)
            if self.compiled_decode is not None
            else None
        )
        if compiled is not None:
            forward = compiled
            self.compiled_steps["batch 1" if len(batch.extend_lens) == 1 else "batch 2+"] += 1
        with torch.inference_mode():
            return forward(batch.input_ids, batch.positions, batch)

    def _layout(self, step: StepInput) -> tuple[list[int], list[int], list[int]]:
        """Per attention row: the request's table row, its tokens before the row's first
        token, and the row's new tokens; one row per request.

        A decode step where requests verify drafts is laid out as one row per token instead
        (row j of a request: one token on kv_len + j before it, the same table row), when a
        captured or compiled decode forward exists: every backend writes a step's K/V before
        attending, so row j sees the drafts before it, and the step runs the decode graph
        rather than the eager extend path."""
        rows = [r.pool_row for r in step.reqs]
        prefix_lens = [r.kv_len for r in step.reqs]
        extend_lens = list(step.extend_lens)
        compiled = self.compiled_decode is not None and self.compiled_decode.batched is not None
        graphs = self.graph_runner is not None or compiled
        if not graphs or not any(r.draft_ids for r in step.reqs):
            return rows, prefix_lens, extend_lens
        if any(e != 1 + len(r.draft_ids) for r, e in zip(step.reqs, extend_lens)):
            return rows, prefix_lens, extend_lens  # forced tokens or a prompt chunk: eager anyway
        rows, prefix_lens = [], []
        for r, e in zip(step.reqs, step.extend_lens):
            rows.extend([r.pool_row] * e)
            prefix_lens.extend(range(r.kv_len, r.kv_len + e))
        return rows, prefix_lens, [1] * len(rows)

    def logits(self, hidden: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
        return self.model.compute_logits(hidden[torch.tensor(list(rows), device=hidden.device)])

    # ------------------------------------------------------------------ tokens

    def sample(
        self,
        hidden: torch.Tensor,
        reqs: list[Req],
        rows: list[int],
        eos_token_ids: list[int],
        drafts: list[list[int]] | None = None,
    ) -> Sampled:
        """One token per request from its row of `hidden`, under its constraint and params.

        With `drafts` (speculative decoding), a token at each of a request's len(draft) + 1
        verify positions instead (its rows end at `rows[i]`), each drawn as if the draft's
        prefix before it were already output: penalties, min_new_tokens, the constraint's
        mask and its budget all see it. The tokens come out flat, request by request."""
        views: list[tuple[Req, list[int]]]
        if drafts is None:
            views = [(r, []) for r in reqs]
        else:
            rows = expand_rows(rows, drafts)
            views = [(r, d[:j]) for r, d in zip(reqs, drafts) for j in range(len(d) + 1)]
        logits = self.logits(hidden, rows)
        allowed = self._grammar_mask(views, logits.device)
        sbatch = SamplingBatch.build(
            [r.sampling_params for r, _ in views], logits.device, self.vocab_size, eos_token_ids
        )
        need_prompt = bool(sbatch.repetition_rows)
        want_logprobs = any(r.logprobs.enabled for r in reqs)
        out = sample(
            logits,
            sbatch,
            output_ids=[r.output_ids + d if d else r.output_ids for r, d in views],
            prompt_ids=[r.origin_input_ids if need_prompt else [] for r, _ in views],
            generators=[self._generator(r, d) for r, d in views],
            top_logprobs_num=[r.logprobs.top_n if r.logprobs.enabled else 0 for r, _ in views],
            allowed_mask=allowed,
            with_logprobs=want_logprobs,
        )
        logprobs = out.logprobs.tolist() if want_logprobs else None
        return Sampled(out.token_ids.tolist(), logprobs, out.top_logprobs)

    def _generator(self, r: Req, drafted: list[int]) -> torch.Generator | None:
        """A seeded request's generator for the token its view draws (by output position)."""
        seed = r.sampling_params.seed
        if seed is None:
            return None
        return position_generator(seed, len(r.output_ids) + len(drafted), self.device)

    def _grammar_mask(
        self, views: list[tuple[Req, list[int]]], device: torch.device
    ) -> torch.Tensor | None:
        """One bool [rows, V] mask from the constrained requests' matchers (None if none); a
        row whose view has drafted tokens gets the mask of the state after them."""
        if all(r.matcher is None for r, _ in views):
            return None
        from sgl.constrained.matcher import allocate_bitmask, bitmask_to_bool

        bits = allocate_bitmask(len(views), self.vocab_size)
        for i, (r, prefix) in enumerate(views):
            if r.matcher is None:
                bits[i] = -1  # every bit set: unconstrained
                continue
            if prefix:  # views of one request come in order: one more drafted token each
                r.matcher.accept(prefix[-1])
            sp = r.sampling_params  # budget: the tokens left, this one included
            left = sp.max_new_tokens - len(r.output_ids) - len(prefix)
            r.matcher.fill_mask(bits[i], left if sp.budget_aware else None)
            last = i + 1 == len(views) or views[i + 1][0] is not r
            if last and prefix:
                r.matcher.rollback(len(prefix))  # back to the committed state
        return bitmask_to_bool(bits, self.vocab_size).to(device)

    def score(
        self, hidden: torch.Tensor, rows: list[int], token_ids: list[int], top_n: int
    ) -> tuple[list[float], list[list[float]] | None, list[list[int]] | None]:
        """Log-probabilities of `token_ids` at `rows` (prompt logprobs), and the top `top_n`."""
        logp = torch.log_softmax(self.logits(hidden, rows), dim=-1)
        ids = torch.tensor(token_ids, device=logp.device)
        chosen = logp.gather(1, ids.unsqueeze(1)).squeeze(1).tolist()
        top_n = min(top_n, logp.shape[-1])
        if top_n <= 0:
            return chosen, None, None
        vals, idx = logp.topk(top_n, dim=-1)
        return chosen, vals.tolist(), idx.tolist()
