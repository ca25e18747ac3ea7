"""Per-request sample rows the gateway keeps for groups under canary analysis whose instances
keep none themselves (command servers such as vLLM, external endpoints).

Only groups the controller names (`GatewaySampling.watch`) record anything; every other
group's `GroupRuntime.samples` is None, so their requests pay one attribute test in
`Exchange._finish`. A recorded row is what the gateway sees of an answer: the instance, the
status (0: cut off after its head), latency to the last byte, time to the first body byte of
a streamed answer (a TTFT proxy) and the body's size in bytes. Never the text.

Memory is bounded: each instance keeps its last `RING_ROWS` rows (a ring), until it leaves
its group's routing (the collector reads READY instances only). Rows carry one
sequence shared by every ring of this gateway, so a reader's cursor (`after`) stays valid
when a group stops and starts recording again.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

__all__ = ["RING_ROWS", "GatewaySampling", "SampleRing"]

RING_ROWS = 8192
"""Rows an instance keeps: eight seconds at 1,000 requests/s, well over one poll (1 s)."""

Row = tuple[int, float, int, float, float | None, int]
"""(seq, at (epoch s), status, latency_s, ttfb_s, output_bytes)"""


class SampleRing:
    """One group's recent answers, a ring per instance."""

    __slots__ = ("_seq", "capacity", "rings")

    def __init__(self, seq: itertools.count[int], capacity: int = RING_ROWS) -> None:
        self._seq = seq
        self.capacity = capacity
        self.rings: dict[str, deque[Row]] = {}

    def record(
        self, instance: str, status: int, latency_s: float, ttfb_s: float | None, nbytes: int
    ) -> None:
        ring = self.rings.get(instance)
        if ring is None:
            ring = self.rings[instance] = deque(maxlen=self.capacity)
        ring.append((next(self._seq), time.time(), status, latency_s, ttfb_s, nbytes))

    def forget(self, keep: set[str]) -> None:
        """Drop the rows of instances not in `keep` (they left the group's routing)."""
        for gone in [i for i in self.rings if i not in keep]:
            del self.rings[gone]


class GatewaySampling:
    """The rings of the groups being recorded, by group name."""

    __slots__ = ("_seq", "capacity", "groups")

    def __init__(self, capacity: int = RING_ROWS) -> None:
        self._seq = itertools.count(1)
        self.capacity = capacity
        self.groups: dict[str, SampleRing] = {}

    def watch(self, groups: Iterable[str]) -> bool:
        """Record exactly `groups` from now on (a group that stays keeps its rows). True if
        the set changed (the caller hands the rings to the group runtimes then)."""
        wanted = set(groups)
        if wanted == set(self.groups):
            return False
        self.groups = {
            g: self.groups.get(g) or SampleRing(self._seq, self.capacity) for g in sorted(wanted)
        }
        return True

    def instances(self) -> list[str]:
        """The instances with recorded rows."""
        return [i for ring in self.groups.values() for i in ring.rings]

    def read(self, instance: str, after: int, limit: int) -> tuple[list[dict[str, Any]], int]:
        """Up to `limit` rows of `instance` after sequence number `after`, oldest first, as
        a worker's `/sluice/samples` rows; and the cursor for the next read."""
        for ring in self.groups.values():
            rows = ring.rings.get(instance)
            if rows is not None:
                break
        else:
            return [], after
        if not rows or rows[-1][0] <= after:
            return [], after
        picked = [r for r in rows if r[0] > after][:limit]
        out = [
            {
                "seq": seq,
                "at": at,
                "status": status,
                "latency_s": latency,
                "ttft_s": ttfb,
                "output_bytes": nbytes,
            }
            for seq, at, status, latency, ttfb, nbytes in picked
        ]
        return out, picked[-1][0]
