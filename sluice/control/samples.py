"""Per-request samples and resource counters, pulled from the instances of groups under
canary analysis (each worker keeps its last requests at `/sluice/samples`).

Pulling from the workers keeps the gateway's hot path free of response parsing, and gives
the analysis what only the instance knows: time to first token, output tokens, finish
reason, the text itself, and process CPU and memory.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx

__all__ = ["GroupSamples", "SampleCollector"]

PAGE = 2000


@dataclass
class _Cursor:
    after: int = 0
    cpu_s: float | None = None
    requests: int | None = None


@dataclass
class GroupSamples:
    """What one group's instances reported since the window began."""

    since: float = 0.0
    samples: list[dict[str, Any]] = field(default_factory=list)
    cpu_s: float = 0.0
    requests: int = 0
    memory_gb: float = 0.0
    """the largest of the instances' resident memory and declared model memory, GiB"""


class SampleCollector:
    """Keeps a cursor per instance so each sample is read once; `window(groups)` returns
    what arrived since the last `reset`."""

    def __init__(self, client: httpx.AsyncClient | None = None) -> None:
        self._client = client or httpx.AsyncClient(timeout=2.0, trust_env=False)
        self._cursors: dict[str, _Cursor] = {}
        self._groups: dict[str, GroupSamples] = {}

    async def aclose(self) -> None:
        await self._client.aclose()

    def reset(self, groups: Iterable[str], now: float) -> None:
        """Start a new analysis window for `groups` (a new step) at `now` (epoch seconds):
        requests that finished before it (warm-up passes included) are not in it."""
        for g in groups:
            self._groups[g] = GroupSamples(since=now)

    def window(self, group: str) -> GroupSamples:
        return self._groups.setdefault(group, GroupSamples())

    async def poll(self, instances: Iterable[tuple[str, str, str]]) -> None:
        """`instances`: (group, instance id, base URL) of READY instances to read."""
        todo = list(instances)
        await asyncio.gather(*(self._poll_one(*i) for i in todo))
        live = {iid for _, iid, _ in todo}
        for gone in set(self._cursors) - live:
            del self._cursors[gone]

    async def _poll_one(self, group: str, iid: str, url: str) -> None:
        cur = self._cursors.setdefault(iid, _Cursor())
        win = self.window(group)
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            r = await self._client.get(
                f"{url}/sluice/samples", params={"after": cur.after, "limit": PAGE}
            )
            r.raise_for_status()
            body = r.json()
            win.samples.extend(s for s in body["samples"] if s["at"] >= win.since)
            cur.after = int(body["next"])
            stats = (await self._client.get(f"{url}/stats")).json()
            cpu, done = float(stats["cpu_s_total"]), int(stats["requests_total"])
            if cur.cpu_s is not None and cur.requests is not None:
                win.cpu_s += max(0.0, cpu - cur.cpu_s)
                win.requests += max(0, done - cur.requests)
            cur.cpu_s, cur.requests = cpu, done
            rss_gb = float(stats.get("rss_bytes", 0)) / 2**30
            win.memory_gb = max(win.memory_gb, rss_gb, float(stats.get("memory_gb", 0.0)))
