"""`SamplingBatch`: the per-row tensors `sample()` reads, gathered from one step's requests.

Built every decode step from the requests' `SamplingParams` (see ModelRunner.sample); the
per-step inputs that change as tokens arrive (tokens so far, generators) are passed to
`sample()` instead. Separate from the sampler so the kernels read without the bookkeeping.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from sgl.runtime.sampling.params import SamplingParams


@dataclass
class _RowGroup:
    """Sampled rows that share a code path (sorted or not); params pre-gathered per group."""

    rows: torch.Tensor  # [n] int64 row indices into the batch
    temperatures: torch.Tensor  # [n, 1] float32
    top_ks: torch.Tensor  # [n] int64, vocab_size when disabled
    top_ps: torch.Tensor  # [n] float32
    min_ps: torch.Tensor  # [n] float32
    use_min_p: bool
    sorted_path: bool  # rows use top_k/top_p, so the CDF is walked in descending order


@dataclass
class SamplingBatch:
    """Per-row tensors built from one step's requests' params (the model runner builds one
    every step); the per-step inputs (tokens so far, generators) are passed to `sample()`."""

    size: int
    vocab_size: int
    device: torch.device
    greedy_rows: torch.Tensor  # [g] int64
    all_greedy: bool
    groups: list[_RowGroup]  # sampled rows: unsorted path first, then sorted path
    # logit_bias as flat (row * V + id) keys, so one index_add applies all of it; with -inf for
    # every id a row's allowed_token_ids leaves out

    bias_keys: torch.Tensor | None
    bias_values: torch.Tensor | None
    # min_new_tokens: per row, the ids to ban until enough tokens exist
    min_new_tokens: list[int]
    min_new_ban_ids: list[list[int]]
    min_new_rows: list[int]
    # penalties, full [B] vectors plus the rows that actually use them
    repetition_penalties: torch.Tensor
    repetition_rows: list[int]
    frequency_penalties: torch.Tensor
    presence_penalties: torch.Tensor
    penalty_rows: list[int]

    @classmethod
    def build(
        cls,
        params: list[SamplingParams],
        device: torch.device | str,
        vocab_size: int,
        eos_token_ids: Sequence[int],
    ) -> SamplingBatch:
        """Gather the batch's params into tensors; ids outside [0, vocab_size) are ignored.
        (Long but flat: one pass over the rows, then one tensor per parameter, so every
        per-row tensor the sampler reads is built in this one place.)"""
        device = torch.device(device)
        V = vocab_size
        eos = sorted({int(t) for t in eos_token_ids if 0 <= int(t) < V})

        greedy: list[int] = []
        unsorted: list[int] = []
        sorted_: list[int] = []
        temps, top_ks, top_ps, min_ps = [], [], [], []
        bias_keys: list[int] = []
        bias_vals: list[float] = []
        banned: list[torch.Tensor] = []
        min_new, ban_ids, min_new_rows = [], [], []
        rep, freq, pres = [], [], []
        rep_rows, pen_rows = [], []
        for row, p in enumerate(params):
            k = p.top_k if 0 < p.top_k < V else V
            top_ks.append(k)
            top_ps.append(float(p.top_p))
            min_ps.append(float(p.min_p))
            temps.append(float(p.temperature) if p.temperature > 0 else 1.0)
            if p.is_greedy:
                greedy.append(row)
            elif k < V or p.top_p < 1.0:
                sorted_.append(row)
            else:
                unsorted.append(row)
            for tid, b in (p.logit_bias or {}).items():
                tid = int(tid)
                if 0 <= tid < V:
                    bias_keys.append(row * V + tid)
                    bias_vals.append(float(b))
            if p.allowed_token_ids is not None:
                banned.append(_banned_keys(row, p.allowed_token_ids, V))
            min_new.append(int(p.min_new_tokens))
            stops = [t for t in (p.stop_token_ids or ()) if 0 <= t < V]
            ban_ids.append(sorted(set(eos).union(stops)))
            if p.min_new_tokens > 0 and ban_ids[-1]:
                min_new_rows.append(row)
            rep.append(float(p.repetition_penalty))
            freq.append(float(p.frequency_penalty))
            pres.append(float(p.presence_penalty))
            if p.repetition_penalty != 1.0:
                rep_rows.append(row)
            if p.frequency_penalty != 0.0 or p.presence_penalty != 0.0:
                pen_rows.append(row)

        f32 = dict(dtype=torch.float32, device=device)
        i64 = dict(dtype=torch.int64, device=device)
        temps_t = torch.tensor(temps, **f32).view(-1, 1)
        top_ks_t = torch.tensor(top_ks, **i64)
        top_ps_t = torch.tensor(top_ps, **f32)
        min_ps_t = torch.tensor(min_ps, **f32)
        groups = []
        for rows, sorted_path in ((unsorted, False), (sorted_, True)):
            if not rows:
                continue
            idx = torch.tensor(rows, **i64)
            groups.append(
                _RowGroup(
                    rows=idx,
                    temperatures=temps_t[idx],
                    top_ks=top_ks_t[idx],
                    top_ps=top_ps_t[idx],
                    min_ps=min_ps_t[idx],
                    use_min_p=any(min_ps[r] > 0 for r in rows),
                    sorted_path=sorted_path,
                )
            )
        return cls(
            size=len(params),
            vocab_size=V,
            device=device,
            greedy_rows=torch.tensor(greedy, **i64),
            all_greedy=len(greedy) == len(params),
            groups=groups,
            **_bias_tensors(bias_keys, bias_vals, banned, device),
            min_new_tokens=min_new,
            min_new_ban_ids=ban_ids,
            min_new_rows=min_new_rows,
            repetition_penalties=torch.tensor(rep, **f32),
            repetition_rows=rep_rows,
            frequency_penalties=torch.tensor(freq, **f32),
            presence_penalties=torch.tensor(pres, **f32),
            penalty_rows=pen_rows,
        )


def _banned_keys(row: int, allowed: Sequence[int], V: int) -> torch.Tensor:
    """Flat keys (row * V + id) of every id outside `allowed` (ids outside the vocabulary
    ignored)."""
    keep = torch.zeros(V, dtype=torch.bool)
    keep[torch.tensor([t for t in allowed if 0 <= t < V], dtype=torch.int64)] = True
    return (~keep).nonzero().squeeze(1) + row * V


def _bias_tensors(
    keys: list[int], values: list[float], banned: list[torch.Tensor], device: torch.device
) -> dict[str, torch.Tensor | None]:
    """bias_keys / bias_values: logit_bias's, then -inf for the `banned` keys (a -inf logit
    stays -inf whatever is added to it, so the sampler needs no stage of its own)."""
    if not keys and not banned:
        return {"bias_keys": None, "bias_values": None}
    k = torch.cat([torch.tensor(keys, dtype=torch.int64), *banned])
    v = torch.cat(
        [
            torch.tensor(values, dtype=torch.float32),
            torch.full((k.numel() - len(keys),), float("-inf")),
        ]
    )
    return {"bias_keys": k.to(device), "bias_values": v.to(device)}
