"""Many gateways, one fleet: slot shares that add up, counters that never go down, the
routing snapshot's JSON round trip (sluice.policy.gateways, sluice.policy.snapshot_wire),
and the controller's view of its gateways: their answers for the canary analysis and their
requests in flight for a drain (sluice.control.gateways)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.control.gateways import GatewayFleet, LocalGateway
from sluice.control.servers import ProbeFailed
from sluice.core import ManualClock
from sluice.gateway.groups import GroupRuntime
from sluice.gateway.metrics import GroupMetrics
from sluice.policy import build_routing_snapshot
from sluice.policy.autoscale.base import TrafficSample
from sluice.policy.gateways import GatewayBook, Share, merge_status, share_endpoints
from sluice.policy.routing import STANDBY_HOLD_S, Endpoint, GroupTraffic, RoutingSnapshot
from sluice.policy.snapshot_wire import (
    sample_from_json,
    sample_to_json,
    snapshot_from_json,
    snapshot_to_json,
)
from sluice.spec import load_spec_text

EXAMPLES = Path(__file__).parents[2] / "examples"


def sample(arrivals: int, in_flight: int = 0, at: float = 0.0) -> TrafficSample:
    return TrafficSample(
        at=at,
        in_flight=in_flight,
        queued=0,
        arrivals=arrivals,
        completions=arrivals,
        latency_bounds=(0.1, 1.0),
        latency_counts=(arrivals, 0, 0),
    )


@given(
    slots=st.lists(st.integers(1, 64), min_size=1, max_size=6),
    count=st.integers(1, 8),
)
def test_the_shares_of_every_instance_add_up_to_its_slots(slots: list[int], count: int) -> None:
    eps = [Endpoint(f"i-{k}", "127.0.0.1", 9000 + k, c) for k, c in enumerate(slots)]
    shares = [share_endpoints(eps, Share(i, count)) for i in range(count)]
    for k, c in enumerate(slots):
        mine = [s[k].max_concurrency for s in shares]
        assert min(mine) >= 1  # every gateway can admit to every instance
        if c >= count:
            assert sum(mine) == c and max(mine) - min(mine) <= 1
        else:
            assert mine == [1] * count  # fewer slots than gateways: one each


def test_one_gateway_keeps_every_slot() -> None:
    eps = (Endpoint("i-0", "127.0.0.1", 9000, 8),)
    assert share_endpoints(eps, Share()) == eps


def test_the_fleet_adds_gateways_counters_and_a_gone_one_leaves_its_counts() -> None:
    book = GatewayBook(ttl_s=5.0)
    assert book.push("gw-a", "boot-1", {"chat": sample(10, 2)}, now=0.0) == Share(0, 1)
    assert book.push("gw-b", "boot-1", {"chat": sample(5, 1)}, now=0.5) == Share(1, 2)
    book.push("gw-a", "boot-1", {"chat": sample(20, 2)}, now=1.0)
    book.push("gw-b", "boot-1", {"chat": sample(9, 1)}, now=1.0)
    t = book.traffic(now=1.0)["chat"]  # what each counted since first seen: 10 + 4
    assert (t.arrivals, t.in_flight, t.latency_counts) == (14, 3, (14, 0, 0))
    # gw-b goes quiet: after the TTL it is gone, its 4 arrivals stay, its in-flight does not
    book.push("gw-a", "boot-1", {"chat": sample(22, 2)}, now=6.5)
    assert book.live() == ["gw-a"] and book.share_of("gw-a") == Share(0, 1)
    t = book.traffic(now=6.5)["chat"]
    assert (t.arrivals, t.in_flight) == (16, 2)


def test_a_gateway_first_seen_late_brings_no_burst_of_old_counts() -> None:
    # a controller that takes over meets gateways that counted for an hour
    book = GatewayBook()
    book.push("gw-a", "boot-1", {"chat": sample(50_000, 3)}, now=0.0)
    first = book.traffic(now=0.0)["chat"]
    assert (first.arrivals, first.in_flight) == (0, 3)
    book.push("gw-a", "boot-1", {"chat": sample(50_012, 3)}, now=1.0)
    assert book.traffic(now=1.0)["chat"].arrivals == 12


def test_a_restarted_gateway_counting_from_zero_does_not_take_the_totals_down() -> None:
    book = GatewayBook()
    book.push("gw-a", "boot-1", {"chat": sample(100)}, now=0.0)
    book.push("gw-a", "boot-1", {"chat": sample(140)}, now=1.0)
    book.push("gw-a", "boot-2", {"chat": sample(3)}, now=2.0)  # a new process
    assert book.traffic(now=2.0)["chat"].arrivals == 40  # 40 kept; the new one from here
    book.push("gw-a", "boot-2", {"chat": sample(8)}, now=3.0)
    assert book.traffic(now=3.0)["chat"].arrivals == 45


def test_the_data_plane_of_several_gateways_reads_as_one() -> None:
    def part(version: int, in_use: int, promoted: float | None = None) -> dict:
        group = {"slots": 4, "in_use": in_use, "queued": {"normal": 1}, "instances": 2,
                 "standby": 1, "standby_promoted_s": promoted}  # fmt: skip
        return {
            "version": version,
            "groups": {"chat": {**group, "unreachable": [], "ejected": []}},
            "served": {"i-0": 3},
            "routes": {"main": {"chat": 3}},
        }

    merged = merge_status({"local": part(7, 1), "gw-a": part(6, 2, promoted=12.5)})
    chat = merged["groups"]["chat"]
    assert (chat["slots"], chat["in_use"], chat["queued"], chat["instances"]) == (
        8,
        3,
        {"normal": 2},
        2,
    )
    assert (chat["standby"], chat["promoted"]) == (1, ["gw-a"])  # its standby is in there
    assert merged["served"] == {"i-0": 6} and merged["routes"] == {"main": {"chat": 6}}
    assert merged["gateways"] == {"local": 7, "gw-a": 6} and merged["version"] == 7


def test_a_snapshot_survives_its_json_round_trip() -> None:
    for name in ("quickstart.yaml", "traffic.yaml"):
        spec = load_spec_text((EXAMPLES / name).read_text(), name).spec
        ready = {g.name: [Endpoint(f"{g.name}-1", "127.0.0.1", 9000, 4, 1.0)] for g in spec.groups}
        snap = build_routing_snapshot(spec, ready, 3, {spec.groups[0].name: spec.groups[-1].name})
        back = snapshot_from_json(snapshot_to_json(snap))
        assert back.routes.rules == snap.routes.rules
        assert dict(back.tenants_by_key) == dict(snap.tenants_by_key)
        assert dict(back.endpoints) == {g: tuple(e) for g, e in snap.endpoints.items()}
        assert dict(back.traffic) == dict(snap.traffic) and back.limits == snap.limits
        assert dict(back.redirects) == dict(snap.redirects) and back.version == 3
        assert "sk-" not in str(snapshot_to_json(snap))  # keys travel as digests only


def test_a_sample_survives_its_json_round_trip() -> None:
    s = sample(7, 2, at=12.5)
    assert sample_from_json(sample_to_json(s)) == s


def test_a_samples_tokens_travel_and_an_older_gateways_sample_without_them_reads_as_zero() -> None:
    s = dataclasses.replace(sample(7, at=1.0), prompt_tokens=120, completion_tokens=35)
    doc = sample_to_json(s)
    assert (doc["prompt_tokens"], doc["completion_tokens"]) == (120, 35)
    assert sample_from_json(doc) == s
    older = {k: v for k, v in doc.items() if k not in ("prompt_tokens", "completion_tokens")}
    back = sample_from_json(older)  # what a gateway from before tokens in history sends
    assert (back.prompt_tokens, back.completion_tokens) == (0, 0)
    assert back == dataclasses.replace(s, prompt_tokens=0, completion_tokens=0)


def test_the_fleets_tokens_are_every_gateways_added_up() -> None:
    def counted(arrivals: int, prompt: int, completion: int) -> TrafficSample:
        return dataclasses.replace(
            sample(arrivals), prompt_tokens=prompt, completion_tokens=completion
        )

    book = GatewayBook()
    book.push("gw-a", "boot-1", {"chat": counted(10, 1000, 100)}, now=0.0)
    book.push("gw-b", "boot-1", {"chat": counted(5, 500, 50)}, now=0.0)
    book.push("gw-a", "boot-1", {"chat": counted(12, 1040, 110)}, now=1.0)
    book.push("gw-b", "boot-1", {"chat": counted(8, 590, 62)}, now=1.0)
    t = book.traffic(now=1.0)["chat"]  # since first seen: 40 + 90 and 10 + 12
    assert (t.prompt_tokens, t.completion_tokens) == (130, 22)


def test_warm_standby_in_rotation_is_the_most_any_gateway_routes_to_now() -> None:
    # both gateways route to the same instances: their promotions are not added up, and a
    # gauge is what it is now, not since the gateway was first seen (nor kept when it goes)
    def promoted(arrivals: int, in_rotation: int) -> TrafficSample:
        return dataclasses.replace(sample(arrivals), standby_in_rotation=in_rotation)

    book = GatewayBook(ttl_s=5.0)
    book.push("gw-a", "boot-1", {"chat": promoted(10, 3)}, now=0.0)
    book.push("gw-b", "boot-1", {"chat": promoted(5, 3)}, now=0.0)
    assert book.traffic(now=0.0)["chat"].standby_in_rotation == 3
    book.push("gw-b", "boot-1", {"chat": promoted(9, 0)}, now=1.0)
    assert book.traffic(now=1.0)["chat"].standby_in_rotation == 3
    book.push("gw-b", "boot-1", {"chat": promoted(12, 0)}, now=6.5)  # gw-a gone
    assert book.traffic(now=6.5)["chat"].standby_in_rotation == 0


def test_sleeping_standby_woken_is_any_gateways_and_only_while_it_says_so() -> None:
    def woke(arrivals: int, *ids: str) -> TrafficSample:
        return dataclasses.replace(sample(arrivals), woken=ids)

    book = GatewayBook(ttl_s=5.0)
    book.push("gw-a", "boot-1", {"chat": woke(10, "i2")}, now=0.0)
    book.push("gw-b", "boot-1", {"chat": woke(5, "i3", "i2")}, now=0.0)
    assert book.traffic(now=0.0)["chat"].woken == ("i2", "i3")
    book.push("gw-a", "boot-1", {"chat": woke(11)}, now=1.0)
    book.push("gw-b", "boot-1", {"chat": woke(6, "i3")}, now=1.0)
    assert book.traffic(now=1.0)["chat"].woken == ("i3",)
    book.push("gw-a", "boot-1", {"chat": woke(12)}, now=6.5)  # gw-b gone
    assert book.traffic(now=6.5)["chat"].woken == ()


def test_a_woken_sleeper_is_warm_standby_in_rotation_until_its_hold_ends() -> None:
    rt = GroupRuntime("chat", GroupMetrics())
    serving, asleep = Endpoint("a", "h", 1, 1), Endpoint("s", "h", 2, 1)
    rt.configure(GroupTraffic(), (serving,), now=0.0, sleeping=(asleep,))
    assert rt.sleeping == (asleep,) and rt.standby == () and rt.endpoints == (serving,)
    rt.awake("s", now=1.0)
    assert rt.sleeping == () and rt.standby == (asleep,) and rt.endpoints == (serving, asleep)
    assert rt.traffic_sample(at=1.0).woken == ("s",)
    # the controller has not heard yet: its next snapshot still lists it as sleeping
    rt.configure(GroupTraffic(), (serving,), now=2.0, sleeping=(asleep,))
    assert rt.endpoints == (serving, asleep) and rt.traffic_sample(at=2.0).woken == ("s",)
    assert not rt.demote(now=1.0 + STANDBY_HOLD_S + 1)  # the hold is over, nothing waits
    assert rt.endpoints == (serving,) and rt.traffic_sample(at=40.0).woken == ()


def test_a_sleeper_woken_then_taken_into_the_count_is_not_routed_once_asleep_again() -> None:
    """The count takes the woken sleeper in (the promotion ends: no standby left); later
    the controller puts it to sleep again: the next promotion must not route to it."""
    rt = GroupRuntime("chat", GroupMetrics())
    serving, s = Endpoint("a", "h", 1, 1), Endpoint("s", "h", 2, 1)
    rt.configure(GroupTraffic(), (serving,), now=0.0, sleeping=(s,))
    rt.awake("s", now=1.0)
    rt.configure(GroupTraffic(), (serving, s), now=2.0)  # in the count now
    assert rt.endpoints == (serving, s) and not rt.promoted_until
    rt.configure(GroupTraffic(), (serving,), now=100.0, sleeping=(s,))  # asleep again
    rt.promote(now=101.0)
    assert rt.endpoints == (serving,) and rt.sleeping == (s,)


def test_a_groups_sample_adds_up_its_tenants_tokens() -> None:
    rt = GroupRuntime("chat", GroupMetrics())
    assert (rt.traffic_sample(0.0).prompt_tokens, rt.traffic_sample(0.0).completion_tokens) == (
        0,
        0,
    )
    rt.metrics.count_tokens("search", 100, 20)
    rt.metrics.count_tokens("billing", 7, 3)
    rt.metrics.count_tokens("search", 10, 2)
    s = rt.traffic_sample(1.0)
    assert (s.prompt_tokens, s.completion_tokens) == (117, 25)


def _fleet_with_local() -> tuple[GatewayFleet, dict[str, list[dict[str, Any]]]]:
    """A fleet whose in-process gateway recorded two answers of `i-1`."""
    local_rows = {
        "i-1": [
            {
                "seq": 1,
                "at": 1.0,
                "status": 200,
                "latency_s": 0.1,
                "ttft_s": None,
                "output_bytes": 9,
            },
            {
                "seq": 2,
                "at": 2.0,
                "status": 500,
                "latency_s": 0.2,
                "ttft_s": None,
                "output_bytes": 0,
            },
        ]
    }
    watched: dict[str, list[dict[str, Any]]] = {"groups": []}

    def samples(instance: str, after: int, limit: int) -> tuple[list[dict[str, Any]], int]:
        rows = [r for r in local_rows.get(instance, []) if r["seq"] > after][:limit]
        return rows, rows[-1]["seq"] if rows else after

    local = LocalGateway(
        update=lambda snap: None,
        traffic=dict,
        status=lambda: {"version": 3, "groups": {}, "in_flight": {"i-1": 1}},
        sample_groups=lambda groups: watched.__setitem__("groups", list(groups)),
        samples=samples,
    )
    return GatewayFleet(ManualClock(100.0), local), watched


def quickstart_snapshot(version: int, *instances: str) -> RoutingSnapshot:
    """The quickstart's routing with `instances` ready in `chat`."""
    spec = load_spec_text((EXAMPLES / "quickstart.yaml").read_text(), "quickstart.yaml").spec
    ready = {"chat": [Endpoint(i, "127.0.0.1", 9000 + k, 4) for k, i in enumerate(instances)]}
    return build_routing_snapshot(spec, ready, version)


