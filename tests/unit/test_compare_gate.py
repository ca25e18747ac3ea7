"""A compare run judged against thresholds (`sluice.policy.compare_gate`)."""

from __future__ import annotations

from typing import Any

import pytest

from sluice.policy.compare_gate import CompareThresholds, judge_compare


def summary(
    *, items: int = 10, compared: int = 10, exact: float | None = 0.9, similarity: float | None
) -> dict[str, Any]:
    return {
        "items": items,
        "compared": compared,
        "exact_match_rate": exact,
        "text": {"similarity": {"mean": similarity}},
        "embedding": {"cosine": {"mean": None}},
    }


def test_thresholds_met_pass_with_a_check_each() -> None:
    v = judge_compare(
        summary(similarity=0.95), CompareThresholds(min_exact_match=0.8, min_similarity=0.9)
    )
    assert v.verdict == "pass" and v.reasons == ()
    assert [c["name"] for c in v.checks] == ["min_exact_match", "min_similarity"]
    assert all(c["held"] for c in v.checks)


def test_a_threshold_not_met_fails_and_says_by_how_much() -> None:
    v = judge_compare(
        summary(items=10, compared=7, exact=0.5, similarity=0.95),
        CompareThresholds(min_exact_match=0.8, max_error_rate=0.1),
    )
    assert v.verdict == "fail"
    assert v.reasons == (
        "exact match 0.500 < 0.8 (--min-exact-match)",
        "items not compared 0.300 > 0.1 (--max-error-rate)",
    )


def test_a_threshold_with_nothing_to_measure_fails() -> None:
    v = judge_compare(summary(similarity=None), CompareThresholds(min_cosine=0.99))
    assert v.verdict == "fail"
    assert v.reasons == ("mean cosine: not measured (no embedding item was compared)",)
    assert v.to_json()["checks"][0]["measured"] is None


def test_thresholds_are_shares() -> None:
    assert not CompareThresholds().any and CompareThresholds(min_cosine=0.5).any
    with pytest.raises(ValueError, match=r"min_similarity must be in \[0, 1\]"):
        CompareThresholds(min_similarity=1.5)
