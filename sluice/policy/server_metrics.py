"""What a model server's own Prometheus metrics say, normalised across vLLM, SGLang and
llama.cpp's server. Pure: the scrape itself is `sluice.control.scraper`.

    signal          vLLM                             SGLang            llama.cpp (--metrics)
    running         num_requests_running             num_running_reqs  requests_processing
    waiting         num_requests_waiting             num_queue_reqs    requests_deferred
    kv_cache_usage  kv_cache_usage_perc (newer),     token_usage       kv_cache_usage_ratio
                    gpu_cache_usage_perc
    ttft            time_to_first_token_seconds      the same          -
    tpot            inter_token_latency_seconds      the same, or      -
                    (newer), time_per_output_token_  time_per_output_
                    seconds                          token_seconds
    prefix cache    prefix_cache_queries_total and   cache_hit_rate    -
                    prefix_cache_hits_total (tokens;
                    newer), gpu_prefix_cache_hit_rate

(each name with its server's prefix, `vllm:`, `sglang:`, `llamacpp:`). Where a server
exposes two names of one signal (a deprecated one beside its successor) the first listed
is read, never both. Gauges add up over label sets (vLLM labels by model and engine),
except the KV-cache fraction, whose largest is kept (the fullest engine is the one that
queues); histograms add up where their buckets agree.

Used for (the signals nothing reads are for operators: status and `/metrics`):
- autoscaling: `server_view` turns `waiting` (and `running`) into `GroupLoad.in_flight` and
  `GroupLoad.server_waiting` (a request queued inside the server waits for a batch slot
  however free the gateway's slots look);
- canary analysis: `ttft` and `tpot` windows per group (`Histogram.since`, `.plus`,
  `.quantile`), shown beside the analysis of groups whose servers keep no per-request
  samples; they are not gated on;
- `kv_cache_usage` and the prefix cache (`prefix_queries`/`prefix_hits`, counters of prompt
  tokens looked up and found; `prefix_hit_rate` where a server gives only a rate): shown only,
  per instance in the status and as `sluice_server_*` series; a group's hit rate is
  `sum(rate(hits)) / sum(rate(queries))` over its instances.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import pairwise

from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "COUNTERS",
    "GAUGES",
    "HISTOGRAMS",
    "MAX_BUCKETS",
    "Histogram",
    "ServerLoad",
    "ServerSignals",
    "parse_server_metrics",
    "server_view",
]

GAUGES: Mapping[str, tuple[str, ...]] = {
    "running": (
        "vllm:num_requests_running",
        "sglang:num_running_reqs",
        "llamacpp:requests_processing",
    ),
    "waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred"),
    "kv_cache_usage": (
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "sglang:token_usage",
        "llamacpp:kv_cache_usage_ratio",
    ),
    "prefix_hit_rate": ("vllm:gpu_prefix_cache_hit_rate", "sglang:cache_hit_rate"),
}
"""signal -> the metric names that carry it, in order of preference"""
HISTOGRAMS: Mapping[str, tuple[str, ...]] = {
    "ttft": ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds"),
    "tpot": (
        "vllm:inter_token_latency_seconds",
        "vllm:time_per_output_token_seconds",
        "sglang:inter_token_latency_seconds",
        "sglang:time_per_output_token_seconds",
    ),
}
COUNTERS: Mapping[str, tuple[str, ...]] = {
    "prefix_queries": ("vllm:prefix_cache_queries",),
    "prefix_hits": ("vllm:prefix_cache_hits",),
}
"""signal -> counters that carry it (their samples end in `_total`), in order of preference"""
MAX_BUCKETS = 256
"""A histogram with more buckets than this is not read (vLLM's TTFT has ~20): the body is
bounded, but a server must not make us keep 100,000 buckets per instance."""

_KNOWN = tuple(
    {n for names in (*GAUGES.values(), *HISTOGRAMS.values(), *COUNTERS.values()) for n in names}
)


@dataclass(frozen=True, slots=True)
class Histogram:
    """Cumulative counts as Prometheus exposes them: `counts[i]` observations <= `bounds[i]`
    (seconds); the last bound is +Inf, so `counts[-1]` is the total."""

    bounds: tuple[float, ...]
    counts: tuple[float, ...]

    @property
    def total(self) -> float:
        return self.counts[-1] if self.counts else 0.0

    def since(self, older: Histogram | None) -> Histogram | None:
        """The observations made after `older` was read (None: not comparable, e.g. the
        first read, other buckets, or a count that went down because the server restarted,
        so the window counts nothing rather than a lifetime of history)."""
        if older is None or older.bounds != self.bounds:
            return None
        deltas = tuple(n - o for n, o in zip(self.counts, older.counts, strict=True))
        if any(d < 0 for d in deltas):
            return None
        return Histogram(self.bounds, deltas)

    def plus(self, other: Histogram | None) -> Histogram:
        """Both together; `other` is left out when its buckets differ (another server
        version), since no sum of the two would be right."""
        if other is None or other.bounds != self.bounds:
            return self
        return Histogram(
            self.bounds, tuple(a + b for a, b in zip(self.counts, other.counts, strict=True))
        )

    def quantile(self, q: float) -> float | None:
        """The `q` quantile (0..1) in seconds, interpolated linearly within its bucket as
        Prometheus' histogram_quantile does; in the +Inf bucket, the last finite bound (a
        lower bound of the truth). None when the histogram is empty."""
        total = self.total
        if total <= 0:
            return None
        rank = q * total
        lower, below = 0.0, 0.0
        for bound, count in zip(self.bounds, self.counts, strict=True):
            if count >= rank and count > below:
                if math.isinf(bound):
                    return lower
                return lower + (bound - lower) * (rank - below) / (count - below)
            lower, below = bound, count
        return lower


@dataclass(frozen=True, slots=True)
class ServerSignals:
    """One scrape of one server, normalised (None: the server did not say). `running` and
    `waiting` are requests; `kv_cache_usage` a fraction 0..1; `found` the metric names
    read, so a status can say where each number came from."""

    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None
    ttft: Histogram | None = None
    tpot: Histogram | None = None
    prefix_queries: float | None = None
    prefix_hits: float | None = None
    prefix_hit_rate: float | None = None
    found: tuple[str, ...] = ()


def parse_server_metrics(text: str) -> ServerSignals:
    """The known signals in a Prometheus text exposition (format 0.0.4, what vLLM, SGLang
    and llama.cpp serve). Lines of other metrics are skipped before parsing (vLLM serves
    dozens of histograms Sluice does not read); ValueError when a line of a known metric is
    malformed or the answer holds none of them (metrics off, or not a metrics page)."""
    lines = [ln for ln in text.splitlines() if ln.startswith(_KNOWN)]
    if not lines:
        raise ValueError(
            "no known server metric in the answer (vllm:, sglang:, llamacpp: running/waiting); "
            "is metrics_path right, and are the server's metrics on (--enable-metrics, --metrics)?"
        )
    values: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for s in family.samples:
            values.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    found: list[str] = []
    gauges: dict[str, float | None] = {}
    for signal, names in GAUGES.items():
        gauges[signal] = None
        for name in names:
            got = [v for _, v in values.get(name, ()) if math.isfinite(v) and v >= 0]
            if got:
                if signal == "kv_cache_usage":
                    gauges[signal] = max(got)
                elif signal == "prefix_hit_rate":  # a rate per engine: their mean
                    gauges[signal] = sum(got) / len(got)
                else:
                    gauges[signal] = sum(got)
                found.append(name)
                break
    counters: dict[str, float | None] = {}
    for signal, names in COUNTERS.items():
        counters[signal] = None
        for name in names:
            got = [v for _, v in values.get(name + "_total", ()) if math.isfinite(v) and v >= 0]
            if got:
                counters[signal] = sum(got)
                found.append(name + "_total")
                break
    hists: dict[str, Histogram | None] = {}
    for signal, names in HISTOGRAMS.items():
        hists[signal] = None
        for name in names:
            h = _histogram(values.get(name + "_bucket", ()))
            if h is not None:
                hists[signal] = h
                found.append(name)
                break
    if not found:
        raise ValueError("the server's metrics name no known signal with a usable value")
    return ServerSignals(
        running=gauges["running"],
        waiting=gauges["waiting"],
        kv_cache_usage=gauges["kv_cache_usage"],
        ttft=hists["ttft"],
        tpot=hists["tpot"],
        prefix_queries=counters["prefix_queries"],
        prefix_hits=counters["prefix_hits"],
        prefix_hit_rate=gauges["prefix_hit_rate"],
        found=tuple(found),
    )


def _histogram(rows: Iterable[tuple[dict[str, str], float]]) -> Histogram | None:
    """One histogram from the `_bucket` rows of every label set: each series (its labels
    without `le`) must end in +Inf and count up; series whose buckets differ from the first
    one's are left out."""
    series: dict[tuple[tuple[str, str], ...], dict[float, float]] = {}
    for labels, value in rows:
        le = labels.pop("le", None)
        if le is None:
            continue
        bound = float(le)  # "+Inf" parses
        if math.isnan(bound) or not math.isfinite(value) or value < 0:
            return None
        series.setdefault(tuple(sorted(labels.items())), {})[bound] = value
    out: Histogram | None = None
    for buckets in series.values():
        bounds = tuple(sorted(buckets))
        if len(bounds) > MAX_BUCKETS or not bounds or not math.isinf(bounds[-1]):
            return None
        counts = tuple(buckets[b] for b in bounds)
        if any(b < a for a, b in pairwise(counts)):
            return None  # not cumulative: not a histogram we can read
        h = Histogram(bounds, counts)
        out = h if out is None else out.plus(h)
    return out


