"""Quota allocation inputs, outputs and memory (see `sluice.policy.quota.allocate`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

from sluice.core.frozen import fast_init
from sluice.spec.quota import BudgetSpec, QuotaSpec

__all__ = [
    "Allocation",
    "Grant",
    "GroupClaim",
    "Loan",
    "PendingReclaim",
    "PoolState",
    "Purpose",
    "QuotaState",
    "Reclaim",
    "Running",
    "RunningInstance",
    "hours_left_in_month",
]

Purpose = Literal["inference", "training"]


@dataclass(frozen=True, slots=True)
class PoolState:
    """A pool as it is NOW: `count` units usable (lower than the spec after a node loss);
    `price_per_hour` per unit."""

    name: str
    purpose: Purpose
    count: int
    price_per_hour: float = 0.0


class Running(Protocol):
    """What the allocator reads of a running instance (an `InstanceStatus` is one: the
    controller passes its observations as they are, no copy per instance per tick)."""

    @property
    def id(self) -> str: ...

    @property
    def started_at(self) -> float: ...


@dataclass(frozen=True, slots=True)
class RunningInstance:
    """An alive, not draining instance; `started_at` in seconds (newest is drained first)."""

    id: str
    started_at: float


@fast_init
@dataclass(frozen=True, slots=True)
class GroupClaim:
    """One group's ask this tick.

    `wanted`: instances the autoscaler (or the operator's replicas/override) wants.
    `running`: its alive instances that are not draining (pending, starting, warming, ready).
    `draining_units`: units still held by its draining instances (released when they stop).
    `quota`, `budget`: from the group's spec. `spent_this_month`: month-to-date spend (price
    units; add up `Grant.spend_per_hour` x tick). `unit_hours_this_month`: month-to-date
    accelerator-hours (add up `Grant.units_held` x tick in hours), for the budget's
    `accelerator_hours_per_month`. `drain_timeout_s`: the group's drain timeout, which bounds
    a reclaim. `purpose`: "inference" for every serving group. `reclaim_first`: instances of
    other groups its reclaim drains before any other (the borrowers placed on the devices of
    its sleeping standby, which wakes only where it lives).
    """

    name: str
    pool: str
    units_per_instance: int
    wanted: int
    quota: QuotaSpec = field(default_factory=QuotaSpec)
    running: Sequence[Running] = ()
    draining_units: int = 0
    budget: BudgetSpec | None = None
    spent_this_month: float = 0.0
    drain_timeout_s: float = 30.0
    purpose: Purpose = "inference"
    unit_hours_this_month: float = 0.0
    reclaim_first: frozenset[str] = frozenset()


@fast_init
@dataclass(frozen=True, slots=True)
class Loan:
    """`borrower` holds `units` above its guarantee, lent by `lender`'s idle guarantee, or by
    the pool's unassigned units when `lender` is None."""

    lender: str | None
    borrower: str
    pool: str
    units: int


@fast_init
@dataclass(frozen=True, slots=True)
class PendingReclaim:
    """An instance the allocator asked to drain, remembered until it leaves `running`."""

    group: str
    lender: str | None
    units: int
    deadline: float
    reason: str


@fast_init
@dataclass(frozen=True, slots=True)
class QuotaState:
    """The allocator's memory between rounds; save `to_json()` to survive restarts.

    `claims_since`: group -> when its unmet guarantee claim began (for the grace period).
    `reclaiming`: instance id -> the pending drain. `loans`: last round's loans (attribution
    is kept stable across rounds so the ledger does not churn)."""

    claims_since: Mapping[str, float] = field(default_factory=dict)
    reclaiming: Mapping[str, PendingReclaim] = field(default_factory=dict)
    loans: tuple[Loan, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "claims_since": dict(self.claims_since),
            "reclaiming": {
                k: {
                    "group": v.group,
                    "lender": v.lender,
                    "units": v.units,
                    "deadline": v.deadline,
                    "reason": v.reason,
                }
                for k, v in self.reclaiming.items()
            },
            "loans": [[x.lender, x.borrower, x.pool, x.units] for x in self.loans],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> QuotaState:
        return cls(
            claims_since={str(k): float(v) for k, v in data.get("claims_since", {}).items()},
            reclaiming={str(k): PendingReclaim(**v) for k, v in data.get("reclaiming", {}).items()},
            loans=tuple(Loan(a, b, c, int(d)) for a, b, c, d in data.get("loans", [])),
        )


@fast_init
@dataclass(frozen=True, slots=True)
class Grant:
    """`instances`: how many the group runs now, <= wanted: the controller's target replicas
    (start `instances - running` if more, drain down to it if fewer, the `Reclaim` ids first).
    `own_units` + `borrowed_units` = instances x units_per_instance.
    `spend_per_hour`: the group's spend rate once the grant is applied (add it up per tick for
    the month-to-date spend); `units_held`: the units it holds then, running, starting and
    draining (add it up per tick for the month-to-date accelerator-hours)."""

    group: str
    instances: int
    own_units: int
    borrowed_units: int
    reason: str
    spend_per_hour: float = 0.0  # units held after this round (draining too) x price
    units_held: int = 0


@fast_init
@dataclass(frozen=True, slots=True)
class Reclaim:
    """Drain `instance_ids` of `borrower` (newest first) so `lender` gets `units` back; `lender`
    None: the pool shrank and the units are gone. Finish by `drain_deadline` (seconds)."""

    borrower: str
    lender: str | None
    pool: str
    instance_ids: tuple[str, ...]
    units: int
    reason: str
    drain_deadline: float


@fast_init
@dataclass(frozen=True, slots=True)
class Allocation:
    """One round's decision. `refusals`: group -> why a wanted start is refused. `wake_at`:
    the earliest end of a reclaim grace period (tick again then), or None. `spend_per_hour`,
    `units_held`: every group's together, advisory-quota groups' included (the global budget's
    meters)."""

    grants: Mapping[str, Grant]
    loans: tuple[Loan, ...]
    reclaims: tuple[Reclaim, ...]
    refusals: Mapping[str, str]
    state: QuotaState
    spend_per_hour: float
    wake_at: float | None
    units_held: int = 0


def hours_left_in_month(now: float) -> float:
    """Hours from `now` (epoch seconds) to the start of the next UTC calendar month (>= 1 s)."""
    t = datetime.fromtimestamp(now, tz=UTC)
    nxt = datetime(t.year + (t.month == 12), t.month % 12 + 1, 1, tzinfo=UTC)
    return max((nxt.timestamp() - now) / 3600.0, 1.0 / 3600.0)