def test_the_canary_reads_every_gateways_answers_through_one_cursor() -> None:
    fleet, watched = _fleet_with_local()
    fleet.publish(quickstart_snapshot(3, "i-1"))
    fleet.sample_groups(["chat"])
    assert watched["groups"] == ["chat"]  # the local gateway records at once
    remote = {"at": 3.0, "status": 200, "latency_s": 0.3, "ttft_s": 0.05, "output_bytes": 7}
    answer = fleet.sync("gw-a", "boot", {}, {}, None, None, {"i-1": [remote]})
    assert answer["sample_groups"] == ["chat"]  # the remote gateway learns it at its sync
    rows, cursor = fleet.samples("i-1", 0, 100)
    assert sorted(r["latency_s"] for r in rows) == [0.1, 0.2, 0.3]
    assert fleet.samples("i-1", cursor, 100) == ([], cursor)  # each answer read once
    fleet.sync("gw-a", "boot", {}, {}, None, None, {"i-1": [remote]})
    more, after = fleet.samples("i-1", cursor, 100)
    assert len(more) == 1 and after > cursor
    fleet.sample_groups([])  # no canary: nothing is kept
    fleet.sync("gw-a", "boot", {}, {}, None, None, {"i-1": [remote]})
    assert fleet.samples("i-1", after, 100) == ([], after)


def test_in_flight_is_unknown_while_a_gateway_may_still_route_to_a_drained_instance() -> None:
    fleet, _ = _fleet_with_local()
    snap = build_routing_snapshot(
        load_spec_text((EXAMPLES / "quickstart.yaml").read_text(), "quickstart.yaml").spec, {}, 4
    )
    fleet.publish(snap)
    # gw-a's last status is of snapshot v3: it may still send to the instance being drained
    fleet.sync("gw-a", "boot", {}, {"version": 3, "in_flight": {"i-1": 2}}, 3)
    with pytest.raises(ProbeFailed, match="gw-a"):
        fleet.in_flight()
    fleet.sync("gw-a", "boot", {}, {"version": 4, "in_flight": {"i-1": 2}}, 4)
    assert fleet.in_flight() == {"i-1": 3}  # the local gateway's one and gw-a's two
