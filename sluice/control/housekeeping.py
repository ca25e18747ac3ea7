"""Bounded history: rotate the access log and instance logs by size, drop the logs of
instances long gone, and expire old store rows (every table that grows with time: events,
decisions, loans, audit, metrics rollups, alert messages, console sessions, drill firings,
capacity runs, proposals, rollouts, tokens), every `retention.interval_s` and on
`sluice gc`.

Logs rotate by rename, and their writer moves to a fresh file under the old name: a worker
notices within a second that its log was renamed (`sluice.worker.logfile`); the gateway's
access log is re-opened by `reopen_access_log` right after (`sluice up` gives it). Until
then each writes on at the end of the renamed file, so no line is lost. Without that hook
the access log rotates by copy-then-truncate (logrotate's `copytruncate`): the writer keeps
its open file (opened for append) without being told, and the few lines written between
the copy and the truncation can be lost, the usual price of that method. The log of a
server Sluice did not write (`command`) rotates that way too: it cannot be told to re-open,
and after a rename it would write on into the renamed file, unbounded, then deleted.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sluice.control.capacity_watch import LOOK_BACK
from sluice.core import Clock
from sluice.policy.history import HOUR_S, MINUTE_S
from sluice.spec import PlatformSpec, RetentionSpec
from sluice.spec.observability import HistorySpec
from sluice.store import Fenced
from sluice.store.ports import RetentionRecords

__all__ = ["Housekeeper", "rotate"]

log = logging.getLogger("sluice.housekeeping")
_DAY = 86_400.0
_MB = 1 << 20


class Housekeeper:
    """`running` names the instances whose logs are still being written; `copy_truncate`
    those of them whose writer cannot re-open its log (command servers);
    `reopen_access_log`, called on the event loop after every pass, points the access log's
    writer at the file now named `access_log` (a no-op when it writes there already)."""

    def __init__(
        self,
        store: RetentionRecords,
        clock: Clock,
        access_log: Path,
        instance_logs: Path,
        running: Callable[[], set[str]],
        reopen_access_log: Callable[[], None] | None = None,
        copy_truncate: Callable[[], set[str]] | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._access_log = access_log
        self._instance_logs = instance_logs
        self._running = running
        self._reopen_access_log = reopen_access_log
        self._copy_truncate = copy_truncate or set

    async def run_once(
        self, retention: RetentionSpec, history: HistorySpec | None = None
    ) -> dict[str, Any]:
        """One pass; returns what it did (rotated files, removed logs, pruned rows: with
        `history`, metrics rollups past their age and finished alert messages too; console
        sessions that ended or expired; drill firings, capacity runs, proposals, rollouts
        and tokens past their age)."""
        running = self._running()
        copied = self._copy_truncate()
        files = await asyncio.to_thread(self._logs, retention, running, copied)
        if self._reopen_access_log is not None:  # every pass: a failed one is made up for
            self._reopen_access_log()
        now = self._clock.now()
        pruned = await asyncio.to_thread(
            self._store.prune,
            events_before=now - retention.events_days * _DAY,
            decisions_before=now - retention.decisions_days * _DAY,
            loans_ended_before=now - retention.loans_days * _DAY,
            audit_before=now - retention.audit_days * _DAY,
        )
        done = asdict(pruned)
        done["console_sessions"] = await asyncio.to_thread(self._store.prune_sessions, before=now)
        done.update(await asyncio.to_thread(self._records, retention, now))
        if history is not None:
            done["minute_rollups"] = await asyncio.to_thread(
                self._store.prune_rollups, MINUTE_S, now - history.minute_days * _DAY
            )
            done["hour_rollups"] = await asyncio.to_thread(
                self._store.prune_rollups, HOUR_S, now - history.hour_days * _DAY
            )
            done["alert_messages"] = await asyncio.to_thread(
                self._store.prune_deliveries, now - retention.events_days * _DAY
            )
        return {**files, "pruned": done}

    async def loop(self, current: Callable[[], PlatformSpec]) -> None:
        """Forever, every `retention.interval_s` of the live spec; a failed pass is logged,
        retried next time, and never stops anything else."""
        while True:
            platform = current()
            spec = platform.retention
            try:
                done = await self.run_once(spec, platform.observability.history)
                if done["rotated"] or done["removed"] or any(done["pruned"].values()):
                    log.info("housekeeping: %s", done)
            except Fenced as exc:  # deposed: stepping down, the new leader keeps house
                log.warning("housekeeping pass refused: %s", exc)
            except Exception:
                log.exception("housekeeping pass failed; next try in %gs", spec.interval_s)
            await asyncio.sleep(spec.interval_s)

    def _records(self, retention: RetentionSpec, now: float) -> dict[str, int]:
        """The tables that grow with the platform's own work: drill firings, capacity
        runs, decided proposals, ended rollouts, and tokens (revoked or expired, and those
        of scheduled drills whose runs are archived); what each still needs stays (see
        `sluice.store.retention`)."""
        store = self._store
        return {
            "drill_fires": store.prune_drill_fires(now - retention.drill_fires_days * _DAY),
            "capacity_runs": store.prune_capacity_runs(
                now - retention.capacity_runs_days * _DAY, keep_loadtests=LOOK_BACK
            ),
            "proposals": store.prune_proposals(now - retention.proposals_days * _DAY),
            "rollouts": store.prune_rollouts(now - retention.rollouts_days * _DAY),
            "tokens": store.prune_tokens(now - retention.tokens_kept_days * _DAY),
        }

    def _logs(
        self, retention: RetentionSpec, running: set[str], copied: set[str]
    ) -> dict[str, Any]:
        rotated: list[str] = []
        removed: list[str] = []
        max_bytes = retention.access_log_max_mb * _MB
        copy = self._reopen_access_log is None
        if rotate(self._access_log, max_bytes, retention.access_log_keep, copy=copy):
            rotated.append(self._access_log.name)
        stale_before = time.time() - retention.stopped_instance_logs_days * _DAY
        for path in sorted(self._instance_logs.glob("*.log")):
            if path.stem in running:
                max_bytes = retention.instance_log_max_mb * _MB
                copy = path.stem in copied
                if rotate(path, max_bytes, retention.instance_log_keep, copy=copy):
                    rotated.append(path.name)
            elif _mtime(path) < stale_before:
                for old in [path, *path.parent.glob(f"{path.name}.*")]:
                    old.unlink(missing_ok=True)
                removed.append(path.name)
        return {"rotated": rotated, "removed": removed}


def rotate(path: Path, max_bytes: float, keep: int, *, copy: bool = True) -> bool:
    """If `path` is over `max_bytes`: shift `path.1..keep-1` up by one (dropping the
    oldest), then copy `path` to `path.1` and truncate `path`, or with `copy=False` rename
    `path` to `path.1` and create an empty `path` (for a writer that re-opens `path` when
    it is another file: nothing lost, see the module; readers never miss the file). True
    if it rotated."""
    try:
        if path.stat().st_size <= max_bytes:
            return False
    except FileNotFoundError:
        return False
    for k in range(keep, 1, -1):
        older = path.with_name(f"{path.name}.{k - 1}")
        if older.exists():
            older.replace(path.with_name(f"{path.name}.{k}"))
    first = path.with_name(f"{path.name}.1")
    if not copy:
        path.replace(first)
        path.open("ab").close()  # (the writer may have created it already: both append)
        return True
    shutil.copyfile(path, first)
    with open(path, "r+b") as f:
        f.truncate(0)
    return True


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return float("inf")
