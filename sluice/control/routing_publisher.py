"""The routing snapshot the controller hands its gateways: rebuilt (`build_routing_snapshot`,
pure) and published with a new version only when what it is made of changed: the spec's
revision, the failovers, the ready instances, the canary splits or the leader's epoch.

A publication is fenced like a store write (issue 31): it carries the lease epoch of the
leader that makes it, and is refused (`Fenced`) once that leader is deposed or has not
renewed its lease in time (`Fence.require`), so a paused-then-resumed ex-leader publishes
nothing; a gateway refuses a snapshot of an older epoch than the one it serves."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping, Sequence

from sluice.policy import CanarySplit, Endpoint, RoutingSnapshot, build_routing_snapshot
from sluice.policy.standby import StandbySplit, split_standby
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
        self._epoch = 0
        self._key: object = None

    @property
    def published(self) -> tuple[int, int]:
        """(epoch, version) of the newest snapshot published; (0, 0): none yet."""
        return self._epoch, self._version

    def update(
        self,
        spec: PlatformSpec,
        revision: int,
        failovers: Mapping[str, str],
        ready: dict[str, list[Endpoint]],
        splits: Sequence[CanarySplit],
        serving: Callable[[str], int],
        asleep: Collection[str] = frozenset(),
        routed: Collection[str] = frozenset(),
        unwakeable: Collection[str] = frozenset(),
        standby_at: Mapping[str, float] | None = None,
    ) -> dict[str, StandbySplit]:
        """Publish a snapshot if anything in it changed. `serving(group)`: how many of a
        standby group's ready instances serve; the others are its warm standby (for the
        gateways to put in when requests start to wait) and sleeping standby (`split_standby`:
        `asleep` are the instances known to sleep, `routed` those a gateway woke and routes
        to; `unwakeable` those no gateway may wake: left out of the published sleeping
        standby; `standby_at`: each standby group's `standby_level`). Returns the
        sleeping-standby groups' placements, for the controller to put to
        sleep and wake what they say.
        Raises `Fenced`, publishing nothing, once this controller may not lead."""
        fence = self._fence()
        if fence is not None:
            fence.require("publish routing")  # checked and published in one step: no await
        epoch = 0 if fence is None else fence.epoch
        standby: dict[str, list[Endpoint]] = {}
        sleeping: dict[str, list[Endpoint]] = {}
        placed: dict[str, StandbySplit] = {}
        for g in spec.groups:
            a, mine = g.autoscaling, ready.get(g.name, ())
            warm = a.warm_standby if a is not None else 0
            dozing = a.sleeping_standby if a is not None else 0
            # (a group that no longer keeps sleeping standby has its sleepers woken)
            if not mine or not (warm or dozing or any(e.instance_id in asleep for e in mine)):
                continue
            split = split_standby(mine, serving(g.name), warm, dozing, asleep, routed)
            ready[g.name], standby[g.name] = list(split.rotation), list(split.warm)
            sleeping[g.name] = [e for e in split.sleeping if e.instance_id not in unwakeable]
            if dozing or split.sleeping or split.to_sleep:
                placed[g.name] = split
        key = (
            epoch,
            revision,
            tuple(sorted(failovers.items())),
            tuple(sorted((g, tuple(e)) for g, e in ready.items())),
            tuple(sorted((g, tuple(e)) for g, e in standby.items())),
            tuple(sorted((g, tuple(e)) for g, e in sleeping.items())),
            tuple(splits),
            tuple(sorted((standby_at or {}).items())),
        )
        if key == self._key:
            return placed
        self._version += 1
        snapshot = build_routing_snapshot(
            spec,
            ready,
            self._version,
            failovers,
            canaries=splits,
            standby=standby,
            sleeping=sleeping,
            standby_at=standby_at,
        )
        self._publish(dataclasses.replace(snapshot, epoch=epoch))
        self._key, self._epoch = key, epoch
        return placed
