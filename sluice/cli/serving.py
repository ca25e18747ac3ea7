"""The parts of a long-running process that owns its signals (`sluice up`, `sluice
gateway`): uvicorn without its own signal handling, and each part kept running (restarted
after a crash, a bounded number of times) until the process is told to stop.

A part that fails because the state store is away (PostgreSQL down, SQLite locked or
read-only) has not crashed: it is logged on one line, then at most once a minute with a
count, and started again for as long as the outage lasts, so it recovers by itself when the
store returns (and says so). The loops that catch their own errors (the controller's ticks,
the observer) log through the process's handlers, on which `keep_serving` puts
`quiet_store_outages`' filter: a record whose exception is a store outage loses its
traceback (the reason is said instead), and its message repeats at most once a minute."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import uvicorn

from sluice.core import Conflict, StoreUnavailable

__all__ = ["QuietServer", "keep_serving", "quiet_store_outages", "until_stopped"]

log = logging.getLogger("sluice.up")


class QuietServer(uvicorn.Server):
    """uvicorn without its own signal handling: the process owns SIGINT/SIGTERM and shuts
    everything down in order (say the gateway, then the instances), not just this server."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


RESTARTS = 5
"""A part of `sluice up` that dies is started again at most this often per RESTART_WINDOW_S;
then it stays down (logged) and the gateway serves on: only SIGINT/SIGTERM stop `sluice up`."""
RESTART_WINDOW_S = 600.0
RESTART_DELAY_S = (1.0, 30.0)
"""The first restart waits 1 s, each next one twice as long, up to 30 s."""
STORE_RETRY_S = (1.0, 10.0)
"""A part stopped by a store outage starts again after 1 s, then twice as long each time up
to 10 s, for as long as the outage lasts (not counted against RESTARTS)."""
REPEAT_LOG_S = 60.0
"""While the store stays away, a part logs its failures once a minute at most, counted."""
BACK_AFTER_S = 10.0
"""A part started again after a store outage is said to be back once it ran this long."""


@dataclass
class _Outage:
    """A part's failures while the store is away, for its log lines."""

    since: float
    said_at: float
    failures: int = 1
    back: bool = False
    """it ran BACK_AFTER_S since its last failure (said): the next failure is a new outage"""


async def keep_serving(
    name: str,
    run_once: Callable[[int], Awaitable[None]],
    stopping: asyncio.Event,
    started: Callable[[], bool] | None = None,
    *,
    store: str | None = None,
) -> None:
    """Run `run_once(attempt)` (attempt 0, 1, ...) and again whenever it ends or crashes
    before `stopping` is set: logged with the traceback, after a backoff, at most RESTARTS
    times in RESTART_WINDOW_S (then it stays down, logged, and this returns). If `started`
    is given and the first run failed before `started()` held, that is a start-up error
    (say a TLS key that cannot be read): it is raised, and `sluice up` stops with it.
    A failure because the state store (`store`: where it is, without its password) cannot be
    reached or written is no crash: one line, repeats once a minute, retried until the
    store answers (see the module's docstring)."""
    quiet_store_outages()
    restarts: deque[float] = deque()
    delay = RESTART_DELAY_S[0]
    attempt = 0
    outage: _Outage | None = None
    while True:
        try:
            if outage is None or outage.back:
                await run_once(attempt)
            else:
                await _run_watched(name, run_once(attempt), outage)
            if stopping.is_set():
                return
            log.error("%s stopped by itself", name)
        except asyncio.CancelledError:
            raise
        except (Exception, SystemExit) as exc:  # uvicorn exits (SystemExit) if it cannot start
            if stopping.is_set():
                return
            if attempt == 0 and started is not None and not started():
                if isinstance(exc, SystemExit):  # would end the event loop, not just this
                    raise Conflict(f"{name} could not start (exit {exc.code}); see above") from None
                raise
            if outage is not None and outage.back:
                outage = None  # it ran again for a while: a failure now is news
            unavailable = _store_outage(exc, store) if isinstance(exc, Exception) else None
            if unavailable is not None:
                outage = _note_outage(name, unavailable, outage)
                wait = min(STORE_RETRY_S[1], STORE_RETRY_S[0] * 2 ** (outage.failures - 1))
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await stopping.wait()
                if stopping.is_set():
                    return
                attempt += 1
                continue
            log.error("%s crashed", name, exc_info=exc)
        now = time.monotonic()
        while restarts and restarts[0] < now - RESTART_WINDOW_S:
            restarts.popleft()
        if len(restarts) >= RESTARTS:
            log.error(
                "%s died %d times in %.0f s: not restarting it again; the gateway keeps "
                "serving, restart `sluice up` to get it back",
                name,
                len(restarts) + 1,
                RESTART_WINDOW_S,
            )
            return
        restarts.append(now)
        log.warning("restarting %s in %g s", name, delay)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await stopping.wait()
        if stopping.is_set():
            return
        delay = min(RESTART_DELAY_S[1], delay * 2)
        attempt += 1


