"""One brain, two bodies, end to end: the same spec and the same arrivals through
`sluice simulate` and through a live `sluice up` (sim runtime) scale the group the same
way: the counts it passes through, the warm standby the gateway puts in rotation when
requests wait, where quota clips it (a limit of 3 units: the count takes the standby's
unit before the standby keeps it, instances serve rather than wait), where a rollout's
floor holds it (a rollout of the group runs from 20 s to 80 s: live, started and aborted
with `sluice rollout`; simulated, `--rollout chat@20-80`), and back down, within the live
clock's jitter.

The simulator keeps the floor only, not the canary's 5 % of the traffic: at these rates
that share moves no decision."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import OpenLoop, Sluice, running

pytestmark = pytest.mark.serial  # it measures time or rates: run alone (Makefile)

SPEC = """
gateway: {host: 127.0.0.1, port: 0}
pools:
  - {name: local, count: 12, memory_gb: 16}
groups:
  - name: chat
    owner: ops@example.com
    business: search
    alert_channel: "#ops"
    models:
      m-chat:
        runtime: sim
        sim: {startup_s: 0.3, service_time: {kind: fixed, seconds: 0.2}, memory_gb: 1}
    resources: {pool: local, accelerators: 1, memory_gb: 1}
    max_concurrency: 2
    replicas: 1
    slow_start_s: 0
    drain_timeout_s: 10
    queue: {max_length: 2000, max_wait_s: 60}
    quota: {limit: 3}
    slo: {latency_ms: 500}
    autoscaling:
      min: 1
      max: 6
      warm_standby: 1
      down: {cooldown_s: 6, stabilization_s: 3, max_step: 1, max_percent: 0, period_s: 3}
  - name: chat-canary
    owner: ops@example.com
    business: search
    alert_channel: "#ops"
    models:
      m-chat:
        runtime: sim
        version: v2
        sim: {startup_s: 0.3, service_time: {kind: fixed, seconds: 0.2}, memory_gb: 1}
    resources: {pool: local, accelerators: 1, memory_gb: 1}
    replicas: 1
tenants:
  - {name: search, api_keys: [sk-search-b095adcc724f4f8a]}
rollouts:
  - {name: chat-v2, baseline: chat, canary: chat-canary, steps: [5, 100], hold_s: 600}
