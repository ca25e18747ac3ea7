"""`sluice simulate --warm-start` and `--policy causal` as a person runs them (issue 16)."""

from __future__ import annotations

import json
from pathlib import Path

from sluice.sim import InstanceModel, load_trace, pick_group, prepare, warm_start_count
from sluice.spec import load_spec_file
from tests.integration.test_simulate_cli import SLICE, SPEC, sluice


def expected_warm_count() -> int:
    spec = load_spec_file(SPEC).spec
    model = InstanceModel.from_spec(spec, pick_group(spec, None))
    return warm_start_count(prepare(model, load_trace(SLICE)))


def simulate(home: Path, *args: str) -> dict[str, object]:
    r = sluice("simulate", "--spec", str(SPEC), "--trace", str(SLICE), *args, home=home)
    assert r.returncode == 0, r.stderr
    out: dict[str, object] = json.loads(r.stdout)
    return out


def test_warm_start_begins_every_policy_with_the_oracles_t0_count(tmp_path: Path) -> None:
    count = expected_warm_count()
    assert count > 1  # differs from the spec's count (replicas: 1) on this slice
    for policy in ("sluice", "hpa", "oracle"):
        warm = simulate(tmp_path, "--policy", policy, "--warm-start", "--json")
        assert warm["start"] == "warm", policy
        assert warm["initial_instances"] == count, policy
        assert warm["policy"] == policy
    cold = simulate(tmp_path, "--json")
    assert cold["start"] == "cold"
    assert cold["initial_instances"] == 1


def test_warm_start_prints_the_start_in_the_text_line(tmp_path: Path) -> None:
    r = sluice(
        "simulate", "--spec", str(SPEC), "--trace", str(SLICE), "--warm-start", home=tmp_path
    )
    assert r.returncode == 0, r.stderr
    assert f"(warm start, {expected_warm_count()} ready at t=0)" in r.stdout


def test_policy_causal_reports_the_best_candidate_and_all_of_them(tmp_path: Path) -> None:
    out = simulate(tmp_path, "--policy", "causal", "--warm-start", "--json")
    assert out["policy"] == "causal" and out["start"] == "warm"
    cands = out["causal_candidates"]
    assert isinstance(cands, list) and len(cands) == 12  # 6 windows x 2 rules
    for c in cands:
        for key in ("window_s", "rule", "headroom", "slo_attainment", "instance_seconds", "plan"):
            assert key in c, key
        assert c["plan"][0] == out["initial_instances"]
    best = out["causal_best"]
    assert isinstance(best, dict)
    assert best["instance_seconds"] == out["instance_seconds"]
    assert best["slo_attainment"] == out["slo_attainment"]
    if out["causal_chosen_for"] == "slo_target":
        reaching = [c["instance_seconds"] for c in cands if c["reaches_target"]]
        assert best["instance_seconds"] == min(reaching)
    assert "hindsight" in str(out["causal_note"])
