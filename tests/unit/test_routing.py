"""Routing: the compiled RouteTable agrees with the linear scan; resolve(), weighted splits,
failover redirects and fallbacks."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.core.errors import Forbidden, NotFound
from sluice.policy.routing import (
    DIRECT_ROUTE_TAG,
    CanarySplit,
    RequestMeta,
    RouteRule,
    RouteTable,
    RoutingSnapshot,
    TenantAccess,
    first_match,
)

TENANTS = ["t1", "t2", "t3"]
MODELS = ["m1", "m2", "m3"]
PRIOS = ["high", "normal", "low"]

rules = st.lists(
    st.builds(
        RouteRule,
        tag=st.text("abc", max_size=3),
        targets=st.sampled_from([(("g1", 1),), (("g2", 1),), (("g1", 9), ("g2", 1))]),
        tenants=st.frozensets(st.sampled_from(TENANTS), max_size=2),  # empty = any
        models=st.frozensets(st.sampled_from(MODELS), max_size=2),
        priorities=st.frozensets(st.sampled_from(PRIOS), max_size=2),
        headers=st.lists(
            st.tuples(st.sampled_from(["x-a", "x-b"]), st.sampled_from(["1", "2"])), max_size=1
        ).map(tuple),
        header_prefixes=st.lists(
            st.tuples(st.just("x-s"), st.sampled_from(["be", "beta"])), max_size=1
        ).map(tuple),
    ),
    max_size=10,
)
# Queries also use names no rule mentions, which only catch-all rules can match.
metas = st.builds(
    RequestMeta,
    tenant=st.sampled_from([*TENANTS, "t-other"]),
    model=st.sampled_from([*MODELS, "m-other"]),
    priority=st.sampled_from(PRIOS),
    headers=st.dictionaries(
        st.sampled_from(["x-a", "x-b", "x-s"]), st.sampled_from(["1", "2", "beta-7", "b"])
    ),
)


@given(rules, st.lists(metas, min_size=1, max_size=10))
def test_compiled_lookup_equals_linear_scan(
    rule_list: list[RouteRule], qs: list[RequestMeta]
) -> None:
    table = RouteTable(rule_list)
    for meta in qs:
        assert table.lookup(meta) == first_match(rule_list, meta)


def test_first_rule_wins_over_a_more_specific_later_one() -> None:
    table = RouteTable(
        [
            RouteRule("canary", (("g2", 1),), models=frozenset({"m1"})),
            RouteRule("t1", (("g1", 1),), frozenset({"t1"})),
        ]
    )
    route = table.lookup(RequestMeta("t1", "m1"))
    assert route is not None and (route.tag, route.group, route.index) == ("canary", "g2", 0)


def test_conditions_on_priority_and_headers() -> None:
    table = RouteTable(
        [
            RouteRule("beta", (("g2", 1),), header_prefixes=(("x-user", "beta-"),)),
            RouteRule("vip", (("g3", 1),), priorities=frozenset({"high"})),
            RouteRule("rest", (("g1", 1),)),
        ]
    )
    assert table.uses_headers and table.uses_priority

    def tag(meta: RequestMeta) -> str:
        route = table.lookup(meta)
        assert route is not None
        return route.tag

    assert tag(RequestMeta("t", "m", headers={"x-user": "beta-42"})) == "beta"
    assert tag(RequestMeta("t", "m", "high", headers={"x-user": "gamma"})) == "vip"
    assert tag(RequestMeta("t", "m", "low")) == "rest"


def test_weighted_split_follows_the_weights() -> None:
    route = RouteTable([RouteRule("split", (("a", 90), ("b", 10)))]).lookup(RequestMeta("t", "m"))
    assert route is not None
    rng = random.Random(7)
    picks = [route.pick_group(rng) for _ in range(20_000)]
    assert abs(picks.count("b") / len(picks) - 0.10) < 0.01


def snapshot(redirects: dict[str, str] | None = None) -> RoutingSnapshot:
    return RoutingSnapshot(
        version=1,
        routes=RouteTable(
            [
                RouteRule("r-hidden", (("g-hidden", 1),), models=frozenset({"m2"})),
                RouteRule("r1", (("g1", 1),), models=frozenset({"m1"}), fallback=("g1", "g2")),
            ]
        ),
        tenants_by_key={},
        endpoints={},
        group_models={
            "g1": frozenset({"m1"}),
            "g2": frozenset({"m1"}),
            "g-hidden": frozenset({"m2"}),
        },
        all_models=frozenset({"m1", "m2", "m3"}),
        redirects=redirects or {},
    )


def test_resolve_routes_an_allowed_model() -> None:
    route = snapshot().resolve(TenantAccess("t1"), RequestMeta("t1", "m1"))
    assert (route.tag, route.group) == ("r1", "g1")


def test_resolve_unknown_model_is_404() -> None:
    with pytest.raises(NotFound) as err:
        snapshot().resolve(TenantAccess("t1"), RequestMeta("t1", "nope"))
    assert err.value.http_status == 404


def test_resolve_model_without_a_route_is_404() -> None:
    with pytest.raises(NotFound):
        snapshot().resolve(TenantAccess("t1"), RequestMeta("t1", "m3"))


@pytest.mark.parametrize(
    "tenant",
    [
        TenantAccess("t1", models=frozenset({"m1"})),  # model not allowed
        TenantAccess("t1", groups=frozenset({"g1"})),  # routed to a group it may not use
    ],
)
def test_resolve_forbidden_model_is_403_without_naming_the_group(tenant: TenantAccess) -> None:
    with pytest.raises(Forbidden) as err:
        snapshot().resolve(tenant, RequestMeta("t1", "m2"))
    assert err.value.http_status == 403
    assert "g-hidden" not in str(err.value.to_json())


def test_failover_redirect_and_fallbacks_never_loop() -> None:
    snap = snapshot({"g1": "g2"})
    assert snap.serving_group("g1") == ("g2", "failover g1->g2")
    assert snap.serving_group("g2") == ("g2", None)
    route = snap.resolve(TenantAccess("t1"), RequestMeta("t1", "m1"))
    assert snap.fallbacks(route, TenantAccess("t1"), "m1") == ["g2"]  # never its own target
    assert snap.fallbacks(route, TenantAccess("t1", groups=frozenset({"g1"})), "m1") == []


def test_priority_header_only_when_the_tenant_may_set_it() -> None:
    assert TenantAccess("t", "normal").priority_for("high") == "normal"
    assert TenantAccess("t", "normal", priority_header=True).priority_for("high") == "high"
    assert TenantAccess("t", "low", priority_header=True).priority_for("bogus") == "low"


def test_operator_may_address_a_group_directly_others_may_not() -> None:
    route = snapshot().direct(TenantAccess("ops", operator=True), "g2", "m1")
    assert (route.tag, route.group) == (DIRECT_ROUTE_TAG, "g2")
    with pytest.raises(Forbidden):
        snapshot().direct(TenantAccess("t1"), "g2", "m1")
    with pytest.raises(NotFound):
        snapshot().direct(TenantAccess("ops", operator=True), "g2", "m2")


def test_canary_split_paces_tenants() -> None:
    split = CanarySplit(
        "base",
        "canary",
        percent=10.0,
        early_percent=50.0,
        late_percent=0.0,
        early_tenants=frozenset({"early"}),
        late_tenants=frozenset({"late"}),
    )
    rng = random.Random(3)
    share = {
        t: sum(split.pick(t, rng) == "canary" for _ in range(10_000)) / 10_000
        for t in ("early", "normal", "late")
    }
    assert abs(share["early"] - 0.5) < 0.02
    assert abs(share["normal"] - 0.1) < 0.02
    assert share["late"] == 0.0
