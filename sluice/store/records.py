"""Immutable rows handed out by the store, so callers never hold a live database handle."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sluice.core import InstanceState

__all__ = ["AuditEntry", "Event", "InstanceRecord", "Revision"]


@dataclass(frozen=True, slots=True)
class Revision:
    """One applied spec: the full YAML plus the diff against the revision before it."""

    number: int
    created_at: float
    author: str
    reason: str
    yaml_text: str
    diff: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """Who changed what and why; the store offers no way to edit or remove one."""

    id: int
    at: float
    actor: str
    action: str
    target: str
    reason: str
    detail: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Event:
    """Something the controller did to a group (or one of its instances), and why."""

    id: int
    at: float
    group: str
    instance: str | None
    kind: str
    message: str
    detail: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class InstanceRecord:
    """A launched instance, remembered so a restarted controller can adopt or clean it up.

    `state` must be an `InstanceState` value; it is normalised to the plain string.
    """

    id: str
    group: str
    template: str
    state: str
    pid: int | None
    host: str | None
    port: int | None
    created_at: float
    updated_at: float
    reason: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", InstanceState(self.state).value)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
