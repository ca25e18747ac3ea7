"""Prometheus metrics of the data plane (O1), counted in plain ints, rendered at scrape time.

A `prometheus_client` child per (group, route, status) costs a `.labels()` lookup and a lock
per request; here a request costs two dict hits, an int add and a `bisect` into a bucket
list. A custom `Collector` turns the counts (and the live admission state, read only then)
into the exposition format when scraped: `Gateway.metrics_text()`, for the control API to
serve (never the public data-plane port).

Per instance (O1): answers by status class and a latency histogram for each (group,
instance), so one slow or failing instance shows on the gateway's `/metrics` with an
`instance` label, not only on its own worker's port. See `InstanceStats` for what bounds them.

Readiness (issue 33): `sluice_gateway_ready`, `sluice_gateway_synced` and
`sluice_gateway_last_sync_age_seconds`, read from `readiness.Readiness` at scrape time.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from sluice.policy.admission import GroupAdmission
from sluice.policy.route_choice import ExchangeRecord
from sluice.policy.routing import PRIORITIES, Endpoint

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from sluice.gateway.readiness import Readiness

__all__ = [
    "CODE_CLASSES",
    "CONTENT_TYPE",
    "DURATION_BUCKETS_S",
    "INSTANCE_RETENTION_S",
    "QUEUE_BUCKETS_S",
    "REFUSAL_REASONS",
    "SHED_REASONS",
    "GatewayMetrics",
    "GroupMetrics",
    "Histogram",
    "InstanceStats",
    "RuntimeView",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""What `generate_latest` writes: the classic text format every Prometheus reads."""
DURATION_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Request latency buckets, seconds: an embedding call takes ms, a long generation a minute."""
QUEUE_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS_S = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0)
"""Time per output token buckets, seconds: vLLM's range, 5 ms (small model) to 1 s."""
SHED_REASONS = ("overloaded", "evicted", "queue_timeout", "no_instance", "group_removed")
"""Why a request was refused by admission: queue full on arrival, pushed out of the queue by a
higher priority, waited too long, no ready instance (and no fallback), group left the spec."""
REFUSAL_REASONS = (
    "header_bytes",
    "header_count",
    "request_line",
    "body_bytes",
    "header_timeout",
    "body_timeout",
    "connections",
    "connections_per_ip",
    "json_depth",
    "write_stall",
)
"""Why the gateway refused a client before routing it (`gateway.limits`): head over
`max_header_bytes`, more than `max_headers` lines, URL over `max_request_line_bytes`, body over
`max_body_bytes`, head or body too slow (408, or a silent close when nothing came at all),
a connection over `max_connections` or `max_connections_per_ip` (503), JSON too deep (400),
a client that stopped reading its answer for `write_stall_s` (cut off, no answer: see
`ClientProtocol.check_deadlines`)."""


CODE_CLASSES = ("0", "1xx", "2xx", "3xx", "4xx", "5xx")
"""Answer classes per instance, indexed by `status // 100` (capped at 5): "0" is an instance
that gave no answer (its connection failed, or its answer was cut off after the head)."""
INSTANCE_RETENTION_S = 600.0
"""How long an instance's counters outlive its leaving its group's routing (see
`InstanceStats`)."""


class Histogram:
    """Counts per bucket (not cumulative; the last is +Inf) and the sum, in seconds."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative `(le, count)` pairs as the exposition wants them, +Inf last."""
        out = []
        total = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += count
            out.append(("+Inf" if bound == float("inf") else repr(bound), float(total)))
        return out


class RouteStats:
    """One (group, route): requests by status, and their latency."""

    __slots__ = ("duration", "statuses")

    def __init__(self) -> None:
        self.statuses: dict[int, int] = {}
        self.duration = Histogram(DURATION_BUCKETS_S)


class InstanceStats:
    """One (group, instance): answers by class (`CODE_CLASSES`) and their latency at the
    instance (less the queue wait, which is the group's, not the instance's).

    Bounded memory: instances come and go (every scale-up, rollout and replacement brings a
    new id), so unlike a group's counters these must not live forever. An instance's stats
    are dropped once it has been out of its group's routing for `INSTANCE_RETENTION_S`
    (ten minutes: long enough for Prometheus to scrape its last counts, even with a scrape
    missed or two, and for a `rate()` window to see it out). "In routing" is checked off
    the hot path, where the routed ids are at hand anyway: when a snapshot is applied to
    the group (`GroupMetrics.prune`, called by `GroupRuntime.configure`) and at each scrape.
    So the map holds the routed instances plus those that left in the last ten minutes (or
    since the last snapshot change or scrape, if neither happened for longer). A cap of N
    per group was the other choice; it would drop a live instance's series in a large
    group, and the time bound never does.
    """

    __slots__ = ("codes", "duration", "unrouted_since")

    def __init__(self, unrouted_since: float) -> None:
        self.codes = [0] * len(CODE_CLASSES)
        self.duration = Histogram(DURATION_BUCKETS_S)
        self.unrouted_since = unrouted_since
        """Monotonic time since which the instance has not been seen in its group's routing;
        0.0 while it is. A new entry starts unconfirmed (its first answer's time)."""