"""

PHASES = ((3.0, 10.0), (25.0, 25.0), (2.0, 55.0))
"""(requests per second, seconds): at 25/s the first requests that wait bring the warm
standby into rotation at once (the gateway's fast tier), and the next decision takes it
into the count (2) and launches a new standby; 25/s x 0.2 s wants more, but quota leaves 2
serving (3 units less the standby's: the gateway puts it in while requests wait); at 2/s
one is enough again (from about 64 s), but the rollout keeps 2 until it ends"""
ROLLOUT_S = (20.0, 80.0)
"""when the rollout of chat starts and ends, seconds from the first request"""


def trace_csv(path: Path) -> Path:
    """The arrivals `OpenLoop.run` sends, phase by phase, as a trace."""
    rows, start = ["t_s,input_tokens,output_tokens,model"], 0.0
    for rate, seconds in PHASES:
        rows += [f"{start + k / rate:.4f},10,1,m-chat" for k in range(int(rate * seconds))]
        start += seconds
    path.write_text("\n".join(rows) + "\n")
    return path


def simulated(spec: Path, trace: Path) -> tuple[list[tuple[float, int, int, str]], dict[str, int]]:
    """`sluice simulate`'s count changes, and its decisions clipped by each guard."""
    r = subprocess.run(
        [sys.executable, "-m", "sluice", "simulate", "--spec", str(spec), "--trace", str(trace),
         "--group", "chat", "--rollout", "chat@{:g}-{:g}".format(*ROLLOUT_S), "--json"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    out: dict[str, Any] = json.loads(r.stdout)
    moves = [(d["t"], d["from"], d["to"], d["reason"]) for d in out["scale_decisions"]]
    return moves, out["clipped_decisions"]


def lived(s: Sluice, since: float) -> list[tuple[float, int, int, str]]:
    """The live controller's count changes (its `autoscale` events), in seconds since `since`."""
    moves = []
    for e in reversed(s.cli("events", "chat", "--limit", "500")):
        if e["kind"] == "autoscale" and e["at"] >= since:
            counts, reason = e["message"].split(":", 1)
            before, after = counts.split(" -> ")
            moves.append((e["at"] - since, int(before), int(after), reason.strip()))
    return moves


def path_of(moves: list[tuple[float, int, int, str]]) -> list[int]:
    return [moves[0][1], *(m[2] for m in moves)] if moves else []


JITTER_S = 2.5
"""How far apart two live ticks may land: the live loop ticks every second, but under load a
tick comes late, and the next one then takes in what two simulated ticks decided apart"""


def merged(moves: list[tuple[float, int, int, str]]) -> list[tuple[float, int, int, str]]:
    """`moves` with each run of steps the same way, each within `JITTER_S` of the one before,
    made one step (first time, first count, last count): what a late live tick decides at once."""
    out: list[tuple[float, int, int, str]] = []
    for t, before, after, reason in moves:
        if out:
            t0, b0, a0, r0 = out[-1]
            same_way = (a0 - b0) * (after - before) > 0
            if same_way and a0 == before and t - t0 <= JITTER_S:
                out[-1] = (t0, b0, after, r0)
                continue
        out.append((t, before, after, reason))
    return out


def test_simulate_and_a_live_run_scale_the_same_way(tmp_path: Path) -> None:
    trace = trace_csv(tmp_path / "arrivals.csv")
    with running(
        tmp_path,
        SPEC,
        "chat and its canary ready",
        lambda s: len(s.ready("chat")) == 2 and len(s.ready("chat-canary")) == 1,
        timeout=60,
    ) as s:  # chat: 1 serving + 1 warm standby
        load = OpenLoop(s.endpoint)
        since = time.time()
        rollout = [  # the rollout's start and end, on the trace's clock
            threading.Timer(at - (time.time() - since), s.cli, (*cmd, "--reason", "parity"))
            for at, cmd in zip(
                ROLLOUT_S,
                (("rollout", "start", "chat-v2"), ("rollout", "abort", "chat-v2")),
                strict=True,
            )
        ]
        started, ended = rollout
        started.start()
        ended.start()
        for rate, seconds in PHASES:
            load.run(rate, seconds)
        results = load.results()
        ended.join()
        s.wait_for("back to 1", lambda: path_of(lived(s, since))[-1:] == [1], timeout=30)
        live = lived(s, since)
        journal = s.cli("explain", "chat", "--limit", "500")["decisions"]
        sim, clipped = simulated(s.spec, trace)
        metrics = httpx.get(f"{s.control_url}/metrics", headers=s.control_headers(), timeout=10)
        promotions = sum(
            float(line.rsplit(" ", 1)[1])
            for line in metrics.text.splitlines()
            if line.startswith('sluice_gateway_standby_promotions_total{group="chat"')
        )
    assert all(code == 200 for code, _ in results)
    print(f"\nsimulated: {[(round(t), a, b) for t, a, b, _ in sim]}, clipped {clipped}")
    print(f"live:      {[(round(t), a, b) for t, a, b, _ in live]}")
    # the same counts, in the same order: up to what quota leaves (3, the standby's unit
    # serving), then back to 1; a late live tick may take two simulated steps at once
    assert path_of(sim) == [1, 2, 3, 2, 1], sim
    assert path_of(live) == path_of(sim) or path_of(merged(live)) == path_of(merged(sim)), (
        sim,
        live,
    )
    # the step up: the warm standby the gateway put in rotation as requests waited (live,
    # the autoscaler's own signal may see the burst in the same tick: either names it)
    assert "a gateway promoted the warm standby" in sim[0][3], sim[0]
    assert promotions >= 1, "the live gateway never put the warm standby in rotation"
    # quota clipped the autoscaler's wish in both, and so did the rollout's floor
    assert clipped.get("quota", 0) > 0 and clipped.get("rollout", 0) > 0, clipped
    clips = [c for d in journal for c in d["detail"]["clipped_by"]]
    assert "quota" in clips and "rollout" in clips, journal
    # when: the scale-up after the step (t = 10 s), the scale-down once the rollout ends
    # (t = 80 s), not when the load fell; the live clock adds the instances' start-up and
    # the readings' lag (a few seconds)
    up = {"sim": sim[0][0], "live": live[0][0]}
    down = {"sim": sim[-1][0], "live": live[-1][0]}
    assert 10 <= up["sim"] <= 16 and abs(up["live"] - up["sim"]) <= 5, up
    assert down["sim"] >= ROLLOUT_S[1] and abs(down["live"] - down["sim"]) <= 10, down
