"""The gateways a controller feeds (issue 21): its own in-process one (`sluice up`) and any
number of `sluice gateway` processes that sync with it over the control API.

`POST /v1/gateways/{id}/sync`, about once a second from each gateway: the gateway pushes
its cumulative per-group counters, its data-plane status and the answers it recorded of the
groups under canary analysis, and gets back its share of the fleet's slots, which groups to
record and, when it is not on the newest one, the routing snapshot. The autoscaler and the
observer read `traffic()`, the fleet's counters merged (`sluice.policy.gateways.GatewayBook`);
`GET /v1/dataplane` reads `status()`; the drain of a command server reads `in_flight()`; the
canary analysis reads every gateway's answers through `samples()`.

A gateway token names its gateway (issue 31): the token named N syncs only the ids `N` and
`N-<suffix>` (`sluice.policy.gateways.gateway_id_fits`), and a live id is held by the token
that synced it; anything else is refused (403) before the body is parsed, and changes
nothing. Counters of groups and answers of instances that are not in the routing the
controller publishes (the newest snapshot or the one before) are dropped and counted per
gateway (`dropped` in `status()`), never kept. At most `MAX_GATEWAYS` remote gateways are
live at once: a new id over that is refused (503) until one falls silent, and one silent
for `GATEWAY_TTL_S` is forgotten with all the controller kept of it.

A tenant's `rate_limit` holds fleet-wide (issue 31, `sluice.policy.rate_shares`): each
sync also pushes the gateway's cumulative arrivals per limited tenant (refused ones too),
and its answer carries the gateway's share of each such tenant's rate (`rates`: tenant ->
`{"rps", "burst"}`), from a table recomputed at most every `REBALANCE_S` and whenever the
live gateways or the limits change. The local gateway is one of the fleet: its arrivals
are read and its shares set directly.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, ConfigDict, Field, model_validator

from sluice.control.auth import Principal, Role
from sluice.control.bodies import TextBody, model_body
from sluice.control.guard import guarded
from sluice.control.servers import ProbeFailed
from sluice.core import Clock, Forbidden, SpecError, SpecIssue, Unavailable
from sluice.policy.answers import TEXT_CHARS
from sluice.policy.autoscale.base import TrafficSample
from sluice.policy.gateways import (
    GATEWAY_ID_PATTERN,
    GATEWAY_TTL_S,
    GatewayBook,
    Share,
    add_samples,
    gateway_id_fits,
    gateway_id_rule,
    merge_status,
    share_snapshot,
)
from sluice.policy.rate_shares import (
    REBALANCE_S,
    DemandBook,
    RateShare,
    rate_shares,
    tenant_limits,
)
from sluice.policy.routing import RoutingSnapshot
from sluice.policy.snapshot_wire import snapshot_to_json
from sluice.spec.names import Name

__all__ = ["MAX_GATEWAYS", "GatewayFleet", "LocalGateway", "gateway_routes"]

log = logging.getLogger("sluice.gateways")

LOCAL = "local"
"""The id of the controller's own in-process gateway in the book."""
MAX_SYNC_BYTES = 8 << 20
"""A sync carries one counter set and one status per group, and at most MAX_SYNC_ROWS
answers (about 100 bytes each)."""
MAX_SYNC_ROWS = 20_000
"""Answers one sync may carry: 20,000 a second per gateway process, more than one serves."""
RING_ROWS = 8192
"""Answers the fleet keeps per instance for the canary analysis (it reads once a second)."""
MAX_SAMPLED_INSTANCES = 1000
MAX_GATEWAYS = 256
"""Remote gateways live at once: a fleet of 64 hosts of `--workers 4`. A sync from a new id
over this is refused until one falls silent, so no number of made-up ids grows the
controller's memory or cuts every instance's slots into slivers."""
DROP_LOG_PERIOD_S = 60.0
"""Dropped counters and answers are logged at most once a minute (they are counted always)."""
GatewayId = Annotated[str, Path(pattern=GATEWAY_ID_PATTERN)]
InstanceId = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,199}$")]


@dataclasses.dataclass(frozen=True)
class LocalGateway:
    """The in-process gateway, as callables (control never imports the gateway)."""

    update: Callable[[RoutingSnapshot], None]
    traffic: Callable[[], Mapping[str, TrafficSample]]
    status: Callable[[], dict[str, Any]]
    sample_groups: Callable[[Iterable[str]], None]
    samples: Callable[[str, int, int], tuple[list[dict[str, Any]], int]]
    arrivals: Callable[[], Mapping[str, int]] | None = None
    """its cumulative arrivals per limited tenant (`Gateway.tenant_arrivals`)"""
    set_rates: Callable[[Mapping[str, RateShare], int], None] | None = None
    """enforce its share of each tenant's rate, one of n gateways (`Gateway.set_rate_shares`);
    None: it is never told, and enforces every limit in full (right only while alone)"""


