"""Loan attribution, ledger diffs and the under-use report (Q3, Q4)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.policy.quota import (
    Holding,
    Loan,
    UsageSample,
    attribute_loans,
    ledger_changes,
    reclaim_loan_ids,
    underused_groups,
)


@dataclass(frozen=True)
class Row:
    id: int
    lender: str | None
    borrower: str
    pool: str
    units: int


def test_borrowed_units_come_from_unassigned_then_the_most_idle_lender() -> None:
    holdings = [Holding("a", 4, 1), Holding("b", 2, 0), Holding("c", 0, 6)]
    loans = attribute_loans("gpu", 8, holdings, [])
    # 8 - 6 guaranteed = 2 unassigned, then a (3 idle) before b (2 idle).
    assert loans == [Loan(None, "c", "gpu", 2), Loan("a", "c", "gpu", 3), Loan("b", "c", "gpu", 1)]


def test_previous_loans_are_kept_while_they_still_fit() -> None:
    holdings = [Holding("a", 4, 1), Holding("b", 2, 0), Holding("c", 0, 6)]
    previous = [Loan("b", "c", "gpu", 2), Loan("a", "c", "gpu", 1)]
    loans = attribute_loans("gpu", 8, holdings, previous)
    assert loans == [Loan(None, "c", "gpu", 2), Loan("a", "c", "gpu", 2), Loan("b", "c", "gpu", 2)]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 8)), min_size=1, max_size=6))
def test_attribution_covers_every_borrowed_unit_and_never_over_lends(
    pairs: list[tuple[int, int]],
) -> None:
    holdings = [Holding(f"g{i}", q, h) for i, (q, h) in enumerate(pairs)]
    count = max(sum(q for q, _ in pairs), sum(h for _, h in pairs))
    loans = attribute_loans("p", count, holdings, [])
    for h in holdings:
        borrowed = sum(x.units for x in loans if x.borrower == h.group)
        assert borrowed == max(0, h.held - h.guaranteed)
        lent = sum(x.units for x in loans if x.lender == h.group)
        assert lent <= max(0, h.guaranteed - h.held)
    assert sum(x.units for x in loans if x.lender is None) <= count - sum(q for q, _ in pairs)


def test_ledger_changes_open_grow_shrink_and_close() -> None:
    rows = [Row(1, "a", "b", "p", 2), Row(2, "a", "b", "p", 1), Row(3, None, "c", "p", 4)]
    same = ledger_changes(rows, [Loan("a", "b", "p", 3), Loan(None, "c", "p", 4)])
    assert (same.close, same.open) == ((), ())
    grow = ledger_changes(rows, [Loan("a", "b", "p", 5), Loan(None, "c", "p", 4)])
    assert (grow.close, grow.open) == ((), (Loan("a", "b", "p", 2),))
    # Shrink 3 -> 2: the newest row (1 unit) closes, the 2-unit row stays.
    shrink = ledger_changes(rows, [Loan("a", "b", "p", 2), Loan(None, "c", "p", 4)])
    assert (shrink.close, shrink.open) == ((2,), ())
    # Shrink 3 -> 1: both close, one 1-unit row opens; c's loan ended.
    part = ledger_changes(rows, [Loan("a", "b", "p", 1)])
    assert part.close == (2, 1, 3) and part.open == (Loan("a", "b", "p", 1),)


def test_underuse_lists_groups_below_the_threshold_with_returnable_units() -> None:
    samples = {
        "idle": [UsageSample(0, 1), UsageSample(50, 2)],  # mean 1.5 of 8, peak 2
        "busy": [UsageSample(0, 7)],
        "spiky": [UsageSample(0, 0), UsageSample(90, 8)],  # mean 0.8 of 8 but peaked at 8
        "new": [UsageSample(95, 0)],  # 5 s of data: not judged
    }
    guarantees = {"idle": 8, "busy": 8, "spiky": 8, "new": 8, "none": 0, "silent": 4}
    found = underused_groups(samples, guarantees, now=100, window_s=100, threshold=0.5)
    assert [(u.group, u.returnable_units) for u in found] == [("idle", 6), ("spiky", 0)]
    idle = found[0]
    assert idle.average_units == pytest.approx(1.5) and idle.peak_units == 2
    assert idle.reason == (
        "used 1.50 of 8 guaranteed units on average (19% < 50%) over 100 s, peak 2: "
        "6 unit(s) could return to the shared pool"
    )


def test_underuse_uses_the_sample_before_the_window_and_ignores_older_peaks() -> None:
    samples = {"a": [UsageSample(-500, 10), UsageSample(-200, 1)]}
    [a] = underused_groups(samples, {"a": 10}, now=100, window_s=100, threshold=0.2)
    assert a.average_units == 1 and a.peak_units == 1 and a.returnable_units == 9
    with pytest.raises(ValueError, match="window_s"):
        underused_groups(samples, {"a": 10}, now=0, window_s=0)


def test_reclaim_marks_the_lenders_rows_first_then_the_newest() -> None:
    rows = [
        Row(1, None, "b", "p", 2),
        Row(2, "a", "b", "p", 1),
        Row(3, "c", "b", "p", 2),
        Row(4, "a", "x", "p", 5),
    ]
    assert reclaim_loan_ids(rows, "b", "a", 1) == (2,)
    assert reclaim_loan_ids(rows, "b", "a", 2) == (2, 3)
    assert reclaim_loan_ids(rows, "b", None, 9) == (1, 3, 2)
    assert reclaim_loan_ids(rows, "nobody", "a", 3) == ()