def _store_outage(exc: Exception, store: str | None) -> StoreUnavailable | None:
    """`exc` as a store outage, or None (a bug). The store's classifier (and SQLAlchemy) is
    imported only here, on a failure."""
    from sluice.store import store_unavailable

    return store_unavailable(exc, store)


def _note_outage(name: str, exc: StoreUnavailable, outage: _Outage | None) -> _Outage:
    """Log `name`'s failure: the first on one line, then at most once per REPEAT_LOG_S."""
    now = time.monotonic()
    store = exc.detail.get("store")
    where = f"the state store ({store})" if store else "the state store"
    problem = exc.detail.get("problem") or "cannot be reached or written"
    why = exc.detail.get("reason") or exc.message
    if outage is None:
        log.error(
            "%s stopped: %s %s: %s; retrying until it answers (repeats logged once a "
            "minute); the gateways keep serving their routes",
            name,
            where,
            problem,
            why,
        )
        return _Outage(since=now, said_at=now)
    outage.failures += 1
    if now - outage.said_at >= REPEAT_LOG_S:
        log.warning(
            "%s: %s still %s (%d failures in %.0f s; last: %s)",
            name,
            where,
            problem,
            outage.failures,
            now - outage.since,
            why,
        )
        outage.said_at = now
    return outage


async def _run_watched(name: str, run: Awaitable[None], outage: _Outage) -> None:
    """Await `run` (a part started again during a store outage); once it has run for
    BACK_AFTER_S, say that the part is back."""
    task = asyncio.ensure_future(run)
    try:
        done, _ = await asyncio.wait({task}, timeout=BACK_AFTER_S)
        if not done:
            outage.back = True
            log.warning(
                "%s runs again: no store failure for %g s (%d failures in %.0f s before)",
                name,
                BACK_AFTER_S,
                outage.failures,
                time.monotonic() - outage.since,
            )
        await task
    finally:
        if not task.done():
            task.cancel()


def quiet_store_outages(logger: logging.Logger | None = None) -> None:
    """Put the store-outage filter (`StoreOutageFilter`) on each of `logger`'s handlers
    (default: the root logger's, where `logging.basicConfig` put the process's), once."""
    for handler in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, StoreOutageFilter) for f in handler.filters):
            handler.addFilter(StoreOutageFilter())


class StoreOutageFilter(logging.Filter):
    """On a log handler: a record whose exception says the state store cannot be reached or
    written is shown without its traceback, with the reason instead, and a record of the
    same logger and message at most once per REPEAT_LOG_S, saying how many were left out.
    Every other record passes as it is."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._monotonic = monotonic
        self._shown: dict[tuple[str, str], tuple[float, int]] = {}
        """(logger, message format) -> (when last shown, how many left out since)"""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is None:
            return True
        from sluice.store import outage_reason  # loaded already where the store is used

        reason = outage_reason(exc)
        if reason is None:
            return True
        key = (record.name, str(record.msg))
        now = self._monotonic()
        last = self._shown.get(key)
        if last is not None and now - last[0] < REPEAT_LOG_S:
            self._shown[key] = (last[0], last[1] + 1)
            return False
        left_out = f"; {last[1]} like it left out" if last is not None and last[1] else ""
        record.msg = (
            f"{record.getMessage()} [the state store cannot be reached or written: {reason}; "
            f"no traceback, at most once a minute{left_out}]"
        )
        record.args = None
        record.exc_info = record.exc_text = None
        self._shown[key] = (now, 0)
        return True


async def until_stopped(
    stopper: asyncio.Task[Any], tasks: list[asyncio.Task[None]]
) -> BaseException | None:
    """Wait for SIGINT/SIGTERM (`stopper`); a task that gave up (it logged why) leaves the
    rest serving. Only a start-up error ends the wait early: it is returned."""
    pending = set(tasks)
    while True:
        done, _ = await asyncio.wait({stopper, *pending}, return_when=asyncio.FIRST_COMPLETED)
        if stopper in done:
            return None
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                return task.exception()
        pending -= done
