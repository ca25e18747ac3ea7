""" "Did it help?" (S12): the verdict on a scaling change, and when a no-gain hold ends."""

from __future__ import annotations

from sluice.policy.gain import Change, NoGainHold, hold_released, judge


def window(rps: float, p95: float, ready: float, in_flight: float, **kw: float) -> dict:
    return {
        "requests_per_s": rps,
        "completed_per_s": rps,
        "p95_ms": p95,
        "ready_instances": ready,
        "in_flight": in_flight,
        "error_rate": 0.0,
        "queue_length": kw.get("queue", 0.0),
        "service_ms": kw.get("service"),
    }


def scale(before: dict, frm: int = 2, to: int = 4) -> Change:
    return Change("db", "scale", 100.0, frm, to, "", before, slots_per_instance=4)


def test_more_instances_that_buy_no_throughput_are_a_no_gain_naming_a_shared_bottleneck() -> None:
    busy = window(10.0, 800.0, 2, 8, queue=20, service=400)
    after = window(10.2, 950.0, 4, 14, queue=22, service=1300)
    f = judge(scale(busy), after, host_load=0.3)
    assert f.verdict == "no_gain"
    assert f.bottleneck is not None and "share outside the group" in f.bottleneck
    assert "400 -> 1300 ms" in f.bottleneck and "did not help" in f.text


def test_a_saturated_host_is_named_as_the_bottleneck() -> None:
    busy = window(10.0, 800.0, 2, 8, queue=20)
    f = judge(scale(busy), window(10.0, 900.0, 4, 10, queue=20), host_load=1.4)
    assert f.verdict == "no_gain" and f.bottleneck and "host's CPUs" in f.bottleneck


def test_a_scale_up_that_drains_the_queue_helped() -> None:
    busy = window(10.0, 800.0, 2, 8, queue=20)
    f = judge(scale(busy), window(19.0, 200.0, 4, 8))
    assert f.verdict == "helped" and f.bottleneck is None


def test_a_group_that_was_not_busy_is_not_a_no_gain() -> None:
    idle = window(1.0, 100.0, 2, 0.2)
    f = judge(scale(idle), window(1.0, 100.0, 4, 0.2))
    assert f.verdict == "no_change" and "not busy" in f.text


def test_too_few_requests_cannot_be_judged() -> None:
    f = judge(scale(window(1.0, 100.0, 2, 8)), {"completed_per_s": 0.0, "p95_ms": None})
    assert f.verdict == "unknown"


def test_a_hold_ends_when_demand_moves_or_its_time_is_up() -> None:
    hold = NoGainHold("db", 4, rate=10.0, since=0.0, until=600.0, reason="r")
    assert hold_released(hold, 11.0, 10.0) is None
    assert "demand moved" in (hold_released(hold, 14.0, 10.0) or "")
    assert "demand moved" in (hold_released(hold, 6.0, 10.0) or "")
    assert "time over" in (hold_released(hold, 10.0, 600.0) or "")
    forever = NoGainHold("db", 4, rate=10.0, since=0.0, until=None, reason="r")
    assert hold_released(forever, 10.0, 1e9) is None


def test_throughput_is_what_finished_not_what_arrived() -> None:
    busy = window(25.0, 5000.0, 1, 2, queue=40)
    busy["completed_per_s"] = 10.0  # an open-loop client: 25 arrive, 10 finish
    after = window(25.0, 900.0, 3, 6)
    after["completed_per_s"] = 25.0
    assert judge(scale(busy, 1, 3), after).verdict == "helped"


def test_a_change_while_the_demand_rose_is_not_judged_by_throughput_that_followed_it() -> None:
    # the scale-up came as the load began: the window before it saw a trickle
    trickle = window(1.4, 240.0, 1, 0.3)
    flood = window(25.0, 4900.0, 3, 12, queue=30)
    flood["completed_per_s"] = 9.7
    f = judge(scale(trickle, 1, 3), flood)
    assert f.verdict == "unknown" and "rose 1.40 -> 25.00 req/s" in f.text


def test_a_scale_up_that_served_more_of_a_rising_demand_helped() -> None:
    busy = window(10.0, 900.0, 2, 8, queue=10)
    busy["completed_per_s"] = 6.0
    after = window(15.0, 950.0, 4, 8)
    assert judge(scale(busy), after).verdict == "helped"


def test_when_the_demand_fell_nothing_that_followed_is_the_changes_doing() -> None:
    busy = window(10.0, 800.0, 2, 8, queue=20)
    quieter = window(4.0, 100.0, 4, 1)
    assert judge(scale(busy), quieter).verdict == "unknown"
    down = Change("db", "scale", 100.0, 4, 2, "", busy, slots_per_instance=4)
    assert judge(down, quieter).verdict == "unknown"


def test_more_throughput_with_far_worse_latency_is_not_called_help() -> None:
    # CI saw "scale 1 -> 5 helped: p95 469 -> 7875 ms, throughput 2.31 -> 9.70 req/s"
    before = window(18.0, 469.0, 1, 2, queue=5)
    before["completed_per_s"] = 2.31
    after = window(25.0, 7875.0, 5, 10, queue=400)
    after["completed_per_s"] = 9.7
    f = judge(scale(before, 1, 5), after)
    assert f.verdict == "unknown" and "latency grew" in f.text
    steady = window(25.0, 469.0, 1, 2, queue=5)
    steady["completed_per_s"] = 2.31
    assert judge(scale(steady, 1, 5), after).verdict == "unknown"
