"""uvicorn inside a process that owns its signals (`sluice up`, `sluice gateway`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import uvicorn

__all__ = ["QuietServer"]


class QuietServer(uvicorn.Server):
    """uvicorn without its own signal handling: the process owns SIGINT/SIGTERM and shuts
    everything down in order (say the gateway, then the instances), not just this server."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield
