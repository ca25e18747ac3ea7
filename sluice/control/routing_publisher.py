"""The routing snapshot the controller hands its gateways: rebuilt (`build_routing_snapshot`,
pure) and published with a new version only when what it is made of changed: the spec's
revision, the failovers, the ready instances or the canary splits."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from sluice.policy import CanarySplit, Endpoint, RoutingSnapshot, build_routing_snapshot
from sluice.spec import PlatformSpec

__all__ = ["RoutingPublisher"]


class RoutingPublisher:
    def __init__(self, publish: Callable[[RoutingSnapshot], None]) -> None:
        self._publish = publish
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
        warm-standby group's ready instances serve (the newest stay out of rotation)."""
        for g in spec.groups:
            if g.autoscaling is not None and g.autoscaling.warm_standby and g.name in ready:
                by_age = sorted(ready[g.name], key=lambda e: e.ready_at)
                ready[g.name] = by_age[: serving(g.name)]
        key = (
            revision,
            tuple(sorted(failovers.items())),
            tuple(sorted((g, tuple(e)) for g, e in ready.items())),
            tuple(splits),
        )
        if key == self._key:
            return
        self._version += 1
        self._publish(
            build_routing_snapshot(spec, ready, self._version, failovers, canaries=splits)
        )
        self._key = key
