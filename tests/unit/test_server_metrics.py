"""Model servers' own Prometheus metrics, read the same way for vLLM, SGLang and llama.cpp
(`sluice.policy.server_metrics`), and what the autoscaler makes of a queue inside them.

The expositions below follow what each server serves (names, labels, bucket layouts, the
`_total` counters and the HELP/TYPE lines), cut to a few families each."""

from __future__ import annotations

import math

import pytest

from sluice.policy.autoscale import GroupLoad, SluicePolicy, Stateful
from sluice.policy.server_metrics import (
    MAX_BUCKETS,
    Histogram,
    ServerLoad,
    parse_server_metrics,
    server_view,
)
from sluice.spec.autoscaling import AutoscalingSpec

MODEL = 'model_name="Qwen/Qwen2.5-0.5B-Instruct"'
TTFT_LE = ["0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "0.25", "0.5"]
TTFT_LE += ["0.75", "1.0", "2.5", "5.0", "7.5", "10.0", "+Inf"]


def buckets(name: str, labels: str, les: list[str], counts: list[float]) -> str:
    rows = [f'{name}_bucket{{{labels},le="{le}"}} {c}' for le, c in zip(les, counts, strict=True)]
    rows += [f"{name}_count{{{labels}}} {counts[-1]}", f"{name}_sum{{{labels}}} 12.5"]
    return f"# HELP {name} Histogram.\n# TYPE {name} histogram\n" + "\n".join(rows) + "\n"


def gauge(name: str, labels: str, value: float) -> str:
    braces = f"{{{labels}}}" if labels else ""
    return f"# HELP {name} A gauge.\n# TYPE {name} gauge\n{name}{braces} {value}\n"


# ttft: 40 requests: 10 at <= 0.1 s, 20 more at <= 0.25 s, 10 more at <= 0.5 s
TTFT_COUNTS = [0.0] * 7 + [10.0, 30.0, 40.0] + [40.0] * 7

VLLM_V0 = (
    gauge("vllm:num_requests_running", MODEL, 3.0)
    + gauge("vllm:num_requests_swapped", MODEL, 0.0)
    + gauge("vllm:num_requests_waiting", MODEL, 7.0)
    + gauge("vllm:gpu_cache_usage_perc", MODEL, 0.42)
    + "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n"
    + "# TYPE vllm:prompt_tokens_total counter\n"
    + f"vllm:prompt_tokens_total{{{MODEL}}} 81234.0\n"
    + buckets("vllm:time_to_first_token_seconds", MODEL, TTFT_LE, TTFT_COUNTS)
    + buckets(
        "vllm:time_per_output_token_seconds",
        MODEL,
        ["0.01", "0.025", "0.05", "0.075", "0.1", "0.15", "0.2", "+Inf"],
        [100.0, 900.0, 1000.0, 1000.0, 1000.0, 1000.0, 1000.0, 1000.0],
    )
    + buckets("vllm:e2e_request_latency_seconds", MODEL, ["1.0", "+Inf"], [30.0, 40.0])
)


def vllm_v1(engine: str, running: float, waiting: float, kv: float, ttft: list[float]) -> str:
    """vLLM V1 (0.10+): an `engine` label per data-parallel engine, kv_cache_usage_perc,
    and inter_token_latency_seconds beside the deprecated time_per_output_token_seconds."""
    labels = f'engine="{engine}",{MODEL}'
    itl = ["0.01", "0.025", "0.05", "+Inf"]
    return (
        gauge("vllm:num_requests_running", labels, running)
        + gauge("vllm:num_requests_waiting", labels, waiting)
        + gauge("vllm:kv_cache_usage_perc", labels, kv)
        + buckets("vllm:time_to_first_token_seconds", labels, TTFT_LE, ttft)
        + buckets("vllm:inter_token_latency_seconds", labels, itl, [5.0, 50.0, 60.0, 60.0])
        + buckets("vllm:time_per_output_token_seconds", labels, itl, [5.0, 50.0, 60.0, 60.0])
    )


SGLANG = (
    "# HELP sglang:prompt_tokens_total Number of prefill tokens processed.\n"
    "# TYPE sglang:prompt_tokens_total counter\n"
    f"sglang:prompt_tokens_total{{{MODEL}}} 8.128902e+06\n"
    + gauge("sglang:num_running_reqs", MODEL, 12.0)
    + gauge("sglang:num_queue_reqs", MODEL, 4.0)
    + gauge("sglang:token_usage", MODEL, 0.28)
    + gauge("sglang:cache_hit_rate", MODEL, 0.0075)
    + buckets("sglang:time_to_first_token_seconds", MODEL, TTFT_LE, TTFT_COUNTS)
    + buckets(
        "sglang:inter_token_latency_seconds",
        MODEL,
        ["0.002", "0.004", "0.006", "0.008", "0.01", "+Inf"],
        [0.0, 10.0, 80.0, 100.0, 100.0, 100.0],
    )
)

LLAMACPP = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 33065
# HELP llamacpp:prompt_seconds_total Prompt process time
# TYPE llamacpp:prompt_seconds_total counter
llamacpp:prompt_seconds_total 235.743
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 7801
# HELP llamacpp:prompt_tokens_seconds Average prompt throughput in tokens/s.
# TYPE llamacpp:prompt_tokens_seconds gauge
llamacpp:prompt_tokens_seconds 140.26
# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.125
# HELP llamacpp:kv_cache_tokens KV-cache tokens.
# TYPE llamacpp:kv_cache_tokens gauge
llamacpp:kv_cache_tokens 1024
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 5
"""


def test_vllm_v0_names_are_read_as_the_common_signals() -> None:
    s = parse_server_metrics(VLLM_V0)
    assert (s.running, s.waiting, s.kv_cache_usage) == (3.0, 7.0, 0.42)
    assert s.ttft is not None and s.ttft.total == 40
    assert s.ttft.bounds[-1] == math.inf and len(s.ttft.bounds) == len(TTFT_LE)
    assert s.tpot is not None and s.tpot.total == 1000
    assert "vllm:time_per_output_token_seconds" in s.found
    assert "vllm:e2e_request_latency_seconds" not in s.found  # not a signal Sluice reads


def test_vllm_v1_engines_add_up_and_a_deprecated_twin_is_not_counted_twice() -> None:
    text = vllm_v1("0", 3, 7, 0.30, TTFT_COUNTS) + vllm_v1("1", 5, 1, 0.55, TTFT_COUNTS)
    s = parse_server_metrics(text)
    assert (s.running, s.waiting) == (8.0, 8.0)  # summed over both engines
    assert s.kv_cache_usage == 0.55  # the fuller engine, not a sum over 1
    assert s.ttft is not None and s.ttft.total == 80
    # inter_token_latency_seconds is preferred; time_per_output_token_seconds (the same
    # observations under its old name) is not added on top
    assert s.tpot is not None and s.tpot.total == 120
    assert "vllm:inter_token_latency_seconds" in s.found
    assert "vllm:time_per_output_token_seconds" not in s.found
    assert "vllm:kv_cache_usage_perc" in s.found


def counter(name: str, labels: str, value: float) -> str:
    return f"# HELP {name} A counter.\n# TYPE {name} counter\n{name}_total{{{labels}}} {value}\n"


def test_vllm_prefix_cache_counters_add_up_over_engines() -> None:
    """vLLM V1 counts prompt tokens looked up in its prefix cache and those found."""
    text = vllm_v1("0", 1, 0, 0.1, TTFT_COUNTS) + vllm_v1("1", 1, 0, 0.1, TTFT_COUNTS)
    for engine, queries, hits in (("0", 1000.0, 600.0), ("1", 3000.0, 400.0)):
        labels = f'engine="{engine}",{MODEL}'
        text += counter("vllm:prefix_cache_queries", labels, queries)
        text += counter("vllm:prefix_cache_hits", labels, hits)
    s = parse_server_metrics(text)
    assert (s.prefix_queries, s.prefix_hits, s.prefix_hit_rate) == (4000.0, 1000.0, None)
    assert "vllm:prefix_cache_hits_total" in s.found
    old = parse_server_metrics(VLLM_V0 + gauge("vllm:gpu_prefix_cache_hit_rate", MODEL, 0.25))
    assert old.prefix_hit_rate == 0.25 and old.prefix_queries is None


def test_sglang_names_are_read_as_the_common_signals() -> None:
    s = parse_server_metrics(SGLANG)
    assert (s.running, s.waiting, s.kv_cache_usage) == (12.0, 4.0, 0.28)
    assert s.ttft is not None and s.ttft.quantile(0.5) == pytest.approx(0.175)
    assert s.tpot is not None and s.tpot.total == 100
    assert s.tpot.quantile(0.5) == pytest.approx(0.004 + 0.002 * 40 / 70)
    assert s.prefix_hit_rate == 0.0075


def test_llamacpp_names_are_read_and_it_has_no_latency_histograms() -> None:
    s = parse_server_metrics(LLAMACPP)
    assert (s.running, s.waiting, s.kv_cache_usage) == (2.0, 5.0, 0.125)
    assert s.ttft is None and s.tpot is None
    assert set(s.found) == {
        "llamacpp:requests_processing",
        "llamacpp:requests_deferred",
        "llamacpp:kv_cache_usage_ratio",
    }


@pytest.mark.parametrize(
    "text",
    [
        "<html><body>404 Not Found</body></html>",
        "",
        "\x00\x01\xfe garbage",
        # metrics of something else entirely (e.g. a metrics_path pointing at Sluice's worker)
        "# TYPE sluice_worker_inflight gauge\nsluice_worker_inflight 3\n",
    ],
)
def test_an_answer_with_no_known_metric_is_an_error(text: str) -> None:
    with pytest.raises(ValueError, match="no known server metric"):
        parse_server_metrics(text)


def test_a_malformed_line_of_a_known_metric_is_an_error() -> None:
    with pytest.raises(ValueError):
        parse_server_metrics('vllm:num_requests_waiting{model_name="x} 3\n')
    with pytest.raises(ValueError):
        parse_server_metrics("vllm:num_requests_waiting three\n")


def test_unusable_values_are_left_out_not_read_as_numbers() -> None:
    text = gauge("vllm:num_requests_waiting", MODEL, math.nan) + gauge(
        "vllm:num_requests_running", MODEL, 2.0
    )
    s = parse_server_metrics(text)
    assert s.waiting is None and s.running == 2.0
    with pytest.raises(ValueError, match="no known signal with a usable value"):
        parse_server_metrics(gauge("vllm:num_requests_waiting", MODEL, -1.0))


def test_histograms_that_cannot_be_read_are_dropped() -> None:
    waiting = gauge("vllm:num_requests_waiting", MODEL, 1.0)
    name = "vllm:time_to_first_token_seconds"
    no_inf = buckets(name, MODEL, ["0.1", "0.5"], [1.0, 2.0])
    going_down = buckets(name, MODEL, ["0.1", "0.5", "+Inf"], [5.0, 2.0, 5.0])
    many = [str(i) for i in range(MAX_BUCKETS + 1)] + ["+Inf"]
    too_many = buckets(name, MODEL, many, [float(i) for i in range(len(many))])
    for text in (no_inf, going_down, too_many):
        assert parse_server_metrics(waiting + text).ttft is None


def test_histogram_windows_difference_sum_and_interpolate_like_prometheus() -> None:
    bounds = (0.1, 0.5, math.inf)
    before = Histogram(bounds, (10.0, 30.0, 40.0))
    after = Histogram(bounds, (20.0, 50.0, 70.0))
    gained = after.since(before)
    assert gained == Histogram(bounds, (10.0, 20.0, 30.0))
    assert gained.quantile(0.5) == pytest.approx(0.1 + 0.4 * (15 - 10) / 10)
    assert gained.quantile(0.99) == 0.5  # in the +Inf bucket: its lower edge
    assert before.quantile(0.5) == pytest.approx(0.3)
    assert before.plus(gained).counts == (20.0, 50.0, 70.0)
    # a restarted server counts from zero again: the window takes nothing, not a negative
    assert Histogram(bounds, (1.0, 1.0, 1.0)).since(before) is None
    other = Histogram((0.2, math.inf), (1.0, 2.0))
    assert after.since(other) is None and after.plus(other) == after
    assert after.since(None) is None
    assert Histogram(bounds, (0.0, 0.0, 0.0)).quantile(0.5) is None


@pytest.mark.parametrize(
    ("gateway", "server", "expected"),
    [
        (40, ServerLoad(2, 30, 10), (40, 10)),  # the waiting ones are among the 40
        (0, ServerLoad(1, 0, 12), (12, 12)),  # the servers see load the gateway does not
        (40, None, (40, 0)),  # nothing fresh scraped: the gateway's count alone
        (5, ServerLoad(1, 0.4, 2.6), (5, 3)),  # gauges are floats; counts are whole
    ],
)
def test_server_view_never_counts_a_request_twice(
    gateway: int, server: ServerLoad | None, expected: tuple[int, int]
) -> None:
    assert server_view(gateway, server) == expected


def _decide(in_flight: int, server_waiting: int) -> tuple[int, dict[str, float], str]:
    spec = AutoscalingSpec.model_validate({"max": 10, "targets": {"latency_p95_ms": 1000}})
    policy = Stateful(SluicePolicy(spec))
    for t in range(5):
        d = policy.decide(
            GroupLoad(
                at=float(t),
                current=1,
                ready=1,
                slots_per_instance=4,
                in_flight=in_flight,
                queued=0,
                arrivals=0,
                latency_p95_s=0.2,
                server_waiting=server_waiting,
            ),
            float(t),
        )
    return d.desired, dict(d.signals), d.reason


def test_a_queue_inside_the_server_scales_up_where_busy_but_fast_instances_do_not() -> None:
    # 12 requests on one 4-slot instance, p95 well under target: all of them served, so
    # the latency veto holds the count (S4)...
    held, signals, reason = _decide(in_flight=12, server_waiting=0)
    assert held == 1 and "no queue: no scale-up" in reason
    assert "server_queue" not in signals
    # ...but if the server says all 12 wait for a batch slot, people wait: a queue
    grown, signals, reason = _decide(in_flight=12, server_waiting=12)
    assert "12 requests wait inside the servers" in reason
    assert grown >= 3  # 12 waiting, 4 slots an instance
    assert signals["server_queue"] == 12.0 and signals["queue"] == 12.0
