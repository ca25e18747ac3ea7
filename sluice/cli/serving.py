"""The parts of a long-running process that owns its signals (`sluice up`, `sluice
gateway`): uvicorn without its own signal handling, and each part kept running (restarted
after a crash, a bounded number of times) until the process is told to stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import uvicorn

from sluice.core import Conflict

__all__ = ["QuietServer", "keep_serving", "until_stopped"]

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


async def keep_serving(
    name: str,
    run_once: Callable[[int], Awaitable[None]],
    stopping: asyncio.Event,
    started: Callable[[], bool] | None = None,
) -> None:
    """Run `run_once(attempt)` (attempt 0, 1, ...) and again whenever it ends or crashes
    before `stopping` is set: logged with the traceback, after a backoff, at most RESTARTS
    times in RESTART_WINDOW_S (then it stays down, logged, and this returns). If `started`
    is given and the first run failed before `started()` held, that is a start-up error
    (say a TLS key that cannot be read): it is raised, and `sluice up` stops with it."""
    restarts: deque[float] = deque()
    delay = RESTART_DELAY_S[0]
    attempt = 0
    while True:
        try:
            await run_once(attempt)
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
            await asyncio.wait_for(stopping.wait(), delay)
        if stopping.is_set():
            return
        delay = min(RESTART_DELAY_S[1], delay * 2)
        attempt += 1


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
