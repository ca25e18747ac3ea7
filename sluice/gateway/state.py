"""What every connection of one gateway shares: the snapshot, groups, load, pool, log, metrics.

Clocks: admission, ejection and rate limits run on `time.monotonic()` seconds; only slow
start reads the wall clock (see `groups`).

Rate limits: a tenant's `rate_limit` holds fleet-wide, so a gateway of several enforces
only its share of it (issue 31, `sluice.policy.rate_shares`): the controller sends the
shares, and the gateway counts each limited tenant's arrivals (refused ones too) for it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Iterable, Mapping
from typing import Any, Final

from sluice.gateway.accesslog import AccessLog
from sluice.gateway.errors import QueueTimeout
from sluice.gateway.groups import GroupRuntime, Waiter, header_value
from sluice.gateway.limits import Limits
from sluice.gateway.metrics import GatewayMetrics
from sluice.gateway.readiness import Readiness
from sluice.gateway.responses import sluice_headers
from sluice.gateway.samples import GatewaySampling
from sluice.gateway.upstream import UpstreamPool
from sluice.gateway.wake import wake_instance
from sluice.policy.rate_shares import RateShare, even_share
from sluice.policy.ratelimit import TokenBucket
from sluice.policy.route_choice import (
    RouteChoice,
    RoutePlan,
    RouteRequest,
    plan,
    plan_route,
    route_of,
)
from sluice.policy.routing import (
    Endpoint,
    GroupTraffic,
    Route,
    RouteTable,
    RoutingSnapshot,
    TenantAccess,
)
from sluice.policy.standby import sleepers_to_wake

log = logging.getLogger(__name__)

__all__ = ["EMPTY_SNAPSHOT", "QUEUE_TICK_S", "GatewayState"]

_MEMO_MAX: Final = 8192  # entries per memo; past that it is cleared (keys may be random garbage)
_BEARER: Final = b"bearer "
_SERVED_MAX: Final = 4096  # instances remembered in `served` before the ones gone are forgotten
_UNKNOWN: Final = TenantAccess("")  # a memo miss (None in the memo means: no such key)
_GROUP_HEADER: Final = b"x-sluice-group"  # an operator's named group (see `RouteRequest.group`)
QUEUE_TICK_S: Final = 0.05
"""How often queued requests are checked for `max_wait_s` while any wait (one timer)."""

EMPTY_SNAPSHOT = RoutingSnapshot(
    version=0, routes=RouteTable(()), tenants_by_key={}, endpoints={}, group_models={}
)
"""Served until the controller's first `update()`: every key is unknown, and the gateway is
unready (`Readiness.routed` is False), so every call is 503 (`NotReady`), not 401."""


class GatewayState:
    """Mutable by design: `snapshot` is swapped whole, `outstanding` counts in-flight requests
    per instance, `groups` hold admission and outlier state across snapshots."""

    __slots__ = (
        "_plans",
        "_promoted",
        "_queue_timer",
        "_rate_caps",
        "_rate_split",
        "_rid_prefix",
        "_rid_seq",
        "_route_headers",
        "_tenants",
        "_uses_headers",
        "_waiting",
        "_wakes",
        "access_log",
        "arrivals",
        "buckets",
        "clients_by_ip",
        "default_traffic",
        "groups",
        "limits",
        "metrics",
        "outstanding",
        "pool",
        "readiness",
        "rng",
        "sampling",
        "served",
        "snapshot",
    )

    def __init__(
        self,
        *,
        rng: random.Random,
        pool: UpstreamPool,
        access_log: AccessLog | None,
        limits: Limits | None = None,
        default_traffic: GroupTraffic | None = None,
        readiness: Readiness | None = None,
    ) -> None:
        self.snapshot = EMPTY_SNAPSHOT
        self.readiness = readiness or Readiness()
        """ready once the first snapshot is in (`set_snapshot`); read per request only on
        the way to a 401 (see `Exchange._tenant`)"""
        self.outstanding: dict[str, int] = {}
        self.served: dict[str, int] = {}
        """Requests sent to each instance, ever (explain: did traffic reach a new one?)."""
        self.rng = rng
        self.pool = pool
        self.access_log = access_log
        self.limits = limits or Limits()
        self.clients_by_ip: dict[str, int] = {}
        """Open client connections per peer address (for `max_connections_per_ip`)."""
        self.default_traffic = default_traffic or GroupTraffic()
        """Settings of a group the snapshot has no `traffic` entry for."""
        self.groups: dict[str, GroupRuntime] = {}
        self.sampling = GatewaySampling()
        """Per-request rows of the groups under canary analysis (`sample_groups`)."""
        self.buckets: dict[str, TokenBucket] = {}
        self.arrivals: dict[str, int] = {}
        """Per limited tenant: its requests that reached the rate limit, refused ones too,
        ever (the controller splits the tenant's rate by them)."""
        self._rate_split: tuple[dict[str, RateShare], int] | None = None
        """This gateway's share of each tenant's rate and the fleet's number of gateways
        (`set_rate_shares`); None: it is alone, and enforces every limit in full."""
        self._rate_caps: dict[str, float] = {}
        """Per tenant whose rate is shared: the longest Retry-After to answer."""
        self.metrics = GatewayMetrics(
            lambda: self.groups, lambda: self.snapshot.version, self.readiness
        )
        if access_log is not None:  # lines a full disk cost, on the same page
            access_log.register(self.metrics.registry)
        # Request ids: a random prefix per gateway plus a counter; unique, and cheap per request.
        self._rid_prefix = b"%012x-" % rng.getrandbits(48)
        self._rid_seq = 0
        self._route_headers: dict[tuple[str | None, str | None, str | None], bytes] = {}
        # Per-snapshot memos: a snapshot never changes, so its answers can be kept until the next.
        self._tenants: dict[bytes, TenantAccess | None] = {}
        self._plans: dict[tuple[str, str, str | None, int], RoutePlan] = {}
        self._uses_headers = False
        self._waiting: set[GroupRuntime] = set()
        self._promoted: set[GroupRuntime] = set()
        """groups whose warm standby this gateway put in rotation (`watch_queue`)"""
        self._queue_timer: asyncio.TimerHandle | None = None
        self._wakes: set[asyncio.Task[None]] = set()
        """wake calls under way (kept: the loop holds only a weak reference to a task)"""

    # -- snapshots ------------------------------------------------------------------------------

    def set_snapshot(self, snapshot: RoutingSnapshot) -> None:
        """Serve `snapshot` from now on; carry group state over, settle what it changes
        (its `limits` too, when it has them: see `Limits.configure`)."""
        now = time.monotonic()
        self.snapshot = snapshot
        self.readiness.routed = True
        if snapshot.limits is not None:
            self.limits.configure(snapshot.limits)
        self._tenants = {}
        self._plans = {}
        self._uses_headers = snapshot.routes.uses_headers
        names = {*snapshot.group_models, *snapshot.endpoints, *snapshot.traffic}
        if len(self.served) > _SERVED_MAX:  # forget instances long gone; keep the live ones
            live = {ep.instance_id for eps in snapshot.endpoints.values() for ep in eps}
            self.served = {i: n for i, n in self.served.items() if i in live}
        groups = self.groups
        orphans: list[Waiter] = []
        for name in [n for n in groups if n not in names]:
            gone = groups.pop(name)
            self._waiting.discard(gone)
            self._promoted.discard(gone)
            orphans += gone.admission.expire(math.inf)  # every waiter: the group is no more
        for name in sorted(names):
            runtime = groups.get(name)
            if runtime is None:
                runtime = groups[name] = GroupRuntime(name, self.metrics.group(name))
                runtime.samples = self.sampling.groups.get(name)
            woken = runtime.configure(
                snapshot.traffic.get(name, self.default_traffic),
                tuple(snapshot.endpoints.get(name, ())),
                now,
                tuple(snapshot.standby.get(name, ())),
                tuple(snapshot.sleeping.get(name, ())),
            )
            if woken:
                self.wake(runtime, woken, now)
            if runtime.samples is not None:  # an instance out of routing is read no more
                runtime.samples.forget({ep.instance_id for ep in runtime.endpoints})
        self._update_buckets(snapshot.tenants_by_key, now)
        self.pool.authorize(
            ep
            for group in (snapshot.endpoints, snapshot.standby, snapshot.sleeping)
            for eps in group.values()
            for ep in eps
        )
        for ex in orphans:  # last: answering one may start its client's next request
            ex.refused_in_queue(
                QueueTimeout("the group serving this request was removed"), "group_removed", now
            )

    def sample_groups(self, groups: Iterable[str]) -> None:
        """Record the answers of exactly `groups` from now on (see `samples`)."""
        if self.sampling.watch(groups):
            rings = self.sampling.groups
            for name, runtime in self.groups.items():
                runtime.samples = rings.get(name)

    def set_rate_shares(self, shares: Mapping[str, RateShare], count: int) -> None:
        """Enforce `shares[tenant]` of each limited tenant's rate from now on: this
        gateway's part, one of `count` gateways (a tenant not in `shares`: L / count)."""
        self._rate_split = (dict(shares), max(1, count))
        self._update_buckets(self.snapshot.tenants_by_key, time.monotonic())

    def _update_buckets(self, tenants: Mapping[str, TenantAccess], now: float) -> None:
        """One bucket per tenant with a limit, at this gateway's share of it. A bucket whose
        rate or burst changes keeps its tokens (`TokenBucket.retune`): the shares move every
        second, and a refill at each move would let a burst through each time."""
        limits = {t.name: t.rate_limit for t in tenants.values() if t.rate_limit is not None}
        split = self._rate_split
        old = self.buckets
        fresh: dict[str, TokenBucket] = {}
        caps: dict[str, float] = {}
        for name, (limit, limit_burst) in limits.items():
            rate, burst = float(limit), float(limit_burst)
            if split is not None and split[1] > 1:
                share = split[0].get(name) or even_share(limit, limit_burst, split[1])
                rate = min(share.rps, rate)  # never more than the whole limit, whatever it says
                burst = max(1.0, min(share.burst, burst))
                # past a wait for one token at the whole limit, the fleet has earned one and
                # the shares move toward where the demand is: no longer Retry-After than that
                caps[name] = max(1.0, 1.0 / limit)
            bucket = old.get(name)
            if bucket is None:
                bucket = TokenBucket(rate, burst, now)
            elif bucket.rate != rate or bucket.burst != burst:
                bucket.retune(rate, burst, now)
            fresh[name] = bucket
        self.buckets = fresh
        self._rate_caps = caps

    # -- per request ----------------------------------------------------------------------------

    def tenant_for(self, authorization: bytes) -> TenantAccess | None:
        """The tenant of an `Authorization: Bearer <key>` value, or None; memoised (sha256)."""
        memo = self._tenants
        tenant = memo.get(authorization, _UNKNOWN)
        if tenant is not _UNKNOWN:
            return tenant
        tenant = None
        if authorization[:7].lower() == _BEARER:
            key = authorization[7:].strip().decode("latin-1")
            tenant = self.snapshot.tenant_for_key(key)
        if len(memo) >= _MEMO_MAX:
            memo.clear()
        memo[authorization] = tenant
        return tenant

    def choose(
        self, tenant: TenantAccess, model: str, priority: str | None, headers: list[bytes]
    ) -> RouteChoice:
        """`route_choice.choose` for one request of `tenant` (`priority`: the one it asked
        for, if it may ask), with its plan kept for the snapshot served: per (tenant, model,
        priority), and per rule matched when rules read headers (then the rules are looked
        up per request). An operator's named group is planned per request. Refusals are
        not kept (they raise)."""
        snapshot = self.snapshot
        direct = header_value(headers, _GROUP_HEADER) if tenant.operator else None
        if direct is not None:
            named = RouteRequest(tenant, model, priority, group=direct)
            return plan(snapshot, named).draw(self.rng)
        request: RouteRequest | None = None
        route: Route | None = None
        if self._uses_headers:
            request = RouteRequest(tenant, model, priority, header_map(headers))
            route = route_of(snapshot, request)
        key = (tenant.name, model, priority, -1 if route is None else route.index)
        plans = self._plans
        found = plans.get(key)
        if found is None:
            if request is None or route is None:
                found = plan(snapshot, RouteRequest(tenant, model, priority))
            else:
                found = plan_route(snapshot, request, route)
            if len(plans) >= _MEMO_MAX:
                plans.clear()
            plans[key] = found
        fixed = found.fixed  # (`found.draw`, for a plan that draws nothing: no call)
        return fixed if fixed is not None else found.draw(self.rng)

    def rate_wait(self, tenant: str) -> float:
        """0.0 if `tenant` may send one more request now, else seconds until it may (at
        most the wait for one token at the tenant's whole limit, when it is shared). Counts
        the arrival of a limited tenant either way."""
        bucket = self.buckets.get(tenant)
        if bucket is None:
            return 0.0
        arrivals = self.arrivals
        arrivals[tenant] = arrivals.get(tenant, 0) + 1
        wait = bucket.try_take(time.monotonic())
        if wait > 0.0 and self._rate_caps:
            return min(wait, self._rate_caps.get(tenant, wait))
        return wait

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
        served = self.served
        served[instance_id] = served.get(instance_id, 0) + 1

    def drop_slot(self, instance_id: str) -> None:
        out = self.outstanding
        left = out[instance_id] - 1
        if left:
            out[instance_id] = left
        else:
            del out[instance_id]  # instances come and go; do not grow without bound

    # -- the queue ------------------------------------------------------------------------------

    def wake(self, group: GroupRuntime, woken: list[Waiter], now: float) -> None:
        """Queued requests that got a slot: each resumes on the next loop iteration (not in
        the middle of the exchange whose release freed the slot)."""
        loop = asyncio.get_running_loop()
        wait = group.metrics.queue_wait
        for ex in woken:
            waited = ex.leave_queue(now)
            wait.observe(waited)
            loop.call_soon(ex.resume)

    def uneject(self, group: GroupRuntime, now: float | None = None) -> None:
        """Bring back instances whose ejection is over (call when `group.unejects_at`)."""
        if now is None:
            now = time.monotonic()
        if now >= group.unejects_at:
            woken = group.refresh(now)
            if woken:
                self.wake(group, woken, now)

    def watch_queue(self, group: GroupRuntime) -> None:
        """`group` has waiters: its warm standby, if any, joins the rotation now (their slots
        admit the waiters on the next loop iteration), and sleeping standby is woken for
        those still waiting; make sure the queue timer runs (it also takes promoted standby
        out again, `GroupRuntime.demote`)."""
        self._waiting.add(group)
        self.take_standby_in(group)

    def take_standby_in(self, group: GroupRuntime) -> None:
        """Requests wait, or more are in flight than the rotation serves within the SLO
        (`GroupRuntime.over_level`): the group's warm standby, if any, joins the rotation
        now, and sleeping standby is woken for what is still over; make sure the queue
        timer runs (it also takes promoted standby out again, `GroupRuntime.demote`)."""
        if group.standby:
            now = time.monotonic()
            woken = group.promote(now)
            self._promoted.add(group)
            if woken:
                self.wake(group, woken, now)
        if group.sleeping and group.traffic.wake is not None:
            self._wake_sleeping(group)
        if self._queue_timer is None:
            self._queue_timer = asyncio.get_running_loop().call_later(QUEUE_TICK_S, self._tick)

    def _wake_sleeping(self, group: GroupRuntime) -> None:
        """Requests wait (or are in flight) beyond what the rotation and the warm standby
        take: wake as many sleeping standby at once as they need (`sleepers_to_wake`, at
        the group's standby level each where it has one), oldest first, each its own call."""
        waking, refused, level = group.waking, group.wake_refused, group.traffic.standby_at
        for ep in sleepers_to_wake(
            group.over_level(),
            sum(waking.values()),
            [
                (ep, ep.max_concurrency if level is None else level)
                for ep in group.sleeping
                if ep.instance_id not in waking and ep.instance_id not in refused
            ],
        ):
            waking[ep.instance_id] = ep.max_concurrency if level is None else level
            task = asyncio.get_running_loop().create_task(self._wake_one(group, ep))
            self._wakes.add(task)
            task.add_done_callback(self._wakes.discard)

    async def _wake_one(self, group: GroupRuntime, ep: Endpoint) -> None:
        """Wake one sleeping standby (its server's wake call, bounded by `WakeCall.timeout_s`)
        and put it in rotation; one that will not wake is passed over for another while
        requests still wait."""
        call, iid = group.traffic.wake, ep.instance_id
        try:
            if call is None:
                return
            started = time.monotonic()
            why = await wake_instance(ep, call)
        finally:
            group.waking.pop(iid, None)
        now = time.monotonic()
        if why is not None:
            log.warning("%s: %s did not wake: %s", group.name, iid, why)
            group.wake_refused.add(iid)
            if group.traffic.wake is not None and group.over_level() > 0:
                self._wake_sleeping(group)
            return
        group.metrics.standby_wakes += 1
        log.info("%s: woke %s in %.2fs", group.name, iid, now - started)
        woken = group.awake(iid, now)
        self._promoted.add(group)
        if woken:
            self.wake(group, woken, now)

    def _tick(self) -> None:
        self._queue_timer = None
        now = time.monotonic()
        for group in list(self._waiting):
            if group.unejects_at:
                self.uneject(group, now)
            for ex in group.admission.expire(now):
                ex.refused_in_queue(
                    QueueTimeout("no capacity freed up in time; retry later"), "queue_timeout", now
                )
            if not group.admission.queue_length:
                self._waiting.discard(group)
        for group in [g for g in self._promoted if not g.demote(now)]:
            self._promoted.discard(group)
        if self._waiting or self._promoted:
            self._queue_timer = asyncio.get_running_loop().call_later(QUEUE_TICK_S, self._tick)

    def close(self) -> None:
        if self._queue_timer is not None:
            self._queue_timer.cancel()
            self._queue_timer = None
        for task in self._wakes:
            task.cancel()

    # -- introspection --------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "version": self.snapshot.version,
            "groups": {name: g.status(now) for name, g in sorted(self.groups.items())},
            "served": dict(self.served),
            "in_flight": {i: n for i, n in self.outstanding.items() if n},
            "routes": self.metrics.route_counts(),
        }


def header_map(headers: list[bytes]) -> dict[str, str]:
    """Lower-cased name -> value from the forwardable header pieces (name, ": ", value, CRLF)."""
    return {
        headers[i].decode("latin-1").lower(): headers[i + 2].decode("latin-1")
        for i in range(0, len(headers), 4)
    }
