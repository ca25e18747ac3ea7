"""Batching instances in the fleet simulator (`sluice.sim.fleet` with a model's
`sim.batching`, issue 36): the slot setting of the batching model gives the slot path's
results; under load TTFT grows and the autoscaler is fed what a live vLLM group gives it
(p95 TTFT and TPOT, KV-cache use, the servers' own queues); a TTFT target scales a group
up on `ttft`; crashes and drains keep every request accounted for; the summary, the CLI
line and both reports show TTFT/TPOT percentiles and KV-cache use."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

import sluice.sim.fleet
from sluice.core.errors import SpecError
from sluice.policy.autoscale import GroupLoad
from sluice.policy.kernel import Memory, World
from sluice.policy.tick import TickDecision
from sluice.sim import (
    InstanceModel,
    PlanPolicy,
    SimOptions,
    make_policy,
    pick_group,
    prepare,
    run,
    trace_from_rows,
)
from sluice.sim.codes import FAILED, PENDING
from sluice.sim.drills import simulate_drill
from sluice.sim.fleet import FleetOptions, run_fleet
from sluice.sim.model import alone_seconds, batch_tokens
from sluice.sim.study import simulate_fleet_spec, simulate_prefix_spec, simulate_spec
from sluice.sim.trace import Trace
from sluice.spec import load_spec_text

REFERENCE = Path(__file__).parents[2] / "examples" / "reference-sim.yaml"
SPT = 0.02
"""seconds per output token of the slot-equivalent settings"""
LLM = {
    "max_seqs": 16,
    "kv_tokens": 12_000,
    "prefill_tps": 20_000,
    "step_base_s": 0.01,
    "step_per_seq_s": 0.0005,
    "step_per_kv_token_s": 1e-7,
}
"""a small generative server: 16 sequences, KV for ~12 requests of 1000 tokens"""


def spec_data(sim: dict[str, Any], **group: Any) -> dict[str, Any]:
    """The reference spec's one group with model `m` of these `sim` params (start-up 5 s)
    and other group fields; `autoscaling` entries update the spec's."""
    data = yaml.safe_load(REFERENCE.read_text())
    g = data["groups"][0]
    g["models"] = {"m": {"runtime": "sim", "sim": {"startup_s": 5, **sim}}}
    g["autoscaling"].update(group.pop("autoscaling", {}))
    g.update(group)
    return data


def model_of(sim: dict[str, Any], **group: Any) -> InstanceModel:
    spec = load_spec_text(yaml.safe_dump(spec_data(sim, **group))).spec
    return InstanceModel.from_spec(spec, pick_group(spec, None))