class GroupMetrics:
    """Counters of one group; they outlive the group's runtime (counters never go back),
    except the per-instance ones (see `InstanceStats`)."""

    __slots__ = (
        "arrivals",
        "instances",
        "mirrored",
        "prefix_blocks",
        "prefix_cached_blocks",
        "queue_wait",
        "routes",
        "served_s",
        "served_sq_s",
        "shed",
        "standby_promotions",
        "standby_wakes",
        "tokens",
        "tpot",
        "ttfb",
        "usage_answers",
        "usage_completion",
    )

    def __init__(self) -> None:
        self.arrivals = 0
        """Requests sent to this group (before any fallback): the autoscaler's demand."""
        self.routes: dict[str, RouteStats] = {}
        self.shed = dict.fromkeys(SHED_REASONS, 0)
        self.mirrored = 0
        self.prefix_blocks = 0
        """Prompt blocks of requests chosen by prefix (`policy.prefix`)..."""
        self.prefix_cached_blocks = 0
        """...and those the chosen instance was expected to hold: the gateway's hit rate."""
        self.standby_promotions = 0
        """Times this gateway put the group's warm standby in rotation (requests waited)."""
        self.standby_wakes = 0
        """Sleeping standby this gateway woke (requests waited, no warm standby left)."""
        self.queue_wait = Histogram(QUEUE_BUCKETS_S)
        self.ttfb = Histogram(DURATION_BUCKETS_S)
        """Time from a streamed request's first byte to its answer's first body byte."""
        self.tokens: dict[str, list[int]] = {}
        """tenant -> [prompt tokens, completion tokens] of its answers (`Exchange._count_tokens`)"""
        self.usage_answers = 0
        """Answers whose usage was read (their tokens are in `tokens`): the denominator of
        the mean prompt and output lengths a batching group is sized on."""
        self.usage_completion = 0
        """Their completion tokens: the mean output length's numerator (`tokens` also
        counts the chunks of streams answered without usage)."""
        self.tpot = Histogram(TPOT_BUCKETS_S)
        """A streamed answer's time per output token after the first."""
        self.served_s = 0.0
        """Seconds finished requests spent at an instance (latency less queue wait): with
        the completion count, the mean service time the autoscaler sizes with."""
        self.served_sq_s = 0.0
        """the sum of their squares: the service time's variability"""
        self.instances: dict[str, InstanceStats] = {}

    def count_tokens(self, tenant: str, prompt: int, completion: int, usage: bool = True) -> None:
        """One answer's tokens; `usage`: read from its usage (else a stream's chunks)."""
        counts = self.tokens.get(tenant)
        if counts is None:
            counts = self.tokens[tenant] = [0, 0]
        counts[0] += prompt
        counts[1] += completion
        if usage:
            self.usage_answers += 1
            self.usage_completion += completion

    def prune(self, routed: Collection[str], now: float) -> None:
        """Mark the instances in `routed` as in routing; drop those out of it for longer
        than `INSTANCE_RETENTION_S` (monotonic seconds). Off the hot path: at snapshot
        changes and scrapes."""
        gone = []
        for iid, stats in self.instances.items():
            if iid in routed:
                stats.unrouted_since = 0.0
            elif not stats.unrouted_since:
                stats.unrouted_since = now
            elif now - stats.unrouted_since > INSTANCE_RETENTION_S:
                gone.append(iid)
        for iid in gone:
            del self.instances[iid]

    def request_done(self, route: str, status: int, latency_s: float) -> None:
        stats = self.routes.get(route)
        if stats is None:
            stats = self.routes[route] = RouteStats()
        statuses = stats.statuses
        statuses[status] = statuses.get(status, 0) + 1
        stats.duration.observe(latency_s)


