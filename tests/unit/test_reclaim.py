"""Chronic under-use becomes a proposal (issue 37): the pure verdict (`judge_reclaim`), the
reason that carries its evidence and names the group, and the spec edit it files."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from sluice.policy.history import HOUR_S, Rollup
from sluice.policy.reclaim import (
    WEEK_S,
    judge_reclaim,
    reclaim_group,
    reclaim_reason,
    weeks_of,
)
from sluice.spec import load_spec_text
from sluice.spec.edit import spec_with_guarantee

UNTIL = datetime(2026, 4, 1, tzinfo=UTC).timestamp()


def hours(days: float, peak: float, mean: float, *, until: float = UNTIL) -> list[Rollup]:
    """`days` of hourly rollups ending at `until`: busy units peaking at `peak` each hour
    (one hour in 200 at twice that: below the p99 rank), mean `mean`."""
    n = int(days * 24)
    out = []
    for k in range(n):
        start = until - (n - k) * HOUR_S
        top = peak * 2 if k % 200 == 7 else peak
        out.append(
            Rollup(
                start=start,
                seconds=HOUR_S,
                gauges={"busy_units": (mean * 60, top, 60), "held_units": (240.0, 4.0, 60)},
            )
        )
    return out


def test_a_month_of_low_peaks_returns_what_the_p99_never_needed() -> None:
    v = judge_reclaim("batch", 4, hours(30, 0.9, 0.5), UNTIL - 30 * 86_400, UNTIL, min_weeks=3)
    assert v.propose and v.why == ""
    assert (v.returnable, v.new_guaranteed) == (3, 1)
    assert v.hourly_peak_p99 == 0.9  # the 3 doubled hours of 720 sit above the p99 rank
    assert (v.weeks_in_span, v.weeks_observed, v.weeks_under_used) == (4, 4, 4)
    reason = reclaim_reason(v)
    assert reason.startswith("quota reclaim batch: guarantee 4 -> 1 (3 unit(s) back")
    assert "4 week(s) observed" in reason and "p99 of hourly peaks of busy units 0.90" in reason
    assert "returnable = guaranteed 4 - ceil(0.90) = 3" in reason
    assert reclaim_group(reason) == "batch"
    assert reclaim_group("vip lane for acme") is None


def test_too_little_history_is_no_proposal_and_says_why() -> None:
    v = judge_reclaim("fresh", 4, hours(10, 0.5, 0.2), UNTIL - 30 * 86_400, UNTIL, min_weeks=3)
    assert not v.propose
    assert v.weeks_observed == 1 and v.returnable == 3  # the units are shown, not proposed
    assert v.why.startswith("not enough history: 1 observed week(s) of 4")
    gaps = [r for i, r in enumerate(hours(28, 0.5, 0.2)) if i % 3 == 0]  # a third stored
    v = judge_reclaim("gappy", 4, gaps, UNTIL - 28 * 86_400, UNTIL, min_weeks=3)
    assert not v.propose and v.weeks_observed == 0 and "not enough history" in v.why


def test_one_busy_week_is_not_chronic() -> None:
    quiet = hours(21, 0.9, 0.5, until=UNTIL - WEEK_S)
    busy = hours(7, 3.8, 2.5)
    v = judge_reclaim("search", 4, quiet + busy, UNTIL - 28 * 86_400, UNTIL, min_weeks=3)
    assert not v.propose and v.weeks_observed == 4 and v.weeks_under_used == 3
    assert v.why.startswith("not chronic: 1 of 4 observed week(s) used the guarantee")


def test_peaks_that_need_the_guarantee_return_nothing() -> None:
    # mean well under half, but every hour peaks at the whole guarantee: it lends instead
    v = judge_reclaim("spiky", 2, hours(28, 2.0, 0.4), UNTIL - 28 * 86_400, UNTIL, min_weeks=3)
    assert not v.propose and v.returnable == 0 and "not chronic" in v.why
    v = judge_reclaim("none", 0, hours(28, 0.0, 0.0), UNTIL - 28 * 86_400, UNTIL, min_weeks=3)
    assert not v.propose and v.why == "no guarantee to return"


def test_a_pending_or_recently_rejected_proposal_holds_a_new_one() -> None:
    rows, since = hours(28, 0.9, 0.5), UNTIL - 28 * 86_400
    v = judge_reclaim("batch", 4, rows, since, UNTIL, min_weeks=3, pending=7)
    assert not v.propose and v.pending == 7 and "#7" in v.why and "pending" in v.why
    v = judge_reclaim("batch", 4, rows, since, UNTIL, min_weeks=3, rejected=(5, UNTIL - 86_400))
    assert not v.propose and "#5" in v.why and "rejected on 2026-03-31" in v.why
    v = judge_reclaim("batch", 4, rows, since, UNTIL, min_weeks=3, rejected=(5, since - 1))
    assert v.propose  # rejected before the span: the weeks since make the case anew


def test_weeks_end_at_until_and_drop_the_part_week() -> None:
    weeks = weeks_of(hours(30, 1.0, 0.5), UNTIL - 30 * 86_400, UNTIL)
    assert [w.start for w in weeks] == [UNTIL - k * WEEK_S for k in (4, 3, 2, 1)]
    assert all(w.observed and w.coverage == 1.0 for w in weeks)


SPEC = """\
pools:
  - {name: p, count: 8, memory_gb: 8}
groups:
  - name: batch   # nightly jobs
    owner: batch-team
    business: nightly batch
    alert_channel: "#batch"
    models: {b: {runtime: sim}}
    resources: {pool: p, accelerators: 1, memory_gb: 1}
    quota: {guaranteed: 4, lendable: 3, limit: 6}
  - name: web
    owner: web-team
    business: web
    alert_channel: "#web"
    models: {w: {runtime: sim}}
    resources: {pool: p, accelerators: 1, memory_gb: 1}
"""


def test_the_edit_lowers_only_the_guarantee_and_a_lendable_above_it() -> None:
    text = spec_with_guarantee(SPEC, "batch", 1)
    assert text == SPEC.replace("guaranteed: 4, lendable: 3", "guaranteed: 1, lendable: 1")
    quota = load_spec_text(text, "x").spec.groups[0].quota
    assert (quota.guaranteed, quota.lendable, quota.limit) == (1, 1, 6)
    with pytest.raises(ValueError, match="no quota block"):
        spec_with_guarantee(SPEC, "web", 1)
    with pytest.raises(ValueError, match="no group named"):
        spec_with_guarantee(SPEC, "gone", 1)
    with pytest.raises(ValueError, match="already guaranteed"):
        spec_with_guarantee(SPEC, "batch", 4)


def test_the_spec_section_defaults_and_bounds() -> None:
    spec = load_spec_text(SPEC, "x").spec
    r = spec.reclaim
    assert (r.enabled, r.every_days, r.lookback_days, r.min_weeks) == (True, 7.0, 28.0, 3)
    with pytest.raises(Exception, match="min_weeks = 5 needs lookback_days >= 35"):
        load_spec_text(SPEC + "reclaim: {min_weeks: 5}\n", "x")
