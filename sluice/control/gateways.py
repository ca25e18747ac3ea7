"""The gateways a controller feeds (issue 21): its own in-process one (`sluice up`) and any
number of `sluice gateway` processes that sync with it over the control API.

`POST /v1/gateways/{id}/sync`, about once a second from each gateway: the gateway pushes
its cumulative per-group counters and its data-plane status, and gets back its share of
the fleet's slots and, when it is not on the newest one, the routing snapshot. The
autoscaler and the observer read `traffic()`, the fleet's counters merged
(`sluice.policy.gateways.GatewayBook`); `GET /v1/dataplane` reads `status()`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, ConfigDict, Field

from sluice.control.auth import Principal, Role
from sluice.control.bodies import model_body
from sluice.core import Clock, Forbidden, SpecError, SpecIssue
from sluice.policy.autoscale.base import TrafficSample
from sluice.policy.gateways import GatewayBook, Share, add_samples, merge_status, share_snapshot
from sluice.policy.routing import RoutingSnapshot
from sluice.policy.snapshot_wire import snapshot_to_json
from sluice.spec.names import Name

__all__ = ["GatewayFleet", "LocalGateway", "gateway_routes"]

LOCAL = "local"
"""The id of the controller's own in-process gateway in the book."""
MAX_SYNC_BYTES = 4 << 20
"""A sync carries one counter set and one status per group: far less for any real spec."""
GatewayId = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,99}$")]


@dataclasses.dataclass(frozen=True)
class LocalGateway:
    """The in-process gateway, as callables (control never imports the gateway)."""

    update: Callable[[RoutingSnapshot], None]
    traffic: Callable[[], Mapping[str, TrafficSample]]
    status: Callable[[], dict[str, Any]]


class GatewayFleet:
    """What the controller knows of its gateways: who is live (`book`), the snapshot they
    should serve, and their statuses. The local gateway, when there is one, is a member."""

    def __init__(self, clock: Clock, local: LocalGateway | None = None) -> None:
        self._clock = clock
        self._local = local
        self.book = GatewayBook()
        self.snapshot: RoutingSnapshot | None = None
        self._statuses: dict[str, dict[str, Any]] = {}
        self._local_share = Share()

    def publish(self, snapshot: RoutingSnapshot) -> None:
        """The controller's newest snapshot: to the local gateway at once (its share), to
        the others at their next sync."""
        self.snapshot = snapshot
        if self._local is not None:
            self._local.update(share_snapshot(snapshot, self._local_share))

    def sync(
        self,
        gateway: str,
        boot: str,
        counters: Mapping[str, TrafficSample],
        status: dict[str, Any],
        have: int | None,
        have_share: tuple[int, int] | None = None,
    ) -> dict[str, Any]:
        """Record one gateway's sync; the snapshot goes back when the gateway has another
        version or another share than the one it would now get."""
        now = self._clock.now()
        share = self.book.push(gateway, boot, counters, now)
        self._statuses[gateway] = status
        self._reshare_local(now)
        snap = self.snapshot
        fresh = snap is not None and (snap.version != have or have_share != tuple(share))
        return {
            "share": {"index": share.index, "count": share.count},
            "version": None if snap is None else snap.version,
            "snapshot": snapshot_to_json(share_snapshot(snap, share)) if fresh and snap else None,
        }

    def traffic(self) -> dict[str, TrafficSample]:
        """Per group: every gateway's counters added up (the autoscaler's input)."""
        now = self._clock.now()
        self._reshare_local(now)
        merged = self.book.traffic(now)
        if self._local is None:
            return merged
        for group, sample in self._local.traffic().items():
            other = merged.get(group)
            merged[group] = sample if other is None else add_samples([sample, other], now)
        return merged

    def status(self) -> dict[str, Any]:
        """`GET /v1/dataplane`: the fleet's admission and traffic, and each gateway's
        snapshot version under `gateways`."""
        live = set(self.book.live())
        self._statuses = {g: s for g, s in self._statuses.items() if g in live}
        parts = dict(self._statuses)
        if self._local is not None:
            parts[LOCAL] = self._local.status()
        return merge_status(parts)

    def _reshare_local(self, now: float) -> None:
        """The local gateway is one of the fleet too: its share changes as others come and
        go, and its snapshot is re-applied with the new share."""
        if self._local is None:
            return
        self.book.push(LOCAL, LOCAL, {}, now)  # the local counters are read directly
        share = self.book.share_of(LOCAL)
        if share != self._local_share:
            self._local_share = share
            if self.snapshot is not None:
                self._local.update(share_snapshot(self.snapshot, share))


class _Sync(BaseModel):
    model_config = ConfigDict(extra="forbid", str_max_length=1000)

    boot: str = Field(min_length=1, max_length=64)
    have: int | None = Field(default=None, ge=0)
    have_share: tuple[int, int] | None = None
    counters: dict[Name, TrafficSample] = Field(default_factory=dict, max_length=10_000)
    status: dict[str, Any] = Field(default_factory=dict)


def gateway_routes(api: APIRouter, fleet: GatewayFleet) -> None:
    """Add `POST /v1/gateways/{id}/sync` (a `gateway` or `admin` token)."""

    @api.post("/v1/gateways/{gateway}/sync")
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
        if gateway == LOCAL:
            raise SpecError([SpecIssue("gateway", f"{LOCAL!r} is the controller's own gateway")])
        body = await model_body(request, _Sync, MAX_SYNC_BYTES, "a gateway sync")
        try:  # a status the others cannot be merged with would break GET /v1/dataplane
            merge_status({gateway: body.status})
        except (TypeError, ValueError, AttributeError) as exc:
            raise SpecError([SpecIssue("status", f"not a data-plane status: {exc}")]) from None
        return fleet.sync(
            gateway, body.boot, body.counters, body.status, body.have, body.have_share
        )
