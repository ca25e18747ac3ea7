"""bench/canary.py's pieces: the regressions are the size they say, the window is the
controller's reservoir, and a rollout on the virtual clock promotes a good canary and rolls
back a bad one through the real analysis and state machine (with few samples, to be quick;
the bench itself runs the defaults)."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from scipy import stats

from sluice.policy.canary_plan import plan_rollout
from sluice.spec.rollouts import RolloutSpec

BENCH = Path(__file__).resolve().parents[2] / "bench" / "canary.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_canary", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_canary"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pools(bench: ModuleType) -> dict[str, list]:  # type: ignore[type-arg]
    return bench.pools_for(3)  # type: ignore[no-any-return]


def _latency(samples: list) -> np.ndarray:  # type: ignore[type-arg]
    return np.array([s.latency_s for s in samples if s.ok])


def test_regressions_are_the_size_they_claim(pools: dict[str, list]) -> None:  # type: ignore[type-arg]
    base = pools["aa"]
    assert np.mean([s.error for s in base]) == pytest.approx(0.005, abs=0.0015)
    assert np.mean([s.error for s in pools["errors"]]) == pytest.approx(0.025, abs=0.003)
    lat_b, lat_c = _latency(base), _latency(pools["latency_p95"])
    assert np.quantile(lat_c, 0.95) / np.quantile(lat_b, 0.95) == pytest.approx(1.5, abs=0.03)
    assert np.quantile(lat_c, 0.5) / np.quantile(lat_b, 0.5) == pytest.approx(1.0, abs=0.01)
    tokens_b = [s.output_tokens for s in base if s.ok]
    tokens_c = [s.output_tokens for s in pools["output_length"] if s.ok]
    assert stats.ks_2samp(tokens_b, tokens_c).statistic == pytest.approx(0.3, abs=0.02)

    def refusing(samples: list) -> float:  # type: ignore[type-arg]
        return float(np.mean([bool(s.text) and "sorry" in s.text for s in samples if s.ok]))

    assert refusing(pools["style_refusals"]) - refusing(base) == pytest.approx(0.03, abs=0.004)


def test_the_window_is_a_uniform_reservoir(bench: ModuleType) -> None:
    pool = list(range(100_000))
    w = bench.Window(1000, np.random.default_rng(1))
    for start in range(0, 20_000, 500):
        w.add(pool, np.arange(start, start + 500))
    assert len(w) == 1000 and w.seen == 20_000
    assert np.mean(w.rows) == pytest.approx(10_000, rel=0.05)  # not the first 1000
    assert stats.kstest(np.array(w.rows) / 20_000, "uniform").pvalue > 0.01


def test_traffic_shapes_keep_the_mean_rate(bench: ModuleType) -> None:
    for shape in ("steady", "bursty", "diurnal"):
        rates = bench.shape_rates(shape, 10.0, 1, 7200)
        assert rates.mean() == pytest.approx(10.0, rel=0.01), shape
    with pytest.raises(ValueError, match="unknown traffic shape"):
        bench.shape_rates("spiky", 1.0, 0, 1)


def test_a_good_canary_is_promoted_and_a_bad_one_caught_on_the_virtual_clock(
    bench: ModuleType,
    pools: dict[str, list],  # type: ignore[type-arg]
) -> None:
    spec = RolloutSpec.model_validate(
        {
            "name": "b",
            "baseline": "a",
            "canary": "c",
            "steps": [5, 25, 100],
            "hold_s": 10,
            "analysis": {"min_samples": 80},
        }
    )
    plan = plan_rollout(spec)
    rng = np.random.default_rng(2)
    good = bench.rollout(spec, plan, pools["aa"], pools["aa"], 100.0, "steady", rng)
    assert good.phase == "promoted" and good.percent == 100 and not good.blamed
    assert good.canary_answers >= 3 * 80 and good.seconds >= 3 * spec.hold_s
    broken = [s.__class__(500, 0.05) for s in pools["aa"][:100]]
    gross = bench.rollout(spec, plan, pools["aa"], broken, 100.0, "steady", rng)
    assert gross.phase == "rolled_back" and gross.fast and gross.percent == 5
    assert gross.blamed == "error_rate" and gross.seconds < 10  # no look waited for
    slow = bench.rollout(spec, plan, pools["aa"], pools["latency_p95"], 100.0, "bursty", rng)
    assert slow.phase == "rolled_back" and "latency_p95" in slow.blamed and not slow.fast
    assert math.isfinite(slow.seconds)


def test_answers_that_take_seconds_end_after_the_horizon_and_a_bad_canary_is_caught(
    bench: ModuleType,
    pools: dict[str, list],  # type: ignore[type-arg]
) -> None:
    """The timed rollouts (issue 32): answers finish their latency after they arrive, the
    window is by arrival and cut at the horizon; a good canary is promoted, later than
    its holds alone (the horizon), and a slower one is caught."""
    spec = RolloutSpec.model_validate(
        {
            "name": "b",
            "baseline": "a",
            "canary": "c",
            "steps": [5, 25, 100],
            "hold_s": 10,
            "analysis": {"min_samples": 80},
        }
    )
    plan = plan_rollout(spec)
    rng = np.random.default_rng(2)
    slow = _latency(pools["timed aa"])
    assert 2.0 < np.median(slow) < 6.0 and np.quantile(slow, 0.999) > 30.0
    good = bench.timed_rollout(spec, plan, pools["timed aa"], pools["timed aa"], 50.0, rng)
    assert good.phase == "promoted" and not good.blamed
    assert good.seconds > 3 * spec.hold_s + 30.0  # each step waited out a horizon
    bad = [
        dataclasses.replace(s, latency_s=2 * s.latency_s, ttft_s=s.ttft_s and 2 * s.ttft_s)
        for s in pools["timed aa"]
    ]
    caught = bench.timed_rollout(spec, plan, pools["timed aa"], bad, 50.0, rng)
    assert caught.phase == "rolled_back" and "latency_p50" in caught.blamed
