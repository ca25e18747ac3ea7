"""Month-to-date metering (Q6), pure: what the budgets count against.

Each round's grants say the spend rate and the units every group holds from then on; the
next round adds rate x elapsed time to the month's totals. A new calendar month (UTC)
starts from zero. The live controller persists a `Meter` (`to_json`) so a restart keeps the
month's spend; the simulator carries one through its virtual month.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from sluice.core.frozen import fast_init
from sluice.policy.quota.model import Allocation

__all__ = ["TOTAL", "Meter"]

TOTAL: Final = ""
"""The key of the all-groups total in `Meter.spent` and `Meter.unit_hours`."""


def _month_of(now: float) -> str:
    return datetime.fromtimestamp(now, tz=UTC).strftime("%Y-%m")


@fast_init
@dataclass(frozen=True, slots=True)
class Meter:
    """Month-to-date spend (price units) and accelerator-hours per group; `TOTAL` for all.
    `rate`/`units`: what each group held after the last round, metered until the next."""

    month: str = ""
    spent: Mapping[str, float] = field(default_factory=dict)
    unit_hours: Mapping[str, float] = field(default_factory=dict)
    at: float | None = None
    rate: Mapping[str, float] = field(default_factory=dict)
    units: Mapping[str, int] = field(default_factory=dict)

    def advanced(self, now: float) -> Meter:
        """The totals at `now`: the last round's rates over the time since."""
        month = _month_of(now)
        spent = dict(self.spent) if month == self.month else {}
        hours_used = dict(self.unit_hours) if month == self.month else {}
        if self.at is not None:
            hours = max(0.0, now - self.at) / 3600.0
            for name, rate in self.rate.items():
                spent[name] = spent.get(name, 0.0) + rate * hours
            for name, units in self.units.items():
                hours_used[name] = hours_used.get(name, 0.0) + units * hours
        return Meter(month, spent, hours_used, now, self.rate, self.units)

    def holding(self, alloc: Allocation) -> Meter:
        """Meter `alloc`'s grants from now on."""
        rate = {name: g.spend_per_hour for name, g in alloc.grants.items()}
        rate[TOTAL] = alloc.spend_per_hour
        units = {name: g.units_held for name, g in alloc.grants.items()}
        units[TOTAL] = alloc.units_held
        return Meter(self.month, self.spent, self.unit_hours, self.at, rate, units)

    def spent_by(self, name: str) -> float:
        return self.spent.get(name, 0.0)

    def hours_by(self, name: str) -> float:
        return self.unit_hours.get(name, 0.0)

    def to_json(self) -> dict[str, Any]:
        return {"month": self.month, "spent": dict(self.spent), "unit_hours": dict(self.unit_hours)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Meter:
        return cls(
            month=str(data.get("month", "")),
            spent={str(k): float(v) for k, v in data.get("spent", {}).items()},
            unit_hours={str(k): float(v) for k, v in data.get("unit_hours", {}).items()},
        )
