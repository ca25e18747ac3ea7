"""The supervisor's record of one instance, and how its lifecycle ends early."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from sluice.control.servers import Probes
from sluice.core import InstanceState, InstanceStatus
from sluice.runtime import InstanceHandle, Placement
from sluice.spec import GroupSpec, PoolSpec
from sluice.spec.servers import EndpointSpec

__all__ = ["LaunchFailed", "Supervised", "Unhealthy"]


class LaunchFailed(Exception):
    """An instance could not be brought to ready (its reason says why)."""


class Unhealthy(LaunchFailed):
    """Health probes failed `failure_threshold` times in a row (the process may live on)."""


@dataclass(eq=False)
class Supervised:
    """One instance as its supervisor tracks it: spec, state, process, probes, devices."""

    id: str
    spec: GroupSpec
    template: str
    created_at: float
    state: InstanceState = InstanceState.PENDING
    handle: InstanceHandle | None = None
    ready_at: float | None = None
    reason: str = ""
    closing: bool = False
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    probes: Probes = field(default_factory=Probes, repr=False)
    pool: PoolSpec | None = None
    """Set when the pool pins devices."""
    devices: tuple[str, ...] = ()
    device_units: int = 0
    endpoint: EndpointSpec | None = None
    """The existing server an external instance fronts."""
    placement: Placement = field(default_factory=Placement)
    """What a cluster runtime reserves for it (its pool's accelerators)."""

    def status(self) -> InstanceStatus:
        return InstanceStatus(
            id=self.id,
            group=self.spec.name,
            template=self.template,
            state=self.state,
            created_at=self.created_at,
            url=self.handle.url if self.handle else None,
            ready_at=self.ready_at,
            reason=self.reason,
            pid=self.handle.pid if self.handle else None,
            labels={"devices": ",".join(self.devices)} if self.devices else {},
        )
