"""A compare run judged against thresholds (`sluice compare --min-exact-match ...`): whether the
candidate's answers stay close enough to the baseline's for a script or CI step to go on.

Pure: the report's `summary` (`sluice.policy.compare`, "sluice.compare/1") comes in, the
verdict goes out. A threshold that cannot be measured (no item of that kind was compared)
fails: a gate that passes on no evidence is no gate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["CompareThresholds", "CompareVerdict", "judge_compare"]


@dataclass(frozen=True, slots=True)
class CompareThresholds:
    """Each None is not judged. Shares and similarities are in [0, 1].

    `min_exact_match`: share of compared items whose outputs are equal;
    `min_similarity`: mean text similarity (SequenceMatcher ratio) of compared text items;
    `min_cosine`: mean cosine of compared embedding items;
    `max_error_rate`: share of the suite's items not compared (either side gave no 2xx)."""

    min_exact_match: float | None = None
    min_similarity: float | None = None
    min_cosine: float | None = None
    max_error_rate: float | None = None

    def __post_init__(self) -> None:
        for name in ("min_exact_match", "min_similarity", "min_cosine", "max_error_rate"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {value}")

    @property
    def any(self) -> bool:
        """Whether any threshold is set (none: the run has no verdict)."""
        return any(
            v is not None
            for v in (
                self.min_exact_match,
                self.min_similarity,
                self.min_cosine,
                self.max_error_rate,
            )
        )


@dataclass(frozen=True, slots=True)
class CompareVerdict:
    """`verdict` "pass" or "fail"; `checks`: one per threshold set (name, wanted, measured,
    held); `reasons`: each failed check in words with numbers."""

    verdict: str
    checks: tuple[dict[str, Any], ...]
    reasons: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "checks": list(self.checks), "reasons": list(self.reasons)}


def judge_compare(summary: Mapping[str, Any], thresholds: CompareThresholds) -> CompareVerdict:
    """Each threshold set against the summary; fails when any is not met or not measurable."""
    items = int(summary["items"])
    compared = int(summary["compared"])
    measured: dict[str, tuple[float | None, str]] = {
        "min_exact_match": (summary.get("exact_match_rate"), "no item was compared"),
        "min_similarity": (
            summary["text"]["similarity"]["mean"],
            "no text item was compared",
        ),
        "min_cosine": (summary["embedding"]["cosine"]["mean"], "no embedding item was compared"),
        "max_error_rate": (
            (items - compared) / items if items else None,
            "the suite has no item",
        ),
    }
    labels = {
        "min_exact_match": "exact match",
        "min_similarity": "mean similarity",
        "min_cosine": "mean cosine",
        "max_error_rate": "items not compared",
    }
    checks: list[dict[str, Any]] = []
    reasons: list[str] = []
    for name, (value, missing) in measured.items():
        wanted = getattr(thresholds, name)
        if wanted is None:
            continue
        at_most = name.startswith("max_")
        held = value is not None and (value <= wanted if at_most else value >= wanted)
        checks.append({"name": name, "wanted": wanted, "measured": value, "held": held})
        if value is None:
            reasons.append(f"{labels[name]}: not measured ({missing})")
        elif not held:
            sign = ">" if at_most else "<"
            reasons.append(f"{labels[name]} {value:.3f} {sign} {wanted:g} (--{_flag(name)})")
    return CompareVerdict("fail" if reasons else "pass", tuple(checks), tuple(reasons))


def _flag(name: str) -> str:
    return name.replace("_", "-")
