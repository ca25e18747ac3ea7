"""A group's metrics over a span of time (O3), as one mergeable record: the rollup.

The observer turns each reading of the gateway's cumulative counters into a `Rollup` of
what happened since the one before (`Rollup.between`), with the control plane's gauges
(instances, units, spend rate) sampled at that moment. Rollups merge (`merge`): counters
and histogram buckets add, gauges keep sum, count and max. So a minute is the merge of its
readings, an hour the merge of its minutes, a quarter the merge of its hours, and a
quantile over any span comes from the merged histogram, never from averaged quantiles.
`series` reads the values alerts, reports and `sluice history` show.

Pure: no clock, no I/O; the store keeps rollups as `to_json` documents.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sluice.policy.autoscale.base import TrafficSample

__all__ = [
    "GAUGES",
    "HOUR_S",
    "MINUTE_S",
    "Accumulator",
    "HistogramCounts",
    "Rollup",
    "SeriesContext",
    "bucket_start",
    "merge",
    "quantile",
    "series",
    "share_within",
]

GAUGES = (
    "queue_length",
    "in_flight",
    "ready_instances",
    "instances",
    "starting_instances",
    "draining_instances",
    "no_ready_instance",
    "held_units",
    "guaranteed_units",
    "busy_units",
    "borrowed_units",
    "lent_units",
    "memory_gb",
    "spend_per_hour",
    "budget_used",
    "quota_refused",
    "accelerator_memory_used_gb",
    "accelerator_utilization",
    "instances_over_estimate",
)
"""Sampled values (mean and max over a span): `instances` counts every running instance
(`starting_instances`: pending, starting or warming; `draining_instances`: draining),
`busy_units` the units the requests in flight keep busy (in_flight / max_concurrency x
accelerators per instance), `memory_gb` the accelerator memory the held units carry;
where a pool lists devices, NVML's: `accelerator_memory_used_gb` what the group's
instances are known to hold,
`accelerator_utilization` the mean percent of their devices, `instances_over_estimate`
how many hold far more than their estimate (`sluice.policy.accelerators`)."""


@dataclass(frozen=True, slots=True)
class HistogramCounts:
    """Counts per bucket (not cumulative): `counts[i]` in (bounds[i-1], bounds[i]], the last
    one above every bound."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]

    @property
    def total(self) -> int:
        return sum(self.counts)


_EMPTY = HistogramCounts((), ())


def _delta(newer: tuple[int, ...], older: tuple[int, ...]) -> tuple[int, ...]:
    if len(older) != len(newer) or any(n < o for n, o in zip(newer, older, strict=True)):
        return newer  # counters began again (a restarted gateway): all of newer is new
    return tuple(n - o for n, o in zip(newer, older, strict=True))


def _counter(newer: int, older: int) -> int:
    return newer - older if newer >= older else newer


