"""What every connection of one gateway shares: the current snapshot, load, pool, log."""

from __future__ import annotations

import random

from sluice.gateway.accesslog import AccessLog
from sluice.gateway.responses import sluice_headers
from sluice.gateway.upstream import UpstreamPool
from sluice.policy.routing import Route, RouteTable, RoutingSnapshot, TenantAccess

__all__ = ["EMPTY_SNAPSHOT", "GatewayState"]

_MEMO_MAX = 8192  # entries per memo; past that it is cleared (keys may be random garbage)
_BEARER = b"bearer "

EMPTY_SNAPSHOT = RoutingSnapshot(
    version=0, routes=RouteTable(()), tenants_by_key={}, endpoints={}, group_models={}
)
"""Served until the controller's first `update()`: every key is unknown, so every call is 401."""


class GatewayState:
    """Mutable by design: `snapshot` is swapped whole, `outstanding` counts in-flight requests."""

    __slots__ = (
        "_rid_prefix",
        "_rid_seq",
        "_route_headers",
        "_routes",
        "_tenants",
        "access_log",
        "max_body",
        "outstanding",
        "pool",
        "rng",
        "snapshot",
    )

    def __init__(
        self,
        *,
        rng: random.Random,
        pool: UpstreamPool,
        access_log: AccessLog | None,
        max_body: int,
    ) -> None:
        self.snapshot = EMPTY_SNAPSHOT
        self.outstanding: dict[str, int] = {}
        self.rng = rng
        self.pool = pool
        self.access_log = access_log
        self.max_body = max_body
        # Request ids: a random prefix per gateway plus a counter; unique, and cheap per request.
        self._rid_prefix = b"%012x-" % rng.getrandbits(48)
        self._rid_seq = 0
        self._route_headers: dict[tuple[str | None, str | None, str | None], bytes] = {}
        # Per-snapshot memos: a snapshot never changes, so its answers can be kept until the next.
        self._tenants: dict[bytes, TenantAccess | None] = {}
        self._routes: dict[tuple[str, str], Route] = {}

    def set_snapshot(self, snapshot: RoutingSnapshot) -> None:
        self.snapshot = snapshot
        self._tenants = {}
        self._routes = {}

    def tenant_for(self, authorization: bytes) -> TenantAccess | None:
        """The tenant of an `Authorization: Bearer <key>` value, or None; memoised (sha256)."""
        memo = self._tenants
        if authorization in memo:
            return memo[authorization]
        tenant = None
        if authorization[:7].lower() == _BEARER:
            key = authorization[7:].strip().decode("latin-1")
            tenant = self.snapshot.tenant_for_key(key)
        if len(memo) >= _MEMO_MAX:
            memo.clear()
        memo[authorization] = tenant
        return tenant

    def resolve(self, tenant: TenantAccess, model: str) -> Route:
        """`snapshot.resolve`, memoised per (tenant name, model); refusals are not memoised."""
        key = (tenant.name, model)
        route = self._routes.get(key)
        if route is None:
            route = self.snapshot.resolve(tenant, model)
            if len(self._routes) >= _MEMO_MAX:
                self._routes.clear()
            self._routes[key] = route
        return route

    def next_request_id(self) -> bytes:
        self._rid_seq += 1
        return self._rid_prefix + b"%x" % self._rid_seq

    def route_headers(self, route: str | None, group: str | None, instance: str | None) -> bytes:
        """The `x-sluice-*` response header lines, rendered once per combination."""
        key = (route, group, instance)
        block = self._route_headers.get(key)
        if block is None:
            if len(self._route_headers) >= 4096:  # instances churn; stay bounded
                self._route_headers.clear()
            block = self._route_headers[key] = sluice_headers(route, group, instance)
        return block

    def take_slot(self, instance_id: str) -> None:
        out = self.outstanding
        out[instance_id] = out.get(instance_id, 0) + 1

    def drop_slot(self, instance_id: str) -> None:
        out = self.outstanding
        left = out[instance_id] - 1
        if left:
            out[instance_id] = left
        else:
            del out[instance_id]  # instances come and go; do not grow without bound
