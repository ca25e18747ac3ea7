"""Capacity tests and peak drills through the real `sluice` command (O4, O5).

One fleet of `sim` instances whose capacity is known: `bench` serves each request in
0.1 s on 4 slots, so one instance does 40 requests a second; `elastic` and `capped` (0.2 s,
2 slots: 10 a second each) autoscale, `capped` only up to 2 instances.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sluice.policy.drills import time_to_scale_tolerance
from tests.e2e.conftest import Sluice, running

pytestmark = pytest.mark.serial  # it measures time or rates: run alone (Makefile)

SERVICE_S, SLOTS = 0.1, 4
CAPACITY_RPS = SLOTS / SERVICE_S
ELASTIC = """
    owner: cap@example.com
    business: search
    alert_channel: "#capacity"
    models:
      m-{name}:
        runtime: sim
        sim: {{startup_s: 1.0, service_time: {{kind: fixed, seconds: 0.2}}, memory_gb: 1}}
    resources: {{pool: local, accelerators: 1, memory_gb: 1}}
    max_concurrency: 2
    slo: {{latency_ms: 1000}}
    slow_start_s: 0
    queue: {{max_length: 500, max_wait_s: 30}}
    autoscaling:
      min: 1
      max: {max}
      interval_s: 1
      targets: {{window_s: 10}}
      down: {{cooldown_s: 600, stabilization_s: 600}}
"""
SPEC = f"""
gateway: {{host: 127.0.0.1, port: 0}}
pools:
  - {{name: local, count: 16, memory_gb: 16}}
groups:
  - name: bench
    owner: cap@example.com
    business: search
    alert_channel: "#capacity"
    models:
      m-bench:
        runtime: sim
        version: v1
        sim: {{startup_s: 0.2, service_time: {{kind: fixed, seconds: {SERVICE_S}}}, memory_gb: 1}}
    resources: {{pool: local, accelerators: 1, memory_gb: 1}}
    max_concurrency: {SLOTS}
    replicas: 2
    slow_start_s: 0
    queue: {{max_length: 2000, max_wait_s: 60}}
    autoscaling: {{min: 1, max: 3, mode: advisory}}
  - name: elastic{ELASTIC.format(name="elastic", max=8)}
  - name: capped{ELASTIC.format(name="capped", max=2)}
tenants:
  - {{name: ops, api_keys: [sk-ops-c391959605db2757], operator: true}}
"""


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sluice]:
    home = tmp_path_factory.mktemp("capacity")
    with running(
        home,
        SPEC,
        "bench, elastic and capped ready",
        lambda s: (
            len(s.ready("bench")) == 2
            and len(s.ready("elastic")) == 1
            and len(s.ready("capped")) == 1
        ),
        timeout=90,
    ) as s:
        yield s


def sluice(platform: Sluice, *args: str, timeout: float = 240) -> tuple[int, Any]:
    """`sluice ARGS --json` as the operator tenant's client: (exit code, its JSON)."""
    r = subprocess.run(
        [sys.executable, "-m", "sluice", *args, "--json"],
        capture_output=True,
        text=True,
        env={**platform.env(), "SLUICE_API_KEY": "sk-ops-c391959605db2757"},
        timeout=timeout,
    )
    assert r.stdout, r.stderr
    return r.returncode, json.loads(r.stdout)


