"""Pure scoring for `sluice compare`: how far apart two answers to the same request are, and
what a set of such pairs says in aggregate. No I/O, no clock: inputs in, numbers out.

Two-sample KS (`sluice.policy.evidence`) and style features (`sluice.policy.analysis`)
are the live canary analysis' own, so compare reports and rollouts measure drift alike.

Text similarity is two numbers because each misses something: the character-level
`difflib.SequenceMatcher` ratio sees reordering and small edits; the word-set Jaccard index
sees vocabulary drift (a new style reads with other words) and ignores order.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from difflib import SequenceMatcher

__all__ = [
    "cosine",
    "distribution",
    "jaccard",
    "percentile",
    "sequence_ratio",
]


def sequence_ratio(a: str, b: str) -> float:
    """difflib's ratio in [0, 1]: 2 * matched characters / total characters; two empty
    strings are identical (1.0)."""
    if a == b:
        return 1.0
    return SequenceMatcher(None, a, b, autojunk=False).ratio()


def jaccard(a: str, b: str) -> float:
    """Jaccard index of the lower-cased word sets: shared / all distinct words, in [0, 1];
    both empty -> 1.0."""
    left, right = set(a.lower().split()), set(b.lower().split())
    union = left | right
    return 1.0 if not union else len(left & right) / len(union)


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """Cosine similarity in [-1, 1]; 0.0 when either vector is all zeros or widths differ."""
    if len(a) != len(b):
        return 0.0
    dot = math.fsum(x * y for x, y in zip(a, b, strict=True))
    norms = math.sqrt(math.fsum(x * x for x in a)) * math.sqrt(math.fsum(y * y for y in b))
    return 0.0 if norms == 0 else max(-1.0, min(1.0, dot / norms))


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear between closest ranks; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def distribution(values: Sequence[float]) -> dict[str, float | int | None]:
    """count, mean, min, p50, p95, max of `values` (None where there are none)."""
    if not values:
        return {"count": 0, "mean": None, "min": None, "p50": None, "p95": None, "max": None}
    return {
        "count": len(values),
        "mean": statistics.fmean(values),
        "min": min(values),
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "max": max(values),
    }