class RuntimeView(Protocol):
    """What a scrape reads of a group's live state (a `groups.GroupRuntime`)."""

    @property
    def endpoints(self) -> Sequence[Endpoint]: ...
    @property
    def admission(self) -> GroupAdmission[Any]: ...
    def ejected_now(self, now: float) -> Mapping[str, object]: ...


class GatewayMetrics:
    """Every group's counters, by group name; `""` holds requests that never reached a group
    (401, 404, rate limited, /healthz, ...)."""

    __slots__ = ("groups", "refused", "registry")

    def __init__(
        self,
        runtimes: Callable[[], Mapping[str, RuntimeView]],
        version: Callable[[], int],
        readiness: Readiness | None = None,
    ) -> None:
        """`readiness`: what the readiness gauges say (none without it)."""
        self.groups: dict[str, GroupMetrics] = {}
        self.refused = dict.fromkeys(REFUSAL_REASONS, 0)
        """Clients refused by `gateway.limits`, by reason (see `REFUSAL_REASONS`)."""
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self, runtimes, version, readiness))

    def group(self, name: str) -> GroupMetrics:
        gm = self.groups.get(name)
        if gm is None:
            gm = self.groups[name] = GroupMetrics()
        return gm

    def record(self, rec: ExchangeRecord) -> None:
        """Count one finished exchange (inlined: it runs for every request). Per instance
        (`rec.instance`: the one that answered or was tried last) by the status it gave
        (`rec.answer`; 0: none, see `CODE_CLASSES`) and its time there (`rec.served_s`)."""
        # Unpacked in one step, in field order: `rec.name` is a descriptor call each.
        (_, _, status, _, _, _, route_tag, group_name, instance, _,
         _, _, _, _, _, _, latency_s, served_s, _, answer) = rec  # fmt: skip
        group = group_name or ""
        gm = self.groups.get(group)
        if gm is None:
            gm = self.groups[group] = GroupMetrics()
        route = route_tag or ""
        stats = gm.routes.get(route)
        if stats is None:
            stats = gm.routes[route] = RouteStats()
        statuses = stats.statuses
        statuses[status] = statuses.get(status, 0) + 1
        hist = stats.duration
        hist.counts[bisect_left(hist.bounds, latency_s)] += 1
        hist.sum += latency_s
        gm.served_s += served_s
        gm.served_sq_s += served_s * served_s
        if instance is not None:
            inst = gm.instances.get(instance)
            if inst is None:
                inst = gm.instances[instance] = InstanceStats(time.monotonic())
            cls = answer // 100
            inst.codes[cls if cls < 5 else 5] += 1
            hist = inst.duration
            hist.counts[bisect_left(hist.bounds, served_s)] += 1
            hist.sum += served_s

    def request_done(
        self,
        group: str | None,
        route: str | None,
        status: int,
        latency_s: float,
        served_s: float = 0.0,
        instance: str | None = None,
        answer: int = 0,
    ) -> None:
        """`record`, for a request given by its parts (only what the metrics read)."""
        queue_ms = (latency_s - served_s) * 1000.0
        self.record(
            ExchangeRecord(
                b"", b"", status, None, None, None, route, group, instance, None, None,
                False, None, b"", 0.0, queue_ms, latency_s, served_s, 0, answer,
            )
        )  # fmt: skip

    def route_counts(self) -> dict[str, dict[str, int]]:
        """Requests answered so far by route rule, then final group (the console's share of
        traffic per rule); requests that matched no rule are left out."""
        out: dict[str, dict[str, int]] = {}
        for group, gm in self.groups.items():
            for route, stats in gm.routes.items():
                if route and group:
                    out.setdefault(route, {})[group] = sum(stats.statuses.values())
        return out

    def render(self) -> bytes:
        """The Prometheus text exposition (format 0.0.4)."""
        return generate_latest(self.registry)


