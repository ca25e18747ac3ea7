"""Per-request sample rows the gateway keeps for groups under canary analysis whose instances
keep none themselves (command servers such as vLLM, external endpoints).

Only groups the controller names (`GatewaySampling.watch`) record anything; every other
group's `GroupRuntime.samples` is None, so their requests pay one attribute test in
`Exchange._finish`. A recorded row is what the gateway sees of an answer: the instance, the
status (0: cut off after its head), latency to the last byte, time to the first body byte of
a streamed answer (a TTFT proxy), the body's size in bytes, and what the answer says of itself
(`sluice.policy.answers`): output tokens, finish reason, time per output token, and on one
row in `TEXT_EVERY` the start of its text (for style drift and empty answers: a bounded
sample, at most `RING_ROWS / TEXT_EVERY x TEXT_CHARS` characters an instance).

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

from sluice.policy.answers import AnswerFacts

__all__ = ["RING_ROWS", "TEXT_EVERY", "GatewaySampling", "SampleRing"]

RING_ROWS = 8192
"""Rows an instance keeps: eight seconds at 1,000 requests/s, well over one poll (1 s)."""

TEXT_EVERY = 8
"""One recorded row in this many keeps the start of its answer's text."""

Row = tuple[
    int, float, int, float, float | None, int, int | None, str | None, float | None, str | None
]
"""(seq, at (epoch s), status, latency_s, ttfb_s, output_bytes, output_tokens, finish_reason,
tpot_s, text)"""


class SampleRing:
    """One group's recent answers, a ring per instance."""

    __slots__ = ("_seq", "capacity", "rings")

    def __init__(self, seq: itertools.count[int], capacity: int = RING_ROWS) -> None:
        self._seq = seq
        self.capacity = capacity
        self.rings: dict[str, deque[Row]] = {}

    def record(
        self,
        instance: str,
        status: int,
        latency_s: float,
        ttfb_s: float | None,
        nbytes: int,
        facts: AnswerFacts | None = None,
        tpot_s: float | None = None,
    ) -> None:
        ring = self.rings.get(instance)
        if ring is None:
            ring = self.rings[instance] = deque(maxlen=self.capacity)
        seq = next(self._seq)
        tokens = finish = text = None
        if facts is not None:
            tokens, finish = facts.completion_tokens, facts.finish_reason
            if seq % TEXT_EVERY == 0:
                text = facts.text
        row = (seq, time.time(), status, latency_s, ttfb_s, nbytes, tokens, finish, tpot_s, text)
        ring.append(row)

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
                "output_tokens": tokens,
                "finish_reason": finish,
                "tpot_s": tpot,
                "text": text,
            }
            for seq, at, status, latency, ttfb, nbytes, tokens, finish, tpot, text in picked
        ]
        return out, picked[-1][0]
