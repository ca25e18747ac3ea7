"""The observed state of one inference instance, shared by runtime, control and policy.

Lifecycle (only READY takes traffic):

    PENDING -> STARTING -> WARMING -> READY -> DRAINING -> STOPPED
        \\---------\\-----------\\--------\\---------> FAILED
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

__all__ = ["ALIVE_STATES", "InstanceState", "InstanceStatus"]


class InstanceState(StrEnum):
    PENDING = "pending"
    STARTING = "starting"
    WARMING = "warming"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"
    FAILED = "failed"


ALIVE_STATES = frozenset(
    {InstanceState.PENDING, InstanceState.STARTING, InstanceState.WARMING, InstanceState.READY}
)


@dataclass(frozen=True, slots=True)
class InstanceStatus:
    """What the controller last observed of one instance.

    `template` is the fingerprint of what the instance runs (models, versions, resources);
    a group whose desired template differs rolls its instances.
    """

    id: str
    group: str
    template: str
    state: InstanceState
    created_at: float
    url: str | None = None
    ready_at: float | None = None
    inflight: int = 0
    reason: str = ""
    pid: int | None = None
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def devices(self) -> tuple[str, ...]:
        """The devices it is pinned to (a pool that lists `devices`; the supervisor's
        `devices` label), none on a pool of virtual units."""
        pinned = self.labels.get("devices")
        return tuple(pinned.split(",")) if pinned else ()

    @property
    def started_at(self) -> float:
        """When it was launched (the quota allocator drains the newest first)."""
        return self.created_at
