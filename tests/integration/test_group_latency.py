"""A group's runtime as the gateway drives it, without sockets: answered requests feed latency
ejection (shared cap, reason in the status, late answers of an ejected instance ignored) and
slow start that listens to latency."""

from __future__ import annotations

import time

from sluice.gateway.groups import GroupRuntime
from sluice.gateway.metrics import GroupMetrics
from sluice.policy.balance import slow_start_weight
from sluice.policy.routing import Endpoint, GroupTraffic


def group(*endpoints: Endpoint, **traffic: object) -> GroupRuntime:
    g = GroupRuntime("g1", GroupMetrics())
    g.configure(GroupTraffic(**traffic), endpoints, time.monotonic())  # type: ignore[arg-type]
    return g


def settled(n: int) -> list[Endpoint]:
    return [Endpoint(f"i{k}", "127.0.0.1", 9000 + k, 8) for k in range(n)]


def test_answers_eject_a_slow_instance_and_the_status_says_why() -> None:
    g = group(*settled(3), slow_start_s=0.0)
    for _ in range(30):
        for iid in ("i0", "i1"):
            assert g.answered(iid, 200, 0.05) == []
    for _ in range(19):
        assert g.answered("i2", 200, 0.5) == []
        assert g.answered("i2", 503, 5.0) == []  # a 5xx is a failure, not a latency
    assert g.answered("i2", 200, 0.5) == []  # the slots shrank: nobody was waiting
    [ejected] = g.status(time.monotonic())["ejected"]
    assert ejected["instance"] == "i2" and ejected["times"] == 1
    assert ejected["reason"] == (
        "latency 500 ms vs peers 50 ms (10.0x) over its last ~20 requests (20 seen)"
    )
    assert [ep.instance_id for ep in g.candidates] == ["i0", "i1"]
    for _ in range(40):  # requests it held when ejected end late: they do not count
        g.answered("i2", 200, 5.0)
    assert g.latency is not None and g.latency.estimate("i2") is None


def test_latency_ejection_respects_the_cap_and_can_be_turned_off() -> None:
    g = group(*settled(2), slow_start_s=0.0, outlier_max_ejected_percent=0)
    off = group(*settled(2), slow_start_s=0.0, outlier_latency_ratio=0.0)
    for gr in (g, off):
        for _ in range(60):
            gr.answered("i0", 200, 0.05)
            gr.answered("i1", 200, 0.5)
        assert gr.status(time.monotonic())["ejected"] == []
    assert off.latency is None


def test_a_lagging_new_instance_stops_gaining_share_while_ramping() -> None:
    new = Endpoint("new", "127.0.0.1", 9100, 8, ready_at=time.time() - 30.0)  # half-way
    g = group(*settled(2), new, slow_start_s=60.0)
    assert g.ramping
    for _ in range(40):
        g.answered("i0", 200, 0.05)
        g.answered("i1", 200, 0.05)
    for _ in range(6):  # 2x its peers: in line it is not, bad enough to eject neither
        g.answered("new", 200, 0.1)
    held = g.ramp.held.get("new", 0.0)
    before = slow_start_weight(new, time.time(), 60.0, held)
    time.sleep(0.3)
    g.answered("new", 200, 0.1)
    assert g.ramp.held["new"] >= held + 0.3  # those 0.3 s did not count as ramp
    assert slow_start_weight(new, time.time(), 60.0, g.ramp.held["new"]) < before + 0.001
    assert g.status(time.monotonic())["ejected"] == []
    settled_group = group(*settled(2), new, slow_start_s=60.0)
    for _ in range(40):
        settled_group.answered("i0", 200, 0.05)
        settled_group.answered("i1", 200, 0.05)
    for _ in range(8):  # in line: the ramp goes on
        settled_group.answered("new", 200, 0.05)
    assert "new" not in settled_group.ramp.held
