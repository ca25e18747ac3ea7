"""Running the reconcile tick forever: a failed tick is logged with its traceback, counted,
and retried after a backoff (RETRY_MIN_S doubling to RETRY_MAX_S, back to normal after a
tick that succeeds). While the store refuses writes (read-only, full, locked by another
process) no tick runs, so the routing snapshot and the instances stay as they are, and
every retry first tries a small write; once one goes through, the events kept meanwhile
are stored and the loop goes on."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from sluice.control.events import EventLog, store_error_text, store_outage
from sluice.core import Clock
from sluice.policy.tick import TICK_S
from sluice.store.ports import StateRecords

__all__ = ["PLATFORM", "TickLoop"]

log = logging.getLogger("sluice.controller")

RETRY_MIN_S = 1.0
RETRY_MAX_S = 30.0
"""After a failed tick the next try waits RETRY_MIN_S, doubling each failure up to this."""
PROBE_KEY = "controller.store-probe"
"""The state row the controller writes to learn whether the store takes writes again."""
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
PLATFORM = "*"
"""The `group` of events about the whole platform (no group may be named so)."""


class TickLoop:
    """Calls `tick` until cancelled (at once when `wake` is set, else every TICK_S) and
    keeps what `status()` reports: counters, the last error, recent durations."""

    def __init__(
        self,
        tick: Callable[[], Awaitable[None]],
        wake: asyncio.Event,
        store: StateRecords,
        events: EventLog,
        clock: Clock,
    ) -> None:
        self._tick = tick
        self._wake = wake
        self._store = store
        self._events = events
        self._clock = clock
        self._ticks = 0
        self._tick_failures = 0
        self._failing = 0
        """ticks failed in a row (0: the last one succeeded)"""
        self._last_error: str | None = None
        self._last_error_at: float | None = None
        self._last_ok_at: float | None = None
        self._retry_s: float | None = None
        self._durations: deque[float] = deque(maxlen=100)
        self._registry = CollectorRegistry(auto_describe=True)
        self._tick_s = Histogram(
            "sluice_controller_tick_seconds",
            "Time of one reconcile tick (decision, journal, store writes, apply).",
            buckets=_BUCKETS,
            registry=self._registry,
        )
        self._decide_s = Histogram(
            "sluice_controller_decide_seconds",
            "Time of the tick's pure decision step (sluice.policy.tick.decide).",
            buckets=_BUCKETS,
            registry=self._registry,
        )

    @contextlib.contextmanager
    def timing_decision(self) -> Iterator[None]:
        """Time the tick's decision step (`sluice_controller_decide_seconds`)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self._decide_s.observe(time.perf_counter() - started)

    def prometheus_text(self) -> bytes:
        return generate_latest(self._registry)

    async def run(self) -> None:
        """Tick until cancelled; an error never ends this."""
        while True:
            self._wake.clear()
            if await self._attempt():
                self._retry_s = None
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel that
                # lands as the wake-up does, and the loop would then never stop
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(TICK_S):
                        await self._wake.wait()
            else:
                self._retry_s = _next_retry(self._retry_s)
                await asyncio.sleep(self._retry_s)

    async def _attempt(self) -> bool:
        """One tick (after a store probe, while the store is known to refuse writes);
        False if it raised."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            if self._events.health.problem is not None:
                await self._probe_store()
            await self._tick()
        except Exception as exc:  # CancelledError is no Exception: stopping still stops
            self._took(loop.time() - started)
            self._failed(exc)
            return False
        self._took(loop.time() - started)
        self._ticks += 1
        self._failing = 0
        self._last_ok_at = self._clock.now()
        return True

    def _took(self, seconds: float) -> None:
        self._durations.append(seconds)
        self._tick_s.observe(seconds)

    def _failed(self, exc: Exception) -> None:
        now = self._clock.now()
        problem = store_outage(exc)
        text = f"{type(exc).__name__}: {store_error_text(exc) if problem else exc}"[:500]
        self._tick_failures += 1
        self._failing += 1
        again = text == self._last_error and self._failing > 1
        self._last_error, self._last_error_at = text, now
        if problem is not None:
            self._events.health.refuse(problem, exc, now)
        what = f"{problem}; holding the last good state" if problem else "tick failed"
        retry = _next_retry(self._retry_s)
        if again:  # the traceback was logged when this error first appeared
            log.error("%s (%d in a row, retry in %gs): %s", what, self._failing, retry, text)
        else:
            log.error("%s (retry in %gs): %s", what, retry, text, exc_info=exc)

    async def _probe_store(self) -> None:
        """Raises while the store still refuses writes; once one goes through, stores the
        events kept meanwhile and says how long the outage was."""
        health = self._events.health
        now = self._clock.now()
        await asyncio.to_thread(self._store.put_state, PROBE_KEY, {"at": now}, now)
        stored, dropped = await self._events.flush()
        problem, error, since = health.problem, health.error, health.since
        refused = health.refused
        health.clear()
        lasted = now - since if since is not None else 0.0
        kept = f"; {stored} events kept meanwhile are stored" if stored else ""
        kept += f", {dropped} more were only logged" if dropped else ""
        log.warning("the store takes writes again after %.0fs (%s: %s)", lasted, problem, error)
        await self._events.emit(
            PLATFORM,
            None,
            "store",
            f"the store takes writes again after {lasted:.0f}s ({problem}: {error}; "
            f"{refused} writes refused){kept}",
            since=since,
            problem=problem,
            error=error,
        )

    @property
    def degraded(self) -> str | None:
        """Why the platform is degraded (the store refuses writes, ticks keep failing)."""
        health = self._events.health
        if health.problem is not None:
            return f"{health.problem}: {health.error}"
        if self._failing:
            return f"ticks failing ({self._failing} in a row): {self._last_error}"
        return None

    def to_json(self) -> dict[str, Any]:
        recent = list(self._durations)
        return {
            "ticks": self._ticks,
            "tick_failures": self._tick_failures,
            "failing_in_a_row": self._failing,
            "last_tick_error": self._last_error,
            "last_tick_error_at": self._last_error_at,
            "last_tick_ok_at": self._last_ok_at,
            "retry_in_s": self._retry_s,
            "last_tick_s": round(recent[-1], 4) if recent else None,
            "slowest_recent_tick_s": round(max(recent), 4) if recent else None,
        }


def _next_retry(previous: float | None) -> float:
    """RETRY_MIN_S after the first failure, then twice the last wait, up to RETRY_MAX_S."""
    return min(RETRY_MAX_S, max(RETRY_MIN_S, (previous or 0.0) * 2))