class GatewayFleet:
    """What the controller knows of its gateways: who is live (`book`), the snapshot they
    should serve, and their statuses. The local gateway, when there is one, is a member."""

    def __init__(self, clock: Clock, local: LocalGateway | None = None) -> None:
        self._clock = clock
        self.local = local
        """the in-process gateway (`sluice up`), set before the first publish; None:
        `sluice controller`, whose gateways all sync over the API"""
        self.book = GatewayBook()
        self.snapshot: RoutingSnapshot | None = None
        self._statuses: dict[str, dict[str, Any]] = {}
        self._serving: dict[str, tuple[int | None, int | None]] = {}
        """live remote gateway id -> the (epoch, version) of the snapshot it said it serves"""
        self._local_share = Share()
        self._sampled: list[str] = []
        self._rows: dict[str, deque[dict[str, Any]]] = {}
        """instance -> the answers the gateways recorded of it, numbered by `_seq`"""
        self._seq = 0
        self._local_cursor: dict[str, int] = {}
        self._owners: dict[str, str | None] = {}
        """live remote gateway id -> the name of the token that syncs it"""
        self._dropped: dict[str, dict[str, int]] = {}
        """live gateway id -> counter sets and answers of it that were dropped"""
        self._known: tuple[frozenset[str], frozenset[str]] | None = None
        """the groups and the instances of the newest snapshot and the one before (a
        gateway a version behind still counts for them); None: none published yet"""
        self._newest: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())
        self._drop_logged_at: float | None = None
        self._drops_unlogged = 0
        self.demand = DemandBook()
        """per live gateway and limited tenant, its recent offered rate"""
        self._limits: dict[str, tuple[float, float]] = {}
        """tenant -> (rps, burst) of the newest snapshot's limited tenants"""
        self.rates: dict[str, dict[str, RateShare]] = {}
        """gateway -> tenant -> its bucket (`sluice.policy.rate_shares.rate_shares`)"""
        self._rates_at: float | None = None
        self._rates_of: tuple[str, ...] = ()
        """the live gateways `rates` was computed for"""

    def publish(self, snapshot: RoutingSnapshot) -> None:
        """The controller's newest snapshot: to the local gateway at once (its share), to
        the others at their next sync."""
        if snapshot is not self.snapshot:
            groups = frozenset({*snapshot.endpoints, *snapshot.group_models, *snapshot.traffic})
            instances = frozenset(
                ep.instance_id for eps in snapshot.endpoints.values() for ep in eps
            )
            before = self._newest
            self._newest = (groups, instances)
            self._known = (groups | before[0], instances | before[1])
            limits = tenant_limits(snapshot)
            if limits != self._limits:
                self._limits, self._rates_at = limits, None  # rebalance at once
        self.snapshot = snapshot
        if self.local is not None:
            self.local.update(share_snapshot(snapshot, self._local_share))
        self._rebalance(self._clock.now())

    def admit(self, gateway: str, token: str | None) -> None:
        """Refuse, changing nothing, a sync of `gateway` by the token named `token` (None:
        not checked, for tests of the book) that it may not make: the id is not the token's
        (403), the id is live under another token (403), or it is a new id while
        `MAX_GATEWAYS` are live (503)."""
        if gateway == LOCAL:
            raise SpecError([SpecIssue("gateway", f"{LOCAL!r} is the controller's own gateway")])
        if token is not None and not gateway_id_fits(token, gateway):
            raise Forbidden(
                f"token {token!r} may sync only gateway {gateway_id_rule(token)}, not "
                f"{gateway!r}: a gateway token names its gateway (`sluice gateway` without "
                f"--id picks '{token}-HOST-PORT')",
                token=token,
                gateway=gateway,
                allowed=[token, f"{token}-<suffix>"],
            )
        self._forget(self._clock.now())
        holder = self._owners.get(gateway, token)
        if holder != token:
            raise Forbidden(
                f"gateway {gateway!r} is live under token {holder!r}, not {token!r}: give "
                f"this one another id (forgotten {GATEWAY_TTL_S:g} s after its last sync)",
                token=token,
                gateway=gateway,
            )
        if gateway not in self._owners and len(self._owners) >= MAX_GATEWAYS:
            raise Unavailable(
                f"the controller keeps at most {MAX_GATEWAYS} live gateways and has "
                f"{len(self._owners)}: gateway {gateway!r} is refused until one falls "
                f"silent for {GATEWAY_TTL_S:g} s",
                gateway=gateway,
                limit=MAX_GATEWAYS,
            )

    def sync(
        self,
        gateway: str,
        boot: str,
        counters: Mapping[str, TrafficSample],
        status: dict[str, Any],
        have: int | None,
        have_share: tuple[int, int] | None = None,
        samples: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
        *,
        token: str | None = None,
        arrivals: Mapping[str, int] | None = None,
        have_epoch: int | None = None,
    ) -> dict[str, Any]:
        """Record one sync of `gateway` by the token named `token` (refused as `admit`
        says); the snapshot goes back when the gateway has another version or another
        share than the one it would now get. Counters and answers outside the published
        routing are dropped and counted, never kept. `arrivals`: its cumulative requests
        per limited tenant (other tenants' are ignored); the answer's `rates` is its share
        of each limited tenant's rate."""
        self.admit(gateway, token)
        now = self._clock.now()
        counters, samples = self._drop_unknown(gateway, token, counters, samples or {}, now)
        share = self.book.push(gateway, boot, counters, now)
        limits = self._limits
        self.demand.observe(
            gateway, boot, {t: n for t, n in (arrivals or {}).items() if t in limits}, now
        )
        self._owners[gateway] = token
        self._statuses[gateway] = status
        self._serving[gateway] = (have_epoch, have)
        self._reshare_local(now)
        self._rebalance(now)
        for instance, rows in samples.items():
            self._keep_rows(instance, rows)
        snap = self.snapshot
        # (epoch, version) names a snapshot: each leader numbers its own from 1 (issue 31)
        fresh = snap is not None and (
            snap.version != have
            or (have_epoch is not None and snap.epoch != have_epoch)
            or have_share != tuple(share)
        )
        mine = self.rates.get(gateway, {})
        return {
            "share": {"index": share.index, "count": share.count},
            "version": None if snap is None else snap.version,
            "epoch": None if snap is None else snap.epoch,
            "snapshot": snapshot_to_json(share_snapshot(snap, share)) if fresh and snap else None,
            "sample_groups": self._sampled,
            "rates": {t: {"rps": r.rps, "burst": r.burst} for t, r in sorted(mine.items())},
        }

    def _rebalance(self, now: float) -> None:
        """Recompute every gateway's share of every limited tenant's rate when the table is
        `REBALANCE_S` old, or was computed for other live gateways or other limits; the
        local gateway gets its shares at once, the others at their next sync."""
        live = tuple(self.book.live())
        at = self._rates_at
        if at is not None and live == self._rates_of and 0.0 <= now - at < REBALANCE_S:
            return
        local = self.local
        if local is not None and local.arrivals is not None and LOCAL in live:
            arrived = local.arrivals()
            self.demand.observe(
                LOCAL, LOCAL, {t: n for t, n in arrived.items() if t in self._limits}, now
            )
        self.demand.forget(live)
        self.rates = rate_shares(self._limits, live, self.demand)
        self._rates_at, self._rates_of = now, live
        if local is not None and local.set_rates is not None and LOCAL in live:
            local.set_rates(self.rates.get(LOCAL, {}), len(live))

    def _drop_unknown(
        self,
        gateway: str,
        token: str | None,
        counters: Mapping[str, TrafficSample],
        samples: Mapping[str, Sequence[Mapping[str, Any]]],
        now: float,
    ) -> tuple[dict[str, TrafficSample], dict[str, Sequence[Mapping[str, Any]]]]:
        """The counters of the groups and the answers of the instances in the published
        routing; the rest is counted in `_dropped` and logged (at most once a minute). Before
        the first publication nothing is kept and nothing counted: there is nothing to judge
        by yet (a group's counts first kept later are its base, `GatewayBook`)."""
        if self._known is None:
            return {}, {}
        groups, instances = self._known
        kept = {g: c for g, c in counters.items() if g in groups}
        rows = {i: r for i, r in samples.items() if i in instances}
        bad_groups = sorted(g for g in counters if g not in groups)
        bad_instances = sorted(i for i in samples if i not in instances)
        answers = sum(len(samples[i]) for i in bad_instances)
        if bad_groups or answers:
            dropped = self._dropped.setdefault(gateway, {"counters": 0, "answers": 0})
            dropped["counters"] += len(bad_groups)
            dropped["answers"] += answers
            self._drops_unlogged += len(bad_groups) + answers
            last = self._drop_logged_at
            if last is None or now - last >= DROP_LOG_PERIOD_S:
                log.warning(
                    "gateway %r (token %r) sent counters of %d group(s) not in the routing "
                    "(%s) and %d answer(s) of %d instance(s) not in it (%s): dropped, not "
                    "kept; %d dropped in all since the last such line (GET /v1/dataplane: "
                    "`dropped`, per gateway)",
                    gateway,
                    token,
                    len(bad_groups),
                    _some(bad_groups),
                    answers,
                    len(bad_instances),
                    _some(bad_instances),
                    self._drops_unlogged,
                )
                self._drop_logged_at, self._drops_unlogged = now, 0
        return kept, rows

    def _forget(self, now: float) -> None:
        """Gateways silent for the TTL are gone from the book; everything else kept of them
        goes too (status, token, drops)."""
        self.book.expire(now)
        live = self.book.gateways
        for table in (self._owners, self._dropped, self._statuses, self._serving):
            for gone in [g for g in table if g not in live]:
                del table[gone]

    def sample_groups(self, groups: Iterable[str]) -> None:
        """Record the answers of exactly `groups` (those under canary analysis whose servers
        keep no samples), in every gateway: the local one at once, the others at their
        next sync."""
        self._sampled = sorted(set(groups))
        if not self._sampled:
            self._rows.clear()
        if self.local is not None:
            self.local.sample_groups(self._sampled)

    def samples(self, instance: str, after: int, limit: int) -> tuple[list[dict[str, Any]], int]:
        """Up to `limit` answers of `instance` recorded by any gateway after cursor `after`,
        oldest first, and the cursor for the next read."""
        if self.local is not None:
            rows, self._local_cursor[instance] = self.local.samples(
                instance, self._local_cursor.get(instance, 0), RING_ROWS
            )
            self._keep_rows(instance, rows)
        picked = [r for r in self._rows.get(instance, ()) if r["seq"] > after][:limit]
        return picked, picked[-1]["seq"] if picked else after

    def _keep_rows(self, instance: str, rows: Sequence[Mapping[str, Any]]) -> None:
        if not rows or not self._sampled:
            return
        ring = self._rows.get(instance)
        if ring is None:
            if len(self._rows) >= MAX_SAMPLED_INSTANCES:  # the longest-kept goes first
                del self._rows[next(iter(self._rows))]
            ring = self._rows[instance] = deque(maxlen=RING_ROWS)
        for row in rows:
            self._seq += 1
            ring.append({**row, "seq": self._seq})

    def traffic(self) -> dict[str, TrafficSample]:
        """Per group: every gateway's counters added up (the autoscaler's input)."""
        now = self._clock.now()
        self._reshare_local(now)
        self._forget(now)
        merged = self.book.traffic(now)
        if self.local is None:
            return merged
        for group, sample in self.local.traffic().items():
            other = merged.get(group)
            merged[group] = sample if other is None else add_samples([sample, other], now)
        return merged

    def status(self) -> dict[str, Any]:
        """`GET /v1/dataplane`: the fleet's admission and traffic, each gateway's snapshot
        version under `gateways`, and under `dropped` what the controller dropped of each
        live gateway that sent any (`counters`: group counter sets, `answers`: recorded
        answers, of groups and instances not in the routing)."""
        self._forget(self._clock.now())
        parts = dict(self._statuses)
        if self.local is not None:
            parts[LOCAL] = self.local.status()
        merged = merge_status(parts)
        merged["dropped"] = {g: dict(d) for g, d in sorted(self._dropped.items())}
        return merged

    def oldest_served(self, epoch: int) -> int | None:
        """The oldest snapshot version of `epoch` a live remote gateway serves (one on
        another epoch, or none yet, counts as 0); None: no remote gateway is live (the
        local one gets each snapshot as it is published)."""
        self._forget(self._clock.now())
        served = [v if e == epoch and v is not None else 0 for e, v in self._serving.values()]
        return min(served, default=None)

    def in_flight(self) -> dict[str, int]:
        """Requests in flight per instance, every gateway's added up: what drains a server
        that is not Sluice's worker. Not known (`ProbeFailed`, the drain asks again) while a
        live gateway's last status is of an older snapshot than the newest: it may still be
        routing to the instance that left rotation."""
        merged = self.status()
        newest = None if self.snapshot is None else self.snapshot.version
        behind = sorted(g for g, v in merged["gateways"].items() if g != LOCAL and v != newest)
        if behind:
            raise ProbeFailed(
                f"gateway(s) {', '.join(behind)} not yet on routing snapshot v{newest}"
            )
        return dict(merged["in_flight"])

    def _reshare_local(self, now: float) -> None:
        """The local gateway is one of the fleet too: its share changes as others come and
        go, and its snapshot is re-applied with the new share."""
        if self.local is None:
            return
        self.book.push(LOCAL, LOCAL, {}, now)  # the local counters are read directly
        share = self.book.share_of(LOCAL)
        if share != self._local_share:
            self._local_share = share
            if self.snapshot is not None:
                self.local.update(share_snapshot(self.snapshot, share))
        self._rebalance(now)


