"""A tenant's rate limit held fleet-wide (issue 31): the split of each tenant's rate among
the gateways (sluice.policy.rate_shares), the buckets that keep their tokens when a share
moves (sluice.policy.ratelimit), the controller's table and sync answers
(sluice.control.gateways), the gateway that enforces its share and falls back to limit / n
without a controller (sluice.gateway), and a virtual fleet on a virtual clock that admits
the limit, not the limit times the number of gateways."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import httpx
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from sluice.control.gateways import LOCAL, GatewayFleet, LocalGateway
from sluice.core import ManualClock
from sluice.gateway import Gateway
from sluice.gateway.remote import ControlSync
from sluice.policy.rate_shares import (
    FLOOR_FRACTION,
    HISTORY_S,
    RATE_HOLD_S,
    DemandBook,
    RateShare,
    bucket_burst,
    even_share,
    rate_shares,
    split_rate,
    tenant_limits,
    total_rps,
)
from sluice.policy.ratelimit import TokenBucket
from sluice.policy.routing import RouteTable, RoutingSnapshot, TenantAccess

demands = st.one_of(st.none(), st.floats(0.0, 1e4, allow_nan=False))


def snapshot(version: int = 1, rps: float = 5.0, burst: int = 5) -> RoutingSnapshot:
    tenants = {
        "k1": TenantAccess("search", rate_limit=(rps, burst)),
        "k2": TenantAccess("search", rate_limit=(rps, burst)),  # a second key, same tenant
        "k3": TenantAccess("free"),
    }
    return RoutingSnapshot(
        version=version,
        routes=RouteTable(()),
        tenants_by_key=tenants,
        endpoints={},
        group_models={},
    )


# -- the split ----------------------------------------------------------------------------------


@given(
    limit=st.floats(0.01, 1e5, allow_nan=False),
    demand=st.dictionaries(st.text("abcdefgh", min_size=1, max_size=3), demands, max_size=12),
)
@example(limit=8.0, demand={"a": None, "aa": None, "b": 5e-324})  # subnormal demands: found
@example(limit=0.5, demand={"a": 5e-324})  # by CI, the parts then summed to 8.33 and 0.025
def test_the_parts_add_up_to_the_limit_and_every_gateway_keeps_a_floor(
    limit: float, demand: dict[str, float | None]
) -> None:
    parts = split_rate(limit, demand)
    assert set(parts) == set(demand)
    if not demand:
        return
    assert sum(parts.values()) <= limit * (1 + 1e-9)
    assert sum(parts.values()) >= limit * (1 - 1e-9)  # nothing is left unassigned either
    fair = limit / len(demand)
    for g, d in demand.items():
        if d is None:
            assert parts[g] == pytest.approx(fair)  # no history yet: the fair share
        else:
            assert parts[g] >= FLOOR_FRACTION * fair * (1 - 1e-9)  # never refused for ever


def test_the_rest_follows_the_offered_rate() -> None:
    assert split_rate(6.0, {"a": 10.0, "b": 10.0}) == {"a": 3.0, "b": 3.0}
    parts = split_rate(8.0, {"a": 30.0, "b": 10.0})
    assert parts == {"a": pytest.approx(6.0), "b": pytest.approx(2.0)}
    # no demand anywhere: evenly
    assert split_rate(6.0, {"a": 0.0, "b": 0.0, "c": 0.0}) == {"a": 2.0, "b": 2.0, "c": 2.0}


def test_an_idle_gateway_keeps_a_floor_and_a_bucket_of_one_token() -> None:
    parts = split_rate(5.0, {"busy": 20.0, "idle": 0.0})
    floor = FLOOR_FRACTION * 5.0 / 2
    assert parts["idle"] == pytest.approx(floor)
    assert parts["busy"] == pytest.approx(5.0 - floor)
    assert bucket_burst(parts["idle"], 5.0, 5.0) == 1.0  # its first request passes


def test_a_new_gateway_gets_a_fair_share_until_it_has_history() -> None:
    parts = split_rate(9.0, {"old-a": 1.0, "old-b": 2.0, "new": None})
    assert parts["new"] == pytest.approx(3.0)
    assert parts["old-a"] == pytest.approx(2.0) and parts["old-b"] == pytest.approx(4.0)


def test_bursts_follow_the_share() -> None:
    assert bucket_burst(2.5, 5.0, 10.0) == 5.0
    assert bucket_burst(0.1, 5.0, 5.0) == 1.0
    assert even_share(6.0, 6.0, 3) == RateShare(2.0, 2.0)
    assert even_share(6.0, 6.0, 0) == RateShare(6.0, 6.0)


@given(
    n=st.integers(1, 8),
    counts=st.lists(st.integers(0, 50), min_size=8, max_size=8),
    rps=st.floats(0.1, 100.0),
    burst=st.integers(1, 100),
)
def test_every_tenants_buckets_add_up_to_its_limit_and_burst(
    n: int, counts: list[int], rps: float, burst: int
) -> None:
    book = DemandBook()
    gateways = [f"gw-{i}" for i in range(n)]
    for t in range(4):
        for i, g in enumerate(gateways):
            book.observe(g, "b", {"search": counts[i] * t}, float(t))
    table = rate_shares({"search": (rps, float(burst))}, gateways, book)
    assert total_rps(table.values(), "search") <= rps * (1 + 1e-9)
    bursts = sum(table[g]["search"].burst for g in gateways)
    assert bursts <= burst + n  # each bucket's part of the burst, at least one token


def test_tenant_limits_reads_each_limited_tenant_once() -> None:
    assert tenant_limits(snapshot(rps=5.0, burst=7)) == {"search": (5.0, 7.0)}


# -- demand -------------------------------------------------------------------------------------


def test_demand_is_the_recent_offered_rate_once_there_is_history() -> None:
    book = DemandBook(tau_s=2.0, history_s=HISTORY_S)
    book.observe("gw", "b", {"search": 0}, 0.0)
    assert book.demand("gw", "search") is None
    for t in range(1, 11):
        book.observe("gw", "b", {"search": 10 * t}, float(t))
    assert book.demand("gw", "search") == pytest.approx(10.0)
    assert book.demand("gw", "other") == 0.0  # history, but none of this tenant
    for t in range(11, 21):  # its load stops: the average follows within a few seconds
        book.observe("gw", "b", {"search": 100}, float(t))
    assert book.demand("gw", "search") == pytest.approx(0.0, abs=0.1)


def test_a_restart_counts_as_a_new_gateway_and_a_counter_that_restarts_is_not_negative() -> None:
    book = DemandBook()
    for t in range(5):
        book.observe("gw", "b1", {"search": 5 * t}, float(t))
    assert book.demand("gw", "search") == pytest.approx(5.0)
    book.observe("gw", "b2", {"search": 0}, 5.0)  # another boot
    assert book.demand("gw", "search") is None
    for t in range(6, 10):
        book.observe("gw", "b2", {"search": 5 * (t - 5)}, float(t))
    book.observe("gw", "b2", {"search": 3}, 10.0)  # went down: counts since
    assert book.demand("gw", "search") is not None and book.demand("gw", "search") >= 0.0
    book.forget(["other"])
    assert book.demand("gw", "search") is None


# -- the bucket ---------------------------------------------------------------------------------


def test_a_retuned_bucket_keeps_its_tokens_and_is_not_refilled() -> None:
    bucket = TokenBucket(rate=4.0, burst=4, now=0.0)
    for _ in range(4):
        assert bucket.try_take(0.0) == 0.0
    bucket.retune(2.0, 2.0, 0.25)  # earned 1 token at the old rate, then the new one
    assert bucket.try_take(0.25) == 0.0
    assert bucket.try_take(0.25) == pytest.approx(0.5)
    bucket.retune(1.0, 1.0, 10.0)  # full at 2 tokens, then cut to the new burst
    assert bucket.try_take(10.0) == 0.0 and bucket.try_take(10.0) > 0.0


# -- the controller's table -----------------------------------------------------------------------


def _local(arrived: dict[str, int], told: list[tuple[dict[str, RateShare], int]]) -> LocalGateway:
    return LocalGateway(
        update=lambda snap: None,
        traffic=dict,
        status=lambda: {"version": 1, "groups": {}},
        sample_groups=lambda groups: None,
        samples=lambda i, a, n: ([], a),
        arrivals=lambda: dict(arrived),
        set_rates=lambda shares, count: told.append((dict(shares), count)),
    )


def test_the_controller_splits_a_tenants_rate_among_its_gateways_by_their_demand() -> None:
    clock = ManualClock(100.0)
    arrived: dict[str, int] = {}
    told: list[tuple[dict[str, RateShare], int]] = []
    fleet = GatewayFleet(clock, _local(arrived, told))
    fleet.publish(snapshot())
    fleet.traffic()
    assert told[-1] == ({"search": RateShare(5.0, 5.0)}, 1)  # alone: the whole limit
    # a remote gateway joins: new, it gets a fair share, and so does the local one
    answer = fleet.sync("gw-a", "b", {}, {}, 1, arrivals={"search": 0, "ghost": 9})
    assert answer["rates"] == {"search": {"rps": 2.5, "burst": 2.5}}
    assert told[-1] == ({"search": RateShare(2.5, 2.5)}, 2)
    assert "ghost" not in fleet.demand.gateways["gw-a"].counts  # not a limited tenant
    # gw-a gets three times the local gateway's load
    for t in range(1, 8):
        clock.advance(1.0)
        arrived["search"] = 4 * t
        answer = fleet.sync("gw-a", "b", {}, {}, 1, arrivals={"search": 12 * t})
    mine = answer["rates"]["search"]
    assert mine["rps"] == pytest.approx(3.75, rel=0.02)
    assert told[-1][0]["search"].rps + mine["rps"] == pytest.approx(5.0)
    assert mine["burst"] == pytest.approx(mine["rps"])  # the burst follows the share
    # the limit changes: the table is recomputed at once, without waiting
    fleet.publish(snapshot(version=2, rps=10.0, burst=10))
    assert told[-1][0]["search"].rps == pytest.approx(2.5, rel=0.02)
    # gw-a falls silent: forgotten after the TTL, the local gateway has it all again
    clock.advance(10.0)
    fleet.traffic()
    assert told[-1] == ({"search": RateShare(10.0, 10.0)}, 1)
    assert set(fleet.demand.gateways) == {LOCAL}


def test_sluice_controller_alone_splits_among_its_remote_gateways() -> None:
    clock = ManualClock(0.0)
    fleet = GatewayFleet(clock)
    fleet.publish(snapshot())
    a = fleet.sync("gw-a", "b", {}, {}, 1)
    assert a["rates"]["search"]["rps"] == 5.0
    b = fleet.sync("gw-b", "b", {}, {}, 1)
    a = fleet.sync("gw-a", "b", {}, {}, 1)
    assert a["rates"]["search"]["rps"] + b["rates"]["search"]["rps"] == pytest.approx(5.0)


# -- the gateway --------------------------------------------------------------------------------


def test_a_gateway_enforces_its_share_and_counts_every_arrival() -> None:
    gateway = Gateway(rng=random.Random(0))
    gateway.update(snapshot())
    state = gateway._state
    assert state.buckets["search"].rate == 5.0  # alone until told otherwise
    gateway.set_rate_shares({"search": RateShare(1.0, 1.0)}, 4)
    bucket = state.buckets["search"]
    assert (bucket.rate, bucket.burst) == (1.0, 1.0)
    assert state.rate_wait("search") == 0.0
    wait = state.rate_wait("search")
    assert 0.0 < wait <= 1.0  # at most the wait for a token at the whole limit (>= 1 s)
    assert gateway.tenant_arrivals() == {"search": 2}  # the refused one too
    gateway.set_rate_shares({}, 4)  # no share named: limit / n
    assert (state.buckets["search"].rate, state.buckets["search"].burst) == (1.25, 1.25)
    gateway.update(snapshot(version=2))  # a new snapshot keeps the shares
    assert state.buckets["search"] is bucket and bucket.rate == 1.25


def _answer(rates: dict[str, Any] | None, count: int = 2) -> dict[str, Any]:
    from sluice.policy.snapshot_wire import snapshot_to_json

    doc: dict[str, Any] = {
        "share": {"index": 0, "count": count},
        "version": 1,
        "snapshot": snapshot_to_json(snapshot()),
        "sample_groups": [],
    }
    if rates is not None:
        doc["rates"] = rates
    return doc


def test_a_remote_gateway_takes_its_share_and_without_a_controller_falls_back_to_l_over_n() -> None:
    gateway = Gateway(rng=random.Random(0))
    bodies: list[dict[str, Any]] = []
    answers = [_answer({"search": {"rps": 4.0, "burst": 4.0}}, count=2)]

    def controller(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        if not answers:
            return httpx.Response(503, json={"error": "standby"})
        return httpx.Response(200, json=answers.pop(0))

    sync = ControlSync(gateway, ["http://control"], "tok", "gw-1")

    async def once() -> bool:
        async with httpx.AsyncClient(transport=httpx.MockTransport(controller)) as client:
            return await sync.sync_once(client)

    assert asyncio.run(once())
    bucket = gateway._state.buckets["search"]
    assert (bucket.rate, bucket.burst) == (4.0, 4.0)
    gateway._state.rate_wait("search")
    assert not asyncio.run(once())  # no controller: the last share holds for a while
    assert bodies[-1]["arrivals"] == {"search": 1}
    assert bucket.rate == 4.0
    assert sync.last_ok is not None
    sync.last_ok -= RATE_HOLD_S + 1  # ... and then it is limit / n, never the whole limit
    assert not asyncio.run(once())
    assert (bucket.rate, bucket.burst) == (2.5, 2.5)
    answers.append(_answer(None, count=4))  # a controller that sends no shares: limit / n
    assert asyncio.run(once())
    assert bucket.rate == 1.25
    answers.append(_answer({"search": {"rps": -1, "burst": 0}}, count=2))  # nonsense: L / n
    assert asyncio.run(once())
    assert bucket.rate == 2.5


# -- a virtual fleet ------------------------------------------------------------------------------


def _virtual_fleet(offered: list[float], seconds: float, limit: float = 5.0) -> float:
    """Gateways offered `offered[g]` req/s each (evenly spaced), syncing once a second with
    a controller that splits `limit` by their demand: admitted req/s over the last
    `seconds` (the first 5 s unmeasured)."""
    gateways = [f"gw-{g}" for g in range(len(offered))]
    book = DemandBook()
    buckets = {g: TokenBucket(limit, limit, 0.0) for g in gateways}  # as alone, at start
    arrivals = dict.fromkeys(gateways, 0)
    admitted = 0
    dt = 0.01
    steps = int((seconds + 5.0) / dt)
    due = {g: 0.0 for g in gateways}
    for k in range(steps):
        now = k * dt
        if k % 100 == 0:  # a sync of every gateway, and the shares they get back
            for g in gateways:
                book.observe(g, "b", {"t": arrivals[g]}, now)
            table = rate_shares({"t": (limit, limit)}, gateways, book)
            for g in gateways:
                share = table[g]["t"]
                buckets[g].retune(share.rps, share.burst, now)
        for i, g in enumerate(gateways):
            while offered[i] > 0 and due[g] <= now:
                due[g] += 1.0 / offered[i]
                arrivals[g] += 1
                if buckets[g].try_take(now) == 0.0 and now >= 5.0:
                    admitted += 1
    return admitted / seconds


@pytest.mark.parametrize(
    "offered",
    [[20.0], [10.0, 10.0], [5.0, 5.0, 5.0, 5.0], [16.0, 2.0, 1.0, 1.0], [0.0, 0.0, 20.0]],
    ids=["one", "two-even", "four-even", "four-skewed", "three-one-busy"],
)
def test_a_virtual_fleet_admits_the_limit_not_the_limit_times_its_gateways(
    offered: list[float],
) -> None:
    admitted = _virtual_fleet(offered, 60.0)
    assert admitted == pytest.approx(5.0, rel=0.1), admitted
