"""Guaranteed capacity, caps, borrowing and budgets (Q1-Q6), in accelerator units of a pool.

The vocabulary follows Kueue's ClusterQueue (nominal quota = `guaranteed`, borrowingLimit =
`borrow_limit`, lendingLimit = `lendable`) and Volcano's guarantee <= capability (= `limit`),
with one pool as the cohort: a group lends only idle units of its guarantee, and only within
the pool (never across purpose: inference vs training, Q5).

A group without a `quota` section has no guarantee and no borrow cap: it runs best-effort on
the pool's unassigned units (count - sum of guarantees) and on idle lendable guarantees, and
its instances are the first drained when an owner wants its units back.

`mode: advisory` makes the allocator's decisions for a group advice only (journaled and
explained, not enforced; `sluice.policy.quota.advisory`): it gets what it asks for while the
pool has free units, is never reclaimed from, and reclaims nothing.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["BudgetSpec", "QuotaSpec", "ReclaimSpec"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class QuotaSpec(_Strict):
    """A group's share of its pool, in accelerators."""

    guaranteed: int = Field(
        default=0, ge=0, le=1_000_000, description="units it always gets (nominal)"
    )
    limit: int | None = Field(
        default=None, ge=0, le=1_000_000, description="cap; None: the pool's size"
    )
    lendable: int | None = Field(
        default=None,
        ge=0,
        le=1_000_000,
        description="idle guaranteed units others may borrow; None: all",
    )
    borrow_limit: int | None = Field(
        default=None,
        ge=0,
        le=1_000_000,
        description="units above its guarantee it may borrow; None: up to `limit`",
    )
    reserved: bool = Field(
        default=False, description="core group: keeps its guarantee first when the pool shrinks"
    )
    priority: int = Field(
        default=0, ge=-1000, le=1000, description="higher borrows first and is reclaimed last"
    )
    reclaim_grace_s: float = Field(
        default=5.0, ge=0, le=3600, description="a lender waits this long before draining"
    )
    mode: Literal["active", "advisory"] = Field(
        default="active",
        description="advisory: the allocator's grants, refusals and reclaims for this group "
        "are journaled, not enforced; it gets what it asks for while the pool has free units",
    )

    @model_validator(mode="after")
    def _consistent(self) -> QuotaSpec:
        if self.limit is not None and self.limit < self.guaranteed:
            raise ValueError(f"limit ({self.limit}) is below guaranteed ({self.guaranteed})")
        if self.lendable is not None and self.lendable > self.guaranteed:
            raise ValueError(
                f"lendable ({self.lendable}) exceeds guaranteed ({self.guaranteed}): a group "
                "lends only its own guarantee"
            )
        return self


class BudgetSpec(_Strict):
    """Spend and accelerator guardrails (Q6): a total cap above all autoscaling.

    Spend is in the pools' price units (price_per_hour x accelerators); the spend rate counts
    every unit held (running and draining instances). A start is refused when it would raise
    the rate above `per_hour`, or above what is left of `per_month` spread evenly over the
    hours left in the calendar month (UTC): (per_month - spent) / hours_left. Keeping to that
    second rate can never overspend the month, and the allowed rate only grows while the fleet
    stays under it. `max_accelerators` and `accelerator_hours_per_month` are the same two caps
    counted in accelerators instead of price, so a budget holds on a pool without a price.

    A cap lowered below what the fleet runs shrinks it: the newest instances above their
    guarantee drain (`sluice.policy.quota.allocate`). A budget never cuts a guarantee.
    """

    per_hour: float | None = Field(default=None, gt=0, description="max spend rate")
    per_month: float | None = Field(default=None, gt=0, description="max spend per month")
    max_accelerators: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="max accelerators held at once (running and draining instances)",
    )
    accelerator_hours_per_month: float | None = Field(
        default=None, gt=0, description="max accelerator-hours per calendar month (UTC)"
    )


class ReclaimSpec(_Strict):
    """Chronic under-use becomes a proposal (Q3, issue 37): every `every_days` the control
    plane reads the last `lookback_days` of each group's hourly history and, for a group
    that under-used its guarantee in every one of at least `min_weeks` observed weeks, files
    a proposal lowering `quota.guaranteed` by the units its peaks never needed (evidence in
    the proposal's reason; `sluice.policy.reclaim`). The proposal goes through the normal
    review; `sluice report usage --propose` runs the same check at once. `enabled: false`
    turns the scheduled check off (the command still works)."""

    enabled: bool = True
    every_days: float = Field(
        default=7.0, gt=0, le=366, description="how often the scheduled check runs (7: weekly)"
    )
    lookback_days: float = Field(
        default=28.0, ge=7, le=366, description="the history each check reads"
    )
    min_weeks: int = Field(
        default=3,
        ge=1,
        le=52,
        description="observed weeks needed (each >= 80% covered), all of them under-used",
    )

    @model_validator(mode="after")
    def _weeks_fit(self) -> ReclaimSpec:
        if self.min_weeks * 7 > self.lookback_days:
            raise ValueError(
                f"min_weeks = {self.min_weeks} needs lookback_days >= {self.min_weeks * 7} "
                f"(it is {self.lookback_days:g}): the weeks are read from that span"
            )
        return self