def _some(names: Sequence[str], most: int = 5) -> str:
    shown = ", ".join(names[:most])
    return f"{shown}, ..." if len(names) > most else shown or "none"


class _Answer(BaseModel):
    """What a gateway saw of one answer (`sluice.gateway.samples`); the start of its text on
    a sample of rows, for the text-based canary criteria."""

    model_config = ConfigDict(extra="forbid")

    at: float
    status: int = Field(ge=0, le=999)
    latency_s: float = Field(ge=0)
    ttft_s: float | None = Field(default=None, ge=0)
    output_bytes: int = Field(ge=0)
    output_tokens: int | None = Field(default=None, ge=0)
    finish_reason: str | None = Field(default=None, max_length=32)
    tpot_s: float | None = Field(default=None, ge=0)
    text: str | None = Field(default=None, max_length=TEXT_CHARS)


class _Sync(TextBody):
    model_config = ConfigDict(extra="forbid", str_max_length=1000)

    boot: str = Field(min_length=1, max_length=64)
    have: int | None = Field(default=None, ge=0)
    have_epoch: int | None = Field(default=None, ge=0)
    have_share: tuple[int, int] | None = None
    counters: dict[Name, TrafficSample] = Field(default_factory=dict, max_length=10_000)
    status: dict[str, Any] = Field(default_factory=dict)
    samples: dict[InstanceId, list[_Answer]] = Field(default_factory=dict, max_length=10_000)
    arrivals: dict[Name, Annotated[int, Field(ge=0)]] = Field(
        default_factory=dict, max_length=10_000
    )

    @model_validator(mode="after")
    def _rows_bounded(self) -> _Sync:
        if sum(len(rows) for rows in self.samples.values()) > MAX_SYNC_ROWS:
            raise ValueError(f"samples: at most {MAX_SYNC_ROWS} answers in one sync")
        return self


