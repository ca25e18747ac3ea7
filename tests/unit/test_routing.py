"""Routing: the compiled RouteTable agrees with the linear scan; resolve() and balancing rules."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.core.errors import Forbidden, NotFound
from sluice.policy.balance import pick_least_outstanding
from sluice.policy.routing import (
    Endpoint,
    RouteRule,
    RouteTable,
    RoutingSnapshot,
    TenantAccess,
    first_match,
)

TENANTS = ["t1", "t2", "t3"]
MODELS = ["m1", "m2", "m3"]

names = st.frozensets(st.sampled_from(TENANTS), max_size=2)  # empty = any tenant
models = st.frozensets(st.sampled_from(MODELS), max_size=2)  # empty = any model
rules = st.lists(
    st.builds(
        RouteRule,
        tag=st.text("abc", max_size=3),
        group=st.sampled_from(["g1", "g2"]),
        tenants=names,
        models=models,
    ),
    max_size=8,
)
# Queries also use names no rule mentions, which only catch-all rules can match.
queries = st.lists(
    st.tuples(st.sampled_from([*TENANTS, "t-other"]), st.sampled_from([*MODELS, "m-other"])),
    min_size=1,
    max_size=10,
)


@given(rules, queries)
def test_compiled_lookup_equals_linear_scan(
    rule_list: list[RouteRule], qs: list[tuple[str, str]]
) -> None:
    table = RouteTable(rule_list)
    for tenant, model in qs:
        assert table.lookup(tenant, model) == first_match(rule_list, tenant, model)


def test_first_rule_wins_over_a_more_specific_later_one() -> None:
    table = RouteTable(
        [
            RouteRule("canary", "g2", models=frozenset({"m1"})),
            RouteRule("t1", "g1", frozenset({"t1"})),
        ]
    )
    route = table.lookup("t1", "m1")
    assert route is not None and (route.tag, route.group, route.index) == ("canary", "g2", 0)


def snapshot(tenant: TenantAccess) -> RoutingSnapshot:
    return RoutingSnapshot(
        version=1,
        routes=RouteTable(
            [
                RouteRule("r-hidden", "g-hidden", models=frozenset({"m2"})),
                RouteRule("r1", "g1", models=frozenset({"m1"})),
            ]
        ),
        tenants_by_key={},
        endpoints={},
        group_models={"g1": frozenset({"m1"}), "g-hidden": frozenset({"m2"})},
        all_models=frozenset({"m1", "m2", "m3"}),
    )


def test_resolve_routes_an_allowed_model() -> None:
    route = snapshot(TenantAccess("t1")).resolve(TenantAccess("t1"), "m1")
    assert (route.tag, route.group) == ("r1", "g1")


def test_resolve_unknown_model_is_404() -> None:
    with pytest.raises(NotFound) as err:
        snapshot(TenantAccess("t1")).resolve(TenantAccess("t1"), "nope")
    assert err.value.http_status == 404


def test_resolve_model_without_a_route_is_404() -> None:
    with pytest.raises(NotFound):
        snapshot(TenantAccess("t1")).resolve(TenantAccess("t1"), "m3")


@pytest.mark.parametrize(
    "tenant",
    [
        TenantAccess("t1", models=frozenset({"m1"})),  # model not allowed
        TenantAccess("t1", groups=frozenset({"g1"})),  # routed to a group it may not use
    ],
)
def test_resolve_forbidden_model_is_403_without_naming_the_group(tenant: TenantAccess) -> None:
    with pytest.raises(Forbidden) as err:
        snapshot(tenant).resolve(tenant, "m2")
    assert err.value.http_status == 403
    assert "g-hidden" not in str(err.value.to_json())


EPS = [Endpoint(f"i{n}", "127.0.0.1", 8000 + n, 4) for n in range(4)]


def pick(load: dict[str, int], rng: random.Random, exclude: str | None = None) -> str:
    endpoint = pick_least_outstanding(EPS, load, rng, exclude)
    assert endpoint is not None
    return endpoint.instance_id


def test_pick_takes_the_least_outstanding() -> None:
    load = {"i0": 3, "i1": 1, "i2": 2}  # i3 absent: also zero
    assert pick(load, random.Random(0)) == "i3"
    load["i3"] = 5
    assert pick(load, random.Random(0)) == "i1"


def test_pick_breaks_ties_with_the_rng() -> None:
    load = {"i0": 0, "i1": 0, "i2": 9, "i3": 9}
    rng = random.Random(42)
    picks = {pick(load, rng) for _ in range(50)}
    assert picks == {"i0", "i1"}
    first = [pick(load, random.Random(5)) for _ in range(3)]
    again = [pick(load, random.Random(5)) for _ in range(3)]
    assert first == again  # deterministic for a given seed


def test_pick_honours_exclude() -> None:
    load = {"i0": 0, "i1": 5, "i2": 5, "i3": 5}
    rng = random.Random(1)
    assert pick(load, rng, exclude="i0") != "i0"
    only = EPS[:1]
    assert pick_least_outstanding(only, {}, rng, exclude="i0") == only[0]  # nothing else
    assert pick_least_outstanding([], {}, rng) is None