class _Collector(Collector):
    def __init__(
        self,
        metrics: GatewayMetrics,
        runtimes: Callable[[], Mapping[str, RuntimeView]],
        version: Callable[[], int],
        readiness: Readiness | None,
    ) -> None:
        self._metrics = metrics
        self._runtimes = runtimes
        self._version = version
        self._readiness = readiness

    def collect(self) -> Iterator[Metric]:
        groups = self._metrics.groups
        requests = CounterMetricFamily(
            "sluice_gateway_requests",
            "Requests answered by the gateway, by final group, route rule and HTTP status.",
            labels=("group", "route", "status"),
        )
        duration = HistogramMetricFamily(
            "sluice_gateway_request_duration_seconds",
            "Time from a request's first byte to its last response byte, seconds.",
            labels=("group", "route"),
        )
        shed = CounterMetricFamily(
            "sluice_gateway_shed",
            "Requests refused by admission (429/503), by group and reason.",
            labels=("group", "reason"),
        )
        mirrored = CounterMetricFamily(
            "sluice_gateway_mirrored",
            "Copies of requests sent to a mirror group (answers discarded).",
            labels=("group",),
        )
        prefix_blocks = CounterMetricFamily(
            "sluice_gateway_prefix_blocks",
            "Prompt blocks of requests sent by prefix-cache-aware choice, by group.",
            labels=("group",),
        )
        promotions = CounterMetricFamily(
            "sluice_gateway_standby_promotions",
            "Times this gateway put a group's warm standby in rotation because requests "
            "waited, before the controller's next decision.",
            labels=("group",),
        )
        wakes = CounterMetricFamily(
            "sluice_gateway_standby_wakes",
            "Sleeping standby instances this gateway woke because requests waited and no "
            "warm standby was left.",
            labels=("group",),
        )
        prefix_cached = CounterMetricFamily(
            "sluice_gateway_prefix_cached_blocks",
            "Of those, the blocks this gateway expected the chosen instance to hold in its "
            "cache (over sluice_gateway_prefix_blocks: the expected prefix hit rate).",
            labels=("group",),
        )
        prompt_tokens = CounterMetricFamily(
            "sluice_gateway_prompt_tokens",
            "Prompt tokens of answered requests, from the answers' usage, by group and tenant.",
            labels=("group", "tenant"),
        )
        completion_tokens = CounterMetricFamily(
            "sluice_gateway_completion_tokens",
            "Completion tokens of answered requests, by group and tenant: the answers' usage, "
            "or a stream's data events but its [DONE] where it gives none.",
            labels=("group", "tenant"),
        )
        tpot = HistogramMetricFamily(
            "sluice_gateway_time_per_output_token_seconds",
            "Streamed answers: time from the first body byte to the last over the tokens "
            "after the first, seconds.",
            labels=("group",),
        )
        queue_wait = HistogramMetricFamily(
            "sluice_gateway_queue_wait_seconds",
            "Time queued requests waited for a slot (admitted or expired), seconds.",
            labels=("group",),
        )
        ttfb = HistogramMetricFamily(
            "sluice_gateway_time_to_first_byte_seconds",
            "Streamed answers: time from the request's first byte to the answer's first body "
            "byte (time to first token, as the gateway sees it), seconds.",
            labels=("group",),
        )
        per_instance = CounterMetricFamily(
            "sluice_gateway_instance_requests",
            "Requests answered per instance, by group, instance and class of the instance's "
            "answer (0: none, the connection failed or the answer was cut off).",
            labels=("group", "instance", "code_class"),
        )
        instance_duration = HistogramMetricFamily(
            "sluice_gateway_instance_request_duration_seconds",
            "Time at the instance per request: from the request's first byte to its last "
            "response byte, less its wait in the group's queue, seconds.",
            labels=("group", "instance"),
        )
        runtimes = self._runtimes()
        now = time.monotonic()  # the clock of ejections and of `InstanceStats`
        for name, gm in sorted(groups.items()):
            if gm.instances:
                rt = runtimes.get(name)
                gm.prune({ep.instance_id for ep in rt.endpoints} if rt else (), now)
            for iid, inst in sorted(gm.instances.items()):
                for cls, count in zip(CODE_CLASSES, inst.codes, strict=True):
                    if count or cls != "1xx":
                        per_instance.add_metric((name, iid, cls), count)
                hist = inst.duration
                instance_duration.add_metric((name, iid), hist.buckets(), hist.sum)
            for route, stats in sorted(gm.routes.items()):
                for status, count in sorted(stats.statuses.items()):
                    requests.add_metric((name, route, str(status)), count)
                duration.add_metric((name, route), stats.duration.buckets(), stats.duration.sum)
            if name:
                for reason, count in gm.shed.items():
                    shed.add_metric((name, reason), count)
                mirrored.add_metric((name,), gm.mirrored)
                if gm.prefix_blocks:
                    prefix_blocks.add_metric((name,), gm.prefix_blocks)
                    prefix_cached.add_metric((name,), gm.prefix_cached_blocks)
                if gm.standby_promotions:
                    promotions.add_metric((name,), gm.standby_promotions)
                if gm.standby_wakes:
                    wakes.add_metric((name,), gm.standby_wakes)
                queue_wait.add_metric((name,), gm.queue_wait.buckets(), gm.queue_wait.sum)
                ttfb.add_metric((name,), gm.ttfb.buckets(), gm.ttfb.sum)
                if gm.tokens:
                    tpot.add_metric((name,), gm.tpot.buckets(), gm.tpot.sum)
                for tenant, (prompt, completion) in sorted(gm.tokens.items()):
                    prompt_tokens.add_metric((name, tenant), prompt)
                    completion_tokens.add_metric((name, tenant), completion)
        refused = CounterMetricFamily(
            "sluice_gateway_refused",
            "Clients refused by the gateway's limits before routing (408, 413, 414, 431, 503, "
            "400 for JSON too deep), by reason.",
            labels=("reason",),
        )
        for reason, count in self._metrics.refused.items():
            refused.add_metric((reason,), count)
        yield from (requests, duration, shed, mirrored, queue_wait, ttfb, refused)
        yield from (prefix_blocks, prefix_cached, prompt_tokens, completion_tokens, tpot)
        yield promotions
        yield wakes
        yield from (per_instance, instance_duration)

        queue_length = GaugeMetricFamily(
            "sluice_gateway_queue_length",
            "Requests waiting for a slot now, by group and priority.",
            labels=("group", "priority"),
        )
        inflight = GaugeMetricFamily(
            "sluice_gateway_inflight",
            "Requests holding one of the group's slots now (mirrored copies included).",
            labels=("group",),
        )
        slots = GaugeMetricFamily(
            "sluice_gateway_slots",
            "The group's slots: max_concurrency summed over its ready, not ejected instances.",
            labels=("group",),
        )
        instances = GaugeMetricFamily(
            "sluice_gateway_instances",
            "The group's ready instances, by state (ready: taking traffic; ejected: outlier).",
            labels=("group", "state"),
        )
        tenant_service = CounterMetricFamily(
            "sluice_gateway_tenant_service",
            "Weighted cost of the requests dispatched from the group's queue, by tenant "
            "(prompt-token units: body bytes / 4 + 2 x expected completion tokens; the "
            "share each tenant got while the group was busy).",
            labels=("group", "tenant"),
        )
        fairness_gap = GaugeMetricFamily(
            "sluice_gateway_fairness_gap",
            "The most the service counters (cost / weight) of tenants waiting in the same "
            "priority differ now, by group; 0 when fewer than two tenants wait.",
            labels=("group",),
        )
        for name, rt in sorted(runtimes.items()):
            for tenant, cost in sorted(rt.admission.tenant_service().items()):
                tenant_service.add_metric((name, tenant), cost)
            fairness_gap.add_metric((name,), rt.admission.fairness_gap())
            adm = rt.admission.statistics()
            for priority in PRIORITIES:
                queue_length.add_metric((name, priority), adm.queued[priority])
            inflight.add_metric((name,), adm.in_use)
            slots.add_metric((name,), adm.slots)
            ejected = len(rt.ejected_now(now))
            instances.add_metric((name, "ready"), len(rt.endpoints) - ejected)
            instances.add_metric((name, "ejected"), ejected)
        version = GaugeMetricFamily(
            "sluice_gateway_snapshot_version", "Version of the routing snapshot being served."
        )
        version.add_metric((), self._version())
        yield from (queue_length, inflight, slots, instances, version)
        yield from (tenant_service, fairness_gap)
        if self._readiness is not None:
            yield from _readiness_gauges(self._readiness, now)


def _readiness_gauges(readiness: Readiness, now: float) -> Iterator[Metric]:
    """`sluice_gateway_ready`, `sluice_gateway_synced` and, once a controller answered a
    sync, `sluice_gateway_last_sync_age_seconds` (see `sluice.gateway.readiness`)."""
    ready = GaugeMetricFamily(
        "sluice_gateway_ready",
        "1 once the gateway has routes to serve (/readyz 200); 0 before its first sync.",
    )
    ready.add_metric((), 1.0 if readiness.routed else 0.0)
    synced = GaugeMetricFamily(
        "sluice_gateway_synced",
        "1 while the routes served are fresh: a controller answered a sync in the last few "
        "seconds (or feeds this gateway in its process); 0 when unready or stale.",
    )
    synced.add_metric((), 1.0 if readiness.routed and not readiness.stale(now) else 0.0)
    yield from (ready, synced)
    age = readiness.age(now)
    if age is not None:
        last = GaugeMetricFamily(
            "sluice_gateway_last_sync_age_seconds",
            "Seconds since a controller last answered this gateway's sync.",
        )
        last.add_metric((), age)
        yield last
