"""`sluice.cli.native_heap`: what a worker thread frees in the middle of its malloc arena
stays resident until `malloc_trim` hands it back (the soak's RSS growth, bench/README.md)."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from sluice.cli import native_heap

pytestmark = pytest.mark.skipif(native_heap.trimmer() is None, reason="not glibc")


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_trim_returns_what_a_thread_freed_inside_its_arena() -> None:
    kept: list[bytearray] = []

    def churn() -> None:  # 64 MB in 32 KiB blocks (below mmap's threshold), 1 in 64 kept
        blocks = [bytearray(32 * 1024) for _ in range(2048)]
        kept.extend(blocks[63::64])  # the last one too: the heap's top stays in use

    worker = threading.Thread(target=churn)
    worker.start()
    worker.join()
    before = _rss_mb()
    trim = native_heap.trimmer()
    assert trim is not None
    trim()
    assert before - _rss_mb() > 32, "free pages inside the arena stayed resident"
    assert len(kept) == 32


def test_trim_periodically_trims_until_cancelled(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def trim() -> bool:
        calls.append(1)
        return True

    monkeypatch.setattr(native_heap, "trimmer", lambda: trim)

    async def run() -> None:
        task = asyncio.create_task(native_heap.trim_periodically(0.01))
        await asyncio.sleep(0.1)
        task.cancel()

    asyncio.run(run())
    assert len(calls) >= 3
