"""Route requests to groups: ordered rules compiled into a dict, plus the gateway's snapshot.

A request is described by `RequestMeta` (tenant, model, priority, headers). Rules are
ordered and the first match wins (R1, R2). Each rule matches a set of tenants (or any) and
a set of models (or any), and optionally priorities and header values. Compilation indexes
rule numbers under the keys (t, m), (t, *), (*, m), (*, *); a lookup walks those four short
sorted lists and stops at the first rule whose remaining conditions hold, so it costs a few
dict hits instead of a scan over all rules, and returns exactly what the ordered scan
(`first_match`) returns, which a hypothesis test checks.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from random import Random
from types import MappingProxyType

from sluice.core.errors import Forbidden, NotFound
from sluice.spec.models import GatewayLimits

__all__ = [
    "ANY",
    "DIRECT_ROUTE_TAG",
    "PRIORITIES",
    "CanarySplit",
    "Endpoint",
    "GroupTraffic",
    "PrefixRouting",
    "RequestMeta",
    "Route",
    "RouteRule",
    "RouteTable",
    "RoutingSnapshot",
    "TenantAccess",
    "WakeCall",
    "api_key_digest",
    "first_match",
]

ANY = "*"
PRIORITIES = ("high", "normal", "low")
"""Highest first: admission serves `high` first and sheds `low` first (R6)."""
STANDBY_HOLD_S = 30.0
"""How long a group's warm standby that a gateway put in rotation (requests waited) stays
there after the last request that waited, unless the controller's count in force takes it
in first (its next decision does): about one start-up."""
_NO_HEADERS: Mapping[str, str] = MappingProxyType({})


def api_key_digest(key: str) -> str:
    """Keys are kept only as sha256 hex digests; the gateway hashes what callers send."""
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class RequestMeta:
    """What routing may look at. `headers` has lower-case names (only those rules use)."""

    tenant: str
    model: str
    priority: str = "normal"
    headers: Mapping[str, str] = field(default_factory=lambda: _NO_HEADERS)


@dataclass(frozen=True, slots=True)
class RouteRule:
    """One rule. Empty sets mean any. `targets` are (group, weight) pairs."""

    tag: str
    targets: tuple[tuple[str, int], ...]
    tenants: frozenset[str] = frozenset()
    models: frozenset[str] = frozenset()
    priorities: frozenset[str] = frozenset()
    headers: tuple[tuple[str, str], ...] = ()
    header_prefixes: tuple[tuple[str, str], ...] = ()
    fallback: tuple[str, ...] = ()
    mirror: tuple[str, float] | None = None
    """(group, percent of matching requests shadowed there)."""

    @property
    def conditional(self) -> bool:
        """True if the rule looks at more than tenant and model."""
        return bool(self.priorities or self.headers or self.header_prefixes)

    def matches_conditions(self, meta: RequestMeta) -> bool:
        """Priority and header conditions (tenant and model are the index's job)."""
        if self.priorities and meta.priority not in self.priorities:
            return False
        get = meta.headers.get
        for name, value in self.headers:
            if get(name) != value:
                return False
        for name, prefix in self.header_prefixes:
            got = get(name)
            if got is None or not got.startswith(prefix):
                return False
        return True

    def matches(self, meta: RequestMeta) -> bool:
        return (
            (not self.tenants or meta.tenant in self.tenants)
            and (not self.models or meta.model in self.models)
            and self.matches_conditions(meta)
        )


@dataclass(frozen=True, slots=True)
class Route:
    """The outcome of a lookup: the rule's tag (logged on every request), its position,
    where its traffic goes, where it may fall back, and what it mirrors."""

    tag: str
    index: int
    targets: tuple[tuple[str, int], ...]
    fallback: tuple[str, ...] = ()
    mirror: tuple[str, float] | None = None
    _cumulative: tuple[int, ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_cumulative", tuple(accumulate(w for _, w in self.targets)))

    @property
    def group(self) -> str:
        """The first (for a single-target rule, the only) target group."""
        return self.targets[0][0]

    def pick_group(self, rng: Random) -> str:
        """A target group drawn by weight (a 90/10 rule sends ~90% to the first)."""
        if len(self.targets) == 1:
            return self.targets[0][0]
        x = rng.random() * self._cumulative[-1]
        return self.targets[bisect_right(self._cumulative, x)][0]


def first_match(rules: Sequence[RouteRule], meta: RequestMeta) -> Route | None:
    """Reference semantics: the first rule (in order) that matches."""
    for i, rule in enumerate(rules):
        if rule.matches(meta):
            return _route(rule, i)
    return None


def _route(rule: RouteRule, index: int) -> Route:
    return Route(rule.tag, index, rule.targets, rule.fallback, rule.mirror)


class RouteTable:
    """Rules compiled into `{(tenant|*, model|*): (rule numbers ascending)}`."""

    __slots__ = ("_routes", "_table", "rules", "uses_headers", "uses_priority")

    def __init__(self, rules: Iterable[RouteRule]) -> None:
        self.rules: tuple[RouteRule, ...] = tuple(rules)
        index: dict[tuple[str, str], list[int]] = {}
        for i, rule in enumerate(self.rules):
            for t in rule.tenants or (ANY,):
                for m in rule.models or (ANY,):
                    index.setdefault((t, m), []).append(i)
        self._table = {key: tuple(nums) for key, nums in index.items()}
        self._routes = tuple(_route(rule, i) for i, rule in enumerate(self.rules))
        self.uses_headers = any(r.headers or r.header_prefixes for r in self.rules)
        """The gateway only builds a header map for rules when some rule needs one."""
        self.uses_priority = any(r.priorities for r in self.rules)

    def lookup(self, meta: RequestMeta) -> Route | None:
        get = self._table.get
        rules = self.rules
        t, m = meta.tenant, meta.model
        best = -1
        for key in ((t, m), (t, ANY), (ANY, m), (ANY, ANY)):
            nums = get(key)
            if nums is None:
                continue
            for i in nums:
                if best >= 0 and i >= best:
                    break
                rule = rules[i]
                if not rule.conditional or rule.matches_conditions(meta):
                    best = i
                    break
        return self._routes[best] if best >= 0 else None


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One ready instance as the gateway sees it. `ready_at`: when it became READY
    (seconds, the controller's clock), for slow start. `api_key_env`: the environment
    variable whose value the gateway sends it as `Authorization: Bearer` (an external
    endpoint that needs a key; the name travels, never the key)."""

    instance_id: str
    host: str
    port: int
    max_concurrency: int
    ready_at: float = 0.0
    api_key_env: str | None = None


@dataclass(frozen=True, slots=True)
class PrefixRouting:
    """A group's prefix-cache-aware choice (`sluice.policy.prefix`): blocks of `block_bytes`
    prompt bytes, at most `max_blocks` hashed, `epsilon` the load guard, `index_blocks` the
    blocks remembered per instance."""

    block_bytes: int = 2048
    max_blocks: int = 64
    epsilon: float = 1.0
    index_blocks: int = 8192


@dataclass(frozen=True, slots=True)
class WakeCall:
    """POST `path` on a sleeping instance wakes it (vLLM: /wake_up); longer than `timeout_s`
    is a failed wake."""

    path: str = "/wake_up"
    timeout_s: float = 30.0


@dataclass(frozen=True, slots=True)
class GroupTraffic:
    """A group's data-plane settings: its queue, timeouts, slow start, outlier ejection."""

    max_queue: int = 100
    max_wait_s: float = 10.0
    timeout_s: float = 300.0
    slow_start_s: float = 10.0
    affinity_header: str | None = None
    outlier_failures: int = 5
    outlier_base_ejection_s: float = 30.0
    outlier_max_ejection_s: float = 300.0
    outlier_max_ejected_percent: int = 50
    outlier_latency_ratio: float = 3.0
    """Eject an instance whose typical latency is this many times its peers' (`policy.latency`);
    0.0 turns latency ejection off."""
    outlier_latency_min_requests: int = 20
    prefix: PrefixRouting | None = None
    """Choose instances by the prompt's cached prefix; None: power of two choices."""
    ask_stream_usage: bool = True
    """Ask servers for a stream's token usage where its caller did not (`policy.answers`)."""
    buffer_when_cold: bool = False
    """Scale-to-zero group: with no ready instance, requests wait in the queue (up to its
    max wait) while the first instance starts, instead of a 503."""
    wake: WakeCall | None = None
    """How a gateway wakes the group's sleeping standby (`autoscaling.sleeping_standby`)."""
    standby_at: float | None = None
    """Requests in flight per instance in rotation past which a gateway takes the group's
    standby in before any waits (`sluice.policy.standby.standby_level`: a batching server's
    capacity at the SLO); None: when requests wait."""


@dataclass(frozen=True, slots=True)
class TenantAccess:
    """What a tenant may reach (R7); `None` means everything."""

    name: str
    priority: str = "normal"
    models: frozenset[str] | None = None
    groups: frozenset[str] | None = None
    priority_header: bool = False
    rate_limit: tuple[float, int] | None = None
    """(requests per second, burst) for this tenant's token bucket, or no limit."""
    operator: bool = False
    """May address a group directly with `x-sluice-group` (compare runs, debugging)."""
    weight: float = 1.0
    """Its share of a busy group's slots against tenants of the same priority (`admission`)."""

    def may_use_model(self, model: str) -> bool:
        return self.models is None or model in self.models

    def may_use_group(self, group: str) -> bool:
        return self.groups is None or group in self.groups

    def priority_for(self, requested: str | None) -> str:
        """The request's priority: the tenant's, or the header's if the tenant may set it."""
        if requested is not None and self.priority_header and requested in PRIORITIES:
            return requested
        return self.priority


@dataclass(frozen=True, slots=True)
class CanarySplit:
    """How the gateway splits requests its routes sent to `baseline` (percent of them, 0-100,
    that go to `canary` instead), by the caller's tenant (C4; `sluice.policy.rollouts`
    decides the numbers per step):

    - `early_tenants` get `early_percent`, `late_tenants` get `late_percent` (0 until the
      rollout reached their step: they stay on the baseline);
    - everyone else gets `percent`.
    Requests routed to other groups are untouched."""

    baseline: str
    canary: str
    percent: float
    early_percent: float = 0.0
    late_percent: float = 0.0
    early_tenants: frozenset[str] = frozenset()
    late_tenants: frozenset[str] = frozenset()

    def share_for(self, tenant: str | None) -> float:
        """Percent (0-100) of this tenant's baseline-bound requests that go to the canary."""
        if tenant is not None and tenant in self.early_tenants:
            return self.early_percent
        if tenant is not None and tenant in self.late_tenants:
            return self.late_percent
        return self.percent

    @property
    def excluded_tenants(self) -> frozenset[str]:
        """Listed tenants that get no canary traffic at this step."""
        out = self.late_tenants if self.late_percent <= 0 else frozenset[str]()
        return out | (self.early_tenants if self.early_percent <= 0 else frozenset())

    def pick(self, tenant: str, rng: Random) -> str:
        """The group for one baseline-bound request of `tenant`."""
        return self.canary if rng.random() * 100.0 < self.share_for(tenant) else self.baseline


DIRECT_ROUTE_TAG = "operator-direct"
"""The route tag of requests an operator sent to a group by name (`x-sluice-group`)."""


@dataclass(frozen=True)
class RoutingSnapshot:
    """Everything the data plane needs, swapped in whole (never mutated) with a version.

    `endpoints[group]` lists the group's READY instances only; `redirects[group] = backup`
    is the escape hatch (R3): all of the group's traffic goes to `backup` instead.
    """

    version: int
    routes: RouteTable
    tenants_by_key: Mapping[str, TenantAccess]
    endpoints: Mapping[str, tuple[Endpoint, ...]]
    group_models: Mapping[str, frozenset[str]]
    all_models: frozenset[str] = field(default_factory=frozenset)
    redirects: Mapping[str, str] = field(default_factory=dict)
    traffic: Mapping[str, GroupTraffic] = field(default_factory=dict)
    canaries: Mapping[str, CanarySplit] = field(default_factory=dict)
    """baseline group -> the rollout split in force for its traffic"""
    limits: GatewayLimits | None = None
    """`gateway.limits` of the revision in force, so that an `apply` changing them reaches a
    running gateway the way routes do; None keeps the limits the gateway has."""
    standby: Mapping[str, tuple[Endpoint, ...]] = field(default_factory=dict)
    """A warm-standby group's ready instances kept out of rotation (its newest): a gateway
    puts them in at once when requests start to wait (`GroupRuntime.promote`), before the
    controller's next tick has seen the burst."""
    sleeping: Mapping[str, tuple[Endpoint, ...]] = field(default_factory=dict)
    """A group's sleeping standby (asleep, out of rotation): a gateway whose requests still
    wait once its warm standby is in rotation wakes as many as they need, at once
    (`GroupTraffic.wake`, `sleepers_to_wake`), and puts them in rotation."""
    epoch: int = 0
    """The lease epoch of the leader that published it (0: no leader election, a test): a
    gateway never swaps in a snapshot of an older epoch than it has, so a deposed leader's
    routes cannot come back (`version` numbers a leader's snapshots; each leader starts
    again from 1)."""

    def tenant_for_key(self, api_key: str) -> TenantAccess | None:
        return self.tenants_by_key.get(api_key_digest(api_key))

    def models_for(self, tenant: TenantAccess) -> list[str]:
        """Model ids this tenant may call and that some rule routes for it (GET /v1/models)."""
        out = []
        for model in sorted(self.all_models):
            route = self.routes.lookup(RequestMeta(tenant.name, model, tenant.priority))
            if (
                route is not None
                and tenant.may_use_model(model)
                and all(tenant.may_use_group(g) for g, _ in route.targets)
            ):
                out.append(model)
        return out

    def resolve(self, tenant: TenantAccess, meta: RequestMeta) -> Route:
        """Route one request or raise: unknown model -> NotFound, not allowed -> Forbidden.

        The Forbidden message never names a group or instance (R7).
        """
        model = meta.model
        if model not in self.all_models:
            raise NotFound(f"model {model!r} does not exist", model=model)
        if not tenant.may_use_model(model):
            raise Forbidden(f"this API key may not use model {model!r}", model=model)
        route = self.routes.lookup(meta)
        if route is None:
            raise NotFound(f"no route serves model {model!r} for this caller", model=model)
        for group, _ in route.targets:
            if not tenant.may_use_group(group) or model not in self.group_models.get(
                group, frozenset()
            ):
                raise Forbidden(f"this API key may not use model {model!r}", model=model)
        return route

    def direct(self, tenant: TenantAccess, group: str, model: str) -> Route:
        """An operator's request for one named group, bypassing the rules (compare runs)."""
        if not tenant.operator:
            raise Forbidden("only operator keys may choose a group with x-sluice-group")
        if model not in self.group_models.get(group, frozenset()):
            raise NotFound(f"no group {group!r} serving model {model!r}", model=model)
        return Route(DIRECT_ROUTE_TAG, -1, ((group, 1),))

    def serving_group(self, group: str) -> tuple[str, str | None]:
        """(group that serves `group`'s traffic now, why if it is another one)."""
        backup = self.redirects.get(group)
        if backup is None:
            return group, None
        return backup, f"failover {group}->{backup}"

    def fallbacks(self, route: Route, tenant: TenantAccess, model: str) -> list[str]:
        """The route's fallback groups this tenant may use and that serve the model, in
        order; never the route's own targets (no loops)."""
        own = {g for g, _ in route.targets}
        return [
            g
            for g in route.fallback
            if g not in own
            and tenant.may_use_group(g)
            and model in self.group_models.get(g, frozenset())
        ]