def test_the_knee_of_one_instance_is_its_analytic_capacity(
    platform: Sluice, tmp_path: Path
) -> None:
    code, report = sluice(
        platform,
        "loadtest",
        "bench",
        "--slo-ms",
        "800",
        # long enough for a 15 % overload to show: in a 4 s step, 46 rps on this 40 rps
        # instance queues only 24 requests (0.6 s of wait, under the SLO) and once held
        "--step",
        "6s",
        "--report",
        str(tmp_path),
        "--propose",
    )
    assert code == 0, report
    knee = report["knee"]
    assert knee is not None, (report["no_knee"], report["steps"])
    # one instance of 4 slots at 0.1 s: 40 requests a second
    assert abs(knee["rate_rps"] - CAPACITY_RPS) <= 0.15 * CAPACITY_RPS, report["steps"]
    assert knee["limited_by"] in ("slo", "throughput"), knee
    assert any(not s["verdict"]["holds"] for s in report["steps"])  # it went past the knee
    rec = report["recommendation"]
    assert 0 < rec["targets"]["utilization"] <= 1
    assert rec["rate_per_instance"] < knee["rate_rps"]
    assert (tmp_path / "loadtest.png").stat().st_size > 10_000
    # the pin held it at one instance while it measured, and is gone
    events = platform.cli("events", "bench", "--limit", "200")
    kinds = [e["kind"] for e in events]
    assert "pin" in kinds and "unpin" in kinds
    bench = next(g for g in platform.cli("get", "groups") if g["name"] == "bench")
    assert bench["desired"] == 2
    # stored under v1; the proposal changes the targets only
    runs = platform.cli("capacity", "bench", "--kind", "loadtest")
    assert runs[0]["version"] == "v1" and runs[0]["verdict"] == "measured"
    proposal = platform.cli("proposal", "show", str(report["proposal"]["id"]))
    changed = [
        line
        for line in proposal["diff"].splitlines()
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    added = [c for c in changed if c.startswith("+")]
    assert any("utilization:" in c for c in added), proposal["diff"]
    keys = ("autoscaling:", "targets:", "utilization:", "queue_per_instance:", "latency_p95_ms:")
    assert all(any(k in c for k in keys) for c in changed if c[1:].strip()), proposal["diff"]


def test_a_drill_passes_where_autoscaling_can_follow_and_fails_at_a_low_max(
    platform: Sluice, tmp_path: Path
) -> None:
    # 5 -> 20 rps: three instances (10 a second each) carry it with room; capped stops at 2
    shape = ["--base", "5", "--shape", "ramp", "--warm", "5s", "--ramp", "20s"]
    shape += ["--hold", "15s", "--cool", "10s"]
    peaks = {"elastic": "4x", "capped": "4x"}
    drill = ["--peak", peaks["elastic"], *shape]
    results: dict[str, tuple[int, Any]] = {}
    failures: dict[str, BaseException] = {}

    def one(group: str) -> None:
        args = ["--peak", peaks[group], *shape, "--report", str(tmp_path / group)]
        try:
            results[group] = sluice(platform, "drill", group, *args)
        except BaseException as e:  # shown by the assert below, with its cause
            failures[group] = e

    threads = [threading.Thread(target=one, args=(g,)) for g in ("elastic", "capped")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    code, elastic = results["elastic"]
    j = elastic["judgement"]
    assert code == 0 and j["verdict"] == "pass", (j["reasons"], j["milestones"])
    assert j["did_the_metric_trigger"]["answer"] and j["did_the_instances_come_up"]["answer"]
    assert j["did_traffic_reach_them"]["answer"], j
    assert (tmp_path / "elastic" / "drill.png").stat().st_size > 10_000

    code, capped = results["capped"]
    c = capped["judgement"]
    assert c["verdict"] == "fail" and c["hit_max"], c
    assert any("max" in why for why in c["reasons"]), c["reasons"]

    # the dry run of the same drill on the simulator agrees on the time to scale up
    start = str(elastic["plan"]["start_instances"])  # the live drill scaled it up since
    code, simulated = sluice(
        platform, "drill", "elastic", *drill, "--simulate", "--instances", start
    )
    assert code == 0 and simulated["mode"] == "simulated", simulated
    live_s = j["milestones"]["first_scale_up_s"]
    sim_s = simulated["judgement"]["milestones"]["first_scale_up_s"]
    tolerance = time_to_scale_tolerance(tick_s=1.0)
    assert abs(live_s - sim_s) <= tolerance, (live_s, sim_s, tolerance)
    stored = platform.cli("capacity", "elastic", "--kind", "drill")
    assert {r["mode"] for r in stored} == {"live", "simulated"}


def test_bad_drills_and_targets_are_refused_with_the_fix(platform: Sluice) -> None:
    code, doc = sluice(platform, "drill", "bench", "--base", "5")
    assert code == 2 and "autoscaling" in doc["error"]["message"]
    code, doc = sluice(platform, "drill", "nope", "--base", "5")
    assert code == 2 and "no group named 'nope'" in doc["error"]["message"]
    code, doc = sluice(platform, "drill", "elastic", "--peak", "100000rps", "--base", "1")
    assert code == 2 and "generator" in doc["error"]["message"]
    code, doc = sluice(
        platform, "loadtest", "bench", "--slo-ms", "500", "--endpoint", "http://10.1.2.3:9"
    )
    assert code == 2 and "--allow-host" in doc["error"]["message"]


def test_a_load_test_that_moves_the_knee_flags_the_targets_with_an_alert_and_a_proposal(
    platform: Sluice,
) -> None:
    """Two load test reports of `elastic`, recorded as `sluice loadtest` records them: the
    second puts the knee 40 % lower, past the 20 % margin, so the control plane raises a
    `capacity_changed` alert to the group's channel and proposes the new targets; a third
    within the margin of the second flags nothing."""

    def record(rate: float, utilization: float) -> dict[str, Any]:
        knee = {"rate_rps": rate, "concurrency": 2.0, "latency_ms": 700.0}
        targets = {"utilization": utilization, "queue_per_instance": 0.5, "latency_p95_ms": 560}
        report = {"group": "elastic", "knee": knee, "recommendation": {"targets": targets}}
        r = httpx.post(
            f"{platform.control_url}/v1/groups/elastic/capacity",
            json={"kind": "loadtest", "mode": "live", "verdict": "measured", "report": report},
            headers=platform.control_headers(),
            timeout=30,
        )
        assert r.status_code == 200, r.text
        return dict(r.json())

    record(10.0, 0.8)
    moved = record(6.0, 0.55)["stale"]
    assert moved["rate_change"] == -0.4 and moved["margin"] == 0.2 and moved["proposal"]
    assert record(6.3, 0.56)["stale"] is None  # +5 %: within the margin
    notices = [e for e in platform.cli("events", "elastic", "--limit", "100")
               if e["kind"] == "alert_notice"]  # fmt: skip
    assert any("capacity_changed" in e["message"] and "-40%" in e["message"] for e in notices)
    diff = platform.cli("proposal", "show", str(moved["proposal"]))["diff"]
    assert "utilization: 0.55" in diff, diff
