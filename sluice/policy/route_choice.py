"""One request's route choice, pure: rule, group (weighted target, canary split, failover),
fallbacks in order, admission class and mirror; and the record of how the exchange went.

`choose(snapshot, request, rng)` is `plan(snapshot, request).draw(rng)`. `plan` does all that
depends only on the snapshot and the request (rule lookup, permissions, priority, fallback
filtering) and builds every choice the request can get; `draw` makes the random draws only
(weighted target, canary share, mirror sample) and returns one of the choices built, so a
caller that keeps plans per snapshot (the gateway does) pays a dict hit per request, and a
route that draws nothing returns the same `RouteChoice` every time. The live gateway and the
simulator both route through here; neither reads a clock or a global random for it.

The instance is picked later, once admission gave the request a slot in the chosen group (or
a fallback): that pick reads live state (ejections, requests in flight) and is
`sluice.policy.balance`'s (`pick_affinity`, `pick_endpoint`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from random import Random
from types import MappingProxyType
from typing import NamedTuple

from sluice.policy.routing import (
    RequestMeta,
    Route,
    RoutingSnapshot,
    TenantAccess,
)

__all__ = [
    "FIXED_FIELDS",
    "ExchangeRecord",
    "RouteChoice",
    "RoutePlan",
    "RouteRequest",
    "choose",
    "plan",
    "plan_route",
    "route_of",
]

_NO_HEADERS: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """What routing needs to know of one request.

    `tenant`: the caller, already found by its key (`RoutingSnapshot.tenant_for_key`);
    `priority`: the priority the caller asked for (`x-sluice-priority`, lower-case), or None;
    honoured only for tenants that may set it. `headers`: lower-case name -> value, for the
    rules that match on headers (only needed when `snapshot.routes.uses_headers`). `group`:
    the group an operator named (`x-sluice-group`), which bypasses the rules; ignored for
    other tenants.
    """

    tenant: TenantAccess
    model: str
    priority: str | None = None
    headers: Mapping[str, str] = field(default_factory=lambda: _NO_HEADERS)
    group: str | None = None


@dataclass(frozen=True, slots=True)
class RouteChoice:
    """Where one request goes and how it is admitted.

    `tag`: the rule's tag (`x-sluice-route`, the access log, metrics). `group`: the group to
    ask for a slot first, after the weighted pick among the rule's targets, the canary
    split and a failover redirect (`via` says so: "failover a->b"). `fallbacks`: the groups
    to try, in their declared order, when `group` has no free slot or no ready instance
    (ones the tenant may use, that serve the model, not redirected, never `group` itself).
    `priority`: the admission class. `mirror`: the group a shadow copy goes to (its sample
    drawn already), or None.
    """

    tag: str
    group: str
    priority: str
    via: str | None = None
    fallbacks: tuple[str, ...] = ()
    mirror: str | None = None


@dataclass(frozen=True, slots=True)
class RoutePlan:
    """Every choice one request can get from a snapshot; `draw` picks one.

    `route`: the rule matched (its targets and weights). `splits[target] = (canary, percent)`:
    the canary split in force for that target, at this tenant's share (100: all of it, no
    draw). `mirror_percent`: the share of requests the mirror samples (0: none, 100: all,
    no draw either way).
    `choices[(group, mirrored)]`: the choice for each group the draws can land on. `fixed`:
    the only choice, when nothing is drawn.
    """

    route: Route
    splits: Mapping[str, tuple[str, float]]
    mirror_percent: float
    choices: Mapping[tuple[str, bool], RouteChoice]
    fixed: RouteChoice | None

    def draw(self, rng: Random) -> RouteChoice:
        """The choice for one request: target by weight, then canary share, then mirror
        sample, each drawn from `rng` only when it is not settled already."""
        fixed = self.fixed
        if fixed is not None:
            return fixed
        group = self.route.pick_group(rng)
        split = self.splits.get(group)
        if split is not None:
            canary, share = split
            if share >= 100.0 or rng.random() * 100.0 < share:
                group = canary
        percent = self.mirror_percent
        mirrored = percent >= 100.0 or (percent > 0.0 and rng.random() * 100.0 < percent)
        return self.choices[(group, mirrored)]


def choose(snapshot: RoutingSnapshot, request: RouteRequest, rng: Random) -> RouteChoice:
    """Route one request. Raises `NotFound` (no such model, no rule, no such group) or
    `Forbidden` (the tenant may not use the model or a group the rule names), as
    `RoutingSnapshot.resolve` and `direct` do."""
    return plan(snapshot, request).draw(rng)


def plan(snapshot: RoutingSnapshot, request: RouteRequest) -> RoutePlan:
    """Everything about `request`'s route that draws nothing (see the module); raises as
    `choose` does. Depends only on its arguments, so it may be kept per snapshot and key."""
    return plan_route(snapshot, request, route_of(snapshot, request))


def route_of(snapshot: RoutingSnapshot, request: RouteRequest) -> Route:
    """The rule `request` matches (or an operator's named group); raises as `choose` does.
    The only part of a plan that reads `request.headers`."""
    tenant = request.tenant
    if request.group is not None and tenant.operator:
        return snapshot.direct(tenant, request.group, request.model)
    priority = tenant.priority_for(request.priority)
    meta = RequestMeta(tenant.name, request.model, priority, request.headers)
    return snapshot.resolve(tenant, meta)


def plan_route(snapshot: RoutingSnapshot, request: RouteRequest, route: Route) -> RoutePlan:
    """`plan`, for `route` = `route_of(snapshot, request)`: a caller that looks rules up per
    request (rules read headers) can keep plans per (tenant, model, priority, rule)."""
    tenant = request.tenant
    model = request.model
    priority = tenant.priority_for(request.priority)
    direct = request.group is not None and tenant.operator
    # an operator's named group: no canary split (nor rule, nor mirror)
    splits = {} if direct else _splits(snapshot, route, tenant)
    mirror = route.mirror
    mirror_percent = 0.0 if mirror is None else mirror[1]
    sampled: tuple[bool, ...] = (False,)  # the mirror samples a request can get
    if mirror_percent >= 100.0:  # (`random()` < 1.0: every request)
        sampled = (True,)
    elif mirror_percent > 0.0:
        sampled = (False, True)
    fallbacks = snapshot.fallbacks(route, tenant, model)
    landings = {target for target, _ in route.targets} | {c for c, _ in splits.values()}
    choices: dict[tuple[str, bool], RouteChoice] = {}
    for landed in sorted(landings):
        group, via = snapshot.serving_group(landed)
        # never chain: a fallback that is failed over itself is not tried
        fb = tuple(g for g in fallbacks if g != group and g not in snapshot.redirects)
        for mirrored in sampled:
            to = mirror[0] if mirrored and mirror is not None else None
            choices[(landed, mirrored)] = RouteChoice(route.tag, group, priority, via, fb, to)
    fixed = None
    if len(route.targets) == 1 and len(sampled) == 1:
        target = route.group
        split = splits.get(target)
        if split is None:
            fixed = choices[(target, sampled[0])]
        elif split[1] >= 100.0:
            fixed = choices[(split[0], sampled[0])]
    return RoutePlan(route, splits, mirror_percent, choices, fixed)


def _splits(
    snapshot: RoutingSnapshot, route: Route, tenant: TenantAccess
) -> dict[str, tuple[str, float]]:
    """target -> (canary, percent of its requests that go there) for `route`'s targets
    under a canary split, at `tenant`'s share (`snapshot.canaries` is keyed by each split's
    baseline). A canary the tenant may not use, or a share of 0, leaves the target alone."""
    splits: dict[str, tuple[str, float]] = {}
    canaries = snapshot.canaries
    if not canaries:
        return splits
    for target, _ in route.targets:
        split = canaries.get(target)
        if split is None or not tenant.may_use_group(split.canary):
            continue
        share = split.share_for(tenant.name)
        if share > 0.0:
            splits[target] = (split.canary, share)
    return splits


class ExchangeRecord(NamedTuple):
    """What one request asked, what was chosen for it and how it went: the one value the
    access log and the metrics read (and what the simulator can report per route and
    tenant). The first thirteen fields, in order, are those that repeat from request to
    request (the access log renders them once per combination: `record[:FIXED_FIELDS]`).

    `group`: where it was served (after any failover or fallback, which `via` tells);
    `instance`: the one that answered or was tried last; `mirror`: the group a copy went to.
    `t0`: when its first byte was read (the gateway's `perf_counter` seconds); `queue_ms`:
    its wait for a slot; `latency_s`: first byte to its end; `served_s`: `latency_s` less
    the queue wait (its time at the instance); `answer`: the status the instance gave it
    (0: none, its connection failed or its answer was cut off, or no instance was tried).
    """

    method: bytes
    url: bytes
    status: int
    tenant: str | None
    model: str | None
    priority: str | None
    route: str | None
    group: str | None
    instance: str | None
    via: str | None
    mirror: str | None
    retried: bool
    error_code: str | None
    request_id: bytes
    t0: float
    queue_ms: float
    latency_s: float
    served_s: float
    bytes_out: int
    answer: int


FIXED_FIELDS = 13
"""`ExchangeRecord` fields that repeat from request to request (see there)."""