@dataclass(frozen=True, slots=True)
class Rollup:
    """What one group did over `seconds` of observed time starting at `start`."""

    start: float
    seconds: float = 0.0
    requests: int = 0
    """requests that reached the group"""
    completed: int = 0
    server_errors: int = 0
    too_many: int = 0
    client_errors: int = 0
    shed: int = 0
    served_s: float = 0.0
    """seconds the completed requests spent at an instance (latency less queue wait)"""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    """tokens of the answers over the span (their usage), every tenant's"""
    latency: HistogramCounts = _EMPTY
    queue_wait: HistogramCounts = _EMPTY
    ttfb: HistogramCounts = _EMPTY
    tpot: HistogramCounts = _EMPTY
    """streamed answers' time per output token"""
    gauges: Mapping[str, tuple[float, float, int]] = field(default_factory=dict)
    """name -> (sum, max, samples)"""
    spend: float = 0.0
    """price units spent over the span (the spend rate integrated)"""

    @classmethod
    def between(
        cls,
        older: TrafficSample | None,
        newer: TrafficSample | None,
        gauges: Mapping[str, float],
        end: float,
        seconds: float,
    ) -> Rollup:
        """The counters' growth from `older` to `newer` and one sample of the gauges,
        covering the `seconds` up to `end`. Without both readings only the gauges count (a
        first reading is the baseline; an unreadable gateway is missing, not zero); a
        counter that went down began again (a restarted gateway): all of it is new."""
        spend = gauges.get("spend_per_hour", 0.0) * seconds / 3600.0
        sampled = {k: (float(v), float(v), 1) for k, v in gauges.items()}
        start = end - seconds
        if newer is None or older is None:
            return cls(start=start, seconds=seconds, gauges=sampled, spend=spend)
        o = older
        return cls(
            start=start,
            seconds=seconds,
            requests=_counter(newer.arrivals, o.arrivals),
            completed=_counter(newer.completions, o.completions),
            server_errors=_counter(newer.server_errors, o.server_errors),
            too_many=_counter(newer.too_many, o.too_many),
            client_errors=_counter(newer.client_errors, o.client_errors),
            shed=_counter(newer.shed, o.shed),
            served_s=newer.served_s - o.served_s
            if newer.served_s >= o.served_s
            else newer.served_s,
            prompt_tokens=_counter(newer.prompt_tokens, o.prompt_tokens),
            completion_tokens=_counter(newer.completion_tokens, o.completion_tokens),
            latency=HistogramCounts(
                newer.latency_bounds, _delta(newer.latency_counts, o.latency_counts)
            ),
            queue_wait=HistogramCounts(
                newer.queue_wait_bounds, _delta(newer.queue_wait_counts, o.queue_wait_counts)
            ),
            ttfb=HistogramCounts(newer.ttfb_bounds, _delta(newer.ttfb_counts, o.ttfb_counts)),
            tpot=HistogramCounts(newer.tpot_bounds, _delta(newer.tpot_counts, o.tpot_counts)),
            gauges=sampled,
            spend=spend,
        )

    def to_json(self) -> dict[str, Any]:
        hist = {
            name: {"b": list(h.bounds), "c": list(h.counts)}
            for name, h in (("latency", self.latency), ("queue_wait", self.queue_wait))
            if h.counts
        }
        for name, h in (("ttfb", self.ttfb), ("tpot", self.tpot)):
            if h.counts and h.total:  # (streams only: most groups have none)
                hist[name] = {"b": list(h.bounds), "c": list(h.counts)}
        return {
            "seconds": round(self.seconds, 3),
            "requests": self.requests,
            "completed": self.completed,
            "server_errors": self.server_errors,
            "too_many": self.too_many,
            "client_errors": self.client_errors,
            "shed": self.shed,
            "served_s": round(self.served_s, 6),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "hist": hist,
            "gauges": {k: [round(s, 6), m, n] for k, (s, m, n) in sorted(self.gauges.items())},
            "spend": round(self.spend, 9),
        }

    @classmethod
    def from_json(cls, start: float, doc: Mapping[str, Any]) -> Rollup:
        hist = doc.get("hist", {})

        def h(name: str) -> HistogramCounts:
            d = hist.get(name)
            return HistogramCounts(tuple(d["b"]), tuple(d["c"])) if d else _EMPTY

        return cls(
            start=start,
            seconds=float(doc.get("seconds", 0.0)),
            requests=int(doc.get("requests", 0)),
            completed=int(doc.get("completed", 0)),
            server_errors=int(doc.get("server_errors", 0)),
            too_many=int(doc.get("too_many", 0)),
            client_errors=int(doc.get("client_errors", 0)),
            shed=int(doc.get("shed", 0)),
            served_s=float(doc.get("served_s", 0.0)),
            prompt_tokens=int(doc.get("prompt_tokens", 0)),
            completion_tokens=int(doc.get("completion_tokens", 0)),
            latency=h("latency"),
            queue_wait=h("queue_wait"),
            ttfb=h("ttfb"),
            tpot=h("tpot"),
            gauges={k: (float(s), float(m), int(n)) for k, (s, m, n) in doc["gauges"].items()},
            spend=float(doc.get("spend", 0.0)),
        )

    def mean(self, gauge: str) -> float | None:
        s = self.gauges.get(gauge)
        return s[0] / s[2] if s and s[2] else None

    def peak(self, gauge: str) -> float | None:
        s = self.gauges.get(gauge)
        return s[1] if s and s[2] else None


