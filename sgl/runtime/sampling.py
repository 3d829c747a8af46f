"""Sampling parameters and the batched, per-row-seeded token sampler.

`SamplingParams` is the user-facing request schema (field names follow SGLang); every
invalid value raises `InvalidRequestError` with `param` set, so the server can answer 400.

`sample()` turns one decode step's logits [B, V] into one token per row. Processing order
(each step is skipped entirely when no row in the batch uses it):

1. logit_bias            logits[row, id] += bias
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
the same token whatever else shares its batch. Greedy rows draw nothing, so a seeded
request's generator advances exactly once per sampled step.

Logprobs are always those of the model's RAW distribution (log_softmax of the input logits,
before bias/penalties/temperature), as OpenAI-style APIs report them. A row whose every token
is masked gets token id -1 (logprob -inf); the scheduler finishes it.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from sgl.runtime.errors import InvalidRequestError

_NEG_INF = float("-inf")
_SEED_MASK = (1 << 64) - 1
# Candidate sizes tried before a full vocabulary sort (see _sample_sorted_rows).
_TOPK_TIERS = (64, 1024)
# Block width of the two-level CDF walk in _inverse_cdf.
_CDF_BLOCK = 256


# --------------------------------------------------------------------------- params


def _is_int(v: Any) -> bool:
    # bool is an int subclass, but `max_new_tokens: true` is a client bug, not 1.
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _type_name(v: Any) -> str:
    return "null" if v is None else type(v).__name__


@dataclass
class SamplingParams:
    """Per-request sampling settings; names and defaults follow SGLang's `sampling_params`."""

    max_new_tokens: int | None = 128  # None: as many as fit in the context and the KV pool
    min_new_tokens: int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0 = disabled
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    logit_bias: dict[int, float] | None = None
    seed: int | None = None
    n: int = 1
    regex: str | None = None
    json_schema: str | dict | None = None
    ebnf: str | None = None
    json_object: bool = False  # reserved for constrained decoding; stored only
    # Constrained: near max_new_tokens, allow only tokens after which a complete member of
    # the language still fits (regex and JSON-schema constraints compiled as automata).
    budget_aware: bool = True
    # --- SGLang 0.5's other names, accepted so its clients run unchanged
    stop_regex: str | list[str] | None = None  # stop where the output first matches; trimmed like stop
    sampling_seed: int | None = None  # SGLang's name for seed
    stream_interval: int | None = None  # streamed: a chunk every this many tokens (and the last)
    structural_tag: str | dict | None = None  # free text with constrained segments (constrained.structural)
    custom_params: dict | None = None  # for SGLang's custom logit processors, which sgl has none of: ignored

    @classmethod
    def field_names(cls) -> list[str]:
        """All accepted keys, in declaration order (used for 'did you mean' hints)."""
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "SamplingParams":
        """Build from a JSON-like dict, rejecting unknown keys and bad types/ranges.

        The result is normalized and passes `validate()` without a vocab size; callers
        that know the vocab size should call `validate(vocab_size)` again for id ranges.
        """
        if d is None:
            d = {}
        if not isinstance(d, dict):
            raise InvalidRequestError(
                f"sampling_params must be a JSON object, got {_type_name(d)}",
                param="sampling_params",
            )
        names = cls.field_names()
        for key in d:
            if key not in names:
                raise InvalidRequestError(_unknown_key_message(key, names), param=str(key))
        params = cls(**d)
        params.validate()
        return params

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (deep-copied) that `from_dict` accepts back, also after a JSON round-trip."""
        return dataclasses.asdict(self)

    @property
    def is_greedy(self) -> bool:
        """True when sampling reduces to argmax (temperature 0, or only one candidate)."""
        return self.temperature == 0 or self.top_k == 1

    def validate(self, vocab_size: int | None = None) -> "SamplingParams":
        """Check types and ranges, normalizing in place (stop -> list, top_k 0 -> -1,
        logit_bias keys -> int). Raises InvalidRequestError naming the bad field. Idempotent.
        (Long but flat: one independent check per field, in declaration order.)"""
        self._check_types_and_normalize()

        if not self.temperature >= 0:
            raise InvalidRequestError(
                f"temperature must be >= 0 (0 = greedy), got {self.temperature:g}",
                param="temperature",
            )
        if not 0 < self.top_p <= 1:
            raise InvalidRequestError(
                f"top_p must be in (0, 1], got {self.top_p:g}", param="top_p"
            )
        if self.top_k == 0:
            self.top_k = -1
        if self.top_k < -1:
            raise InvalidRequestError(
                f"top_k must be -1 (disabled) or >= 1, got {self.top_k}", param="top_k"
            )
        if not 0 <= self.min_p <= 1:
            raise InvalidRequestError(
                f"min_p must be in [0, 1], got {self.min_p:g}", param="min_p"
            )
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if not -2 <= value <= 2:
                raise InvalidRequestError(
                    f"{name} must be in [-2, 2], got {value:g}", param=name
                )
        if not self.repetition_penalty > 0:
            raise InvalidRequestError(
                f"repetition_penalty must be > 0 (1 = off), got {self.repetition_penalty:g}",
                param="repetition_penalty",
            )
        if self.max_new_tokens is not None and self.max_new_tokens < 0:
            raise InvalidRequestError(
                f"max_new_tokens must be >= 0, got {self.max_new_tokens}",
                param="max_new_tokens",
            )
        if self.min_new_tokens < 0:
            raise InvalidRequestError(
                f"min_new_tokens must be >= 0, got {self.min_new_tokens}",
                param="min_new_tokens",
            )
        if self.max_new_tokens is not None and self.min_new_tokens > self.max_new_tokens:
            raise InvalidRequestError(
                f"min_new_tokens must be <= max_new_tokens ({self.max_new_tokens}), "
                f"got {self.min_new_tokens}",
                param="min_new_tokens",
            )
        if self.n < 1:
            raise InvalidRequestError(f"n must be >= 1, got {self.n}", param="n")

        constraints = [
            name for name in ("regex", "json_schema", "ebnf", "structural_tag") if getattr(self, name) is not None
        ]
        if len(constraints) > 1:
            raise InvalidRequestError(
                "only one of regex, json_schema, ebnf, structural_tag may be set; got "
                + " and ".join(constraints),
                param=constraints[1],
            )

        id_range = f"[0, {'vocab_size' if vocab_size is None else vocab_size})"
        for name, ids in (("stop_token_ids", self.stop_token_ids), ("logit_bias", self.logit_bias)):
            for tid in ids or ():
                if tid < 0 or (vocab_size is not None and tid >= vocab_size):
                    raise InvalidRequestError(
                        f"{name} token ids must be in {id_range}, got {tid}", param=name
                    )
        return self

    def _check_types_and_normalize(self) -> None:
        """Reject wrong JSON types early, so range checks never compare a str with an int.
        (Long but flat: one type check per field.)"""
        for name in ("max_new_tokens", "min_new_tokens", "top_k", "n"):
            value = getattr(self, name)
            if value is None and name == "max_new_tokens":  # as many as fit (the engine resolves it)
                continue
            if not _is_int(value):
                raise InvalidRequestError(
                    f"{name} must be an integer, got {_type_name(value)} {value!r}", param=name
                )
        for name in (
            "temperature",
            "top_p",
            "min_p",
            "frequency_penalty",
            "presence_penalty",
            "repetition_penalty",
        ):
            value = getattr(self, name)
            if not _is_number(value) or not math.isfinite(value):
                raise InvalidRequestError(
                    f"{name} must be a finite number, got {_type_name(value)} {value!r}",
                    param=name,
                )
            setattr(self, name, float(value))
        for name in (
            "ignore_eos",
            "skip_special_tokens",
            "spaces_between_special_tokens",
            "no_stop_trim",
            "json_object",
            "budget_aware",
        ):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise InvalidRequestError(
                    f"{name} must be true or false, got {_type_name(value)} {value!r}",
                    param=name,
                )
        if self.seed is not None and not _is_int(self.seed):
            raise InvalidRequestError(
                f"seed must be an integer or null, got {_type_name(self.seed)} {self.seed!r}",
                param="seed",
            )
        for name in ("regex", "ebnf"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise InvalidRequestError(
                    f"{name} must be a string, got {_type_name(value)}", param=name
                )
        if self.json_schema is not None and not isinstance(self.json_schema, (str, dict)):
            raise InvalidRequestError(
                "json_schema must be a JSON schema object or its JSON string, "
                f"got {_type_name(self.json_schema)}",
                param="json_schema",
            )
        self.stop = _normalize_stop(self.stop)
        if self.stop_token_ids is not None:
            if not isinstance(self.stop_token_ids, (list, tuple)) or not all(
                _is_int(t) for t in self.stop_token_ids
            ):
                raise InvalidRequestError(
                    "stop_token_ids must be a list of integer token ids, "
                    f"got {self.stop_token_ids!r}",
                    param="stop_token_ids",
                )
            self.stop_token_ids = list(self.stop_token_ids)
        if self.logit_bias is not None:
            self.logit_bias = _normalize_logit_bias(self.logit_bias)
        self._check_sglang_names()

    def _check_sglang_names(self) -> None:
        """SGLang's fields: sampling_seed folds into seed, stop_regex into a list ([] is none,
        as SGLang's frontend sends it), stream_interval >= 1, structural_tag an object or its JSON."""
        if self.sampling_seed is not None:
            if not _is_int(self.sampling_seed):
                raise InvalidRequestError(f"sampling_seed must be an integer or null, got "
                                          f"{_type_name(self.sampling_seed)} {self.sampling_seed!r}", param="sampling_seed")
            if self.seed is not None and self.seed != self.sampling_seed:
                raise InvalidRequestError(f"seed ({self.seed}) and sampling_seed ({self.sampling_seed}) differ; give one",
                                          param="sampling_seed")
            self.seed = self.sampling_seed
        self.stop_regex = _normalize_stop_regex(self.stop_regex)
        if self.stream_interval is not None and (not _is_int(self.stream_interval) or self.stream_interval < 1):
            raise InvalidRequestError(f"stream_interval must be an integer >= 1 or null, got {self.stream_interval!r}",
                                      param="stream_interval")
        if self.structural_tag is not None and not isinstance(self.structural_tag, (str, dict)):
            raise InvalidRequestError(f"structural_tag must be an object or its JSON text, got "
                                      f"{_type_name(self.structural_tag)}", param="structural_tag")
        if self.custom_params is not None and not isinstance(self.custom_params, dict):
            raise InvalidRequestError(f"custom_params must be an object or null, got {_type_name(self.custom_params)}",
                                      param="custom_params")


