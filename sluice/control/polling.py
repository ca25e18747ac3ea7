"""A task that reads a set of targets in rounds, off the controller's tick.

Shared by the sample collector (canary analysis) and the server scraper (servers' own
metrics): both read every target concurrently once a round, must not stop on a bug in one
round, and must not keep connections open while there is nothing to read, since those to
instances stopped meanwhile would sit half-closed (CLOSE_WAIT) for as long as they idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Generic, TypeVar

import httpx

__all__ = ["RoundPoller"]

log = logging.getLogger("sluice.polling")

T = TypeVar("T")


class RoundPoller(Generic[T]):
    """`watch` sets the targets and starts the task on the running loop when there are
    any; a round (`poll`, the subclass's) starts every `poll_s`, or as soon as the last one
    ended if it took longer; with no targets left the task closes its pool (a client it
    made itself) and ends. `aclose` stops it."""

    name = "poller"

    def __init__(self, client: httpx.AsyncClient | None, poll_s: float, timeout_s: float) -> None:
        self._own_client = client is None
        self._client = client or self._new_client(timeout_s)
        self._poll_s = poll_s
        self._timeout_s = timeout_s
        self._targets: list[T] = []
        self._task: asyncio.Task[None] | None = None
        self.rounds = 0
        self.last_round_s = 0.0

    @staticmethod
    def _new_client(timeout_s: float) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=timeout_s, trust_env=False)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._client.aclose()

    def _set_targets(self, targets: Sequence[T]) -> None:
        self._targets = list(targets)
        if self._targets and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    async def poll(self, targets: Sequence[T]) -> None:
        raise NotImplementedError

    def _forget(self) -> None:
        """Called when the task idles: drop per-target state that a new watch re-learns."""

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while self._targets:
                started = loop.time()
                try:
                    await self.poll(self._targets)
                except Exception:  # a bug here must not end the polling
                    log.exception("%s round failed", self.name)
                self.rounds += 1
                self.last_round_s = loop.time() - started
                await asyncio.sleep(max(0.0, self._poll_s - self.last_round_s))
            self._forget()
            if self._own_client:
                client, self._client = self._client, self._new_client(self._timeout_s)
                await client.aclose()
            if not self._targets:  # no await from here to the end: watch() sees us done
                return
