"""When a scheduled drill is due (CronJob semantics), on handed-in times."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from sluice.policy.drills import MAX_COUNTED, due_firing, latest_firing, next_firing
from sluice.spec import load_spec_text
from sluice.spec.drills import DrillSchedule
from tests.unit.test_spec_quota import HEAD, group, issues, line_of


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


NIGHTLY = "0 3 * * *"


def test_nothing_is_due_before_the_first_firing_after_the_schedule_was_seen() -> None:
    seen = at("2026-12-01T03:30:00")
    assert (
        due_firing(
            NIGHTLY, "UTC", since=seen, now=at("2026-12-02T02:59:59"), starting_deadline_s=300
        )
        is None
    )


def test_a_firing_is_due_once_its_time_has_come_and_then_handled() -> None:
    since = at("2026-12-01T03:00:00")
    due = due_firing(
        NIGHTLY, "UTC", since=since, now=at("2026-12-02T03:00:04"), starting_deadline_s=300
    )
    assert due is not None and due.at == at("2026-12-02T03:00:00")
    assert due.late_s == pytest.approx(4.0) and not due.missed and due.passed_over == 0
    # handled: the caller moves `since` to it
    assert (
        due_firing(
            NIGHTLY, "UTC", since=due.at, now=at("2026-12-02T03:00:09"), starting_deadline_s=300
        )
        is None
    )


def test_a_controller_down_for_days_runs_one_and_only_if_within_the_deadline() -> None:
    since = at("2026-12-01T03:00:00")
    due = due_firing(
        NIGHTLY, "UTC", since=since, now=at("2026-12-04T03:02:00"), starting_deadline_s=300
    )
    assert due is not None and due.at == at("2026-12-04T03:00:00")
    assert not due.missed and due.passed_over == 2  # the 2nd and the 3rd were not run
    late = due_firing(
        NIGHTLY, "UTC", since=since, now=at("2026-12-04T09:00:00"), starting_deadline_s=300
    )
    assert late is not None and late.missed and late.at == at("2026-12-04T03:00:00")


def test_passed_over_firings_are_counted_up_to_a_bound() -> None:
    every_minute = "* * * * *"
    due = due_firing(
        every_minute,
        "UTC",
        since=at("2026-01-01T00:00:00"),
        now=at("2026-02-01T00:00:30"),
        starting_deadline_s=60,
    )
    assert due is not None and due.passed_over == MAX_COUNTED


def test_cron_fields_are_read_in_the_entry_time_zone() -> None:
    # 03:00 in Paris is 02:00 UTC in winter
    assert latest_firing(NIGHTLY, "Europe/Paris", at("2026-12-02T02:30:00")) == at(
        "2026-12-02T02:00:00"
    )


@given(st.floats(min_value=1.7e9, max_value=1.9e9))
def test_latest_is_at_or_before_now_and_the_next_one_after(now: float) -> None:
    last = latest_firing("*/7 * * * *", "UTC", now)
    assert last <= now < next_firing("*/7 * * * *", "UTC", last)


def test_a_firing_exactly_now_is_the_latest() -> None:
    now = at("2026-12-02T03:00:00")
    assert latest_firing(NIGHTLY, "UTC", now) == now


def test_a_schedule_is_the_drill_command_it_stands_for() -> None:
    d = DrillSchedule(
        name="nightly",
        group="search",
        cron=NIGHTLY,
        api_key_env="KEY",
        peak="4x",
        base_rps=5,
        hold_s=60,
    )
    args = d.drill_args()
    assert args[:5] == ["search", "--peak", "4x", "--shape", "ramp"]
    assert args[args.index("--hold") + 1] == "60s" and args[args.index("--base") + 1] == "5"
    assert d.duration_s == 10 + 60 + 60 + 30


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"cron": "0 3 * *"}, "5-field cron"),
        ({"cron": "0 25 * * *"}, "5-field cron"),
        ({"timezone": "Mars/Olympus"}, "unknown time zone"),
        ({"api_key_file": "/etc/key"}, "exactly one of api_key_env or api_key_file"),
        ({"api_key_env": None}, "exactly one of api_key_env or api_key_file"),
        ({"peak": "lots"}, "peak"),
    ],
)
def test_a_bad_schedule_says_what_to_fix(fields: dict[str, object], says: str) -> None:
    base: dict[str, object] = {"name": "n", "group": "g", "cron": NIGHTLY, "api_key_env": "K"}
    with pytest.raises(ValidationError, match=says):
        DrillSchedule.model_validate({**base, **fields})


def _spec_with_drill(drill: str, *, autoscaling: str = "{max: 4}") -> str:
    extra = f"    autoscaling: {autoscaling}\n    slo: {{latency_ms: 500}}\n"
    return HEAD + group("a", extra=extra) + "drills:\n" + drill


def test_a_drill_in_the_spec_names_a_group_it_can_exercise_or_is_located() -> None:
    ok = "  - {name: weekly, group: a, cron: '0 3 * * 2', api_key_env: DRILL_KEY}\n"
    [d] = load_spec_text(_spec_with_drill(ok)).spec.drills
    assert (d.group, d.shape, d.peak) == ("a", "ramp", "5x")

    text = _spec_with_drill("  - {name: weekly, group: nope, cron: '0 3 * * 2', api_key_env: K}\n")
    [msg] = issues(text)
    assert f"q.yaml:{line_of(text, 'name: weekly')}: drills[0].group" in msg
    assert "no group named 'nope'" in msg

    text = _spec_with_drill(ok, autoscaling="{max: 4, mode: advisory}")
    [msg] = issues(text)
    assert "drills[0].group" in msg and "advisory" in msg

    found = issues(_spec_with_drill(ok + ok))
    assert any("drills[1].name" in m and "duplicate name 'weekly'" in m for m in found)


def test_a_key_pasted_where_the_variable_name_goes_is_not_echoed() -> None:
    text = _spec_with_drill(
        "  - {name: w, group: a, cron: '0 3 * * 2', api_key_env: sk-live-123}\n"
    )
    [msg] = issues(text)
    assert "drills[0].api_key_env" in msg and "sk-live-123" not in msg