def _unknown_key_message(key: Any, names: list[str]) -> str:
    close = difflib.get_close_matches(str(key), names, n=3, cutoff=0.6)
    if close:
        hint = "did you mean " + " or ".join(repr(c) for c in close) + "?"
    else:
        hint = "valid names are: " + ", ".join(names)
    return f"unknown sampling parameter {key!r}; {hint}"


def _normalize_stop(stop: Any) -> list[str] | None:
    """A str or list of str -> list of non-empty str (an empty stop would match everywhere)."""
    if stop is None:
        return None
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, (list, tuple)) or not all(isinstance(s, str) for s in items):
        raise InvalidRequestError(
            f"stop must be a string or a list of strings, got {stop!r}", param="stop"
        )
    if any(s == "" for s in items):
        raise InvalidRequestError(
            "stop strings must be non-empty; remove the empty string from stop", param="stop"
        )
    return list(items)


def _normalize_stop_regex(stop_regex: Any) -> list[str] | None:
    """A pattern or a list of them -> a list (None when empty), each one checked to compile
    the way the stop matcher runs it (an error names the pattern)."""
    if stop_regex is None:
        return None
    items = [stop_regex] if isinstance(stop_regex, str) else stop_regex
    if not isinstance(items, (list, tuple)) or not all(isinstance(p, str) for p in items):
        raise InvalidRequestError(f"stop_regex must be a regex string or a list of them, got {stop_regex!r}",
                                  param="stop_regex")
    if any(p == "" for p in items):
        raise InvalidRequestError("stop_regex patterns must be non-empty", param="stop_regex")
    from sgl.runtime.stop_regex import check_stop_regex

    for pattern in items:
        check_stop_regex(pattern)
    return list(items) or None


