"""Prometheus metrics, written in the text exposition format (no client library).

Names follow SGLang's with the prefix `sgl:` (SGLang's `sglang:`), so its dashboards port.
Per-request numbers (tokens, TTFT, latency) come from the engine's finish events:
`create_app` registers `Metrics.record_event` with `engine.add_finish_listener`, so every
request the engine finishes (native, OpenAI, extraction programs, health checks, and
aborted ones, also when their client is gone) is counted once. Gauges (running / waiting
requests, KV pool usage, speculative decoding's acceptance) are read from
`engine.get_server_info()` at scrape time.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Iterable
from typing import Any

from sgl.runtime.errors import InvalidRequestError
from sgl.runtime.messages import ReqEvent

TTFT_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
)
TPOT_BUCKETS = (
    0.002,
    0.005,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _fmt(value: float) -> str:
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)


class Histogram:
    def __init__(self, buckets: Iterable[float]) -> None:
        self.bounds = tuple(sorted(buckets))
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out, cumulative = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts):
            cumulative += n
            le = "+Inf" if bound == float("inf") else _fmt(bound)
            out.append(f'{name}_bucket{{{labels},le="{le}"}} {cumulative}')
        out.append(f"{name}_sum{{{labels}}} {_fmt(self.sum)}")
        out.append(f"{name}_count{{{labels}}} {self.count}")
        return out


class Metrics:
    """Counters and histograms of finished requests; thread-safe."""

    def __init__(self, model_name: str) -> None:
        self.labels = f'model_name="{_escape(model_name)}"'
        self._lock = threading.Lock()
        self.num_requests = 0
        self.num_aborted = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.cached_tokens = 0
        self.spec_verify_calls = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.tpot = Histogram(TPOT_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.refused: dict[int, int] = {}  # HTTP status (413, 429, 503) -> requests refused with it

    def record_refusal(self, status: int) -> None:
        """A request turned away by a limit, overload, draining or a fault (never reached the
        engine)."""
        with self._lock:
            self.refused[status] = self.refused.get(status, 0) + 1

    def record_event(self, event: ReqEvent) -> None:
        """Count one finished request (a finish listener: runs on the scheduler thread).

        A request the scheduler rejected as invalid (e.g. a turn of a closed session) is a
        400 to its caller, like every request rejected before it reached the scheduler: it
        is not counted."""
        if isinstance(event.error, InvalidRequestError):
            return
        s = event.stats
        aborted = event.finish is None or event.finish.is_abort
        completion = int(s.completion_tokens or 0)
        with self._lock:
            self.num_requests += 1
            self.num_aborted += int(aborted)
            self.prompt_tokens += int(s.prompt_tokens or 0)
            self.generation_tokens += completion
            self.cached_tokens += int(s.cached_tokens or 0)
            self.spec_verify_calls += int(s.spec_verify_ct or 0)
            if s.ttft is not None:
                self.ttft.observe(float(s.ttft))
            if s.e2e_latency is not None and not aborted:
                self.e2e.observe(float(s.e2e_latency))
                if s.ttft is not None and completion > 1:
                    self.tpot.observe((float(s.e2e_latency) - float(s.ttft)) / (completion - 1))

    def render(self, server_info: dict[str, Any]) -> str:
        """The exposition text: scrape-time gauges from `server_info`, then the counters."""
        lab = self.labels
        max_total = int(server_info.get("max_total_tokens") or 0)
        available = int(server_info.get("available_kv_tokens") or 0)
        evictable = int(server_info.get("evictable_tokens") or 0)
        used = max(
            max_total - available - evictable, 0
        )  # as SGLang: evictable cache counts as free
        lines: list[str] = []

        def metric(name: str, kind: str, help_: str, value: float) -> None:
            lines.extend(
                (
                    f"# HELP sgl:{name} {help_}",
                    f"# TYPE sgl:{name} {kind}",
                    f"sgl:{name}{{{lab}}} {_fmt(value)}",
                )
            )

        running, waiting = (
            server_info.get("num_running_reqs", 0),
            server_info.get("num_waiting_reqs", 0),
        )
        metric("num_running_reqs", "gauge", "Requests decoding or prefilling now.", running)
        metric("num_waiting_reqs", "gauge", "Requests waiting to be scheduled.", waiting)
        metric(
            "num_queue_reqs", "gauge", "Requests waiting to be scheduled (SGLang's name).", waiting
        )
        metric(
            "num_used_tokens",
            "gauge",
            "KV pool slots held by requests (evictable cache excluded).",
            used,
        )
        metric("max_total_num_tokens", "gauge", "KV pool capacity in tokens.", max_total)
        metric(
            "token_usage",
            "gauge",
            "Share of the KV pool in use (0..1).",
            used / max_total if max_total else 0.0,
        )
        metric(
            "radix_cache_tokens",
            "gauge",
            "Tokens held by the radix cache.",
            server_info.get("radix_cache_tokens", 0),
        )
        metric(
            "num_open_sessions", "gauge", "Open sessions.", server_info.get("num_open_sessions", 0)
        )
        metric(
            "session_locked_tokens",
            "gauge",
            "Tokens pinned in the radix cache by open sessions.",
            server_info.get("session_locked_tokens", 0),
        )
        spec = server_info.get("speculative") or {}
        if spec.get("algorithm"):  # SGLang's names; since start, where SGLang's are per interval
            metric(
                "spec_accept_length",
                "gauge",
                "Tokens per speculative verify step (accepted drafts + the drawn token).",
                spec.get("avg_spec_accept_length") or 0.0,
            )
            metric(
                "spec_accept_rate",
                "gauge",
                "Accepted draft tokens / drafted tokens.",
                spec.get("acceptance_rate") or 0.0,
            )
            metric(
                "spec_num_draft_tokens",
                "gauge",
                "Most tokens drafted per request and step (speculative_num_draft_tokens).",
                spec.get("num_draft_tokens") or 0,
            )
        with self._lock:
            hit = self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
            metric(
                "cache_hit_rate",
                "gauge",
                "Cached prompt tokens / prompt tokens, over all requests.",
                hit,
            )
            metric("num_requests_total", "counter", "Finished requests.", self.num_requests)
            metric(
                "num_aborted_requests_total",
                "counter",
                "Aborted requests (client gone or abort_request).",
                self.num_aborted,
            )
            metric(
                "prompt_tokens_total",
                "counter",
                "Prompt tokens of finished requests.",
                self.prompt_tokens,
            )
            metric(
                "generation_tokens_total",
                "counter",
                "Generated tokens of finished requests.",
                self.generation_tokens,
            )
            metric(
                "cached_tokens_total",
                "counter",
                "Prompt tokens served from the radix cache.",
                self.cached_tokens,
            )
            if spec.get("algorithm"):
                metric(
                    "spec_verify_calls_total",
                    "counter",
                    "Speculative verify steps of finished requests.",
                    self.spec_verify_calls,
                )
            lines.extend(
                (
                    "# HELP sgl:num_refused_requests_total Requests refused: 413 over a size "
                    "limit, 429 at "
                    "capacity, 503 draining or failed.",
                    "# TYPE sgl:num_refused_requests_total counter",
                )
            )
            lines.extend(
                f'sgl:num_refused_requests_total{{{lab},code="{code}"}} {n}'
                for code, n in sorted(self.refused.items())
            )
            for name, help_, hist in (
                ("time_to_first_token_seconds", "Time to first token.", self.ttft),
                (
                    "time_per_output_token_seconds",
                    "Time per output token after the first.",
                    self.tpot,
                ),
                ("e2e_request_latency_seconds", "End-to-end request latency.", self.e2e),
            ):
                lines.extend((f"# HELP sgl:{name} {help_}", f"# TYPE sgl:{name} histogram"))
                lines.extend(hist.lines(f"sgl:{name}", lab))
        return "\n".join(lines) + "\n"
