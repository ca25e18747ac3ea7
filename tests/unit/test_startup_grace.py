"""The start-up grace (`sluice.policy.startup`): a group's first start, and a start from
zero, hold its availability readings off until an instance is ready, one launched since
failed, or the spec's start-up allowance ran out; a group that served once is watched."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sluice.policy.startup import (
    StartupReading,
    StartupState,
    follow_startups,
    starting_groups,
)

A = 360.0  # health.startup_timeout_s 300 + warm-up timeout 60


def reading(wanted: int = 2, ready: int = 0, failed_at: float | None = None) -> StartupReading:
    return StartupReading(wanted=wanted, ready=ready, allowance_s=A, newest_failed_at=failed_at)


def run(readings: list[tuple[float, StartupReading]]) -> list[StartupState]:
    states: dict[str, StartupState] = {}
    seen = []
    for now, r in readings:
        states = follow_startups(states, {"g": r}, now)
        seen.append(states["g"])
    return seen


def test_a_first_start_is_held_until_an_instance_is_ready() -> None:
    seen = run([(0.0, reading()), (10.0, reading()), (22.0, reading(ready=1))])
    assert [s.phase for s in seen] == ["starting", "starting", "watched"]
    assert seen[0].until == A
    assert seen[2].reason == "ready"


def test_a_group_that_served_and_lost_its_instances_is_watched_not_held() -> None:
    seen = run([(0.0, reading(ready=2)), (5.0, reading(ready=0)), (6.0, reading(ready=0))])
    assert [s.phase for s in seen] == ["watched"] * 3


def test_a_start_from_zero_is_held_again() -> None:
    seen = run(
        [
            (0.0, reading(ready=2)),
            (10.0, reading(wanted=0, ready=0)),  # a deliberate scale to zero
            (20.0, reading(wanted=0, ready=0)),
            (30.0, reading(wanted=1, ready=0)),  # scaled up from zero
            (31.0, reading(wanted=1, ready=0)),
        ]
    )
    assert [s.phase for s in seen] == ["watched", "at_rest", "at_rest", "starting", "starting"]
    assert seen[2].since == 10.0  # resting since the scale to zero
    assert seen[3].since == 30.0 and seen[3].until == 30.0 + A


def test_the_grace_ends_when_the_allowance_runs_out() -> None:
    seen = run([(0.0, reading()), (A - 1, reading()), (A, reading())])
    assert [s.phase for s in seen] == ["starting", "starting", "watched"]
    assert "allowed 360s" in seen[2].reason


def test_an_instance_that_failed_while_starting_ends_the_grace() -> None:
    # an instance that failed before this start-up (launched at -50) does not end it
    seen = run([(0.0, reading(failed_at=-50.0)), (3.0, reading(failed_at=1.0))])
    assert [s.phase for s in seen] == ["starting", "watched"]
    assert seen[1].reason == "an instance failed while starting"


def test_a_group_that_left_the_spec_is_forgotten() -> None:
    states = follow_startups({}, {"g": reading(), "h": reading()}, 0.0)
    assert starting_groups(states) == {"g", "h"}
    states = follow_startups(states, {"h": reading()}, 1.0)
    assert set(states) == {"h"}


steps = st.lists(
    st.tuples(
        st.integers(0, 3),
        st.integers(0, 3),
        st.floats(0, 400, allow_nan=False),
        st.booleans(),
    ),
    min_size=1,
    max_size=30,
)


@given(steps)
def test_held_only_while_starting_and_never_past_the_allowance(
    seq: list[tuple[int, int, float, bool]],
) -> None:
    """Invariants: a group with a ready instance is never held, nor one whose start-up saw
    an instance fail; no grace outlives its allowance; a group that was watched with
    instances wanted stays watched."""
    states: dict[str, StartupState] = {}
    now = 0.0
    for wanted, ready, dt, failed in seq:
        now += dt
        before = states.get("g")
        r = reading(wanted=wanted, ready=ready, failed_at=now if failed else None)
        states = follow_startups(states, {"g": r}, now)
        s = states["g"]
        if s.phase == "starting":
            assert ready == 0 and wanted > 0
            assert not failed or before is None or before.phase != "starting"
            assert s.until is not None and now < s.until <= s.since + A
        if before is not None and before.phase == "watched" and wanted > 0:
            assert s.phase == "watched"
        if wanted == 0:
            assert s.phase == "at_rest"
