"""Health verdicts and crash-loop backoff, on a manual clock."""

from __future__ import annotations

from sluice.core import InstanceState, InstanceStatus, ManualClock
from sluice.policy import CrashBackoff, ProbeRecord, record_probe
from sluice.policy.backoff import CrashLoops


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


def _inst(iid: str, state: InstanceState, group: str = "g") -> InstanceStatus:
    return InstanceStatus(iid, group, "t", state, created_at=0.0)


def test_crash_loops_count_each_failure_once_and_a_ready_instance_resets_the_group() -> None:
    loops = CrashLoops()
    failed = [_inst("a", InstanceState.FAILED)]
    loops, waits = loops.track(failed, 100.0)
    assert waits == () and loops.launch_allowed("g", 100.0)  # the first is replaced at once
    loops, waits = loops.track(failed, 101.0)  # the same failure, seen again: not counted
    assert loops.backoff["g"].failures == 1 and waits == ()
    again, waits = loops.track([*failed, _inst("b", InstanceState.FAILED)], 102.0)
    assert [(g, b.failures, b.not_before) for g, b in waits] == [("g", 2, 103.0)]
    assert not again.launch_allowed("g", 102.5) and again.launch_allowed("g", 103.0)
    assert loops.backoff["g"].failures == 1  # a value: the earlier one is unchanged
    reset, _ = again.track([_inst("c", InstanceState.READY)], 104.0)
    assert "g" not in reset.backoff and "c" in reset.counted
    unchanged, waits = reset.track([_inst("c", InstanceState.READY)], 105.0)
    assert unchanged is reset and waits == ()  # most ticks: nothing new, nothing copied


def test_crash_loops_forget_instances_that_are_gone() -> None:
    loops = CrashLoops()
    for k in range(1000):  # a replacement a tick, each failing at once
        loops, _ = loops.track([_inst(f"i{k}", InstanceState.FAILED)], float(k))
    assert len(loops.counted) <= 2 + 64 and "i999" in loops.counted
