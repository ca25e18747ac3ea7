"""`sluice.cli.heapdump`: heap snapshots on SIGUSR2, only when its variable is set (never by
default); the first signal starts tracing, so a later snapshot holds what was kept since."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.cli import heapdump


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.remove_signal_handler(signal.SIGUSR2)
    loop.close()


def test_off_by_default(loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(heapdump.ENV, raising=False)
    assert heapdump.install(loop) is None
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL


def test_sigusr2_starts_tracing_and_dumps_what_grew(
    loop: asyncio.AbstractEventLoop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if tracemalloc.is_tracing():
        pytest.skip("this interpreter traces allocations already")
    monkeypatch.setenv(heapdump.ENV, str(tmp_path / "heap"))
    assert heapdump.install(loop) == tmp_path / "heap"

    def signal_and_wait() -> None:
        os.kill(os.getpid(), signal.SIGUSR2)
        loop.run_until_complete(asyncio.sleep(0.05))

    try:
        signal_and_wait()
        assert tracemalloc.is_tracing()
        kept = [bytearray(4096) for _ in range(256)]  # 1 MiB that stays
        signal_and_wait()
    finally:
        tracemalloc.stop()
    pid = os.getpid()
    dumps = sorted(p.name for p in (tmp_path / "heap").iterdir())
    assert dumps == [f"{pid}-{n}.{kind}" for n in (1, 2) for kind in ("json", "tracemalloc")]
    native = json.loads((tmp_path / "heap" / f"{pid}-2.json").read_text())
    assert native["traced"] >= len(kept) * 4096 and "malloc_free" in native
    dumps = dumps[1::2]
    first, second = (tracemalloc.Snapshot.load(str(tmp_path / "heap" / d)) for d in dumps)
    assert second.traceback_limit == heapdump.TRACE_FRAMES
    (top, *_) = second.compare_to(first, "lineno")
    assert top.size_diff >= len(kept) * 4096
    assert top.traceback[0].filename == __file__
