"""The fleet simulator (`sluice.sim.fleet`): every tick goes through the controller's own
kernel `step`; borrowing lets a burst hold its SLO and the lender gets its guarantee back in
time; a smaller pool costs less and hurts the lowest priority first; burst instances go
first on scale-down."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import sluice.policy.kernel
import sluice.sim.fleet
from sluice.policy.kernel import Memory, World
from sluice.policy.tick import TickDecision
from sluice.sim import InstanceModel, Trace, Workload, prepare, trace_from_rows
from sluice.sim.fleet import TICK_S, FleetOptions, FleetResult, run_fleet
from sluice.spec import PlatformSpec, load_spec_text

GROUP = """
  - name: NAME
    owner: o
    business: b
    alert_channel: c
    models: {m: {runtime: sim, sim: {startup_s: 2, service_time: {kind: fixed, seconds: 1}}}}
    resources: {pool: gpu, memory_gb: 1}
    max_concurrency: 4
    warmup: {requests: 0}
    drain_timeout_s: 10
    queue: {max_length: 100000, max_wait_s: 600}
    slo: {latency_ms: 5000, target: 0.99}
"""


def spec_of(pool: int, **groups: str) -> PlatformSpec:
    """A pool of `pool` units and groups NAME: extra YAML lines (indented 4)."""
    text = f"pools:\n  - {{name: gpu, count: {pool}, memory_gb: 16, price_per_hour: 2.0}}\ngroups:"
    for name, extra in groups.items():
        text += GROUP.replace("NAME", name) + "".join(f"    {x}\n" for x in extra.splitlines())
    return load_spec_text(text).spec


def arrivals(rate: Callable[[np.ndarray], np.ndarray], duration: float, seed: int) -> Trace:
    """Poisson arrivals at `rate(t)` req/s (thinning), seeded."""
    rng = np.random.default_rng(seed)
    peak = float(rate(np.linspace(0.0, duration, 2001)).max())
    t = np.sort(rng.uniform(0.0, duration, rng.poisson(peak * duration)))
    t = t[rng.uniform(0.0, peak, t.size) < rate(t)]
    return trace_from_rows(((x, 10, 10) for x in t.tolist()), f"seed{seed}")


def works(spec: PlatformSpec, traces: dict[str, Trace]) -> dict[str, Workload]:
    out = {}
    for name, trace in traces.items():
        g = spec.group(name)
        assert g is not None
        out[name] = prepare(InstanceModel.from_spec(spec, g), trace)
    return out


def ramp(t: np.ndarray, start: float, length: float) -> np.ndarray:
    return np.clip((t - start) / length, 0.0, 1.0)


# steady: 4 req/s (one or two instances of 4 slots x 1 s) until 240 s, then up to 15 req/s
# within a minute (five instances: its whole guarantee). bursty: 2 req/s, and 15 req/s from
# 80 s to 180 s (five instances, where its guarantee holds two).
def steady(t: np.ndarray) -> np.ndarray:
    return 4.0 + 11.0 * ramp(t, 240.0, 60.0)


def burst(t: np.ndarray) -> np.ndarray:
    return 2.0 + 13.0 * ramp(t, 60.0, 20.0) * (t < 180.0)


STEADY = "replicas: 2\nautoscaling: {min: 1, max: 8}\nquota: {guaranteed: 5, lendable: 5}"
BURSTY = "replicas: 1\nautoscaling: {min: 1, max: 8}\nquota: {guaranteed: 2, BORROW}"


def borrowing_run(borrow: str = "priority: 0", length: float = 400.0) -> FleetResult:
    spec = spec_of(8, steady=STEADY, bursty=BURSTY.replace("BORROW", borrow))
    traces = {"steady": arrivals(steady, length, 1), "bursty": arrivals(burst, length, 2)}
    return run_fleet(spec, works(spec, traces))


def row(result: FleetResult, group: str) -> dict[str, object]:
    return next(r for r in result.summary()["groups"] if r["group"] == group)


def test_every_tick_is_the_controllers_own_step(monkeypatch: pytest.MonkeyPatch) -> None:
    assert sluice.sim.fleet.step is sluice.policy.kernel.step
    seen: list[float] = []

    def spy(memory: Memory, world: World, now: float) -> tuple[TickDecision, Memory]:
        seen.append(now)
        return sluice.policy.kernel.step(memory, world, now)

    monkeypatch.setattr(sluice.sim.fleet, "step", spy)
    spec = spec_of(8, steady=STEADY, bursty=BURSTY.replace("BORROW", "priority: 0"))
    result = run_fleet(spec, works(spec, {"bursty": arrivals(burst, 60.0, 3)}))
    assert len(seen) == result.ticks > 60
    assert np.allclose(np.diff(seen), TICK_S)
    assert seen[0] == FleetOptions().epoch  # virtual second 0 on the epoch clock


def test_a_burst_borrows_a_lenders_idle_guarantee_and_the_lender_gets_it_back_in_time() -> None:
    lent = borrowing_run()
    steady_row, bursty_row = row(lent, "steady"), row(lent, "bursty")
    assert bursty_row["slo_attainment"] >= 0.99  # the burst ran on borrowed units
    assert bursty_row["peak_instances"] >= 5 and bursty_row["borrowed_unit_hours"] > 0
    assert steady_row["slo_attainment"] >= 0.99  # and steady's own rise was served
    assert steady_row["lent_unit_hours"] > 0
    # steady asked for its guarantee back; bursty's borrowed instances drained in time
    g, b = lent.spec.group("steady"), lent.spec.group("bursty")
    assert g is not None and b is not None
    reclaims = [r for r in lent.reclaims if r.lender == "steady"]
    assert reclaims and steady_row["reclaims"] == len(reclaims)
    for r in reclaims:
        assert r.borrower == "bursty" and r.units > 0 and r.latency_s is not None
        assert r.latency_s <= g.quota.reclaim_grace_s + b.drain_timeout_s + TICK_S
    assert lent.groups["steady"].column("held").max() == g.quota.guaranteed
    loans = [x for x in lent.ledger if x.lender == "steady" and x.borrower == "bursty"]
    assert loans and all(x.units > 0 for x in loans)
    assert any(x.reclaim_requested_at is not None and x.ended_at is not None for x in loans)
    # the same spec without borrowing: bursty is held to its guarantee and misses its SLO
    alone = borrowing_run("borrow_limit: 0")
    assert row(alone, "bursty")["slo_attainment"] < 0.5
    assert row(alone, "bursty")["peak_instances"] == 2
    assert not alone.ledger and not alone.reclaims


def test_a_smaller_pool_costs_less_and_hurts_the_lowest_priority_first() -> None:
    spec = spec_of(
        10,
        core="replicas: 4\nquota: {guaranteed: 4, reserved: true}",
        mid="replicas: 3\nquota: {guaranteed: 3, priority: 5}",
        low="replicas: 3\nquota: {guaranteed: 3, priority: 0}",
    )
    flat = {"core": 12.0, "mid": 9.0, "low": 9.0}  # 75 % of each group's replicas
    traces = {
        name: arrivals(lambda t, r=rate: np.full(t.shape, r), 240.0, seed)
        for seed, (name, rate) in enumerate(flat.items())
    }
    # the same 300 s in both (starved, `low`'s requests would wait out max_wait_s)
    full = run_fleet(spec, works(spec, traces), FleetOptions(end_s=300.0))
    small = run_fleet(spec, works(spec, traces), FleetOptions(end_s=300.0, pool_counts={"gpu": 7}))
    assert small.spec.pools[0].count == 7 and spec.pools[0].count == 10
    before, after = full.summary(), small.summary()
    assert after["totals"]["cost"] < before["totals"]["cost"]
    for name in flat:
        assert row(full, name)["slo_attainment"] >= 0.99
    assert row(small, "low")["slo_attainment"] < 0.5  # its guarantee is cut first
    assert row(small, "mid")["slo_attainment"] >= 0.99
    assert row(small, "core")["slo_attainment"] >= 0.99  # reserved: keeps its guarantee
    assert small.groups["core"].column("held").min() == 4
    assert any(r.borrower == "low" and r.lender is None for r in small.reclaims)


def test_burst_instances_run_only_above_the_guarantee_and_go_first_on_scale_down() -> None:
    result = borrowing_run(length=700.0)  # steady's rise reclaims, then bursty scales down
    g = result.groups["bursty"]
    stable, burst_n = g.column("stable"), g.column("burst")
    assert burst_n.max() >= 3
    guaranteed = 2  # one unit per instance
    assert np.all((burst_n == 0) | (stable + burst_n > guaranteed))
    assert np.all(stable <= guaranteed)
    running = stable + burst_n
    assert running[-1] <= guaranteed  # back on its own units
    # each instance that went was burst while the group had any (reclaims and its own
    # scale-down alike), so the stable part only shrinks once the burst part is gone
    times = g.column("t").tolist()
    stops = [s for s in g.stops if s["tier"] is not None]
    assert {s["action"] for s in stops} == {"drain"}
    assert any("reclaim" in s["reason"] for s in stops)
    assert any("scale down" in s["reason"] for s in stops)
    for s in stops:
        k = times.index(s["t"])
        if s["tier"] == "stable":
            assert burst_n[k] == 0 and burst_n[k - 1] == 0, s
    assert sum(s["tier"] == "burst" for s in stops) >= burst_n.max()  # all of them went
