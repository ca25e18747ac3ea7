"""Many gateways, one fleet (issue 21): which gateways are live, the share of every
instance's slots each one admits, and one set of per-group counters for the autoscaler.

Each gateway process (`sluice gateway`, one per worker) syncs with the controller about once
a second: it pushes its cumulative per-group counters and learns its share. Pure: the
controller's edge (`sluice.control.gateways`) keeps the table, time comes in.

A gateway token names its gateway (issue 31): the token named N syncs only the gateway ids
`N` and `N-<suffix>` (`gateway_id_fits`): the workers of `sluice gateway --workers K` are
`N-...-w0`..`N-...-w{K-1}`, the pods of one Deployment sharing a token `N-<pod name>`.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sluice.policy.autoscale.base import TrafficSample
from sluice.policy.routing import Endpoint, RoutingSnapshot

__all__ = [
    "GATEWAY_ID_PATTERN",
    "GatewayBook",
    "Share",
    "add_samples",
    "gateway_id_fits",
    "gateway_id_rule",
    "merge_status",
    "share_endpoints",
    "share_snapshot",
]

GATEWAY_TTL_S = 5.0
"""A gateway not heard from for this long is gone: its share goes to the others. Five sync
periods, so one slow sync does not reshuffle every gateway's slots."""
GATEWAY_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,99}$"
"""What a gateway id may be (it is a path segment of the sync)."""


def gateway_id_fits(token_name: str, gateway_id: str) -> bool:
    """Whether the token named `token_name` may sync gateway `gateway_id`: its own name, or
    its name, a dash and a suffix of its choosing (a worker, a host, a pod)."""
    if gateway_id == token_name:
        return True
    return gateway_id.startswith(f"{token_name}-") and len(gateway_id) > len(token_name) + 1


def gateway_id_rule(token_name: str) -> str:
    """The ids the token named `token_name` may sync, in words (for a refusal)."""
    return f"{token_name!r} or '{token_name}-<suffix>'"


@dataclass(frozen=True, slots=True)
class Share:
    """Gateway `index` of `count` live ones (ids in sorted order)."""

    index: int = 0
    count: int = 1

    def __iter__(self) -> Iterator[int]:  # compares with the (index, count) a gateway sends
        return iter((self.index, self.count))


def share_endpoints(endpoints: Sequence[Endpoint], share: Share) -> tuple[Endpoint, ...]:
    """Each endpoint with this gateway's part of its `max_concurrency`, so the slots of all
    gateways add up to the instance's: `c // n` each, and the remainder's slots to
    `c % n` gateways chosen by the instance id (not always the first gateway). An instance
    with fewer slots than there are gateways still gets one slot in each: a gateway with no
    slot for a group would refuse its every request; the instance's own queue takes the at
    most n - 1 extra."""
    n, i = share.count, share.index
    if n <= 1:
        return tuple(endpoints)
    out = []
    for ep in endpoints:
        c = ep.max_concurrency
        offset = zlib.crc32(ep.instance_id.encode()) % n
        mine = c // n + (1 if (i - offset) % n < c % n else 0)
        out.append(dataclasses.replace(ep, max_concurrency=max(1, mine)))
    return tuple(out)


def share_snapshot(snapshot: RoutingSnapshot, share: Share) -> RoutingSnapshot:
    """`snapshot` with every endpoint's slots cut to this gateway's share."""
    if share.count <= 1:
        return snapshot
    endpoints = {g: share_endpoints(eps, share) for g, eps in snapshot.endpoints.items()}
    return dataclasses.replace(snapshot, endpoints=endpoints)


_BOUNDS = frozenset(f for f in TrafficSample.__dataclass_fields__ if f.endswith("_bounds"))
_GAUGES = ("in_flight", "queued", "standby_in_rotation", "woken")
"""what a sample says of now, not since the start"""


