"""Immutable rows handed out by the store, so callers never hold a live database handle."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sluice.core import InstanceState

__all__ = [
    "AuditEntry",
    "Event",
    "InstanceRecord",
    "Loan",
    "Proposal",
    "Revision",
    "RolloutRecord",
    "ScalingDecision",
    "TokenRecord",
]


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
    devices: str = ""
    """The device ids it is pinned to, comma-separated ('' when none)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", InstanceState(self.state).value)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class ScalingDecision:
    """One autoscaler decision as journaled: `detail` holds `signals`, `proposals`,
    `clipped_by` and `unclipped` (see `sluice.policy.autoscale.Decision`)."""

    id: int
    at: float
    group: str
    policy: str
    current: int
    desired: int
    winner: str | None
    reason: str
    detail: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Loan:
    """One row of the borrow ledger (Q4): `borrower` held `units` of `lender`'s idle guarantee
    (`lender` None: the pool's unassigned units) from `started_at` until `ended_at` (None:
    still open). `reclaim_latency_s` = ended_at - reclaim_requested_at when the lender asked
    for the units back. Times in seconds."""

    id: int
    lender: str | None
    borrower: str
    pool: str
    units: int
    started_at: float
    reclaim_requested_at: float | None
    ended_at: float | None
    reason: str
    end_reason: str
    reclaim_latency_s: float | None

    @property
    def open(self) -> bool:
        return self.ended_at is None

    def unit_hours(self, now: float) -> float:
        """Units x hours lent so far (up to `now` while open)."""
        end = now if self.ended_at is None else self.ended_at
        return self.units * max(0.0, end - self.started_at) / 3600.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class RolloutRecord:
    """One archived rollout run: `state` is the state machine's JSON (timeline, per-step
    analysis), `compare` the compare report's JSON (or None), `conclusion` a sentence."""

    id: int
    name: str
    baseline: str
    canary: str
    phase: str
    started_at: float
    updated_at: float
    ended_at: float | None
    started_by: str
    spec: dict[str, Any]
    state: dict[str, Any]
    compare: dict[str, Any] | None
    conclusion: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Proposal:
    """A spec change waiting for review (R5): `state` is pending, approved or rejected;
    `base_revision` the revision its `diff` is against (0: none yet); `revision` the one
    its approval applied; `preview` the impact preview (see `sluice.policy.route_impact`).
    `author` and `reviewer` are token names; `author_person` and `reviewer_person` the
    persons holding those tokens (approval needs two persons, not two tokens)."""

    id: int
    created_at: float
    author: str
    reason: str
    base_revision: int
    yaml_text: str
    diff: str
    preview: dict[str, Any]
    state: str
    reviewer: str | None = None
    reviewed_at: float | None = None
    review_reason: str | None = None
    revision: int | None = None
    author_person: str = ""
    reviewer_person: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """An API token's identity and rights; never the token (the store keeps its digest).
    `person`: who holds it (lower-case; see `sluice.control.tokens` for who may mint a
    token for whom)."""

    id: int
    name: str
    person: str
    role: str
    groups: tuple[str, ...] | None
    created_at: float
    created_by: str
    expires_at: float | None
    revoked_at: float | None
    revoked_by: str | None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["groups"] = None if self.groups is None else list(self.groups)
        return out


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """A console log-in: the token it was made from, and when it stops being valid."""

    token_name: str
    created_at: float
    expires_at: float
    ended_at: float | None
