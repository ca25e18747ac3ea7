"""Budget caps (Q6) as the allocator applies them: one ceiling per `BudgetSpec` field, on
spend (price units per hour) or on units (accelerators), with the words that explain it.

The per-month caps become a rate: what is left of the month's budget spread evenly over the
hours left in the calendar month (UTC), so that keeping to it can never overspend the month.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sluice.spec.quota import BudgetSpec

if TYPE_CHECKING:
    from sluice.policy.quota.metering import Meter
    from sluice.policy.quota.model import Allocation
    from sluice.spec import PlatformSpec

__all__ = ["BudgetCap", "budget_caps", "budget_shares", "budget_used"]


class BudgetCap:
    """One ceiling and how to explain it: on spend (an instance costs its units x the pool's
    price per hour) or on units (an instance costs its units). `scope`: "global" or
    "group 'name'"; `key`: the `BudgetSpec` field."""

    __slots__ = ("key", "label", "limit", "scope", "units")

    def __init__(self, limit: float, label: str, scope: str, key: str, *, units: bool) -> None:
        self.limit = limit
        self.label = label
        self.scope = scope
        self.key = key
        self.units = units

    def cost(self, u: int, price: float) -> float:
        """What one instance of `u` units at `price` per hour adds to this cap's level."""
        return float(u) if self.units else price

    def refusal(self, u: int, price: float, base: float) -> str:
        """Why one more instance does not fit under this cap at level `base`."""
        if not self.units:
            return (
                f"budget: one more instance ({price:g}/h) would take the spend rate from "
                f"{base:g}/h above {self.label}"
            )
        whose = "all groups" if self.scope == "global" else f"the {self.scope}"
        return (
            f"budget: one more instance ({u} unit{'' if u == 1 else 's'}) would take {whose} "
            f"from {base:g} to {base + u:g} accelerators, above {self.label}"
        )

    def exceeded(self, level: float) -> str:
        """What is over this cap: `level` is what runs (draining units left out)."""
        every = self.scope == "global"
        verb = ("hold" if self.units else "spend") + ("" if every else "s")
        held = f"{'all groups ' if every else ''}{verb} {level:g}{'' if self.units else '/h'}"
        if self.key in ("per_hour", "max_accelerators"):
            to = f"{self.limit:g}{'' if self.units else '/h'}"
            return f"{self.scope} {self.key} lowered to {to} ({held})"
        return f"{self.label} is exceeded ({held})"


def budget_caps(
    budget: BudgetSpec | None, spent: float, unit_hours: float, hours_left: float, scope: str
) -> list[BudgetCap]:
    """The caps of `budget` now: `spent`, `unit_hours`: month-to-date spend and
    accelerator-hours; `hours_left`: hours to the end of the month."""
    if budget is None:
        return []
    caps = []
    if budget.per_hour is not None:
        label = f"{scope} per_hour {budget.per_hour:g}"
        caps.append(BudgetCap(budget.per_hour, label, scope, "per_hour", units=False))
    if budget.per_month is not None:
        left = budget.per_month - spent
        label = (
            f"{scope} per_month {budget.per_month:g} ({left:g} left over "
            f"{hours_left:.1f} h = {left / hours_left:.4g}/h)"
        )
        caps.append(BudgetCap(left / hours_left, label, scope, "per_month", units=False))
    if budget.max_accelerators is not None:
        n = budget.max_accelerators
        label = f"{scope} max_accelerators {n}"
        caps.append(BudgetCap(float(n), label, scope, "max_accelerators", units=True))
    if budget.accelerator_hours_per_month is not None:
        cap = budget.accelerator_hours_per_month
        left = cap - unit_hours
        label = (
            f"{scope} accelerator_hours_per_month {cap:g} ({left:g} left over "
            f"{hours_left:.1f} h = {left / hours_left:.4g} units)"
        )
        key = "accelerator_hours_per_month"
        caps.append(BudgetCap(left / hours_left, label, scope, key, units=True))
    return caps


def budget_used(
    budget: BudgetSpec | None,
    *,
    spend_per_hour: float,
    units: float,
    spent: float,
    unit_hours: float,
    hours_left: float,
    scope: str,
) -> float | None:
    """The share of the tightest cap of `budget` that the level (`spend_per_hour` for a
    spend cap, `units` for a unit cap) takes now: 1.0 is at the cap (a month's budget used
    up counts as 1.0 while anything is held). None: no cap."""
    shares = []
    for cap in budget_caps(budget, spent, unit_hours, max(hours_left, 1e-9), scope):
        level = units if cap.units else spend_per_hour
        shares.append(level / cap.limit if cap.limit > 0 else (1.0 if level > 0 else 0.0))
    return max(shares, default=None)


def budget_shares(
    spec: PlatformSpec, alloc: Allocation | None, meter: Meter, now: float
) -> dict[str, float]:
    """Per group, the share of the tightest cap in force on it (its own budget's or the
    platform's, whichever is nearer its cap); groups under no cap are absent."""
    from sluice.policy.quota.metering import TOTAL
    from sluice.policy.quota.model import hours_left_in_month

    hours_left = hours_left_in_month(now)
    platform = budget_used(
        spec.budget,
        spend_per_hour=alloc.spend_per_hour if alloc else 0.0,
        units=float(alloc.units_held) if alloc else 0.0,
        spent=meter.spent_by(TOTAL),
        unit_hours=meter.hours_by(TOTAL),
        hours_left=hours_left,
        scope="global",
    )
    out = {}
    for g in spec.groups:
        grant = alloc.grants.get(g.name) if alloc else None
        own = budget_used(
            g.budget,
            spend_per_hour=grant.spend_per_hour if grant else 0.0,
            units=float(grant.units_held) if grant else 0.0,
            spent=meter.spent_by(g.name),
            unit_hours=meter.hours_by(g.name),
            hours_left=hours_left,
            scope=f"group {g.name!r}",
        )
        shares = [x for x in (own, platform) if x is not None]
        if shares:
            out[g.name] = max(shares)
    return out
