"""Sizing on what callers of a generative group feel (issue 36): time to first token and
time per output token against their p95 targets, and the servers' KV-cache use as a leading
signal; each one named in the decision that it set."""

from __future__ import annotations

from sluice.policy.autoscale import SluicePolicy
from tests.unit.test_autoscale_sluice import World, spec

CALM = {"panic": {"enabled": False}}


def test_ttft_over_target_on_busy_instances_scales_up_and_is_named() -> None:
    pol = SluicePolicy(spec(targets={"ttft_p95_ms": 500}, **CALM))
    w = World(pol, current=4)
    dec = w.run(30, 11, ttft_p95_s=1.5)  # 11 in flight on 16 slots, 11 / 2.8 -> 4: busy
    first_up = next(d for d in w.decisions if d.desired > 4)
    assert first_up.winner == "ttft" and first_up.proposals["ttft"] == 8  # 4 x min(3, 2)
    assert first_up.signals["ttft_p95_ms"] == 1500.0
    assert first_up.signals["ttft_target_ms"] == 500.0
    assert first_up.reason.startswith("ttft p95 1500ms over target 500ms")
    assert dec.desired >= 8


def test_tpot_over_target_scales_up_by_how_far_over_it_is() -> None:
    pol = SluicePolicy(spec(targets={"tpot_p95_ms": 40}, **CALM))
    w = World(pol, current=4)
    w.run(30, 11, tpot_p95_s=0.05)  # 50 ms a token against 40: x1.25 -> 5
    up = next(d for d in w.decisions if d.desired > 4)
    assert up.winner == "tpot" and up.proposals["tpot"] == 5 and up.desired == 5


def test_ttft_over_target_on_idle_instances_is_a_bottleneck_elsewhere() -> None:
    pol = SluicePolicy(spec(targets={"ttft_p95_ms": 500}, **CALM))
    w = World(pol, current=4)
    dec = w.run(60, 2, ttft_p95_s=3.0)
    assert max(w.counts) == 4
    assert "ttft p95 over target on idle instances" in dec.reason


def test_ttft_over_target_with_requests_waiting_inside_the_servers_scales_up() -> None:
    """A batching server bound by its prefill or KV cache is busy far under its gateway
    slots: 6 in flight on 16 slots (under the concurrency target), 4 of them waiting inside
    the servers (vLLM's num_requests_waiting), and the backlog test (4 x 4 slots / 1 s drain
    16/s against 6/s arriving, 30 s lead) sees no backlog at ready time. The servers' own
    queue, over `queue_per_instance` (0.5) per ready instance, is the evidence that the
    instances are busy: TTFT over target scales up."""
    pol = SluicePolicy(spec(targets={"ttft_p95_ms": 500}, **CALM))
    w = World(pol, current=4, startup_s=30.0)
    w.run(60, 6, server_waiting=4)  # the service time known (the backlog test runs)
    assert set(w.counts) == {4}
    dec = w.tick(6, ttft_p95_s=3.0, server_waiting=4)
    assert dec.desired == 8 and dec.winner == "ttft" and dec.proposals["ttft"] == 8  # 4 x 2
    assert dec.signals["server_queue"] == 4.0 and dec.proposals["queue"] == 0
    assert dec.signals["backlog_at_ready"] == 0.0
    assert dec.signals["concurrency"] < 0.95 * 4 * 2.8  # not busy by the gateway's count
    # the same readings with the servers' queue at the per-instance target (2 for 4
    # ready): no evidence the instances are busy, the bottleneck is elsewhere (S12)
    w2 = World(SluicePolicy(spec(targets={"ttft_p95_ms": 500}, **CALM)), 4, startup_s=30.0)
    w2.run(60, 6, server_waiting=2)
    dec2 = w2.run(30, 6, ttft_p95_s=3.0, server_waiting=2)
    assert set(w2.counts) == {4} and "over target on idle instances" in dec2.reason


def test_caller_targets_over_block_a_scale_down_and_well_under_veto_a_scale_up() -> None:
    pol = SluicePolicy(spec(targets={"ttft_p95_ms": 500, "tpot_p95_ms": 50}, **CALM))
    w = World(pol, current=6)
    dec = w.run(200, 2, ttft_p95_s=0.6, tpot_p95_s=0.01)  # little load, ttft over target
    assert set(w.counts) == {6} and "ttft p95 over target: no scale-down" in dec.reason
    # busy, but every caller-facing p95 well under its target and no queue: S4 holds
    w2 = World(SluicePolicy(spec(targets={"ttft_p95_ms": 500, "tpot_p95_ms": 50}, **CALM)), 4)
    dec2 = w2.run(60, 15, ttft_p95_s=0.1, tpot_p95_s=0.01)
    assert set(w2.counts) == {4} and "no scale-up (S4)" in dec2.reason


def test_kv_cache_use_over_its_target_scales_up_before_any_queue() -> None:
    pol = SluicePolicy(spec(targets={"kv_cache_usage": 0.8}, **CALM))
    w = World(pol, current=4)
    dec = w.run(30, 8, kv_cache_usage=0.96)  # 8 in flight on 16 slots: no queue yet
    up = next(d for d in w.decisions if d.desired > 4)
    assert up.winner == "kv_cache" and up.proposals["kv_cache"] == 5  # ceil(4 x 0.96 / 0.8)
    assert up.signals["kv_cache_usage"] == 0.96 and up.signals["kv_cache_target"] == 0.8
    assert up.reason.startswith("kv_cache 0.96 over target 0.8 -> 5")
    assert dec.desired >= 5
    # under its target it asks for nothing: the count holds
    w2 = World(SluicePolicy(spec(targets={"kv_cache_usage": 0.8}, **CALM)), 4)
    w2.run(30, 8, kv_cache_usage=0.5)
    assert set(w2.counts) == {4}


def test_without_targets_the_readings_are_shown_but_ask_for_nothing() -> None:
    w = World(SluicePolicy(spec(**CALM)), current=4)
    dec = w.run(30, 8, ttft_p95_s=5.0, tpot_p95_s=1.0, kv_cache_usage=0.99)
    assert set(w.counts) == {4}
    assert dec.signals["ttft_p95_ms"] == 5000.0 and dec.signals["kv_cache_usage"] == 0.99
    assert not {"ttft", "tpot", "kv_cache"} & set(dec.proposals)


def test_instances_still_starting_do_not_compound_the_ttft_proposal() -> None:
    """TTFT stays over target until new instances are ready (30 s here): sized from the ready
    ones, the proposal stays at 2x them instead of doubling every tick."""
    pol = SluicePolicy(spec(targets={"ttft_p95_ms": 500}, **CALM))
    w = World(pol, current=4, startup_s=30.0)
    w.run(20, 30, ttft_p95_s=3.0)  # 6x over target, a queue: as many as the load asks
    assert max(w.counts) == max(d.proposals["concurrency"] for d in w.decisions), w.counts
    assert all(d.proposals["ttft"] <= 8 for d in w.decisions)  # 2 x the 4 ready, no more
