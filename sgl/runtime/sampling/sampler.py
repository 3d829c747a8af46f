"""The batched, per-row-seeded token sampler: `sample()` and its kernels.

`sample()` turns one decode step's logits [B, V] into one token per row. Processing order
(each step is skipped entirely when no row in the batch uses it):

1. logit_bias            logits[row, id] += bias; allowed_token_ids: every other id -> -inf
                         (batch.py adds it to the bias keys)
2. allowed_mask          bool [B, V], True = allowed; disallowed -> -inf (grammar constraints)
3. min_new_tokens        while len(output) < min_new_tokens: eos ids and the row's
                         stop_token_ids -> -inf (regardless of ignore_eos)
4. repetition_penalty    HF style over prompt + output tokens: positive logits / penalty,
                         negative logits * penalty
5. frequency / presence  OpenAI style over output tokens only:
                         logit -= frequency_penalty * count + presence_penalty * (count > 0)
6. greedy rows           (temperature == 0 or top_k == 1) take the argmax
7. sampled rows          logits / temperature -> softmax -> top_k -> top_p (smallest prefix of the
                         descending-probability order whose mass reaches top_p; the top token is
                         always kept) -> min_p (drop p < min_p * max p) -> inverse-CDF draw.
                         top_p and min_p are measured on the temperature-scaled softmax itself
                         (not renormalized after top_k), as in SGLang's torch sampler.

The draw uses ONE uniform u per sampled row, taken from the row's generator when it has one
(seeded request) and from the default torch RNG otherwise. The token is the first position
where the cumulative (unnormalized) kept probability exceeds u * total, which equals sampling
from the renormalized distribution. Rows with top_k/top_p walk the CDF in descending
probability order; rows without walk it in vocabulary order (no sort needed). Which path a row
takes depends only on its own parameters, and all arithmetic is per row, so a seeded row gets
the same token whatever else shares its batch. Greedy rows draw nothing. The engine gives a
seeded request a fresh generator per output position (`position_generator`), so a token's
draw depends on the seed and its position only: not on the batch, retraction, or how many
positions one step verifies (speculative decoding gives the same tokens as without it).

Logprobs are always those of the model's RAW distribution (log_softmax of the input logits,
before bias/penalties/temperature), as OpenAI-style APIs report them. A row whose every token
is masked gets token id -1 (logprob -inf); the scheduler finishes it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from sgl.runtime.sampling.batch import SamplingBatch, _RowGroup

_NEG_INF = float("-inf")
_SEED_MASK = (1 << 64) - 1
# Candidate sizes tried before a full vocabulary sort (see _sample_sorted_rows).
_TOPK_TIERS = (64, 1024)
# Block width of the two-level CDF walk in _inverse_cdf.
_CDF_BLOCK = 256


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator for one seeded request; any Python int is folded into 64 bits."""
    gen = torch.Generator(device=torch.device(device))
    gen.manual_seed(seed & _SEED_MASK)
    return gen


def position_generator(
    seed: int, position: int, device: torch.device | str = "cpu"
) -> torch.Generator:
    """The generator of a seeded request's draw for its output token number `position`:
    `seed` and `position` mixed by splitmix64 (distinct positions get unrelated streams)."""
    x = ((seed & _SEED_MASK) + (position + 1) * 0x9E3779B97F4A7C15) & _SEED_MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _SEED_MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _SEED_MASK
    return make_generator(x ^ (x >> 31), device)


@dataclass
class SampleOutput:
    """One step's result: tokens [B] int64 (-1 = nothing allowed), raw logprobs [B] float32
    (None when not asked for: `sample(with_logprobs=False)`)."""

    token_ids: torch.Tensor
    logprobs: torch.Tensor | None
    top_logprobs: list[list[tuple[int, float]] | None]