def merge(rollups: Iterable[Rollup], start: float | None = None) -> Rollup | None:
    """One rollup for all of `rollups` (None for none); it starts at `start`, else at the
    earliest."""
    items = list(rollups)
    if not items:
        return None
    by_name: dict[str, list[tuple[float, float, int]]] = {}
    for r in items:
        for k, v in r.gauges.items():
            by_name.setdefault(k, []).append(v)
    gauges = {}
    for k, values in by_name.items():
        sums, maxes, ns = zip(*values, strict=True)
        gauges[k] = (sum(sums), max(maxes), sum(ns))
    return Rollup(
        start=min(r.start for r in items) if start is None else start,
        seconds=sum(r.seconds for r in items),
        requests=sum(r.requests for r in items),
        completed=sum(r.completed for r in items),
        server_errors=sum(r.server_errors for r in items),
        too_many=sum(r.too_many for r in items),
        client_errors=sum(r.client_errors for r in items),
        shed=sum(r.shed for r in items),
        served_s=sum(r.served_s for r in items),
        prompt_tokens=sum(r.prompt_tokens for r in items),
        completion_tokens=sum(r.completion_tokens for r in items),
        latency=_summed([r.latency for r in items]),
        queue_wait=_summed([r.queue_wait for r in items]),
        ttfb=_summed([r.ttfb for r in items]),
        tpot=_summed([r.tpot for r in items]),
        gauges=gauges,
        spend=sum(r.spend for r in items),
    )


def _summed(hists: list[HistogramCounts]) -> HistogramCounts:
    """The bucket-wise sum (column sums at C speed: a window merges ~60 of them a second
    for every group); where the buckets changed between versions, the newest count."""
    kept = [h for h in hists if h.counts]
    if not kept:
        return _EMPTY
    bounds = kept[-1].bounds
    same = [h.counts for h in kept if h.bounds == bounds]
    return HistogramCounts(bounds, tuple(map(sum, zip(*same, strict=True))))