def gateway_routes(api: APIRouter, fleet: GatewayFleet) -> None:
    """Add `POST /v1/gateways/{id}/sync` (a `gateway` or `admin` token, syncing an id that
    the token names: `GatewayFleet.admit`)."""

    @api.post("/v1/gateways/{gateway}/sync")
    @guarded(Role.GATEWAY, MAX_SYNC_BYTES)  # the handler admits gateway and admin tokens
    async def sync(gateway: GatewayId, request: Request) -> dict[str, Any]:
        """Push this gateway's counters and status; get its share of every instance's slots
        and, when `have` is not the newest version, the routing snapshot."""
        me: Principal = request.state.principal
        if me.role not in (Role.GATEWAY, Role.ADMIN):
            raise Forbidden(
                f"syncing a gateway needs a gateway token; token {me.name!r} is {me.role.value}",
                needs=Role.GATEWAY.value,
                role=me.role.value,
            )
        fleet.admit(gateway, me.name)  # before the body is parsed: a refusal costs little
        body = await model_body(request, _Sync, MAX_SYNC_BYTES, "a gateway sync")
        try:  # a status the others cannot be merged with would break GET /v1/dataplane
            merge_status({gateway: body.status})
        except (TypeError, ValueError, AttributeError) as exc:
            raise SpecError([SpecIssue("status", f"not a data-plane status: {exc}")]) from None
        samples = {i: [a.model_dump() for a in rows] for i, rows in body.samples.items()}
        return fleet.sync(
            gateway,
            body.boot,
            body.counters,
            body.status,
            body.have,
            body.have_share,
            samples,
            token=me.name,
            arrivals=body.arrivals,
            have_epoch=body.have_epoch,
        )
