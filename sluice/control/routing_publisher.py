"""The routing snapshot the controller hands its gateways: rebuilt (`build_routing_snapshot`,
pure) and published with a new version only when what it is made of changed: the spec's
revision, the failovers, the ready instances, the canary splits or the leader's epoch.

A publication is fenced like a store write (issue 31): it carries the lease epoch of the
leader that makes it, and is refused (`Fenced`) once that leader is deposed or has not
renewed its lease in time (`Fence.require`), so a paused-then-resumed ex-leader publishes
nothing; a gateway refuses a snapshot of an older epoch than the one it serves."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from sluice.policy import CanarySplit, Endpoint, RoutingSnapshot, build_routing_snapshot
from sluice.spec import PlatformSpec
from sluice.store import Fence

__all__ = ["RoutingPublisher"]


class RoutingPublisher:
    def __init__(
        self,
        publish: Callable[[RoutingSnapshot], None],
        fence: Callable[[], Fence | None] = lambda: None,
    ) -> None:
        """`fence()`: the leadership's fence now (None: no leader election, as in tests)."""
        self._publish = publish
        self._fence = fence
        self._version = 0
        self._key: object = None

    def update(
        self,
        spec: PlatformSpec,
        revision: int,
        failovers: Mapping[str, str],
        ready: dict[str, list[Endpoint]],
        splits: Sequence[CanarySplit],
        serving: Callable[[str], int],
    ) -> None:
        """Publish a snapshot if anything in it changed. `serving(group)`: how many of a
        warm-standby group's ready instances serve (the newest stay out of rotation, listed as
        its standby for the gateways to put in when requests start to wait).
        Raises `Fenced`, publishing nothing, once this controller may not lead."""
        fence = self._fence()
        if fence is not None:
            fence.require("publish routing")  # checked and published in one step: no await
        epoch = 0 if fence is None else fence.epoch
        standby: dict[str, list[Endpoint]] = {}
        for g in spec.groups:
            if g.autoscaling is not None and g.autoscaling.warm_standby and g.name in ready:
                by_age = sorted(ready[g.name], key=lambda e: e.ready_at)
                n = serving(g.name)
                ready[g.name], standby[g.name] = by_age[:n], by_age[n:]
        key = (
            epoch,
            revision,
            tuple(sorted(failovers.items())),
            tuple(sorted((g, tuple(e)) for g, e in ready.items())),
            tuple(sorted((g, tuple(e)) for g, e in standby.items())),
            tuple(splits),
        )
        if key == self._key:
            return
        self._version += 1
        snapshot = build_routing_snapshot(
            spec, ready, self._version, failovers, canaries=splits, standby=standby
        )
        self._publish(dataclasses.replace(snapshot, epoch=epoch))
        self._key = key
