"""Every controller action becomes an event with its reason: in the log and in the store.

The store can refuse writes (a read-only file, a full disk, a write lock another process
holds). An event is then still logged, kept in a bounded buffer to store once the store takes
writes again, and the refusal is noted in `StoreHealth`, which the controller reads: it holds
the last good state until a write goes through (`Controller.run`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass
from typing import Any

from sluice.core import Clock
from sluice.store import outage_reason
from sluice.store.ports import EventRecords

__all__ = ["EventLog", "StoreHealth", "store_outage"]

log = logging.getLogger("sluice.events")

UNSTORED_EVENTS = 1000
"""Events kept in memory while the store refuses writes; older ones are only in the log."""


def store_outage(exc: BaseException) -> str | None:
    """What a store error says about the store ("store read-only", "store full", "store
    locked", "store unavailable"), or None when `exc` is no store outage (a bug is not one;
    `sluice.store.outage_reason` decides, for SQLite and PostgreSQL alike)."""
    reason = outage_reason(exc)
    if reason is None:
        return None
    text = f"{reason} {store_error_text(exc)}".lower()
    if "readonly" in text or "read-only" in text or "read only" in text:
        return "store read-only"
    if "disk is full" in text or "disk full" in text or "no space" in text:
        return "store full"
    if "locked" in text or "busy" in text:
        return "store locked"
    return "store unavailable"


def store_error_text(exc: BaseException) -> str:
    """The driver's message ("attempt to write a readonly database"), without SQLAlchemy's
    statement and background link."""
    return str(getattr(exc, "orig", None) or exc).strip()


@dataclass
class StoreHealth:
    """Whether the store takes writes: `problem` is None while it does. Set by whoever saw a
    write refused (events, instance records, the controller); cleared by the controller once
    a write succeeds again."""

    problem: str | None = None
    error: str | None = None
    since: float | None = None
    refused: int = 0
    """writes refused since `since`"""

    def refuse(self, problem: str, exc: BaseException, now: float) -> None:
        if self.problem is None:
            self.since = now
            self.refused = 0
        self.problem, self.error = problem, store_error_text(exc)
        self.refused += 1

    def saw(self, exc: BaseException, now: float) -> str | None:
        """Record `exc` if it is a store outage (a write refused); returns the problem, or
        None for any other error."""
        problem = store_outage(exc)
        if problem is not None:
            self.refuse(problem, exc, now)
        return problem

    def clear(self) -> None:
        self.problem = self.error = self.since = None
        self.refused = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.problem is None,
            "problem": self.problem,
            "error": self.error,
            "since": self.since,
            "refused_writes": self.refused,
        }


class EventLog:
    def __init__(self, store: EventRecords, clock: Clock) -> None:
        self._store = store
        self._clock = clock
        self.health = StoreHealth()
        self._unstored: deque[dict[str, Any]] = deque(maxlen=UNSTORED_EVENTS)
        self._dropped = 0

    async def emit(
        self, group: str, instance: str | None, kind: str, message: str, **detail: Any
    ) -> None:
        """Log the event and store it; a store that refuses the write does not fail the
        caller (a drain or a stop must go on): the event waits in memory for `flush`."""
        log.info("%s %s %s: %s", group, instance or "-", kind, message)
        row: dict[str, Any] = {
            "group": group,
            "instance": instance,
            "kind": kind,
            "message": message,
            "detail": detail,
            "now": self._clock.now(),
        }
        try:
            await asyncio.to_thread(self._store.append_event, **row)
        except Exception as exc:
            problem = store_outage(exc)
            if problem is None:
                raise
            self.health.refuse(problem, exc, row["now"])
            if len(self._unstored) == self._unstored.maxlen:
                self._dropped += 1
            self._unstored.append(row)
            log.log(
                logging.WARNING if self.health.refused == 1 else logging.DEBUG,
                "%s (%s): events are kept in memory until the store takes writes",
                problem,
                store_error_text(exc),
            )

    async def flush(self) -> tuple[int, int]:
        """Store the events the store refused, oldest first, with their own times; returns
        (stored, dropped because the buffer was full). Raises if the store refuses again."""
        stored = 0
        while self._unstored:
            await asyncio.to_thread(self._store.append_event, **self._unstored[0])
            self._unstored.popleft()
            stored += 1
        dropped, self._dropped = self._dropped, 0
        return stored, dropped