@dataclass(frozen=True, slots=True)
class ServerLoad:
    """What a group's servers said at their latest scrapes (fresh ones only), summed over
    `instances` of them: requests `running` in their batches and `waiting` for one; the
    mean share of their KV caches in use, of those that export it (None: none does)."""

    instances: int
    running: float
    waiting: float
    kv_cache_usage: float | None = None


def server_view(gateway_in_flight: int, server: ServerLoad | None) -> tuple[int, int]:
    """`(in_flight, server_waiting)` for `GroupLoad` from the gateway's in-flight count and
    the servers' own.

    Every request of a command group passes the gateway, so a request waiting inside a
    server is already in the gateway's in-flight count: adding `waiting` on top would count
    it twice. What the gateway cannot tell is which of its in-flight requests are being
    served and which wait for a batch slot; `server_waiting` says that. Where the servers
    see more than the gateway (callers that reach them directly, a gateway restarted with
    fresh counters) their `running + waiting` is the better in-flight count.

        gateway 40, servers 30 running + 10 waiting  ->  (40, 10)
        gateway  0, servers  0 running + 12 waiting  ->  (12, 12)
        gateway 40, no fresh scrape                  ->  (40, 0)
    """
    if server is None:
        return gateway_in_flight, 0
    waiting = max(0, round(server.waiting))
    at_servers = round(server.running) + waiting
    in_flight = max(gateway_in_flight, at_servers)
    return in_flight, min(waiting, in_flight)