def sample(
    logits: torch.Tensor,
    batch: SamplingBatch,
    output_ids: list[list[int]],
    prompt_ids: list[list[int]],
    generators: list[torch.Generator | None],
    top_logprobs_num: list[int] | None = None,
    allowed_mask: torch.Tensor | None = None,
    with_logprobs: bool = True,
) -> SampleOutput:
    """Pick one token per row; see the module docstring for the processing order (one step
    per stage of that order, kept in one function so the order reads top to bottom).
    with_logprobs=False (no row wants logprobs) skips the logsumexp over the vocabulary:
    ~5% of a 48-row decode step on CPU."""
    if logits.dim() != 2 or logits.shape[0] != batch.size or logits.shape[1] != batch.vocab_size:
        raise ValueError(
            f"logits must be [{batch.size}, {batch.vocab_size}], got {tuple(logits.shape)}"
        )
    B, V = logits.shape
    if allowed_mask is not None and (
        allowed_mask.shape != (B, V) or allowed_mask.dtype != torch.bool
    ):
        raise ValueError(f"allowed_mask must be bool [{B}, {V}], got {tuple(allowed_mask.shape)}")
    if not with_logprobs and top_logprobs_num and any(top_logprobs_num):
        raise ValueError("top_logprobs_num needs with_logprobs=True")
    raw = logits.float()
    # Raw-distribution statistics first, so the edits below may reuse `raw`'s storage.
    lse = row_logsumexp(raw) if with_logprobs else None
    top_logprobs = _top_logprobs(raw, lse, top_logprobs_num, B) if with_logprobs else [None] * B

    active_min_new = [r for r in batch.min_new_rows if len(output_ids[r]) < batch.min_new_tokens[r]]
    edits = (
        batch.bias_keys is not None
        or allowed_mask is not None
        or bool(active_min_new)
        or bool(batch.repetition_rows)
        or bool(batch.penalty_rows)
    )
    x = raw
    if edits:
        # Never edit the caller's tensor. A dtype conversion already made a private copy.
        if raw.data_ptr() == logits.data_ptr() or not raw.is_contiguous():
            x = raw.clone(memory_format=torch.contiguous_format)
        flat = x.view(-1)
        if batch.bias_keys is not None:
            flat.index_add_(0, batch.bias_keys, batch.bias_values)
        if allowed_mask is not None:
            x.masked_fill_(~allowed_mask, _NEG_INF)
        if active_min_new:
            keys = [r * V + t for r in active_min_new for t in batch.min_new_ban_ids[r]]
            flat[torch.tensor(keys, dtype=torch.int64, device=x.device)] = _NEG_INF
        if batch.repetition_rows:
            _apply_repetition_penalty(flat, batch, output_ids, prompt_ids)
        if batch.penalty_rows:
            _apply_frequency_presence(flat, batch, output_ids)

    token_ids = _choose_tokens(x, batch, generators)
    if lse is None:
        return SampleOutput(token_ids=token_ids, logprobs=None, top_logprobs=top_logprobs)

    # Logprob under the raw distribution: logits[id] - logsumexp(logits).
    picked = logits.gather(1, token_ids.clamp(min=0).unsqueeze(1)).squeeze(1).float() - lse
    logprobs = picked.masked_fill(token_ids < 0, _NEG_INF)
    return SampleOutput(token_ids=token_ids, logprobs=logprobs, top_logprobs=top_logprobs)


def row_logsumexp(x: torch.Tensor) -> torch.Tensor:
    """logsumexp over each row, summed in the same order whatever the row count. torch splits a
    lone row's sum among its threads but gives each of 2+ rows to one thread, so a row's
    logprobs came out ~1e-6 apart alone and beside others (a speculative verify step's rows
    against the decode step each stands for); a lone row is summed as the first of two."""
    if x.shape[0] == 1 and torch.get_num_threads() > 1:
        return torch.logsumexp(x.repeat(2, 1), dim=-1)[:1]
    return torch.logsumexp(x, dim=-1)


def _flat_keys(
    rows: list[int], seqs: list[Sequence[int]], V: int, device: torch.device
) -> torch.Tensor:
    """row * V + token for every token of every listed row (out-of-range ids dropped)."""
    lens = [len(s) for s in seqs]
    total = sum(lens)
    if total == 0:
        return torch.empty(0, dtype=torch.int64, device=device)
    toks = torch.tensor(list(itertools.chain.from_iterable(seqs)), dtype=torch.int64)
    row_idx = torch.repeat_interleave(
        torch.tensor(rows, dtype=torch.int64), torch.tensor(lens, dtype=torch.int64)
    )
    ok = (toks >= 0) & (toks < V)
    return (row_idx[ok] * V + toks[ok]).to(device)


