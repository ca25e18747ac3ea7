"""Bounded history on a real store (SQLite, then PostgreSQL) and real files: logs rotate by
size while their writer keeps writing, logs of long-gone instances go, old rows expire, the
audit log lasts longest."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sluice.control.housekeeping import Housekeeper, rotate
from sluice.core import ManualClock
from sluice.spec import RetentionSpec
from sluice.store import Store

DAY = 86_400.0


def test_copy_truncate_rotation_keeps_the_writer_writing(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    with open(log, "a", encoding="utf-8") as writer:  # as the gateway opens it
        for round_ in range(4):
            writer.write(f"round {round_}\n" * 100)
            writer.flush()
            assert rotate(log, max_bytes=500, keep=2)
        writer.write("after\n")
        writer.flush()
    assert log.read_text() == "after\n"  # the open file went on at the new end
    assert (tmp_path / "access.log.1").read_text() == "round 3\n" * 100
    assert (tmp_path / "access.log.2").read_text() == "round 2\n" * 100
    assert not (tmp_path / "access.log.3").exists()  # keep=2: older ones dropped
    assert not rotate(log, max_bytes=500, keep=2)  # small again: nothing to do
    assert not rotate(tmp_path / "missing.log", max_bytes=1, keep=1)


WRITER = """
import sys, time
from sluice.worker.logfile import LogFile

log = LogFile(sys.argv[1])
for i in range(int(sys.argv[2])):
    print(f"line {i}", file=sys.stdout if i % 2 else sys.stderr, flush=True)
    if i % 20 == 0:  # (the worker checks once a second; this writes faster)
        log.reopen_if_moved()
    time.sleep(0.0002)
"""


def test_rotation_by_rename_loses_no_line_of_a_writer_that_follows(tmp_path: Path) -> None:
    """A process writing numbered lines to fds 1 and 2 as a worker does, its log rotated
    again and again while it writes: every line is in exactly one file, and the live
    name keeps getting new lines (the writer follows it)."""
    log = tmp_path / "i1.log"
    lines = 20_000
    with open(log, "ab") as out:  # as the local runtime starts a worker
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(log), str(lines)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    rotations = 0
    try:
        while proc.poll() is None:
            rotations += rotate(log, max_bytes=8_000, keep=10_000, copy=False)
            time.sleep(0.005)
    finally:
        proc.kill()
        proc.wait(10)
    assert proc.returncode == 0
    files = [log, *sorted(tmp_path.glob("i1.log.*"), key=lambda p: int(p.suffix[1:]))]
    seen = [line for f in reversed(files) for line in f.read_text().splitlines()]
    print(f"\n{lines} lines, {rotations} rotations by rename: {len(set(seen))} kept")
    assert rotations >= 10  # the writer moved to each new file (else no more rotations)
    assert seen == [f"line {i}" for i in range(lines)]  # none lost, none twice, in order


def test_a_pass_rotates_prunes_and_keeps_the_audit_longest(store: Store, tmp_path: Path) -> None:
    clock = ManualClock(1000 * DAY)
    logs = tmp_path / "instances"
    logs.mkdir()
    (logs / "live-1.log").write_text("x" * 3000)
    (logs / "gone-1.log").write_text("old")
    (logs / "gone-1.log.1").write_text("older")
    (logs / "gone-2.log").write_text("recent")
    ten_days_ago = time.time() - 10 * DAY
    os.utime(logs / "gone-1.log", (ten_days_ago, ten_days_ago))
    for age_days in (400.5, 40, 1):
        at = clock.now() - age_days * DAY
        store.append_event(group="g", instance=None, kind="k", message="m", detail={}, now=at)
        store.append_audit(actor="a", action="x", target="t", reason="r", detail={}, now=at)
    for digest, ended in (("a" * 64, None), ("b" * 64, clock.now() - 60), ("c" * 64, None)):
        expires = clock.now() + (3600 if digest != "c" * 64 else -1)
        store.add_session(digest=digest, token_name="t", now=clock.now() - 120, expires_at=expires)
        if ended is not None:
            store.end_session(digest, now=ended)
    keeper = Housekeeper(store, clock, tmp_path / "access.log", logs, lambda: {"live-1"})
    retention = RetentionSpec(instance_log_max_mb=0.001, stopped_instance_logs_days=7)
    done = asyncio.run(keeper.run_once(retention))
    assert done["rotated"] == ["live-1.log"]
    assert done["removed"] == ["gone-1.log"]  # gone 10 days; gone-2 only just
    assert sorted(p.name for p in logs.iterdir()) == ["gone-2.log", "live-1.log", "live-1.log.1"]
    assert done["pruned"] == {
        "events": 2,
        "decisions": 0,
        "loans": 0,
        "audit": 1,
        "console_sessions": 2,
        "drill_fires": 0,  # (each kind of row: tests/integration/test_retention.py)
        "capacity_runs": 0,
        "proposals": 0,
        "rollouts": 0,
        "tokens": 0,
    }
    kept = store.session_by_digest("a" * 64)  # live: kept
    assert kept is not None and kept[0].token_name == "t" and kept[1] is None  # no such token
    assert store.session_by_digest("b" * 64) is None  # logged out
    assert store.session_by_digest("c" * 64) is None  # expired
    assert len(store.list_events()) == 1 and len(store.list_audit()) == 2


def test_the_audit_log_must_be_kept_longest() -> None:
    with pytest.raises(ValueError, match="the audit log is kept longest"):
        RetentionSpec(events_days=500, audit_days=400)


def test_a_command_servers_log_rotates_by_copy_so_its_writer_stays_in_the_named_file(
    tmp_path: Path, store: Store
) -> None:
    """A server Sluice did not write keeps its stdout fd: after a rename it would write on
    into `<id>.log.1` (unbounded, and deleted once rotated out); copy-truncate keeps its
    output in `<id>.log`, where the next rotation (and the failure event's tail) finds it."""
    logs = tmp_path / "instances"
    logs.mkdir()
    path = logs / "cmd-1.log"
    with open(path, "ab") as out:  # as the local runtime opens it for a command
        writer = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import time\nwhile True: print('x' * 99, flush=True); time.sleep(0.01)",
            ],
            stdout=out,
        )
    try:
        keeper = Housekeeper(
            store,
            ManualClock(0),
            tmp_path / "access.log",
            logs,
            lambda: {"cmd-1"},
            copy_truncate=lambda: {"cmd-1"},
        )
        time.sleep(0.3)
        done = asyncio.run(keeper.run_once(RetentionSpec(instance_log_max_mb=0.001)))
        assert done["rotated"] == ["cmd-1.log"]
        rotated_size = (logs / "cmd-1.log.1").stat().st_size
        time.sleep(0.3)
        assert path.stat().st_size > 0  # the writer goes on in the named file
        assert (logs / "cmd-1.log.1").stat().st_size == rotated_size
    finally:
        writer.kill()
        writer.wait()
