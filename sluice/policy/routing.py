"""Route requests to groups: ordered rules compiled into a dict, plus the gateway's snapshot.

A request is (tenant, model). Rules are ordered and the first match wins (R1, R2). Each rule
matches a set of tenants (or any) and a set of models (or any), so one lookup tries the four
keys (t, m), (t, *), (*, m), (*, *) and keeps the lowest rule index: O(1), no scan, and the
same answer as the linear scan (`first_match`), which tests check with hypothesis.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from sluice.core.errors import Forbidden, NotFound

__all__ = [
    "ANY",
    "Endpoint",
    "Route",
    "RouteRule",
    "RouteTable",
    "RoutingSnapshot",
    "TenantAccess",
    "api_key_digest",
    "first_match",
]

ANY = "*"


def api_key_digest(key: str) -> str:
    """Keys are kept only as sha256 hex digests; the gateway hashes what callers send."""
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class RouteRule:
    """`tenants`/`models` empty means any. `group` is where matching requests go."""

    tag: str
    group: str
    tenants: frozenset[str] = frozenset()
    models: frozenset[str] = frozenset()

    def matches(self, tenant: str, model: str) -> bool:
        return (not self.tenants or tenant in self.tenants) and (
            not self.models or model in self.models
        )


@dataclass(frozen=True, slots=True)
class Route:
    """The outcome of a lookup: the rule's tag (logged on every request) and its group."""

    tag: str
    group: str
    index: int


def first_match(rules: Sequence[RouteRule], tenant: str, model: str) -> Route | None:
    """Reference semantics: the first rule (in order) that matches."""
    for i, rule in enumerate(rules):
        if rule.matches(tenant, model):
            return Route(rule.tag, rule.group, i)
    return None


class RouteTable:
    """Rules compiled into `{(tenant|*, model|*): Route}`; lookup is four dict hits."""

    __slots__ = ("_table", "rules")

    def __init__(self, rules: Iterable[RouteRule]) -> None:
        self.rules: tuple[RouteRule, ...] = tuple(rules)
        table: dict[tuple[str, str], Route] = {}
        for i, rule in enumerate(self.rules):
            route = Route(rule.tag, rule.group, i)
            for t in rule.tenants or (ANY,):
                for m in rule.models or (ANY,):
                    table.setdefault((t, m), route)  # earlier rules win
        self._table = table

    def lookup(self, tenant: str, model: str) -> Route | None:
        get = self._table.get
        best: Route | None = None
        for key in ((tenant, model), (tenant, ANY), (ANY, model), (ANY, ANY)):
            hit = get(key)
            if hit is not None and (best is None or hit.index < best.index):
                best = hit
        return best


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One ready instance as the gateway sees it."""

    instance_id: str
    host: str
    port: int
    max_concurrency: int


@dataclass(frozen=True, slots=True)
class TenantAccess:
    """What a tenant may reach (R7); `None` means everything."""

    name: str
    priority: str = "normal"
    models: frozenset[str] | None = None
    groups: frozenset[str] | None = None

    def may_use_model(self, model: str) -> bool:
        return self.models is None or model in self.models

    def may_use_group(self, group: str) -> bool:
        return self.groups is None or group in self.groups


@dataclass(frozen=True)
class RoutingSnapshot:
    """Everything the data plane needs, swapped in whole (never mutated) with a version.

    `endpoints[group]` lists the group's READY instances only; `group_models[group]` the
    model ids it serves.
    """

    version: int
    routes: RouteTable
    tenants_by_key: Mapping[str, TenantAccess]
    endpoints: Mapping[str, tuple[Endpoint, ...]]
    group_models: Mapping[str, frozenset[str]]
    all_models: frozenset[str] = field(default_factory=frozenset)

    def tenant_for_key(self, api_key: str) -> TenantAccess | None:
        return self.tenants_by_key.get(api_key_digest(api_key))

    def models_for(self, tenant: TenantAccess) -> list[str]:
        """Model ids this tenant may call and that some rule routes for it (GET /v1/models)."""
        out = []
        for model in sorted(self.all_models):
            route = self.routes.lookup(tenant.name, model)
            if (
                route is not None
                and tenant.may_use_model(model)
                and tenant.may_use_group(route.group)
            ):
                out.append(model)
        return out

    def resolve(self, tenant: TenantAccess, model: str) -> Route:
        """Route one request or raise: unknown model -> NotFound, not allowed -> Forbidden.

        The Forbidden message never names the hidden group or instance (R7).
        """
        if model not in self.all_models:
            raise NotFound(f"model {model!r} does not exist", model=model)
        if not tenant.may_use_model(model):
            raise Forbidden(f"tenant {tenant.name!r} may not use model {model!r}", model=model)
        route = self.routes.lookup(tenant.name, model)
        if route is None:
            raise NotFound(f"no route serves model {model!r} for this tenant", model=model)
        if not tenant.may_use_group(route.group) or model not in self.group_models.get(
            route.group, frozenset()
        ):
            raise Forbidden(f"tenant {tenant.name!r} may not use model {model!r}", model=model)
        return route
