"""The benchmark's platform: a generated spec (groups, tenants, ordered routes) and its snapshot.

Shared by `gateway.py` (which times route lookups in-process and picks the request to send)
and `_gateway_server.py` (which serves the same snapshot), so both see identical rules.
The spec goes through pydantic validation, `check_platform` and `build_routing_snapshot`:
the real rule compiler is exercised, not a hand-made table.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from sluice.policy.routing import Endpoint, Route, RoutingSnapshot, TenantAccess
from sluice.policy.snapshot import build_routing_snapshot
from sluice.spec.models import PlatformSpec

BACKEND_HOST = "127.0.0.1"


def model_name(i: int) -> str:
    return f"model-{i:02d}"


def tenant_name(i: int) -> str:
    return f"tenant-{i:02d}"


def tenant_key(i: int) -> str:
    key = f"sk-bench-{i:02d}"  # + 16 hex digits of its sha256: strong enough for `apply`
    return f"{key}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def group_name(i: int) -> str:
    return f"g{i:03d}"


def spec_dict(
    *, groups: int = 100, routes: int = 1000, tenants: int = 20, models: int = 50, replicas: int = 2
) -> dict[str, Any]:
    """Group j serves models j and j + models/2 (mod models), so each model has several groups.

    Routes cover tenants x models in order: rule i sends tenant (i // models) % tenants asking
    for model i % models to one of the groups that serve that model (which one varies by
    tenant). Every tenant has one API key and may use everything.
    """
    half = max(1, models // 2)
    serving: dict[int, list[int]] = {m: [] for m in range(models)}
    group_list = []
    for j in range(groups):
        served = sorted({j % models, (j + half) % models})
        for m in served:
            serving[m].append(j)
        group_list.append(
            {
                "name": group_name(j),
                "owner": f"owner{j % 7}@example.com",
                "business": f"biz-{j % 5}",
                "alert_channel": f"#oncall-{j % 5}",
                "models": {
                    model_name(m): {"runtime": "sim", "sim": {"memory_gb": 1}} for m in served
                },
                "resources": {"pool": "bench", "accelerators": 1, "memory_gb": 4},
                "max_concurrency": 64,
                "replicas": replicas,
            }
        )
    route_list = []
    for i in range(routes):
        t = (i // models) % tenants
        m = i % models
        candidates = serving[m] or [0]
        route_list.append(
            {
                "tag": f"r{i:04d}-t{t:02d}-m{m:02d}",
                "match": {"tenants": [tenant_name(t)], "models": [model_name(m)]},
                "to": group_name(candidates[t % len(candidates)]),
            }
        )
    return {
        "gateway": {"host": "127.0.0.1", "port": 0},
        "pools": [
            {
                "name": "bench",
                "accelerator": "virtual",
                "count": groups * max(replicas, 1),
                "memory_gb": 16,
            }
        ],
        "groups": group_list,
        "tenants": [
            {"name": tenant_name(t), "api_keys": [tenant_key(t)], "business": "bench"}
            for t in range(tenants)
        ],
        "routes": route_list,
    }


def make_spec(**kwargs: int) -> PlatformSpec:
    spec = PlatformSpec.model_validate(spec_dict(**kwargs))
    try:
        from sluice.spec.checks import check_platform
    except ImportError:  # the checks moved: validation above still ran
        return spec
    problems = check_platform(spec)
    if problems:
        shown = "; ".join(f"{'.'.join(map(str, p))}: {msg}" for p, msg in problems[:5])
        raise ValueError(f"generated spec has {len(problems)} problem(s): {shown}")
    return spec


def make_snapshot(
    spec: PlatformSpec, port: int, *, host: str = BACKEND_HOST, version: int = 1
) -> RoutingSnapshot:
    """Every group's `replicas` endpoints point at the one backend `host:port`."""
    ready = {
        g.name: [
            Endpoint(f"{g.name}-{r}", host, port, g.max_concurrency)
            for r in range(max(g.replicas, 1))
        ]
        for g in spec.groups
    }
    return build_routing_snapshot(spec, ready, version)


def lookup_args(access: TenantAccess, model: str) -> tuple[tuple[object, ...], tuple[object, ...]]:
    """Arguments for (`routes.lookup`, `snapshot.resolve`) under either routing API.

    The table takes a `RequestMeta` where the routing module has one, else (tenant, model).
    """
    try:
        from sluice.policy.routing import RequestMeta  # type: ignore[attr-defined]
    except ImportError:
        return (access.name, model), (access, model)
    meta = RequestMeta(access.name, model, access.priority)
    return (meta,), (access, meta)


def lookup(snapshot: RoutingSnapshot, access: TenantAccess, model: str) -> Route | None:
    return snapshot.routes.lookup(*lookup_args(access, model)[0])  # type: ignore[arg-type]


@dataclass(frozen=True)
class Target:
    """The request the benchmark sends: a valid key, and a (tenant, model) matching rule `index`."""

    tenant: str
    api_key: str
    model: str
    tag: str
    group: str
    index: int


def pick_target(spec: PlatformSpec, snapshot: RoutingSnapshot) -> Target:
    """The (tenant, model) pair whose first matching rule is the latest explicit rule."""
    keys = {t.name: t.api_keys[0] for t in spec.tenants if t.api_keys}
    access = {a.name: a for a in snapshot.tenants_by_key.values()}
    models = sorted({m for g in spec.groups for m in g.models})
    best = None
    for tenant in keys:
        for model in models:
            route = lookup(snapshot, access[tenant], model)
            if route is None or route.index >= len(spec.routes):
                continue  # an implicit default rule, not one of the spec's routes
            if best is None or route.index > best[2].index:
                best = (tenant, model, route)
    if best is None:
        raise ValueError("no explicit route matches any (tenant, model)")
    tenant, model, route = best
    return Target(tenant, keys[tenant], model, route.tag, route.group, route.index)