def bucket_start(at: float, step_s: int) -> float:
    """The start of the `step_s` bucket (UTC-aligned) holding `at`."""
    return float(int(at // step_s) * step_s)


def quantile(h: HistogramCounts, q: float) -> float | None:
    """The `q` quantile, interpolated within its bucket as Prometheus' histogram_quantile
    does; None for an empty histogram; the lowest bound of the overflow bucket when it
    falls there."""
    total = h.total
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    lower = 0.0
    for i, count in enumerate(h.counts):
        if i == len(h.bounds):
            return lower
        if count and seen + count >= rank:
            return lower + (h.bounds[i] - lower) * (rank - seen) / count
        seen += count
        lower = h.bounds[i]
    return lower


def share_within(h: HistogramCounts, limit: float) -> float | None:
    """The share of observations at or under `limit`, interpolated within its bucket."""
    total = h.total
    if total <= 0:
        return None
    below = 0.0
    lower = 0.0
    for i, count in enumerate(h.counts):
        if i == len(h.bounds):
            break
        upper = h.bounds[i]
        if limit >= upper:
            below += count
        else:
            if limit > lower:
                below += count * (limit - lower) / (upper - lower)
            break
        lower = upper
    return below / total


@dataclass(frozen=True, slots=True)
class SeriesContext:
    """What a group's spec adds to reading its rollup: the SLO's latency bound and target."""

    slo_latency_s: float | None = None
    slo_target: float | None = None


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1000.0


def series(r: Rollup, ctx: SeriesContext = SeriesContext()) -> dict[str, float | None]:
    """Every `sluice.spec.observability.SERIES` value of the span (None: nothing to say,
    e.g. no request finished), plus the request counts and spend behind them and the
    answers' prompt and completion tokens per second."""
    done = r.completed
    attainment = (
        share_within(r.latency, ctx.slo_latency_s) if ctx.slo_latency_s is not None else None
    )
    burn = None
    if attainment is not None and ctx.slo_target is not None and ctx.slo_target < 1.0:
        burn = (1.0 - attainment) / (1.0 - ctx.slo_target)
    out: dict[str, float | None] = {
        "requests": float(r.requests),
        "completed": float(done),
        "requests_per_s": r.requests / r.seconds if r.seconds > 0 else None,
        "completed_per_s": done / r.seconds if r.seconds > 0 else None,
        "prompt_tokens_per_s": r.prompt_tokens / r.seconds if r.seconds > 0 else None,
        "completion_tokens_per_s": r.completion_tokens / r.seconds if r.seconds > 0 else None,
        "error_rate": (r.server_errors + r.too_many) / done if done else None,
        "shed_rate": r.shed / r.requests if r.requests else None,
        "p50_ms": _ms(quantile(r.latency, 0.50)),
        "p95_ms": _ms(quantile(r.latency, 0.95)),
        "p99_ms": _ms(quantile(r.latency, 0.99)),
        "ttft_p95_ms": _ms(quantile(r.ttfb, 0.95)),
        "tpot_p95_ms": _ms(quantile(r.tpot, 0.95)),
        "queue_wait_p95_ms": _ms(quantile(r.queue_wait, 0.95)),
        "service_ms": _ms(r.served_s / done) if done else None,
        "slo_attainment": attainment,
        "slo_burn": burn,
        "spend": r.spend,
    }
    for g in GAUGES:
        out[g] = r.mean(g)
    return out


MINUTE_S = 60
HOUR_S = 3600


class Accumulator:
    """Readings in, rollups out: each group's readings gather into its current minute, a
    minute is handed out (`closed`) once a reading falls in a later one, and the readings of
    the last `keep_s` stay for windows (`window`: what alerts and follow-ups read), merged
    into slices of `slice_s`: a window is then a dozen merges, not one per reading, and
    its edge is exact to a slice."""

    def __init__(self, keep_s: float, slice_s: float = 1.0) -> None:
        self.keep_s = keep_s
        self.slice_s = slice_s
        self._last: dict[str, TrafficSample | None] = {}
        self._at: dict[str, float] = {}
        self._open: dict[str, list[Rollup]] = {}
        self._recent: dict[str, deque[Rollup]] = {}
        self._closed: list[tuple[str, float, Rollup]] = []

    def observe(
        self, group: str, sample: TrafficSample | None, gauges: Mapping[str, float], now: float
    ) -> None:
        """One reading of `group` at `now`: its counters (None: unreadable) and gauges."""
        seconds = now - self._at.get(group, now)
        if group in self._at and seconds <= 0:
            return  # the clock went back, or a second reading at one instant: skip it
        older = self._last.get(group)
        step = Rollup.between(older, sample, gauges, now, seconds)
        if sample is not None or older is None:
            self._last[group] = sample
        self._at[group] = now
        minute = bucket_start(now, MINUTE_S)
        pending = self._open.setdefault(group, [])
        if pending and bucket_start(pending[-1].start + pending[-1].seconds, MINUTE_S) < minute:
            self._close(group)
            pending = self._open[group] = []
        pending.append(step)
        recent = self._recent.setdefault(group, deque())
        if recent and now - recent[-1].start <= self.slice_s:
            both = merge((recent[-1], step), start=recent[-1].start)
            assert both is not None
            recent[-1] = both
        else:
            recent.append(step)
        while recent and recent[0].start + recent[0].seconds < now - self.keep_s:
            recent.popleft()

    def _close(self, group: str) -> None:
        pending = self._open.get(group)
        if pending:
            end = pending[-1].start + pending[-1].seconds
            minute = bucket_start(end, MINUTE_S)
            done = merge(pending, start=minute)
            assert done is not None
            self._closed.append((group, minute, done))
        self._open[group] = []

    def closed(self) -> list[tuple[str, float, Rollup]]:
        """(group, minute start, rollup) of every minute ended since the last call."""
        out, self._closed = self._closed, []
        return out

    def flush(self) -> list[tuple[str, float, Rollup]]:
        """Close every open minute too (on shutdown: a restart loses nothing observed)."""
        for group in list(self._open):
            self._close(group)
        return self.closed()

    def forget(self, keep: Iterable[str]) -> None:
        """Drop the groups not in `keep` (left the spec), after closing their minutes."""
        kept = set(keep)
        for group in [g for g in self._at if g not in kept]:
            self._close(group)
            for d in (self._last, self._at, self._open, self._recent):
                d.pop(group, None)

    def window(self, group: str, now: float, window_s: float) -> Rollup | None:
        """The readings of the last `window_s` before `now` (to a slice), merged (None:
        none yet)."""
        recent = self._recent.get(group, ())
        return merge(r for r in recent if r.start + r.seconds > now - window_s)
