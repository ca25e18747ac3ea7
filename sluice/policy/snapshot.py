"""Build the gateway's RoutingSnapshot from the spec and the READY instances.

Explicit routes come first, in spec order. After them, every model gets an implicit rule to
the first group (in spec order) that serves it, tagged `default:<model>`, so a group that
serves a model is reachable without writing a rule, and the tag still says which path won.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sluice.policy.routing import (
    Endpoint,
    RouteRule,
    RouteTable,
    RoutingSnapshot,
    TenantAccess,
    api_key_digest,
)
from sluice.spec.models import PlatformSpec

__all__ = ["build_routing_snapshot", "route_rules"]


def route_rules(spec: PlatformSpec) -> list[RouteRule]:
    rules = [
        RouteRule(r.tag, r.to, frozenset(r.match.tenants), frozenset(r.match.models))
        for r in spec.routes
    ]
    seen: set[str] = set()
    for g in spec.groups:
        for model in g.models:
            if model not in seen:
                seen.add(model)
                rules.append(RouteRule(f"default:{model}", g.name, models=frozenset({model})))
    return rules


def build_routing_snapshot(
    spec: PlatformSpec,
    ready: Mapping[str, Sequence[Endpoint]],
    version: int,
) -> RoutingSnapshot:
    """`ready[group]`: the group's READY endpoints; `version` numbers the snapshot."""
    tenants: dict[str, TenantAccess] = {}
    for t in spec.tenants:
        access = TenantAccess(
            name=t.name,
            priority=t.priority,
            models=None if "*" in t.models else frozenset(t.models),
            groups=None if "*" in t.groups else frozenset(t.groups),
        )
        for key in t.api_keys:
            tenants[api_key_digest(key)] = access
    endpoints = {g.name: tuple(ready.get(g.name, ())) for g in spec.groups}
    group_models = {g.name: frozenset(g.models) for g in spec.groups}
    all_models = frozenset(m for g in spec.groups for m in g.models)
    return RoutingSnapshot(
        version=version,
        routes=RouteTable(route_rules(spec)),
        tenants_by_key=tenants,
        endpoints=endpoints,
        group_models=group_models,
        all_models=all_models,
    )
