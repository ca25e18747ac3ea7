"""Spec work off the event loop (issue 31): parsing, validating, redacting and diffing a
spec runs in a worker process, never on the loop that proxies requests in `sluice up`.

Measured on this 2-core machine: PyYAML with located errors takes 30-90 ms for the
examples' specs and 5.4 s for a 1 MB one. A worker *thread* would not help: that work holds
the GIL, so the gateway on the loop would still wait for it in 5 ms slices. One worker
process (spawned at first use, kept, replaced every `TASKS_PER_PROCESS` tasks so a huge
spec's memory is given back) runs one task at a time; a task that runs past `SPEC_WORK_S` is
killed with its process and refused as a spec error. Only the picklable result (a few
strings and the parsed spec, ~40 ms to unpickle for 1 MB) comes back to the loop.
"""

from __future__ import annotations

import asyncio
import ctypes
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from sluice.core import SpecError, SpecIssue, Unavailable

__all__ = ["SPEC_WORK_S", "offload", "warm_up"]

SPEC_WORK_S = 60.0
"""A spec that takes longer than this to check is refused (a 2 MiB spec, the cap, takes
about 11 s here)."""
TASKS_PER_PROCESS = 50
_PR_SET_PDEATHSIG = 1  # linux/prctl.h

T = TypeVar("T")

_guard = threading.Lock()
_pool: ProcessPoolExecutor | None = None


async def offload(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args)` in the spec worker process; `fn` is a module-level function of
    `sluice.spec` (or another module the worker can import), its arguments and result
    picklable, and its errors come back as raised. A task past `SPEC_WORK_S` is a
    SpecError; a worker that died, Unavailable."""
    pool = _the_pool()
    future = pool.submit(fn, *args, **kwargs)
    try:
        async with asyncio.timeout(SPEC_WORK_S):
            return await asyncio.wrap_future(future)
    except TimeoutError:
        _discard(pool)
        why = f"checking this spec took longer than {SPEC_WORK_S:g} s: make it smaller"
        raise SpecError([SpecIssue("", why)]) from None
    except BrokenProcessPool:
        _discard(pool)
        raise Unavailable("the spec worker process died (out of memory?): try again") from None


def warm_up() -> None:
    """Start the worker process now (its imports take a second or two), not at the first
    spec that needs it."""
    _the_pool().submit(int)


def _the_pool() -> ProcessPoolExecutor:
    global _pool
    with _guard:
        if _pool is None:
            _pool = ProcessPoolExecutor(
                max_workers=1,
                mp_context=multiprocessing.get_context("spawn"),  # no copy of our threads/loop
                max_tasks_per_child=TASKS_PER_PROCESS,
                initializer=_bound_to,
                initargs=(os.getpid(),),
            )
        return _pool


def _bound_to(parent: int) -> None:
    """In the worker: die with the process that started it (a SIGKILLed controller must not
    leave a worker behind, holding its stdout and the resource tracker open), and let go of
    the controller's stdin, stdout and stderr (the worker prints nothing)."""
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before the line above took effect
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


def _discard(pool: ProcessPoolExecutor) -> None:
    """Kill the pool's process (a task stuck in C code cannot be cancelled) and forget it."""
    global _pool
    with _guard:
        if _pool is pool:
            _pool = None
    for process in list(getattr(pool, "_processes", {}).values()):
        process.kill()
    pool.shutdown(wait=False, cancel_futures=True)
