"""The last requests of one instance, one row each, for canary analysis (GET /sluice/samples).

Aggregates (Prometheus histograms) cannot give an output-length distribution or the texts a
style-drift check reads, so the worker keeps a ring of per-request rows. Recording costs one
tuple and one deque append on the event loop; dicts are built only when someone reads.

Rows carry a sequence number (1, 2, ...) so a reader pages with `after=` and sees a gap when
the ring (10,000 rows) overwrote rows it had not read yet.
"""

from __future__ import annotations

import time
from collections import deque
from itertools import islice
from typing import Any

__all__ = ["SAMPLE_TEXT_CHARS", "SampleRing"]

SAMPLE_TEXT_CHARS = 200
"""How much of each output a row keeps: enough to see style drift, small enough to ship."""

# (seq, at, model, status, latency_s, ttft_s, output_tokens, finish_reason, text)
_Row = tuple[int, float, str | None, int, float, float | None, int | None, str | None, str | None]


class SampleRing:
    """A bounded ring of request rows; `record` is O(1), `page` is O(limit + skipped)."""

    def __init__(self, capacity: int = 10_000) -> None:
        self.capacity = capacity
        self._rows: deque[_Row] = deque(maxlen=capacity)
        self._seq = 0

    @property
    def last_seq(self) -> int:
        return self._seq

    def record(
        self,
        model: str | None,
        status: int,
        latency_s: float,
        ttft_s: float | None,
        output_tokens: int | None,
        finish_reason: str | None,
        text: str | None,
    ) -> None:
        """One finished request; `text` is already cut to SAMPLE_TEXT_CHARS by the caller."""
        self._seq += 1
        self._rows.append(
            (
                self._seq,
                time.time(),
                model,
                status,
                latency_s,
                ttft_s,
                output_tokens,
                finish_reason,
                text,
            )
        )

    def page(self, after: int, limit: int) -> dict[str, Any]:
        """Rows with seq > `after`, oldest first, at most `limit`; `next` is the `after` to pass
        for the following page (unchanged when there is nothing new). An `after` beyond the
        last seq is a cursor from an earlier life of this process: paging restarts from 0."""
        if after > self._seq:
            after = 0
        rows = self._rows
        if not rows or after >= self._seq:
            return {"next": after, "samples": []}
        skip = max(0, after - rows[0][0] + 1)
        out = [_as_dict(row) for row in islice(rows, skip, skip + max(0, limit))]
        return {"next": out[-1]["seq"] if out else after, "samples": out}


def _as_dict(row: _Row) -> dict[str, Any]:
    seq, at, model, status, latency, ttft, tokens, finish, text = row
    tpot = None
    if ttft is not None and tokens is not None:
        tpot = (latency - ttft) / max(1, tokens - 1)
    return {
        "seq": seq,
        "at": at,
        "model": model,
        "status": status,
        "latency_s": latency,
        "ttft_s": ttft,
        "tpot_s": tpot,
        "output_tokens": tokens,
        "finish_reason": finish,
        "text": text,
    }
