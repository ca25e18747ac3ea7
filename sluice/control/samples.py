"""Per-request samples and resource counters, pulled from the instances of groups under
canary analysis (each worker keeps its last requests at `/sluice/samples`).

Pulling from the workers keeps the gateway's hot path free of response parsing, and gives
the analysis what only the instance knows: time to first token, output tokens, finish
reason, the text itself, and process CPU and memory.

Command servers (vLLM, ...) and external endpoints keep no samples: for their groups the
rows are what the gateway saw of each answer (status, latency, time to the first body byte
of a streamed one, no text), read in-process from an injected `GatewaySampleSource` (the
gateway `sluice up` runs beside the controller), which records only the groups named in
`watch(..., from_gateway=...)`. Their windows say so (`from_gateway`), and the analysis
skips what such rows cannot show (`sluice.policy.analysis.unobserved`).

The pulling runs in its own task, never in the controller's tick: the tick says which
instances to read (`watch`) and reads the windows as they are. Every instance is read
concurrently, each within `INSTANCE_TIMEOUT_S`, so a hung instance costs one round at most
that long and delays nobody else's samples by more. Memory is bounded: a window keeps a
uniform random sample (reservoir) of at most `capacity` requests of its step.

A window holds the requests that ARRIVED since it began (a row's finish time `at` less its
latency), not those that finished since: an answer that started under the step before's
split belongs to neither side (`sluice.policy.windows`). For each instance the collector
keeps `through`, the time its answers are known up to (the start of its last read that
returned all it had), and for each group the latencies of its recent answers (across
windows), from which the runner picks a look's horizon.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from sluice.control.polling import RoundPoller
from sluice.policy.analysis import RequestSample

__all__ = ["GatewaySampleSource", "GroupSamples", "SampleCollector", "window_rows"]


PAGE = 2000
LATENCY_HISTORY = 4000
"""Latencies of recent answers kept per group (across windows), for the look horizon."""
POLL_S = 1.0
"""A round of reads starts this often (or as soon as the last one ended, if it took longer)."""
INSTANCE_TIMEOUT_S = 1.5
"""Both reads of one instance (a page of samples and /stats) must be done within this."""
WINDOW_ROWS = 5000
"""Requests a window keeps per group at least: about 3,000 a side detect a one-point rise of
a 1% error rate at alpha 0.01 with 80% power; more mostly costs analysis time (the style
criterion reads every text, ~0.45 s for 5,000 a side)."""


def window_rows(min_samples: int) -> int:
    """A window's capacity for an analysis that needs `min_samples` a side: WINDOW_ROWS, or
    twice `min_samples` if that is more, so the cap never holds a verdict back."""
    return max(WINDOW_ROWS, 2 * min_samples)


class GatewaySampleSource(Protocol):
    """The gateway's per-request rows (`sluice.gateway.Gateway` is one): `sample_groups`
    says which groups to record, `samples` reads an instance's rows after a cursor."""

    def sample_groups(self, groups: Iterable[str]) -> None: ...

    def samples(
        self, instance: str, after: int, limit: int
    ) -> tuple[list[dict[str, Any]], int]: ...


NO_GATEWAY = "no gateway in this process records the answers of this server"


@dataclass
class _Cursor:
    after: int = 0
    cpu_s: float | None = None
    requests: int | None = None
    read_at: float | None = None
    """monotonic time of the /stats read the two counters above come from"""
    failures: int = 0
    """reads of this instance that failed in a row"""
    through: float | None = None
    """epoch time its answers are known up to: the start of its last read that returned
    every row it had (None: none yet)"""
    error: str = ""