def poisson(rate: float, duration: float, seed: int, prompt: int = 800) -> Trace:
    """Poisson arrivals; prompts around `prompt` tokens, answers of 20-200 tokens."""
    rng = np.random.default_rng(seed)
    t = np.sort(rng.uniform(0.0, duration, rng.poisson(rate * duration)))
    ins = rng.integers(prompt // 2, prompt * 3 // 2 + 1, t.size)
    outs = rng.integers(20, 201, t.size)
    rows = zip(t.tolist(), ins.tolist(), outs.tolist(), strict=True)
    return trace_from_rows(((a, int(i), int(o)) for a, i, o in rows), f"poisson{rate:g}")


def loads_seen(monkeypatch: pytest.MonkeyPatch) -> list[GroupLoad]:
    """Every `GroupLoad` the fleet hands the kernel's `step` from now on."""
    seen: list[GroupLoad] = []
    real = sluice.sim.fleet.step

    def spy(memory: Memory, world: World, now: float) -> tuple[TickDecision, Memory]:
        seen.extend(world.loads.values())
        return real(memory, world, now)

    monkeypatch.setattr(sluice.sim.fleet, "step", spy)
    return seen


# -- the slot model as a setting -----------------------------------------------------------


@pytest.mark.parametrize("policy", ["fixed:2", None])
def test_the_slot_setting_gives_the_slot_paths_done_times(policy: str | None) -> None:
    slots = model_of({"service_time": {"kind": "linear", "a": 0.0, "c": SPT}})
    batching = model_of({"batching": {"max_seqs": 4, "step_base_s": SPT}})
    assert batching.batching is not None and batching.batching.kv_tokens == math.inf
    trace = poisson(6.0, 90.0, seed=3)
    ws, wb = prepare(slots, trace), prepare(batching, trace)
    np.testing.assert_allclose(wb.service, ws.service, rtol=1e-12)
    rs = run(ws, make_policy(slots, policy))
    rb = run(wb, make_policy(batching, policy))
    assert (rs.done >= 0).all() and (rb.done >= 0).all()
    np.testing.assert_allclose(rb.done, rs.done, rtol=0, atol=1e-9)
    assert rb.scale_events == rs.scale_events
    assert rb.peak_instances == rs.peak_instances
    assert rb.instance_seconds == pytest.approx(rs.instance_seconds)
    assert rs.column("queued").max() > 0  # the gateway queue formed: the same queue
    # what callers felt: the wait plus one token, then one token per SPT
    assert rb.ttft_s is not None and rb.tpot_s is not None
    lat = rb.done - trace.t
    np.testing.assert_allclose(rb.ttft_s, lat - wb.service + SPT, atol=1e-9)
    np.testing.assert_allclose(rb.tpot_s, SPT, rtol=1e-9)
    assert rs.ttft_s is None and "ttft_p50_ms" not in rs.summary()
    assert rb.summary()["preemptions"] == 0
    # the slot group's timeline says nothing of KV; the unbounded cache neither
    assert np.isnan(rs.column("kv_cache_usage")).all()
    assert np.isnan(rb.column("kv_cache_usage")).all()
    assert rs.summary()["p99_ms"] == pytest.approx(rb.summary()["p99_ms"])


# -- under load ----------------------------------------------------------------------------


def test_ttft_grows_with_load_and_the_autoscaler_sees_kv_and_server_queues(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    m = model_of({"batching": LLM}, max_concurrency=24)
    seen = loads_seen(monkeypatch)
    p95: list[float] = []
    for rate in (2.0, 8.0, 14.0):
        seen.clear()
        res = run(prepare(m, poisson(rate, 60.0, seed=5)), make_policy(m, "fixed:2"))
        s = res.summary()
        assert s["completed"] == s["requests"]
        p95.append(s["ttft_p95_ms"])
        assert s["tpot_p50_ms"] > LLM["step_base_s"] * 1000
    assert p95[0] < p95[1] < p95[2]
    assert p95[2] > 5 * p95[0]
    # at the highest rate: the loads given to the autoscaler
    assert all(x.kv_cache_usage is not None for x in seen)
    assert max(x.kv_cache_usage or 0.0 for x in seen) > 0.5
    assert all(0.0 <= (x.kv_cache_usage or 0.0) <= 1.0 for x in seen)
    assert max(x.server_waiting for x in seen) > 0  # 24 sent, 16 (or KV) run
    assert all(x.server_waiting <= x.in_flight for x in seen)
    assert any(x.ttft_p95_s is not None and x.ttft_p95_s > 0 for x in seen)
    assert any(x.tpot_p95_s is not None for x in seen)
    # the same over time in the timeline, and preemption when the cache filled up
    assert res.column("kv_cache_usage").max() > 0.5
    assert res.column("server_waiting").max() > 0
    assert res.summary()["kv_cache_usage_max"] == pytest.approx(res.column("kv_cache_usage").max())


def test_a_ttft_target_scales_a_batching_group_up_on_ttft() -> None:
    m = model_of(
        {"batching": LLM},
        max_concurrency=32,
        replicas=1,
        autoscaling={"min": 1, "max": 20, "targets": {"ttft_p95_ms": 500}},
    )
    res = run(prepare(m, poisson(10.0, 60.0, seed=2)), make_policy(m, None), SimOptions())
    ups = [d for d in res.decisions if d["changed"] and d["to"] > d["from"]]
    assert ups and ups[0]["winner"] == "ttft"
    assert ups[0]["signals"]["ttft_p95_ms"] > 500
    assert "ttft p95" in ups[0]["reason"]
    assert res.peak_instances > 1


# -- crashes and drains --------------------------------------------------------------------


def test_crashes_fail_a_servers_requests() -> None:
    m = model_of({"batching": LLM}, max_concurrency=24, autoscaling={"min": 1, "max": 6})
    work = prepare(m, poisson(12.0, 60.0, seed=7))
    res = run(work, make_policy(m, None), SimOptions(seed=4, crash_rate_per_hour=60.0))
    s = res.summary()
    assert (res.done != PENDING).all()  # every request finished, failed or turned away
    assert s["completed"] + s["rejected"] + s["failed"] == s["requests"]
    assert s["failed"] > 0
    assert res.ttft_s is not None
    assert np.isnan(res.ttft_s[res.done == FAILED]).all()
    assert not np.isnan(res.ttft_s[res.done >= 0]).any()


def test_a_draining_server_takes_nothing_new_and_stops_once_empty() -> None:
    m = model_of({"batching": LLM}, max_concurrency=24)
    work = prepare(m, poisson(12.0, 60.0, seed=7))
    # four instances, then one from t = 20 s while every server holds requests
    plan = PlanPolicy(np.array([4] * 20 + [1] * 100), lead_s=0, epoch=SimOptions().epoch)
    res = run(work, plan, SimOptions(initial=4))
    s = res.summary()
    assert s["failed"] == 0 and s["completed"] == s["requests"]
    t, draining, alive = res.column("t"), res.column("draining"), res.column("alive")
    held = draining[(t >= 20) & (t < 24)]
    assert held.max() == 3  # still finishing what they hold (drain_timeout_s is 60)
    assert draining[-1] == 0 and alive[-1] == 1
    ends = t[(t > 20) & (draining == 0)]
    assert ends.size and ends[0] < 60  # they stopped once their servers were empty


def _rows(trace: Trace) -> list[tuple[float, int, int]]:
    return list(
        zip(
            trace.t.tolist(),
            trace.input_tokens.tolist(),
            trace.output_tokens.tolist(),
            strict=True,
        )
    )


# -- the spec ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("batching", "field"),
    [
        ({"max_seqs": 0, "step_base_s": 0.01}, "max_seqs"),
        ({"max_seqs": 4, "step_base_s": 0.01, "kv_tokens": 0}, "kv_tokens"),
        ({"max_seqs": 4, "step_base_s": 0.01, "prefill_tps": -1}, "prefill_tps"),
        ({"max_seqs": 4, "step_base_s": 0.0}, "step_base_s"),
        ({"max_seqs": 4, "step_base_s": 0.01, "step_per_kv_token_s": 1.0}, "step_per_kv_token_s"),
        ({"max_seqs": 4, "step_base_s": 0.01, "max_batch": 8}, "max_batch"),
    ],
)
def test_a_bad_batching_block_is_an_error_naming_its_field(
    batching: dict[str, Any], field: str
) -> None:
    with pytest.raises(SpecError) as err:
        load_spec_text(yaml.safe_dump(spec_data({"batching": batching})))
    assert field in str(err.value)
    assert "batching" in str(err.value)


def test_models_of_one_group_share_one_batching_server() -> None:
    data = spec_data({"batching": LLM})
    g = data["groups"][0]
    g["models"]["other"] = {"runtime": "sim", "sim": {"startup_s": 5}}
    spec = load_spec_text(yaml.safe_dump(data)).spec
    with pytest.raises(SpecError, match=r"models\.other\.sim\.batching"):
        InstanceModel.from_spec(spec, spec.groups[0])
    g["models"]["other"]["sim"]["batching"] = dict(LLM)
    spec = load_spec_text(yaml.safe_dump(data)).spec
    assert InstanceModel.from_spec(spec, spec.groups[0]).batching is not None


def test_tokens_are_clipped_as_the_server_needs_and_service_is_alone_latency() -> None:
    m = model_of({"batching": LLM})
    b = m.batching
    assert b is not None
    prompt, output = batch_tokens(
        b, np.array([100, 50_000, 0, 11_000]), np.array([0, 10, 20_000, 500])
    )
    assert output.tolist() == [1, 10, b.kv_tokens - 1, 500]
    assert (prompt + output <= b.kv_tokens).all()
    assert prompt.tolist() == [100, b.kv_tokens - 10, 0, 11_000]
    alone = alone_seconds(b, np.array([1000.0]), np.array([100.0]))[0]
    expect = 1000 / b.prefill_tps + 100 * b.step_s(1, 1000 + 50)
    assert alone == pytest.approx(expect)


def test_a_drills_dry_run_uses_the_batching_server_unless_service_was_measured() -> None:
    data = spec_data({"batching": LLM, "output_tokens": 64}, max_concurrency=24)
    spec = load_spec_text(yaml.safe_dump(data)).spec
    times = np.arange(0.0, 30.0, 0.1)
    d = simulate_drill(spec, spec.groups[0], times, start_instances=1, slo_ms=5000)
    assert d.model["instances"] == "batching"
    assert sum(x.completed for x in d.samples) == len(times)
    measured = simulate_drill(
        spec, spec.groups[0], times, start_instances=1, slo_ms=5000, service_s=0.5
    )
    assert measured.model["instances"] == "slots"
    assert measured.model["sources"]["service"] == "measured"


def test_a_block_trace_study_prefills_at_the_batching_servers_rate(tmp_path: Path) -> None:
    data = spec_data({"batching": LLM}, max_concurrency=24, replicas=2)
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(data))
    trace = tmp_path / "blocks.jsonl"
    rows = [
        {"timestamp": 100 * i, "input_length": 1024, "output_length": 50, "hash_ids": [i % 7, i]}
        for i in range(200)
    ]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = simulate_prefix_spec(spec_path, trace)
    assert (r["prefill_tps"], r["prefill_from"]) == (LLM["prefill_tps"], "sim.batching")
    r = simulate_prefix_spec(spec_path, trace, prefill_tps=5000.0)
    assert (r["prefill_tps"], r["prefill_from"]) == (5000.0, "--prefill-tps")
    data["groups"][0]["models"]["m"]["sim"].pop("batching")
    spec_path.write_text(yaml.safe_dump(data))
    r = simulate_prefix_spec(spec_path, trace)
    assert (r["prefill_tps"], r["prefill_from"]) == (10_000.0, "default")


