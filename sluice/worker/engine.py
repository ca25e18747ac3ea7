"""The state of one instance: its runtimes, the concurrency gate and exact request counters.

The controller decides a draining instance is empty from /stats, so the counters are plain
integers changed only on the event loop (no sampling, no estimates), and the Prometheus
gauges read the same integers. /stats also reports process CPU time and resident memory, so the
controller can divide their change over a window by the requests finished in it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from sluice.core.errors import NotFound
from sluice.worker.config import WorkerConfig
from sluice.worker.metrics import WorkerMetrics
from sluice.worker.runtimes import Runtime, make_runtime
from sluice.worker.samples import SampleRing

__all__ = ["Worker"]

log = logging.getLogger("sluice.worker")


class Worker:
    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.runtimes: dict[str, Runtime] = {
            name: make_runtime(name, spec, config.instance_id)
            for name, spec in config.models.items()
        }
        self.started_at = time.time()
        self.inflight = 0
        self.queued = 0
        self.served = 0
        self.errors = 0
        self.disconnected = 0
        """Requests whose client went away first (stopped at once): neither served nor errors."""
        self.failure: str | None = None
        self.on_failure: Callable[[], None] | None = None
        """Called once if a model fails to load: the process should stop, not idle unready."""
        self.metrics = WorkerMetrics()
        self.samples = SampleRing()
        self.memory_gb = sum(spec.memory_gb for spec in config.models.values())
        """Declared model memory of the instance (sum over its models), GiB."""
        self.metrics.inflight.set_function(lambda: self.inflight)
        self.metrics.queued.set_function(lambda: self.queued)
        self._loaded: set[str] = set()
        self._gate = asyncio.Semaphore(config.max_concurrency)
        self._loading: list[asyncio.Task[None]] = []
        self.sleep_state = "awake"
        """'awake', 'falling asleep', 'asleep' or 'waking' (`sleep`, `wake`)"""
        self.refused_asleep = 0
        """requests refused because the instance slept (none, where the routing is right)"""
        self._napping = asyncio.Lock()

    @property
    def can_sleep(self) -> bool:
        """Whether the instance has vLLM's sleep mode: only `sim` models do here (their
        `sim.sleep_s` / `sim.wake_s`); a real server declares its own (`command.sleep`)."""
        return all(spec.runtime == "sim" for spec in self.config.models.values())

    @property
    def is_sleeping(self) -> bool:
        """Asleep, falling asleep or waking: it serves nothing (as vLLM's /is_sleeping)."""
        return self.sleep_state != "awake"

    async def sleep(self) -> None:
        """vLLM's POST /sleep: the weights leave the accelerator; asleep `sim.sleep_s`
        after (the longest of the models'). Asleep already: nothing to do."""
        async with self._napping:
            if self.sleep_state == "asleep":
                return
            self.sleep_state = "falling asleep"
            await asyncio.sleep(max(self._sim("sleep_s"), 0.0))
            self.sleep_state = "asleep"

    async def wake(self) -> None:
        """vLLM's POST /wake_up: the weights come back; awake `sim.wake_s` after."""
        async with self._napping:
            if self.sleep_state == "awake":
                return
            self.sleep_state = "waking"
            await asyncio.sleep(max(self._sim("wake_s"), 0.0))
            self.sleep_state = "awake"

    def _sim(self, name: str) -> float:
        return max(
            (float(getattr(spec.sim, name)) for spec in self.config.models.values() if spec.sim),
            default=0.0,
        )

    @property
    def ready(self) -> bool:
        return self.failure is None and len(self._loaded) == len(self.runtimes)

    def is_loaded(self, model: str) -> bool:
        return model in self._loaded

    def loading(self) -> list[str]:
        return [name for name in self.runtimes if name not in self._loaded]

    def runtime(self, model: str) -> Runtime:
        try:
            return self.runtimes[model]
        except KeyError:
            served = ", ".join(sorted(self.runtimes))
            raise NotFound(
                f"model {model!r} is not served by instance {self.config.instance_id!r} "
                f"(it serves: {served})"
            ) from None

    def start(self) -> None:
        """Load every model in the background; the server answers /health meanwhile."""
        self._loading = [
            asyncio.create_task(self._load(name, runtime), name=f"load-{name}")
            for name, runtime in self.runtimes.items()
        ]

    async def stop(self) -> None:
        for task in self._loading:
            task.cancel()
        await asyncio.gather(*self._loading, return_exceptions=True)

    async def _load(self, name: str, runtime: Runtime) -> None:
        started = time.monotonic()
        try:
            await runtime.load()
        except Exception as exc:
            self.failure = f"model {name!r} failed to load: {exc}"
            log.exception("instance %s: %s", self.config.instance_id, self.failure)
            if self.on_failure is not None:
                self.on_failure()
            return
        self._loaded.add(name)
        log.info(
            "instance %s: model %r (%s, %s) loaded in %.2fs",
            self.config.instance_id,
            name,
            runtime.spec.runtime,
            runtime.spec.version,
            time.monotonic() - started,
        )
        if self.ready:
            self.metrics.ready.set(1)

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one of `max_concurrency` slots; waiters are served in arrival order."""
        self.queued += 1
        try:
            await self._gate.acquire()
        finally:
            self.queued -= 1
        try:
            yield
        finally:
            self._gate.release()

    def request_started(self) -> None:
        self.inflight += 1

    def request_finished(self, model: str | None, status: str, seconds: float) -> None:
        """`status`: the HTTP status sent, 'error' (broke off on this side) or 'disconnected'
        (the client went away first)."""
        self.inflight -= 1
        if status.isdigit() and int(status) < 400:
            self.served += 1
        elif status == "disconnected":
            self.disconnected += 1
        else:
            self.errors += 1
        label = model or "-"
        self.metrics.requests.labels(model=label, status=status).inc()
        self.metrics.latency.labels(model=label).observe(seconds)

    def stats(self) -> dict[str, Any]:
        return {
            "instance_id": self.config.instance_id,
            "ready": self.ready,
            "inflight": self.inflight,
            "queued": self.queued,
            "served": self.served,
            "errors": self.errors,
            "disconnected": self.disconnected,
            "requests_total": self.served + self.errors + self.disconnected,
            "cpu_s_total": time.process_time(),
            "rss_bytes": _rss_bytes(),
            "memory_gb": self.memory_gb,
            "sleep_state": self.sleep_state,
            "refused_asleep": self.refused_asleep,
        }


def _rss_bytes() -> int:
    """Resident memory now, from /proc; where there is none, the peak from getrusage."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