@dataclass
class GroupSamples:
    """What one group's instances reported since the window began (`since`, epoch s)."""

    since: float = 0.0
    capacity: int = WINDOW_ROWS
    samples: list[RequestSample] = field(default_factory=list)
    """a uniform random sample of the `seen` requests, at most `capacity` of them"""
    seen: int = 0
    cpu_s: float = 0.0
    requests: int = 0
    instance_s: float = 0.0
    """instance-seconds `cpu_s` and `requests` were counted over (summed over instances), so
    that per-instance load can be compared"""
    memory_gb: float = 0.0
    """the largest of the instances' resident memory and declared model memory, GiB"""
    version: int = 0
    """bumped whenever anything above changes (the analysis reruns only then)"""
    from_gateway: bool = False
    """the rows are the gateway's (no text, tokens or resources), not the instances' own"""
    _rng: random.Random = field(default_factory=random.Random, repr=False)

    def add(self, sample: RequestSample) -> None:
        """Reservoir sampling (algorithm R): every request of the window has the same chance
        to be in `samples`, so both sides cover the whole step, however long it holds."""
        self.seen += 1
        if len(self.samples) < self.capacity:
            self.samples.append(sample)
        else:
            k = self._rng.randrange(self.seen)
            if k < self.capacity:
                self.samples[k] = sample