def _apply_repetition_penalty(
    flat: torch.Tensor,
    batch: SamplingBatch,
    output_ids: list[list[int]],
    prompt_ids: list[list[int]],
) -> None:
    """HF style: each distinct prompt/output token's logit is divided (if > 0) or
    multiplied (if <= 0) by the penalty. Sparse over the seen tokens, not dense over V."""
    rows = batch.repetition_rows
    seqs = [list(prompt_ids[r]) + list(output_ids[r]) for r in rows]
    keys = torch.unique(_flat_keys(rows, seqs, batch.vocab_size, flat.device))
    if keys.numel() == 0:
        return
    penalty = batch.repetition_penalties[keys // batch.vocab_size]
    vals = flat[keys]
    flat[keys] = torch.where(vals > 0, vals / penalty, vals * penalty)


def _apply_frequency_presence(
    flat: torch.Tensor, batch: SamplingBatch, output_ids: list[list[int]]
) -> None:
    """OpenAI style over output tokens. Counts come from unique(return_counts), i.e. exact
    integers, and each key is written once, so the result is deterministic on any device."""
    rows = batch.penalty_rows
    keys = _flat_keys(rows, [output_ids[r] for r in rows], batch.vocab_size, flat.device)
    if keys.numel() == 0:
        return
    keys, counts = torch.unique(keys, return_counts=True)
    row = keys // batch.vocab_size
    counts_f = counts.to(torch.float32)
    penalty = batch.frequency_penalties[row] * counts_f + batch.presence_penalties[row]
    flat[keys] = flat[keys] - penalty


def _choose_tokens(
    x: torch.Tensor, batch: SamplingBatch, generators: list[torch.Generator | None]
) -> torch.Tensor:
    """Argmax for greedy rows, seeded inverse-CDF draws for the rest."""
    if batch.all_greedy:
        return _argmax_rows(x)
    token_ids = torch.empty(batch.size, dtype=torch.int64, device=x.device)
    if batch.greedy_rows.numel():
        token_ids[batch.greedy_rows] = _argmax_rows(x.index_select(0, batch.greedy_rows))
    for group in batch.groups:
        u = _draw_uniforms(group.rows, generators, x.device)
        xs = x if group.rows.numel() == batch.size else x.index_select(0, group.rows)
        token_ids[group.rows] = _sample_group(xs, group, u)
    return token_ids


def _argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """Argmax per row; -1 where the whole row is -inf (nothing allowed)."""
    values, ids = x.max(dim=-1)
    return ids.masked_fill(values == _NEG_INF, -1)


def _draw_uniforms(
    rows: torch.Tensor, generators: list[torch.Generator | None], device: torch.device
) -> torch.Tensor:
    """One U[0, 1) per row: from its own generator when seeded, else from the default RNG.

    A seeded row's draw thus depends only on its generator's state, never on its neighbours.
    """
    row_list = rows.tolist()
    seeded = [i for i, r in enumerate(row_list) if generators[r] is not None]
    if not seeded:
        return torch.rand(len(row_list), device=device)
    u = torch.empty(len(row_list), device=device)
    free = [i for i, r in enumerate(row_list) if generators[r] is None]
    if free:
        u[torch.tensor(free, device=device)] = torch.rand(len(free), device=device)
    draws = [torch.rand(1, generator=generators[row_list[i]], device=device) for i in seeded]
    u[torch.tensor(seeded, device=device)] = torch.cat(draws)
    return u


def _sample_group(x: torch.Tensor, group: _RowGroup, u: torch.Tensor) -> torch.Tensor:
    """Temperature -> softmax -> filters -> inverse CDF, for rows sharing one path."""
    probs = torch.softmax(x / group.temperatures, dim=-1)
    # A row with every logit -inf softmaxes to all-NaN (checking one column suffices);
    # give it finite weights so the draw below is well defined, then report -1.
    dead = torch.isnan(probs[:, 0])
    any_dead = bool(dead.any())
    if any_dead:
        probs.masked_fill_(dead.unsqueeze(1), 1.0)
    if group.sorted_path:
        ids = _sample_sorted_rows(probs, group, u)
    else:
        if group.use_min_p:
            floor = group.min_ps.unsqueeze(1) * probs.amax(dim=-1, keepdim=True)
            probs.masked_fill_(probs < floor, 0.0)
        ids = _inverse_cdf(probs, u)
    if any_dead:
        ids = ids.masked_fill(dead, -1)
    return ids


def _inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """First index whose cumulative weight exceeds u * total (= a draw from the renormalized
    weights). Zero-weight entries are never chosen.

    A CPU cumsum over a 50k vocabulary is a serial dependency chain and dominated the
    sampled path, so wide rows are walked in two levels: vectorized per-block sums pick the
    block, then only that block is cumsum'd. All reductions are per row, so the result does
    not depend on the other rows.
    """
    n, V = weights.shape
    bs = _CDF_BLOCK
    if V <= 2 * bs:
        cdf = weights.cumsum(dim=-1)
        return _walk_cdf(cdf, u.unsqueeze(1).to(cdf.dtype) * cdf[:, -1:])
    nb = -(-V // bs)
    if nb * bs != V:  # zero-weight padding is never chosen
        weights = torch.nn.functional.pad(weights, (0, nb * bs - V))
    blocks = weights.view(n, nb, bs)
    block_cdf = blocks.sum(dim=-1).cumsum(dim=-1)  # [n, nb]
    target = u.unsqueeze(1).to(weights.dtype) * block_cdf[:, -1:]
    b = _walk_cdf(block_cdf, target).unsqueeze(1)  # [n, 1]
    before = block_cdf.gather(1, (b - 1).clamp(min=0)).masked_fill(b == 0, 0.0)
    local = blocks.gather(1, b.unsqueeze(2).expand(n, 1, bs)).squeeze(1)  # [n, bs]
    j = _walk_cdf(local.cumsum(dim=-1), (target - before).clamp(min=0.0))
    return b.squeeze(1) * bs + j


def _walk_cdf(cdf: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """searchsorted(right=True) with the target [n, 1] kept strictly below the row total, so
    the answer is in range and lands on a positive-weight entry even after float rounding."""
    total = cdf[:, -1:]
    target = torch.minimum(target, torch.nextafter(total, torch.zeros_like(total)))
    idx = torch.searchsorted(cdf, target, right=True).squeeze(1)
    return idx.clamp_(max=cdf.shape[1] - 1)


def _sample_sorted_rows(probs: torch.Tensor, group: _RowGroup, u: torch.Tensor) -> torch.Tensor:
    """top_k / top_p / min_p over the descending-probability order.

    A full sort of a 50k vocabulary is slow on CPU, and the kept set is almost always tiny,
    so each row first tries the top 64, then 1024 candidates; a tier suffices when the row's
    top_k fits in it or its mass already reaches top_p (then nothing past it is kept). Only
    rows failing both tiers are fully sorted. The tier decision depends on the row alone, so
    seeded rows stay independent of their batch.
    """
    n, V = probs.shape
    out = torch.empty(n, dtype=torch.int64, device=probs.device)
    pending = torch.arange(n, device=probs.device)
    for K in _TOPK_TIERS:
        if K >= V or pending.numel() == 0:
            break
        sub = probs if pending.numel() == n else probs.index_select(0, pending)
        vals, idx = sub.topk(K, dim=-1)
        cum = vals.cumsum(dim=-1)
        fits = (group.top_ks[pending] <= K) | (cum[:, -1] >= group.top_ps[pending])
        if bool(fits.all()):
            out[pending] = _pick_sorted(vals, idx, cum, group, pending, u)
            return out
        if bool(fits.any()):
            sel = fits.nonzero().squeeze(1)
            rows = pending[sel]
            out[rows] = _pick_sorted(vals[sel], idx[sel], cum[sel], group, rows, u)
        pending = pending[~fits]
    if pending.numel():
        sub = probs if pending.numel() == n else probs.index_select(0, pending)
        vals, idx = sub.sort(dim=-1, descending=True)
        out[pending] = _pick_sorted(vals, idx, vals.cumsum(dim=-1), group, pending, u)
    return out


def _pick_sorted(
    vals: torch.Tensor,
    idx: torch.Tensor,
    cum: torch.Tensor,
    group: _RowGroup,
    rows: torch.Tensor,
    u: torch.Tensor,
) -> torch.Tensor:
    """Apply the filters to descending candidates `vals` (vocab ids `idx`) and draw."""
    K = vals.shape[1]
    pos = torch.arange(K, device=vals.device).unsqueeze(0)
    # Exclusive prefix sum: mass strictly before each position (0 for the top token).
    before = torch.cat([torch.zeros_like(cum[:, :1]), cum[:, :-1]], dim=1)
    keep = (pos < group.top_ks[rows].unsqueeze(1)) & (before < group.top_ps[rows].unsqueeze(1))
    if group.use_min_p:
        keep &= vals >= group.min_ps[rows].unsqueeze(1) * vals[:, :1]
    choice = _inverse_cdf(vals.masked_fill(~keep, 0.0), u[rows])
    return idx.gather(1, choice.unsqueeze(1)).squeeze(1)


def _top_logprobs(
    raw: torch.Tensor, lse: torch.Tensor, nums: list[int] | None, B: int
) -> list[list[tuple[int, float]] | None]:
    """Per row, the top-N (token, raw logprob) pairs, descending; None where not asked."""
    result: list[list[tuple[int, float]] | None] = [None] * B
    if not nums:
        return result
    rows = [r for r in range(B) if nums[r] and nums[r] > 0]
    if not rows:
        return result
    k = min(max(nums[r] for r in rows), raw.shape[1])
    idx_rows = torch.tensor(rows, dtype=torch.int64, device=raw.device)
    vals, ids = raw.index_select(0, idx_rows).topk(k, dim=-1)
    vals = (vals - lse[idx_rows].unsqueeze(1)).tolist()
    ids = ids.tolist()
    for j, r in enumerate(rows):
        n = min(nums[r], k)
        result[r] = list(zip(ids[j][:n], vals[j][:n]))
    return result
