"""Health verdicts and crash-loop backoff, on a manual clock."""

from __future__ import annotations

from sluice.core import ManualClock
from sluice.policy import CrashBackoff, ProbeRecord, record_probe


def test_failures_must_be_consecutive() -> None:
    rec = ProbeRecord()
    rec, bad = record_probe(rec, False, "timeout", failure_threshold=3)
    rec, bad = record_probe(rec, False, "timeout", failure_threshold=3)
    assert not bad and rec.consecutive_failures == 2
    rec, bad = record_probe(rec, True, "", failure_threshold=3)
    assert rec == ProbeRecord() and not bad
    for _ in range(3):
        rec, bad = record_probe(rec, False, "refused", failure_threshold=3)
    assert bad and rec.last_error == "refused"


def test_backoff_replaces_first_failure_at_once_then_doubles_up_to_the_cap() -> None:
    clock = ManualClock(100.0)
    b = CrashBackoff()
    delays = []
    for _ in range(9):
        b = b.after_failure(clock.now(), base_s=1.0, cap_s=60.0)
        delays.append(b.not_before - clock.now())
    assert delays == [0, 1, 2, 4, 8, 16, 32, 60, 60]
    assert not b.launch_allowed(clock.now())
    clock.advance(60)
    assert b.launch_allowed(clock.now())
