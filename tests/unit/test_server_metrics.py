"""`Metrics.record_event`, the engine finish listener behind /metrics: what each kind of
finished request adds to the counters and histograms."""

from __future__ import annotations

from sgl.runtime.errors import InvalidRequestError
from sgl.runtime.messages import FinishReason, ReqEvent, RequestStats
from sgl.server.metrics import Metrics


def event(
    finish: FinishReason,
    completion: int = 5,
    ttft: float | None = 0.1,
    error: BaseException | None = None,
) -> ReqEvent:
    stats = RequestStats(
        prompt_tokens=10, completion_tokens=completion, cached_tokens=4, e2e_latency=0.5, ttft=ttft
    )
    return ReqEvent("r", "", [], stats, finish, error)


def samples(m: Metrics) -> dict[str, float]:
    out = {}
    for line in m.render({}).splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name.split("{")[0] + ("" if "le=" not in name else name[name.index("le=") :])] = (
                float(value)
            )
    return out


def test_finished_and_aborted_requests_are_counted():
    m = Metrics("m")
    m.record_event(event(FinishReason.stop(None)))
    m.record_event(event(FinishReason.of_length(5)))
    m.record_event(event(FinishReason.abort("client gone"), completion=2))
    s = samples(m)
    assert s["sgl:num_requests_total"] == 3
    assert s["sgl:num_aborted_requests_total"] == 1
    assert s["sgl:prompt_tokens_total"] == 30 and s["sgl:cached_tokens_total"] == 12
    assert s["sgl:generation_tokens_total"] == 12
    assert (
        s["sgl:time_to_first_token_seconds_count"] == 3
    )  # an aborted request had its first token too
    assert s["sgl:e2e_request_latency_seconds_count"] == 2  # ... but no end-to-end latency
    assert s["sgl:time_per_output_token_seconds_count"] == 2
    assert s["sgl:cache_hit_rate"] == 0.4


def test_an_abort_before_the_first_token_and_a_rejected_request():
    m = Metrics("m")
    m.record_event(event(FinishReason.abort("aborted by request"), completion=0, ttft=None))
    # A turn the scheduler rejected (its session was closed) is a 400, like any invalid request: not
    # counted.
    m.record_event(
        event(
            FinishReason.abort("no open session"),
            completion=0,
            ttft=None,
            error=InvalidRequestError("no open session", "session_params.id"),
        )
    )
    s = samples(m)
    assert s["sgl:num_requests_total"] == 1 and s["sgl:num_aborted_requests_total"] == 1
    assert s["sgl:time_to_first_token_seconds_count"] == 0
    # An engine failure is counted, as an abort.
    m.record_event(
        event(
            FinishReason.abort("engine error: boom"),
            completion=0,
            ttft=None,
            error=RuntimeError("boom"),
        )
    )
    assert samples(m)["sgl:num_aborted_requests_total"] == 2


def test_speculative_decoding_metrics_only_where_it_is_on():
    m = Metrics("m")
    for verify in (3, 4):
        e = event(FinishReason.of_length(5))
        e.stats.spec_verify_ct = verify
        m.record_event(e)
    assert not any(name.startswith("sgl:spec_") for name in samples(m))  # off: not exported
    info = {
        "speculative": {
            "algorithm": "NGRAM",
            "num_draft_tokens": 6,
            "acceptance_rate": 0.75,
            "avg_spec_accept_length": 2.5,
        }
    }
    s = {
        line.split("{")[0]: float(line.rsplit(" ", 1)[1])
        for line in m.render(info).splitlines()
        if line.startswith("sgl:spec_")
    }
    assert s == {
        "sgl:spec_accept_length": 2.5,
        "sgl:spec_accept_rate": 0.75,
        "sgl:spec_num_draft_tokens": 6,
        "sgl:spec_verify_calls_total": 7,
    }
    # before any verify step the server info holds None: 0, not an unparsable sample
    info["speculative"].update(acceptance_rate=None, avg_spec_accept_length=None)
    assert 'sgl:spec_accept_rate{model_name="m"} 0' in m.render(info).splitlines()
