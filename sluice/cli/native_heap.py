"""Give the C heap's free memory back to the system now and then (glibc's `malloc_trim`).

glibc keeps what is freed in its arenas (one per thread that allocates, up to eight a core)
and by itself returns only the free top of a heap. In `sluice up` the canary analysis, the
store's calls and the control API's handlers run on worker threads and free almost all
they allocate, and what stays free in the middle of their arenas stays resident: in a
10-minute soak malloc's free memory grew 0.9 -> 15.1 MB, a third of the RSS growth
(`bench/README.md`, `bench/soak.py`). `malloc_trim(0)` hands the whole free pages of every
arena back (madvise; the address space stays), in a few milliseconds. Off glibc (musl,
macOS) there is nothing to call and nothing is done.
"""

from __future__ import annotations

import asyncio
import ctypes
from collections.abc import Callable

__all__ = ["TRIM_EVERY_S", "trim_periodically", "trimmer"]

TRIM_EVERY_S = 60.0
"""Often enough that an analysis's garbage does not pile up between trims; rare enough that
their cost (ms, the arenas locked meanwhile) is nothing."""


def trimmer() -> Callable[[], bool] | None:
    """`malloc_trim(0)` (True if it released memory), or None without glibc."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: bool(trim(0))


async def trim_periodically(every_s: float = TRIM_EVERY_S) -> None:
    """Trim every `every_s` until cancelled (at once if there is nothing to call), on a
    worker thread: ctypes lets go of the GIL, so the event loop (the gateway's, in `sluice
    up`) goes on meanwhile instead of stalling for the trim's milliseconds."""
    trim = trimmer()
    if trim is None:
        return
    while True:
        await asyncio.sleep(every_s)
        await asyncio.to_thread(trim)
