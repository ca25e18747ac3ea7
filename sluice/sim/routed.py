"""A trace of callers, not of groups: each request's tenant, model and asked priority go
through the gateway's own decisions (the tenant's rate limit, `sluice.policy.ratelimit`;
then the route choice, `sluice.policy.route_choice.choose`, on a routing snapshot of the
spec), which name its route, its group and its admission priority; the fleet simulator then
runs each group's share, and the outcomes are read back per route and per tenant.

What the gateway decides later, with live state, is not simulated: a request whose first
choice is full waits in that group's queue rather than trying a fallback group, and there
are no canary splits or failovers (those come from a running controller).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from sluice.core.errors import Forbidden, NotFound, SpecError, SpecIssue
from sluice.policy.ratelimit import TokenBucket
from sluice.policy.route_choice import RoutePlan, RouteRequest, plan
from sluice.policy.routing import PRIORITIES
from sluice.policy.snapshot import build_routing_snapshot, tenant_access
from sluice.sim.codes import FAILED, REJECTED
from sluice.sim.fleet_report import FleetResult
from sluice.sim.trace import Trace
from sluice.spec import PlatformSpec

__all__ = ["REFUSALS", "RoutedTrace", "route_trace", "routed_outcomes"]

REFUSALS = ("unknown_tenant", "rate_limited", "no_route", "forbidden")
"""Why the gateway answered a request itself (401, 429, 404, 403), by index in `group_of`
(-1 - index)."""


@dataclass(frozen=True)
class RoutedTrace:
    """`groups[name]`: the group's requests (its priority the chosen one); `positions[name]`:
    where each of them is in the caller trace; per caller request, `group_of` (the group's
    index in `group_names`, or -1 - the `REFUSALS` index) and `route_of` (the index of its
    route tag in `tags`, -1 when refused before a route)."""

    trace: Trace
    group_names: tuple[str, ...]
    groups: Mapping[str, Trace]
    positions: Mapping[str, npt.NDArray[np.int64]]
    group_of: npt.NDArray[np.int32]
    tags: tuple[str, ...]
    route_of: npt.NDArray[np.int32]


def route_trace(spec: PlatformSpec, trace: Trace, seed: int = 0) -> RoutedTrace:
    """Route every request of `trace` as the gateway would (module docstring); the draws
    (weighted targets, mirrors) come from one `random.Random(seed)`."""
    if not any(trace.tenants):
        fix = "add a `tenant` column naming each request's tenant (one of the spec's tenants)"
        raise SpecError([SpecIssue("--trace", f"a routed simulation needs tenants; {fix}")])
    snapshot = build_routing_snapshot(spec, {}, 0)
    access = {t.name: tenant_access(t) for t in spec.tenants}
    buckets: dict[str, TokenBucket] = {}
    names = tuple(g.name for g in spec.groups)
    group_index = {n: i for i, n in enumerate(names)}
    rng = random.Random(seed)
    plans: dict[tuple[int, int, int], RoutePlan | int] = {}
    tags: dict[str, int] = {}
    n = len(trace)
    group_of = np.empty(n, dtype=np.int32)
    route_of = np.full(n, -1, dtype=np.int32)
    chosen_priority = np.empty(n, dtype=np.int8)
    prio_index = {p: i for i, p in enumerate(PRIORITIES)}
    t_list = trace.t.tolist()
    tenants, models, prios = trace.tenant.tolist(), trace.model.tolist(), trace.priority.tolist()
    for i in range(n):
        name = trace.tenants[tenants[i]]
        tenant = access.get(name)
        if tenant is None:
            group_of[i] = -1 - REFUSALS.index("unknown_tenant")
            continue
        if tenant.rate_limit is not None:
            bucket = buckets.get(name)
            if bucket is None:
                rate, burst = tenant.rate_limit
                bucket = buckets[name] = TokenBucket(rate, burst, t_list[i])
            if bucket.try_take(t_list[i]) > 0.0:
                group_of[i] = -1 - REFUSALS.index("rate_limited")
                continue
        key = (tenants[i], models[i], prios[i])
        found = plans.get(key)
        if found is None:
            request = RouteRequest(tenant, trace.models[models[i]], PRIORITIES[prios[i]])
            try:
                found = plan(snapshot, request)
            except NotFound:
                found = -1 - REFUSALS.index("no_route")
            except Forbidden:
                found = -1 - REFUSALS.index("forbidden")
            plans[key] = found
        if isinstance(found, int):
            group_of[i] = found
            continue
        choice = found.draw(rng)
        group_of[i] = group_index[choice.group]
        route_of[i] = tags.setdefault(choice.tag, len(tags))
        chosen_priority[i] = prio_index[choice.priority]
    groups: dict[str, Trace] = {}
    positions: dict[str, npt.NDArray[np.int64]] = {}
    for gi, gname in enumerate(names):
        idx = np.nonzero(group_of == gi)[0].astype(np.int64)
        if not idx.size:
            continue
        positions[gname] = idx
        groups[gname] = Trace(
            name=f"{trace.name}[{gname}]",
            t=np.ascontiguousarray(trace.t[idx]),
            input_tokens=trace.input_tokens[idx],
            output_tokens=trace.output_tokens[idx],
            model=trace.model[idx],
            models=trace.models,
            priority=chosen_priority[idx],
            tenant=trace.tenant[idx],
            tenants=trace.tenants,
        )
    return RoutedTrace(
        trace=trace,
        group_names=names,
        groups=groups,
        positions=positions,
        group_of=group_of,
        tags=tuple(sorted(tags, key=tags.__getitem__)),
        route_of=route_of,
    )


def routed_outcomes(routed: RoutedTrace, result: FleetResult) -> dict[str, Any]:
    """Per route and per tenant: requests, answered by the gateway itself (by reason),
    completed, rejected or failed in the group, SLO attainment (each request against its
    group's bound; one the gateway refused counts as a miss), latency percentiles
    (`p50_ms`, `p95_ms`, `p99_ms`: arrival to done) and queue-wait percentiles (`wait_p50_ms`,
    `wait_p95_ms`, `wait_p99_ms`: arrival to the start of service, in its group's queue where
    tenants share by weight), all over completed requests (None without any)."""
    n = len(routed.trace)
    done = np.full(n, np.nan)
    service = np.full(n, np.nan)
    in_slo = np.zeros(n, dtype=np.bool_)
    for gname, idx in routed.positions.items():
        sim = result.groups[gname].sim
        done[idx] = sim.done
        service[idx] = sim.workload.service
        in_slo[idx] = sim.in_slo_mask()  # its group's bounds: latency, TTFT, TPOT
    latency = done - routed.trace.t
    wait = np.maximum(latency - service, 0.0)
    ok = done >= 0
    tenant_names = routed.trace.tenants

    def outcome(mask: npt.NDArray[np.bool_]) -> dict[str, Any]:
        count = int(mask.sum())
        refused = {
            why: int(np.count_nonzero(mask & (routed.group_of == -1 - k)))
            for k, why in enumerate(REFUSALS)
        }
        served = mask & ok
        lat, waits = latency[served], wait[served]

        def ms(xs: npt.NDArray[np.float64], q: float) -> float | None:
            return float(np.percentile(xs, q) * 1000) if xs.size else None

        return {
            "requests": count,
            "refused": {k: v for k, v in refused.items() if v},
            "completed": int(served.sum()),
            "failed": int(np.count_nonzero(mask & (done == FAILED))),
            "rejected": int(np.count_nonzero(mask & (done == REJECTED))),
            "slo_attainment": float(np.count_nonzero(mask & in_slo)) / count if count else 1.0,
            "p50_ms": ms(lat, 50),
            "p95_ms": ms(lat, 95),
            "p99_ms": ms(lat, 99),
            "wait_p50_ms": ms(waits, 50),
            "wait_p95_ms": ms(waits, 95),
            "wait_p99_ms": ms(waits, 99),
        }

    routes: dict[str, Any] = {}
    for k, tag in enumerate(routed.tags):
        mask = routed.route_of == k
        groups = sorted({routed.group_names[g] for g in np.unique(routed.group_of[mask])})
        routes[tag] = {"groups": groups, **outcome(mask)}
    tenants = {
        name: outcome(routed.trace.tenant == k)
        for k, name in enumerate(tenant_names)
        if np.any(routed.trace.tenant == k)
    }
    return {"routes": routes, "tenants": tenants}
