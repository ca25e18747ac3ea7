"""The held tier and the level trigger (issue 36): capacity the scale-down stabilization
holds beyond what the last `sleep_held_after_s` asked for sleeps, and a gateway takes a
batching group's standby in (wakes its sleepers) once its in-flight requests pass the
capacity at the SLO, before any request waits at the gateway."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from sluice.policy.autoscale import GroupLoad, SluicePolicy, Stateful
from sluice.policy.autoscale.factory import held_window
from sluice.policy.autoscale.windows import RollingExtreme
from sluice.policy.kernel import Memory, serving_in_force
from sluice.policy.routing import Endpoint, GroupTraffic, RouteRule, RouteTable, RoutingSnapshot
from sluice.policy.snapshot_wire import snapshot_from_json, snapshot_to_json
from sluice.policy.standby import over_level, sleepers_to_wake, standby_level
from sluice.sim import make_policy, prepare, run, trace_from_rows
from sluice.spec import load_spec_text
from sluice.spec.autoscaling import AutoscalingSpec
from tests.unit.test_sim_sleeping import QUIET, sleepy


@given(
    st.lists(st.tuples(st.integers(0, 50), st.integers(0, 20)), min_size=1, max_size=40),
    st.integers(0, 60),
)
def test_the_extreme_since_a_time_is_the_max_of_the_values_recorded_after_it(
    steps: list[tuple[int, int]], back: int
) -> None:
    window: RollingExtreme[int] = RollingExtreme(30.0)
    seen: list[tuple[float, int]] = []
    t = 0.0
    for dt, value in steps:
        t += dt
        window = window.add(t, value)
        seen.append((t, value))
    cutoff = t - back
    inside = [v for at, v in seen if at > cutoff and at > t - 30.0]
    assert window.extreme_since(cutoff) == (max(inside) if inside else None)


def load(at: float, current: int, in_flight: int, arrivals: int) -> GroupLoad:
    return GroupLoad(
        at=at,
        current=current,
        ready=current,
        slots_per_instance=4,
        in_flight=in_flight,
        queued=0,
        arrivals=arrivals,
        completions=arrivals,
        served_s=float(arrivals),
    )


def burst_then_quiet(**auto: Any) -> list[tuple[int, int | None]]:
    """A minute at 20 requests in flight (1 s each, 4 slots), then 2 minutes at 1: each
    tick's (desired, awake)."""
    spec = AutoscalingSpec.model_validate({"max": 20, **auto})
    scaler = Stateful(SluicePolicy(spec))
    out: list[tuple[int, int | None]] = []
    current, arrivals = 1, 0
    for t in range(180):
        busy = 20 if t < 60 else 1
        arrivals += busy
        d = scaler.decide(load(float(t), current, busy, arrivals), float(t))
        current = d.desired
        out.append((d.desired, d.awake))
    return out


def test_what_the_rolling_max_holds_beyond_the_last_minutes_need_is_held_asleep() -> None:
    held = burst_then_quiet(sleeping_standby=1, sleep_held_after_s=30)
    during = held[50]
    assert during[0] >= 5 and during[1] is None  # the burst's need: all of it serves
    late = held[150]  # 90 s after the burst: the 300 s rolling max still holds it
    assert late[0] == during[0] and late[1] is not None and late[1] < 3, late
    # the same policy with every instance awake, or without sleeping standby
    for auto in ({"sleeping_standby": 1, "sleep_held_after_s": 0}, {}):
        assert all(awake is None for _, awake in burst_then_quiet(**auto))
        assert [n for n, _ in burst_then_quiet(**auto)] == [n for n, _ in held]


def test_only_the_rolling_max_holds_capacity_asleep_not_a_cooldown() -> None:
    # the count went up 10 s ago: the cooldown keeps it, not the rolling max
    spec = AutoscalingSpec.model_validate(
        {
            "max": 20,
            "sleeping_standby": 1,
            "sleep_held_after_s": 2,
            "down": {"cooldown_s": 60, "stabilization_s": 5},
            "panic": {"enabled": False},
        }
    )
    scaler = Stateful(SluicePolicy(spec))
    current, arrivals, cooled = 1, 0, 0
    for t in range(60):
        busy = 20 if t < 5 else 1
        arrivals += busy
        d = scaler.decide(load(float(t), current, busy, arrivals), float(t))
        current = d.desired
        if "cooldown" in d.clipped_by:
            cooled += 1
            assert d.awake is None, (t, d)
    assert cooled > 10


def test_a_pin_serves_all_it_sets_and_the_autoscalers_count_serves_what_is_awake() -> None:
    from sluice.spec import load_spec_text

    spec = load_spec_text(
        """
pools: [{name: p, accelerator: virtual, count: 8, memory_gb: 80}]
groups:
  - name: chat
    owner: a@example.com
    business: b
    alert_channel: "#c"
    models: {m: {runtime: sim, sim: {startup_s: 1}}}
    resources: {pool: p, accelerators: 1, memory_gb: 1}
    autoscaling: {min: 1, max: 6, sleeping_standby: 1}
"""
    ).spec
    g = spec.groups[0]
    memory = Memory(counts={"chat": 5}, awake={"chat": 2})
    assert serving_in_force(g, memory, {}, {}) == 2
    assert serving_in_force(g, memory, {}, {"chat": 4}) == 4
    assert serving_in_force(g, Memory(counts={"chat": 5}), {}, {}) == 5