# -- what it shows -------------------------------------------------------------------------


def test_the_reports_show_ttft_tpot_percentiles_and_kv_use(tmp_path: Path) -> None:
    data = spec_data({"batching": LLM}, max_concurrency=24)
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(data))
    trace_path = tmp_path / "trace.csv"
    tr = poisson(8.0, 40.0, seed=1)
    lines = ["t_s,input_tokens,output_tokens,model"]
    lines += [f"{t},{i},{o},m" for t, i, o in _rows(tr)]
    trace_path.write_text("\n".join(lines) + "\n")
    s = simulate_spec(
        spec_path, trace_path, policy="fixed:2", report_dir=tmp_path / "one", group=None
    )
    for what in ("ttft", "tpot"):
        for q in (50, 95, 99):
            assert s[f"{what}_p{q}_ms"] > 0
    assert s["instance_model"]["instances"]["kind"] == "batching"
    assert s["instance_model"]["instances"]["params"]["max_seqs"] == 16
    page = (tmp_path / "one" / "index.html").read_text()
    assert "TTFT" in page and "TPOT" in page and "continuously batching server" in page
    assert f"{s['ttft_p95_ms']:.1f}" in page
    assert (tmp_path / "one" / "kv_cache.png").stat().st_size > 1000
    json.dumps(s, default=str)

    # a fleet of a slot group and a batching group
    slot = yaml.safe_load(REFERENCE.read_text())["groups"][0]
    slot["name"] = "slots"
    slot["models"]["ref-model"]["sim"]["startup_s"] = 5
    data["groups"].append(slot)
    spec_path.write_text(yaml.safe_dump(data))
    refs = [f"ref={trace_path}", f"slots={trace_path}"]
    f = simulate_fleet_spec(spec_path, refs, policy="fixed:2", report_dir=tmp_path / "fleet")
    rows = {r["group"]: r for r in f["groups"]}
    assert rows["ref"]["instances"]["kind"] == "batching"
    assert rows["slots"]["instances"]["kind"] == "slots"
    assert rows["ref"]["ttft_p99_ms"] >= rows["ref"]["ttft_p95_ms"] >= rows["ref"]["ttft_p50_ms"]
    assert "ttft_p50_ms" not in rows["slots"]
    page = (tmp_path / "fleet" / "index.html").read_text()
    assert "tpot_p95_ms" in page and "kv_cache_usage_max" in page
    assert "independent slots" in page and "continuously batching server" in page


def test_a_fleet_runs_batching_and_slot_groups_together() -> None:
    data = spec_data({"batching": LLM}, max_concurrency=24, replicas=2)
    slot = yaml.safe_load(REFERENCE.read_text())["groups"][0]
    slot["name"] = "slots"
    slot["replicas"] = 2
    data["groups"].append(slot)
    spec = load_spec_text(yaml.safe_dump(data)).spec
    works = {
        g.name: prepare(InstanceModel.from_spec(spec, g), poisson(4.0, 30.0, seed=9))
        for g in spec.groups
    }
    res = run_fleet(spec, works, FleetOptions())
    for g in res.groups.values():
        s = g.sim.summary()
        assert s["completed"] == s["requests"] > 50
    assert res.groups["ref"].sim.ttft_s is not None
    assert res.groups["slots"].sim.ttft_s is None
