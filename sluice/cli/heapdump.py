"""Heap snapshots of a running `sluice up` on demand, to find what grows in a long run.

Off unless `SLUICE_TRACEMALLOC_DIR` names a directory. Then each SIGUSR2 writes a
tracemalloc snapshot, after a full collection (cyclic garbage is not growth), to
`DIR/<pid>-<n>.tracemalloc`, and beside it `<pid>-<n>.json`, what tracemalloc cannot see
(`native_memory`: C allocations, such as SQLite's page caches, and malloc's free space); the
first starts tracing (`TRACE_FRAMES` frames an allocation)
unless the process was started tracing (`python -X tracemalloc=N`). Tracing from the first
signal, not from the start, leaves start-up alone (the imports run ~30x slower traced) and
traces exactly what was allocated since: what a later snapshot holds of it is the growth.
Tracing slows every allocation and a snapshot stalls the event loop for a second or more,
so neither happens without both the variable and the signal. Compare two snapshots with
`Snapshot.load(b).compare_to(Snapshot.load(a), "traceback")`, as
`bench/soak.py --tracemalloc DIR` does.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import itertools
import json
import os
import signal
import tracemalloc
from pathlib import Path
from typing import Any

__all__ = ["ENV", "TRACE_FRAMES", "install", "native_memory"]

ENV = "SLUICE_TRACEMALLOC_DIR"
TRACE_FRAMES = 16
"""Frames kept an allocation: enough to get past asyncio's and the web framework's own."""


def install(loop: asyncio.AbstractEventLoop) -> Path | None:
    """Dump a snapshot on each SIGUSR2 if asked for (see the module); the directory, or
    None (the default: nothing installed)."""
    where = os.environ.get(ENV)
    if not where:
        return None
    directory = Path(where)
    directory.mkdir(parents=True, exist_ok=True)
    numbers = itertools.count(1)

    def dump() -> None:
        if not tracemalloc.is_tracing():
            tracemalloc.start(TRACE_FRAMES)
        gc.collect()
        path = directory / f"{os.getpid()}-{next(numbers)}.tracemalloc"
        part = path.with_suffix(".part")
        tracemalloc.take_snapshot().dump(str(part))
        path.with_suffix(".json").write_text(json.dumps(native_memory()))
        part.rename(path)  # whole or absent: a reader polls for the name

    loop.add_signal_handler(signal.SIGUSR2, dump)
    return directory


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


def native_memory() -> dict[str, Any]:
    """Bytes tracemalloc does not trace: its own, SQLite's (every connection's page and
    statement caches), and glibc malloc's in use and free (held, not returned: what
    fragmentation shows as), all arenas; a figure this C library lacks is left out."""
    traced, peak = tracemalloc.get_traced_memory()
    out: dict[str, Any] = {
        "traced": traced,
        "traced_peak": peak,
        "tracemalloc_own": tracemalloc.get_tracemalloc_memory(),
    }
    try:
        import _sqlite3

        used = ctypes.CDLL(_sqlite3.__file__).sqlite3_memory_used
        used.restype = ctypes.c_int64
        out["sqlite"] = used()
    except (ImportError, OSError, AttributeError):
        pass
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return out
    mallinfo2.restype = _Mallinfo2
    info = mallinfo2()
    out.update(
        malloc_in_use=info.uordblks,
        malloc_free=info.fordblks,
        malloc_mmapped=info.hblkhd,
        malloc_arena=info.arena,
    )
    return out