def test_the_level_is_the_capacity_at_the_slo_and_over_it_counts_what_passes_it() -> None:
    assert standby_level({"slots_per_instance": 12.3456}, 256) == 12.0  # 2 digits
    assert standby_level({"slots_per_instance": 256.0}, 256) is None  # slots: the queue
    assert standby_level({}, 256) is None
    assert standby_level({"slots_per_instance": 0.28}, 8) == 1.0  # one alone meets the SLO
    assert over_level(in_flight=30, waiting=0, level=12.0, in_rotation=2) == 6.0
    assert over_level(in_flight=30, waiting=3, level=None, in_rotation=2) == 3.0  # waiting
    # 6 over a level of 2.5 each: three sleepers, not one
    assert sleepers_to_wake(6.0, 0.0, [(k, 2.5) for k in "abcd"]) == ["a", "b", "c"]


def test_a_snapshot_sent_to_a_remote_gateway_keeps_its_sleepers_and_level() -> None:
    ep = Endpoint("s1", "127.0.0.1", 9, 256)
    snap = RoutingSnapshot(
        version=3,
        routes=RouteTable([RouteRule("r", (("g", 1),))]),
        tenants_by_key={},
        endpoints={"g": (Endpoint("a", "127.0.0.1", 8, 256),)},
        group_models={"g": frozenset({"m"})},
        all_models=frozenset({"m"}),
        redirects={},
        traffic={"g": GroupTraffic(standby_at=11.0)},
        sleeping={"g": (ep,)},
    )
    back = snapshot_from_json(json.loads(json.dumps(snapshot_to_json(snap))))
    assert back.sleeping == {"g": (ep,)} and back.traffic["g"].standby_at == 11.0


def test_the_simulator_sleeps_held_capacity_and_a_returning_burst_wakes_it() -> None:
    """Two bursts 220 s apart, within the rolling max's 300 s: after the first, the
    instances it holds sleep (the held tier), and the second wakes them, served a wake
    later, not a start-up later: the SLO of keeping them awake, at less cost."""
    burst = [(60 + i / 20, 100, 10) for i in range(400)]
    again = [(t + 220, p, o) for t, p, o in burst]
    rows = sorted(QUIET + burst + [(80 + i / 2, 100, 10) for i in range(400)] + again)
    runs = {}
    for held_s in (0, 20):
        model = sleepy(1, wake_s=1.0)
        auto = model.group.autoscaling
        assert auto is not None
        update = {"autoscaling": auto.model_copy(update={"sleep_held_after_s": held_s})}
        model = dataclasses.replace(model, group=model.group.model_copy(update=update))
        res = run(prepare(model, trace_from_rows(rows)), make_policy(model, "sluice"))
        runs[held_s] = res.summary()
    h, awake = runs[20], runs[0]
    assert h["sleeping_instance_seconds"] > awake["sleeping_instance_seconds"] + 200, (h, awake)
    assert h["standby_wakes"] > awake["standby_wakes"], (h, awake)
    assert h["priced_instance_seconds"] < 0.95 * awake["priced_instance_seconds"], (h, awake)
    assert h["slo_attainment"] >= awake["slo_attainment"] - 0.02, (h, awake)


HELD_SPEC = """
pools: [{name: gpu, count: 4, memory_gb: 16}]
groups:
  - name: chat
    owner: o
    business: b
    alert_channel: c
    models: {m: MODEL}
    resources: {pool: gpu, memory_gb: 1}
    slo: SLO
    autoscaling: AUTO
"""


def held_window_of(model: str, slo: str, auto: str = "{max: 4, sleeping_standby: 1}") -> float:
    text = HELD_SPEC.replace("MODEL", model).replace("SLO", slo).replace("AUTO", auto)
    return held_window(load_spec_text(text).spec.groups[0])[0]


def test_the_held_tier_holds_only_where_a_wake_is_within_half_the_first_token_bound() -> None:
    sim = "{runtime: sim, sim: {wake_s: WAKE}}"
    ttft = "{ttft_ms: 2000, target: 0.99}"
    assert held_window_of(sim.replace("WAKE", "1"), ttft) == 60.0  # 1 s <= 2 s / 2
    assert held_window_of(sim.replace("WAKE", "3"), ttft) == 0.0  # a burst would be served late
    assert held_window_of(sim.replace("WAKE", "3"), "{latency_ms: 8000}") == 60.0
    assert held_window_of("{runtime: sim}", ttft) == 0.0  # the sim's default wake: 3 s
    command = "{runtime: command, command: {argv: [s, '{port}'], sleep: SLEEP}}"
    unknown = command.replace("SLEEP", "{host_memory_gb: 16}")
    assert held_window_of(unknown, ttft) == 0.0  # a wake nobody measured holds nothing
    measured = command.replace("SLEEP", "{host_memory_gb: 16, wake_s: 0.8}")
    assert held_window_of(measured, ttft) == 60.0
    # the operator's word, whatever the wake
    auto = "{max: 4, sleeping_standby: 1, sleep_held_after_s: 90}"
    assert held_window_of(unknown, ttft, auto) == 90.0
    assert held_window_of(sim.replace("WAKE", "1"), ttft, "{max: 4}") == 0.0  # no sleepers
    text = HELD_SPEC.replace("MODEL", sim.replace("WAKE", "3")).replace("SLO", ttft)
    why = held_window(
        load_spec_text(text.replace("AUTO", "{max: 4, sleeping_standby: 1}")).spec.groups[0]
    )[1]
    assert why == "a 3 s wake is over half the 2000 ms first-token bound"
