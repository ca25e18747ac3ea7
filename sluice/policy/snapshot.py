"""Build the gateway's RoutingSnapshot from the spec, the READY instances and the failovers.

Explicit routes come first, in spec order. After them, every model gets an implicit rule to
the first group (in spec order) that serves it, tagged `default:<model>`, so a group that
serves a model is reachable without writing a rule, and the tag still says which path won.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sluice.policy.routing import (
    CanarySplit,
    Endpoint,
    GroupTraffic,
    PrefixRouting,
    RouteRule,
    RouteTable,
    RoutingSnapshot,
    TenantAccess,
    WakeCall,
    api_key_digest,
)
from sluice.spec.models import (
    GroupSpec,
    PlatformSpec,
    PrefixRoutingSpec,
    RouteSpec,
    TenantSpec,
)

__all__ = ["build_routing_snapshot", "route_rules", "tenant_access"]


def route_rules(spec: PlatformSpec) -> list[RouteRule]:
    rules = [_rule(r) for r in spec.routes]
    seen: set[str] = set()
    for g in spec.groups:
        for model in g.models:
            if model not in seen:
                seen.add(model)
                rules.append(
                    RouteRule(f"default:{model}", ((g.name, 1),), models=frozenset({model}))
                )
    return rules


def _rule(r: RouteSpec) -> RouteRule:
    m = r.match
    return RouteRule(
        tag=r.tag,
        targets=((r.to, 1),) if isinstance(r.to, str) else tuple((t.group, t.weight) for t in r.to),
        tenants=frozenset(m.tenants),
        models=frozenset(m.models),
        priorities=frozenset(m.priorities),
        headers=tuple((k.lower(), v) for k, v in sorted(m.headers.items())),
        header_prefixes=tuple((k.lower(), v) for k, v in sorted(m.header_prefixes.items())),
        fallback=tuple(r.fallback),
        mirror=(r.mirror.group, r.mirror.percent) if r.mirror else None,
    )


def tenant_access(t: TenantSpec) -> TenantAccess:
    """What tenant `t` may reach, as routing reads it."""
    limit = t.rate_limit
    return TenantAccess(
        name=t.name,
        priority=t.priority,
        models=None if "*" in t.models else frozenset(t.models),
        groups=None if "*" in t.groups else frozenset(t.groups),
        priority_header=t.priority_header,
        rate_limit=(limit.rps, limit.burst or max(1, int(limit.rps))) if limit else None,
        operator=t.operator,
        weight=t.weight,
    )


def _prefix(p: PrefixRoutingSpec | None) -> PrefixRouting | None:
    if p is None:
        return None
    return PrefixRouting(p.block_bytes, p.max_blocks, p.epsilon, p.index_blocks)


def _traffic(g: GroupSpec, standby_at: float | None = None) -> GroupTraffic:
    return GroupTraffic(
        max_queue=g.queue.max_length,
        max_wait_s=g.queue.max_wait_s,
        timeout_s=g.timeout_s,
        slow_start_s=g.slow_start_s,
        affinity_header=g.affinity_header.lower() if g.affinity_header else None,
        outlier_failures=g.outlier.consecutive_failures,
        outlier_base_ejection_s=g.outlier.base_ejection_s,
        outlier_max_ejection_s=g.outlier.max_ejection_s,
        outlier_max_ejected_percent=g.outlier.max_ejected_percent,
        outlier_latency_ratio=g.outlier.latency_ratio if g.outlier.latency else 0.0,
        outlier_latency_min_requests=g.outlier.latency_min_requests,
        prefix=_prefix(g.prefix_choice()),
        ask_stream_usage=g.ask_stream_usage,
        buffer_when_cold=g.autoscaling is not None
        and g.autoscaling.min == 0
        and g.autoscaling.mode == "active",
        wake=_wake(g),
        standby_at=standby_at,
    )


def _wake(g: GroupSpec) -> WakeCall | None:
    """The group's wake call, where it keeps sleeping standby (`GroupSpec.sleep`)."""
    if g.autoscaling is None or not g.autoscaling.sleeping_standby:
        return None
    sleep = g.sleep
    return WakeCall(sleep.wake_path, sleep.wake_timeout_s) if sleep is not None else None


def build_routing_snapshot(
    spec: PlatformSpec,
    ready: Mapping[str, Sequence[Endpoint]],
    version: int,
    redirects: Mapping[str, str] | None = None,
    canaries: Sequence[CanarySplit] = (),
    standby: Mapping[str, Sequence[Endpoint]] | None = None,
    sleeping: Mapping[str, Sequence[Endpoint]] | None = None,
    standby_at: Mapping[str, float] | None = None,
) -> RoutingSnapshot:
    """`ready[group]`: the group's READY endpoints in rotation; `standby[group]`: its ready
    warm standby, out of it; `sleeping[group]`: its asleep standby; `standby_at[group]`: the
    in-flight level that takes its standby in (`GroupTraffic.standby_at`); `redirects[group]
    = backup`: failovers in force; `version` numbers the snapshot."""
    tenants: dict[str, TenantAccess] = {}
    for t in spec.tenants:
        access = tenant_access(t)
        for key in t.api_keys:
            tenants[api_key_digest(key)] = access
        for digest in t.api_key_sha256:
            tenants[digest.lower()] = access
    return RoutingSnapshot(
        version=version,
        routes=RouteTable(route_rules(spec)),
        tenants_by_key=tenants,
        endpoints={g.name: tuple(ready.get(g.name, ())) for g in spec.groups},
        group_models={g.name: frozenset(g.models) for g in spec.groups},
        all_models=frozenset(m for g in spec.groups for m in g.models),
        redirects=dict(redirects or {}),
        traffic={g.name: _traffic(g, (standby_at or {}).get(g.name)) for g in spec.groups},
        canaries={c.baseline: c for c in canaries},
        limits=spec.gateway.limits,
        standby={g: tuple(eps) for g, eps in (standby or {}).items() if eps},
        sleeping={g: tuple(eps) for g, eps in (sleeping or {}).items() if eps},
    )