def add_samples(samples: Sequence[TrafficSample], at: float) -> TrafficSample:
    """One sample of a group from several gateways': every count is a sum (in flight and
    queued now, the rest cumulative), histograms bucket by bucket; the buckets' bounds are
    the first sample's (every gateway runs the same code). The warm standby in rotation is
    the most any gateway routes to: they share the same instances; the sleeping standby
    woken, those any gateway woke."""
    if not samples:
        return TrafficSample(at, 0, 0, 0, 0, (), ())
    first, values = samples[0], {}
    for f in dataclasses.fields(TrafficSample):
        if f.name == "at" or f.name in _BOUNDS:
            continue
        total = getattr(first, f.name)
        if f.name == "standby_in_rotation":
            values[f.name] = max(getattr(s, f.name) for s in samples)
            continue
        if f.name == "woken":  # instances, not counts: any gateway's
            values[f.name] = tuple(sorted({i for s in samples for i in s.woken}))
            continue
        for s in samples[1:]:
            more = getattr(s, f.name)
            total = _add(total, more) if isinstance(total, tuple) else total + more
        values[f.name] = total
    return dataclasses.replace(first, at=at, **values)


def _add(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    if not a:
        return b
    if not b:
        return a
    if len(a) != len(b):
        raise ValueError(f"histograms of {len(a)} and {len(b)} buckets cannot be added")
    return tuple(x + y for x, y in zip(a, b, strict=True))


def _since(now: TrafficSample, base: TrafficSample | None) -> TrafficSample:
    """`now`'s cumulative counts less `base`'s (its gauges, in flight and queued, as they
    are); a base whose histograms differ in shape is ignored."""
    if base is None:
        return now
    values: dict[str, Any] = {}
    for f in dataclasses.fields(TrafficSample):
        if f.name == "at" or f.name in _GAUGES or f.name in _BOUNDS:
            continue
        a, b = getattr(now, f.name), getattr(base, f.name)
        if isinstance(a, tuple):
            values[f.name] = (
                tuple(x - y for x, y in zip(a, b, strict=True)) if len(a) == len(b) else a
            )
        else:
            values[f.name] = a - b
    return dataclasses.replace(now, **values)


def _without_gauges(s: TrafficSample) -> TrafficSample:
    """What a gone gateway leaves in the fleet's cumulative counts: nothing in flight."""
    return dataclasses.replace(s, in_flight=0, queued=0, standby_in_rotation=0, woken=())


@dataclass
class _Gateway:
    boot: str
    seen: float
    counters: dict[str, TrafficSample]
    base: dict[str, TrafficSample]
    """per group, its counts when this book first saw them (this boot): what it counted
    before is not news to the autoscaler, whose windows would otherwise read it as one
    second's load (a group's counts the controller dropped until it knew the group, too)"""

    def counted(self) -> dict[str, TrafficSample]:
        """What it counted since first seen, per group (gauges as they are now)."""
        return {g: _since(s, self.base.get(g)) for g, s in self.counters.items()}


@dataclass
class GatewayBook:
    """The live gateways and the fleet's per-group counters.

    Counters stay cumulative across the fleet's changes, as the autoscaler's windows need
    (a window is the difference of two samples): a gateway that leaves, or restarts with a
    new `boot` id and counts from zero again, has its last counts kept in `retired`, so no
    total ever goes down."""

    ttl_s: float = GATEWAY_TTL_S
    gateways: dict[str, _Gateway] = field(default_factory=dict)
    retired: dict[str, TrafficSample] = field(default_factory=dict)

    def push(
        self, gateway: str, boot: str, counters: Mapping[str, TrafficSample], now: float
    ) -> Share:
        """Record one sync of `gateway` and return its share of the live fleet."""
        old = self.gateways.get(gateway)
        if old is not None and old.boot != boot:
            self._retire(old)
            old = None
        base = dict(old.base) if old is not None else {}
        for group, sample in counters.items():
            base.setdefault(group, sample)
        self.gateways[gateway] = _Gateway(boot, now, dict(counters), base)
        self.expire(now)
        return self.share_of(gateway)

    def expire(self, now: float) -> list[str]:
        """Forget gateways not heard from within `ttl_s` (their entries go; what they
        counted stays in `retired`); returns their ids."""
        gone = [g for g, gw in self.gateways.items() if now - gw.seen > self.ttl_s]
        for g in gone:
            self._retire(self.gateways.pop(g))
        return gone

    def share_of(self, gateway: str) -> Share:
        live = sorted(self.gateways)
        return Share(live.index(gateway), len(live)) if gateway in live else Share()

    def live(self) -> list[str]:
        return sorted(self.gateways)

    def traffic(self, now: float) -> dict[str, TrafficSample]:
        """Per group: the sum over live gateways plus what gone ones counted."""
        self.expire(now)
        groups: dict[str, list[TrafficSample]] = {g: [s] for g, s in self.retired.items()}
        for gw in self.gateways.values():
            for g, s in gw.counted().items():
                groups.setdefault(g, []).append(s)
        return {g: add_samples(ss, now) for g, ss in groups.items()}

    def _retire(self, gw: _Gateway) -> None:
        for g, s in gw.counted().items():
            kept = self.retired.get(g)
            left = _without_gauges(s)
            self.retired[g] = left if kept is None else add_samples([kept, left], s.at)


def merge_status(parts: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The data plane of several gateways as one (`GET /v1/dataplane`): per group, slots,
    in use and queued add up, `instances` is what the most up-to-date gateway routes to
    (`standby` the warm standby it keeps out, `sleeping` its sleeping standby, `standby_at`
    the in-flight level that takes them in; `promoted` the gateways that put theirs in
    because requests waited or passed it, `woken` the sleepers any woke),
    unreachable and ejected instances are each gateway's, named;
    served and per-route counts add up, and so do the requests in flight per instance.
    `gateways[id]` is the snapshot version each one serves."""
    groups: dict[str, dict[str, Any]] = {}
    served: dict[str, int] = {}
    in_flight: dict[str, int] = {}
    routes: dict[str, dict[str, int]] = {}
    for gw, part in sorted(parts.items()):
        for name, g in (part.get("groups") or {}).items():
            into = groups.setdefault(
                name,
                {
                    "slots": 0,
                    "in_use": 0,
                    "queued": {},
                    "instances": 0,
                    "standby": 0,
                    "standby_at": None,
                    "sleeping": 0,
                    "woken": [],
                    "promoted": [],
                    "unreachable": [],
                    "ejected": [],
                },
            )
            into["slots"] += int(g.get("slots", 0))
            into["in_use"] += int(g.get("in_use", 0))
            for prio, n in (g.get("queued") or {}).items():
                into["queued"][prio] = into["queued"].get(prio, 0) + int(n)
            into["instances"] = max(into["instances"], int(g.get("instances", 0)))
            into["standby"] = max(into["standby"], int(g.get("standby", 0)))
            into["sleeping"] = max(into["sleeping"], int(g.get("sleeping", 0)))
            if g.get("standby_at") is not None:  # (one snapshot's: the same everywhere)
                into["standby_at"] = g["standby_at"]
            into["woken"] = sorted(set(into["woken"]) | set(g.get("woken", ())))
            if g.get("standby_promoted_s") is not None:
                into["promoted"].append(gw)
            into["unreachable"] = sorted(set(into["unreachable"]) | set(g.get("unreachable", ())))
            into["ejected"] += [{**e, "gateway": gw} for e in g.get("ejected", ())]
        for instance, n in (part.get("served") or {}).items():
            served[instance] = served.get(instance, 0) + int(n)
        for instance, n in (part.get("in_flight") or {}).items():
            in_flight[instance] = in_flight.get(instance, 0) + int(n)
        for tag, by_group in (part.get("routes") or {}).items():
            into_route = routes.setdefault(tag, {})
            for group, n in by_group.items():
                into_route[group] = into_route.get(group, 0) + int(n)
    versions = {gw: part.get("version") for gw, part in parts.items()}
    return {
        "version": max((v for v in versions.values() if isinstance(v, int)), default=0),
        "groups": dict(sorted(groups.items())),
        "served": served,
        "in_flight": in_flight,
        "routes": routes,
        "gateways": versions,
    }
