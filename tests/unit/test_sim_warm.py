"""Warm starts (issue 16): the count is the oracle plan's own t = 0 need, and a warm run of
any policy, the oracle too, begins with that many ready instances."""

from __future__ import annotations

from typing import Any

import pytest

from sluice.sim import (
    OracleResult,
    SimOptions,
    SimResult,
    WarmStart,
    Workload,
    make_policy,
    oracle,
    prepare,
    run,
    trace_from_rows,
    warm_start,
    warm_start_count,
)
from tests.unit.test_sim_single import fixed_service

DESIRED = SimResult.TIMELINE_COLUMNS.index("desired")
READY = SimResult.TIMELINE_COLUMNS.index("ready")


def busy_start_then_burst() -> Any:
    """24 req/s of 0.5 s requests from t = 0 (12 busy slots: 3 instances of 4), a 30 s burst
    at 80 req/s from t = 60 (the best fixed fleet is sized for it), then a trickle."""
    rows = [(i / 24.0, 1, 1) for i in range(24 * 60)]
    rows += [(60 + i / 80.0, 1, 1) for i in range(80 * 30)]
    rows += [(90 + i / 2.0, 1, 1) for i in range(2 * 60)]
    return trace_from_rows(rows)


@pytest.fixture(scope="module")
def work() -> Workload:
    return prepare(fixed_service(0.5, startup_s=30), busy_start_then_burst())


@pytest.fixture(scope="module")
def ws(work: Workload) -> WarmStart:
    return warm_start(work)


@pytest.fixture(scope="module")
def found(work: Workload) -> OracleResult:
    return oracle(work)  # the oracle as it runs without a warm start


def test_the_warm_count_is_what_the_oracle_plan_asks_for_at_t0(
    work: Workload, ws: WarmStart, found: OracleResult
) -> None:
    assert ws.oracle.plan == found.plan
    row0 = found.result.timeline[0]
    # the plan's t = 0 need: what it asks for at t = 0 (covering [0, startup + 1 s]), held
    # ready from the start; not the spec's count, not the burst, not the best fixed fleet
    assert ws.count == int(row0[DESIRED]) == int(row0[READY]) == found.initial
    assert found.result.decisions[0]["to"] == ws.count
    assert ws.count == 3
    assert found.best_fixed_n is not None and found.best_fixed_n > ws.count
    assert ws.options.initial == ws.count
    # the count is defined on the oracle from its own need: a caller's initial is ignored
    assert warm_start_count(work, SimOptions(initial=9)) == ws.count


@pytest.mark.parametrize("name", ["sluice", "hpa", "kpa", "oracle"])
def test_a_warm_run_begins_with_that_many_ready(
    work: Workload, ws: WarmStart, found: OracleResult, name: str
) -> None:
    model = work.model
    if name == "oracle":
        warm = oracle(work, ws.options).result
        cold_initial = found.initial  # the oracle always began at its own need
    else:
        warm = run(work, make_policy(model, name), ws.options)
        cold_initial = run(work, make_policy(model, name)).initial_instances
        assert cold_initial == 1  # the spec's count
    assert warm.initial_instances == ws.count
    # what the policy saw at its first decision (t = 0): the warm fleet, ready
    first = warm.decisions[0]
    assert first["t"] == 0 and first["ready"] == ws.count
    assert warm.summary()["initial_instances"] == ws.count
    if name in ("sluice", "oracle"):  # they keep it through t = 0 (timeline row 0)
        assert warm.timeline[0, READY] == ws.count
    else:
        # HPA and KPA decide at t = 0, before the first arrival and with no history: they
        # scale the idle warm fleet down at once (row 0 shows that first decision)
        assert warm.timeline[0, READY] == warm.timeline[0, DESIRED] < ws.count
    if name == "oracle":
        assert cold_initial == ws.count


def test_the_warm_oracle_search_starts_every_candidate_there(work: Workload) -> None:
    """`oracle(work, SimOptions(initial=k))` runs its candidates, the fixed fleet too, from k."""
    res = oracle(work, SimOptions(initial=7))
    assert res.initial == 7
    assert res.best_fixed is not None and res.best_fixed.initial_instances == 7