def _normalize_logit_bias(bias: Any) -> dict[int, float]:
    """JSON object keys are strings: accept "123" as token id 123; values must be finite."""
    if not isinstance(bias, dict):
        raise InvalidRequestError(
            f"logit_bias must be an object mapping token id to bias, got {_type_name(bias)}",
            param="logit_bias",
        )
    out: dict[int, float] = {}
    for key, value in bias.items():
        if _is_int(key):
            tid = key
        elif isinstance(key, str):
            try:
                tid = int(key.strip())
            except ValueError:
                raise InvalidRequestError(
                    f"logit_bias keys must be integer token ids, got {key!r}",
                    param="logit_bias",
                ) from None
        else:
            raise InvalidRequestError(
                f"logit_bias keys must be integer token ids, got {key!r}", param="logit_bias"
            )
        if not _is_number(value) or not math.isfinite(value):
            raise InvalidRequestError(
                f"logit_bias values must be finite numbers, got {value!r} for token {key!r}",
                param="logit_bias",
            )
        out[tid] = float(value)
    return out


# --------------------------------------------------------------------------- sampler


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator for one seeded request; any Python int is folded into 64 bits."""
    gen = torch.Generator(device=torch.device(device))
    gen.manual_seed(seed & _SEED_MASK)
    return gen


@dataclass
class SampleOutput:
    """One step's result: tokens [B] int64 (-1 = nothing allowed), raw logprobs [B] float32
    (None when not asked for: `sample(with_logprobs=False)`)."""

    token_ids: torch.Tensor
    logprobs: torch.Tensor | None
    top_logprobs: list[list[tuple[int, float]] | None]


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
    """Per-row tensors built once per batch from the requests' params.

    Rebuild it whenever the batch composition changes; the per-step inputs (tokens so far,
    generators) are passed to `sample()` instead, because they change every step.
    """

    size: int
    vocab_size: int
    device: torch.device
    greedy_rows: torch.Tensor  # [g] int64
    all_greedy: bool
    groups: list[_RowGroup]  # sampled rows: unsorted path first, then sorted path
    # logit_bias as flat (row * V + id) keys, so one index_add applies all of it
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
    ) -> "SamplingBatch":
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
            bias_keys=torch.tensor(bias_keys, **i64) if bias_keys else None,
            bias_values=torch.tensor(bias_vals, **f32) if bias_keys else None,
            min_new_tokens=min_new,
            min_new_ban_ids=ban_ids,
            min_new_rows=min_new_rows,
            repetition_penalties=torch.tensor(rep, **f32),
            repetition_rows=rep_rows,
            frequency_penalties=torch.tensor(freq, **f32),
            presence_penalties=torch.tensor(pres, **f32),
            penalty_rows=pen_rows,
        )


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
    lse = torch.logsumexp(raw, dim=-1) if with_logprobs else None
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