class SampleCollector(RoundPoller[tuple[str, str, str]]):
    """Keeps a cursor per instance so each sample is read once; `window(group)` returns
    what arrived since the last `reset`. `watch` starts the polling task (on the running
    loop); `aclose` stops it."""

    name = "sample-poller"

    def __init__(
        self,
        client: httpx.AsyncClient | None = None,
        poll_s: float = POLL_S,
        timeout_s: float = INSTANCE_TIMEOUT_S,
        gateway: GatewaySampleSource | None = None,
    ) -> None:
        """`gateway`: where the rows of groups `from_gateway` are read (None: nowhere, so
        their instances count as failing reads)."""
        super().__init__(client, poll_s, timeout_s)
        self._gateway = gateway
        self._gateway_groups: frozenset[str] = frozenset()
        self._cursors: dict[str, _Cursor] = {}
        self._groups: dict[str, GroupSamples] = {}
        self._latencies: dict[str, deque[float]] = {}

    def reset(self, groups: Iterable[str], now: float, capacity: int = WINDOW_ROWS) -> None:
        """Start a new analysis window for `groups` (a new step) at `now` (epoch seconds):
        requests that arrived before it (warm-up passes included) are not in it."""
        for g in groups:
            self._groups[g] = GroupSamples(
                since=now,
                capacity=capacity,
                from_gateway=g in self._gateway_groups,
                _rng=random.Random(f"{g}@{now}"),
            )

    def window(self, group: str) -> GroupSamples:
        return self._groups.setdefault(group, GroupSamples())

    def through(self, group: str) -> float | None:
        """Epoch time up to which the watched instances of `group` have been read (the
        earliest of theirs); None while one has not been read whole yet, or none answers.
        An instance whose last read failed is left out, so a hung one holds no look back:
        its answers are missing from its side, whichever they would have been, which
        leaves the two sides exchangeable (they come in when it answers again)."""
        times: list[float] = []
        for g, iid, _ in self._targets:
            cur = self._cursors.get(iid)
            if g != group or (cur is not None and cur.failures):
                continue
            if cur is None or cur.through is None:
                return None
            times.append(cur.through)
        return min(times) if times else None

    def latencies(self, group: str) -> list[float]:
        """Latencies of `group`'s recent answers (the last LATENCY_HISTORY, any window)."""
        return list(self._latencies.get(group, ()))

    def watch(
        self, instances: Iterable[tuple[str, str, str]], from_gateway: Iterable[str] = ()
    ) -> None:
        """From now on read `instances`, (group, instance id, base URL) of READY instances
        (none: the task idles); those of groups `from_gateway` (servers that keep no samples)
        from the gateway, which records exactly those groups from now on. Returns at once;
        the reads happen in the polling task."""
        self._gateway_groups = frozenset(from_gateway)
        if self._gateway is not None:
            self._gateway.sample_groups(self._gateway_groups)
        self._set_targets(list(instances))

    def status(self) -> dict[str, Any]:
        """For the control API: rounds so far, the last one's length, failing instances."""
        return {
            "instances": len(self._targets),
            "rounds": self.rounds,
            "last_round_s": round(self.last_round_s, 3),
            "failing": {
                iid: {"failures": c.failures, "error": c.error}
                for iid, c in self._cursors.items()
                if c.failures
            },
        }

    def _forget(self) -> None:
        self._cursors.clear()

    async def poll(self, instances: Iterable[tuple[str, str, str]]) -> None:
        """One round: read every instance concurrently, each within the timeout."""
        todo = list(instances)
        await asyncio.gather(*(self._poll_one(*i) for i in todo))
        live = {iid for _, iid, _ in todo}
        for gone in set(self._cursors) - live:
            del self._cursors[gone]

    async def _poll_one(self, group: str, iid: str, url: str) -> None:
        cur = self._cursors.setdefault(iid, _Cursor())
        if group in self._gateway_groups:
            self._read_gateway(group, iid, cur)
            return
        try:
            async with asyncio.timeout(self._timeout_s):
                read_at = time.time()
                r = await self._client.get(
                    f"{url}/sluice/samples", params={"after": cur.after, "limit": PAGE}
                )
                r.raise_for_status()
                body = r.json()
                cur.after = int(body["next"])
                self._take(group, [RequestSample.from_json(s) for s in body["samples"]])
                if len(body["samples"]) < PAGE:
                    cur.through = read_at
                stats = (await self._client.get(f"{url}/stats")).json()
                self._count(self.window(group), cur, stats, time.monotonic())
        except (httpx.HTTPError, ValueError, KeyError, TypeError, TimeoutError) as exc:
            cur.failures += 1
            cur.error = f"{type(exc).__name__}: {exc}"[:200]
            return
        cur.failures, cur.error = 0, ""

    def _read_gateway(self, group: str, iid: str, cur: _Cursor) -> None:
        """One instance's new rows from the gateway's ring (in-process: no I/O). No CPU or
        memory counts: such servers report neither."""
        if self._gateway is None:
            cur.failures += 1
            cur.error = NO_GATEWAY
            return
        self.window(group).from_gateway = True
        read_at = time.time()
        rows: list[RequestSample] = []
        while True:  # every new row: the ring would drop what a later round did not read
            body, cur.after = self._gateway.samples(iid, cur.after, PAGE)
            rows += [RequestSample.from_json(s) for s in body]
            if len(body) < PAGE:
                break
        self._take(group, rows)
        cur.through = read_at
        cur.failures, cur.error = 0, ""

    def _take(self, group: str, rows: list[RequestSample]) -> None:
        """New rows of `group`: their latencies into its history, those that arrived since
        its window began into the window (as it is now: a reset during a read starts a new
        one)."""
        history = self._latencies.setdefault(group, deque(maxlen=LATENCY_HISTORY))
        history.extend(r.latency_s for r in rows)
        win = self.window(group)
        kept = [r for r in rows if r.arrived_at is None or r.arrived_at >= win.since]
        for row in kept:
            win.add(row)
        if kept:
            win.version += 1

    @staticmethod
    def _count(win: GroupSamples, cur: _Cursor, stats: dict[str, Any], now: float) -> None:
        cpu, done = float(stats["cpu_s_total"]), int(stats["requests_total"])
        before = (win.requests, win.memory_gb)
        if cur.cpu_s is not None and cur.requests is not None and cur.read_at is not None:
            win.cpu_s += max(0.0, cpu - cur.cpu_s)
            win.requests += max(0, done - cur.requests)
            win.instance_s += max(0.0, now - cur.read_at)
        cur.cpu_s, cur.requests, cur.read_at = cpu, done, now
        rss_gb = float(stats.get("rss_bytes", 0)) / 2**30
        win.memory_gb = max(win.memory_gb, rss_gb, float(stats.get("memory_gb", 0.0)))
        if (win.requests, win.memory_gb) != before:
            win.version += 1  # CPU alone creeps up while idle: no reason to rerun
