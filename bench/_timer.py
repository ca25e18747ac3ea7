"""Sub-millisecond timers for an asyncio loop.

uvloop's (and asyncio's) timers tick in whole milliseconds, which blurs a 20 ms backend delay
and an open-loop send schedule by up to 1 ms: as much as the latency a proxy adds. This
thread sleeps on a condition variable (with the kernel's timer slack set to 1 us where
`prctl` allows) and hands each due callback to the loop with `call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import heapq
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

_PR_SET_TIMERSLACK = 29


def _low_timer_slack() -> None:
    # Not Linux: the default slack (~50 us) is still far below a millisecond.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_TIMERSLACK, 1000, 0, 0, 0)


class PreciseTimer:
    """`call_at(when, fn, *args)`: run `fn(*args)` on `loop` at `time.perf_counter() == when`."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._heap: list[tuple[float, int, Callable[..., Any], tuple[Any, ...]]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="precise-timer", daemon=True)
        self._thread.start()

    def call_at(self, when: float, fn: Callable[..., Any], *args: Any) -> None:
        with self._cond:
            heapq.heappush(self._heap, (when, next(self._seq), fn, args))
            if self._heap[0][0] == when:
                self._cond.notify()

    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> None:
        self.call_at(time.perf_counter() + delay, fn, *args)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def _run(self) -> None:
        _low_timer_slack()
        heap = self._heap
        with self._cond:
            while not self._stopped:
                if not heap:
                    self._cond.wait()
                    continue
                wait = heap[0][0] - time.perf_counter()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                _, _, fn, args = heapq.heappop(heap)
                try:
                    self._loop.call_soon_threadsafe(fn, *args)
                except RuntimeError:  # the loop is closed: we are shutting down
                    return
