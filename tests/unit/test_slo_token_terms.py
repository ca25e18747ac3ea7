"""A generative group's SLO in the caller's terms (issue 36): `slo.ttft_ms` and `slo.tpot_ms`
validate with an error naming the fix, and the simulator judges a batching group's
`slo_attainment` with them (each request in SLO when every given bound holds; a one-token
answer has no TPOT), the same in the one-group summary, a fleet's row and totals."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import yaml
from pydantic import ValidationError

from sluice.core.errors import SpecError
from sluice.sim import InstanceModel, SimResult, make_policy, prepare, run, trace_from_rows
from sluice.sim.fleet import run_fleet
from sluice.spec import load_spec_text
from sluice.spec.autoscaling import SloSpec
from tests.unit.test_fleet_batching import LLM, model_of, poisson, spec_data


def test_slo_takes_ttft_and_tpot_alone_or_with_latency() -> None:
    assert SloSpec(ttft_ms=2000).tpot_ms is None
    both = SloSpec(ttft_ms=2000, tpot_ms=100, target=0.95)
    assert both.has_token_bound and not both.has_latency_bound
    assert SloSpec(latency_ms=5000, tpot_ms=80).has_latency_bound
    with pytest.raises(ValidationError, match="'ttft_ms' and/or 'tpot_ms'"):
        SloSpec()
    with pytest.raises(ValidationError):
        SloSpec(ttft_ms=0)


def test_a_token_slo_on_slot_instances_is_refused_naming_the_fix() -> None:
    with pytest.raises(SpecError, match=r"sim\.batching.*latency_ms"):
        model_of({"service_time": {"kind": "fixed", "seconds": 1}}, slo={"ttft_ms": 500})


def _judged(slo: dict[str, float], rate: float = 12.0) -> tuple[dict[str, Any], SimResult]:
    m = model_of({"batching": LLM}, max_concurrency=24, slo=slo)
    res = run(prepare(m, poisson(rate, 60.0, seed=5)), make_policy(m, "fixed:1"))
    return res.summary(), res


def test_attainment_counts_requests_within_every_token_bound() -> None:
    s, res = _judged({"ttft_ms": 1500, "tpot_ms": 60})
    ttft, tpot = res.ttft_s, res.tpot_s
    assert ttft is not None and tpot is not None
    ok = res.done >= 0
    want = ok & (ttft <= 1.5) & (np.isnan(tpot) | (tpot <= 0.06))
    assert s["slo_attainment"] == pytest.approx(want.sum() / len(ttft))
    assert 0.0 < s["slo_attainment"] < 1.0  # loaded: some miss, some do not
    only_ttft, _ = _judged({"ttft_ms": 1500})
    only_tpot, _ = _judged({"tpot_ms": 60})
    assert s["slo_attainment"] <= min(only_ttft["slo_attainment"], only_tpot["slo_attainment"])
    loose, _ = _judged({"ttft_ms": 1e9, "tpot_ms": 1e9})
    assert loose["slo_attainment"] == 1.0


def test_a_latency_bound_still_holds_beside_the_token_bounds() -> None:
    tight, _ = _judged({"ttft_ms": 1e9, "latency_ms": 1})
    assert tight["slo_attainment"] == 0.0


def test_a_one_token_answer_has_no_tpot_to_miss() -> None:
    m = model_of({"batching": LLM}, max_concurrency=24, slo={"tpot_ms": 0.001})
    rows = [(0.1 * k, 100, 1) for k in range(10)] + [(5.0, 100, 50)]
    res = run(prepare(m, trace_from_rows(rows, "one-token")), make_policy(m, "fixed:1"))
    assert res.tpot_s is not None and math.isnan(res.tpot_s[0])
    assert res.summary()["slo_attainment"] == pytest.approx(10 / 11)


def test_a_fleet_judges_a_batching_group_by_its_token_bounds() -> None:
    data = spec_data({"batching": LLM}, max_concurrency=24, slo={"ttft_ms": 1500, "tpot_ms": 60})
    spec = load_spec_text(yaml.safe_dump(data)).spec
    m = InstanceModel.from_spec(spec, spec.groups[0])
    fleet = run_fleet(spec, {"ref": prepare(m, poisson(12.0, 60.0, seed=5))})
    row = fleet.summary()["groups"][0]
    sim = fleet.groups["ref"].sim
    assert sim.ttft_s is not None
    assert row["slo_attainment"] == pytest.approx(sim.summary()["slo_attainment"])
    assert fleet.summary()["totals"]["slo_attainment"] == pytest.approx(row["slo_attainment"])
    assert "TTFT <= 1500 ms" in str(sim.workload.model.describe()["slo"])


def test_the_sluice_policy_sizes_on_the_slos_token_bounds_unless_targets_say_otherwise() -> None:
    m = model_of({"batching": LLM}, slo={"ttft_ms": 1500, "tpot_ms": 60})
    targets = make_policy(m, "sluice").spec.targets  # type: ignore[attr-defined]
    assert (targets.ttft_p95_ms, targets.tpot_p95_ms) == (1500, 60)
    own = model_of(
        {"batching": LLM},
        slo={"ttft_ms": 1500, "tpot_ms": 60},
        autoscaling={"targets": {"ttft_p95_ms": 800}},
    )
    targets = make_policy(own, "sluice").spec.targets  # type: ignore[attr-defined]
    assert (targets.ttft_p95_ms, targets.tpot_p95_ms) == (800, 60)
    plain = model_of({"batching": LLM}, slo={"latency_ms": 5000})
    targets = make_policy(plain, "sluice").spec.targets  # type: ignore[attr-defined]
    assert (targets.ttft_p95_ms, targets.tpot_p95_ms) == (None, None)
