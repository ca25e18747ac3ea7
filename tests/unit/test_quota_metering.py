"""Month-to-date metering (`sluice.policy.quota.metering.Meter`): what the budgets count."""

from __future__ import annotations

import pytest

from sluice.policy.quota import Allocation, Grant, QuotaState
from sluice.policy.quota.metering import TOTAL, Meter

# 2026-11-30T23:00:00Z: one hour before December.
LAST_HOUR = 1_796_079_600.0


def holding(units: int, rate: float) -> Allocation:
    grant = Grant("a", units, units, 0, "", spend_per_hour=rate, units_held=units)
    return Allocation({"a": grant}, (), (), {}, QuotaState(), rate, None, units_held=units)


def test_spend_and_accelerator_hours_add_up_at_the_rate_held_since_the_last_round() -> None:
    meter = Meter().advanced(LAST_HOUR).holding(holding(4, 8.0))
    half = meter.advanced(LAST_HOUR + 1800)
    assert half.spent_by("a") == pytest.approx(4.0) and half.spent_by(TOTAL) == pytest.approx(4.0)
    assert half.hours_by("a") == pytest.approx(2.0) and half.hours_by(TOTAL) == pytest.approx(2.0)
    # the rate held is kept until a round says otherwise
    assert half.advanced(LAST_HOUR + 3599).hours_by("a") == pytest.approx(4 * 3599 / 3600)


def test_a_new_month_starts_from_zero() -> None:
    meter = Meter().advanced(LAST_HOUR).holding(holding(4, 8.0)).advanced(LAST_HOUR + 1800)
    december = meter.advanced(LAST_HOUR + 3600 + 60)
    assert december.month == "2026-12"
    # November's totals are gone; the time since the last round (31 min) counts in December
    assert december.hours_by("a") == pytest.approx(4 * 1860 / 3600)
    assert december.spent_by(TOTAL) == pytest.approx(8.0 * 1860 / 3600)


def test_it_survives_a_restart_and_reads_the_spend_only_format_of_before() -> None:
    meter = Meter().advanced(LAST_HOUR).holding(holding(2, 3.0)).advanced(LAST_HOUR + 3600 - 1)
    back = Meter.from_json(meter.to_json())
    assert back.month == meter.month and back.spent == meter.spent
    assert back.unit_hours == meter.unit_hours
    old = Meter.from_json({"month": "2026-11", "spent": {"a": 1.5, "": 1.5}})
    assert old.spent_by("a") == 1.5 and old.hours_by("a") == 0.0
