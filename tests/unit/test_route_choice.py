"""The route choice (`sluice.policy.route_choice`): rule, weighted target, canary split,
failover, fallbacks in order, priority and mirror, as a pure function of snapshot, request
and rng; and the same answers as the gateway's inline decision it replaced."""

from __future__ import annotations

import random
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.core.errors import Forbidden, NotFound, SluiceError
from sluice.policy.route_choice import RouteChoice, RouteRequest, choose, plan
from sluice.policy.routing import (
    DIRECT_ROUTE_TAG,
    CanarySplit,
    RequestMeta,
    RouteRule,
    RouteTable,
    RoutingSnapshot,
    TenantAccess,
)

GROUPS = ["g1", "g2", "g3", "g4"]
MODELS = ["m1", "m2"]
TENANTS = ["t1", "t2"]


def snap(
    rules: list[RouteRule],
    *,
    group_models: Mapping[str, frozenset[str]] | None = None,
    redirects: Mapping[str, str] | None = None,
    canaries: Mapping[str, CanarySplit] | None = None,
) -> RoutingSnapshot:
    gm = group_models or {g: frozenset(MODELS) for g in GROUPS}
    return RoutingSnapshot(
        version=1,
        routes=RouteTable(rules),
        tenants_by_key={},
        endpoints={},
        group_models=gm,
        all_models=frozenset(m for ms in gm.values() for m in ms),
        redirects=redirects or {},
        canaries=canaries or {},
    )


T1 = TenantAccess("t1")


class Fixed(random.Random):
    """Every draw is `u`: makes two deciders comparable whatever draws each one skips."""

    def __init__(self, u: float) -> None:
        super().__init__(0)
        self.u = u

    def random(self) -> float:
        return self.u


# -- examples --------------------------------------------------------------------------------


def test_a_plain_route_draws_nothing_and_is_one_value() -> None:
    s = snap([RouteRule("r1", (("g1", 1),), fallback=("g2", "g3"))])
    p = plan(s, RouteRequest(T1, "m1"))
    rng = random.Random(1)
    state = rng.getstate()
    first = p.draw(rng)
    assert first == RouteChoice("r1", "g1", "normal", None, ("g2", "g3"), None)
    assert p.draw(rng) is first and rng.getstate() == state  # no draw, no allocation


def test_weighted_targets_split_by_weight() -> None:
    s = snap([RouteRule("r1", (("g1", 9), ("g2", 1)))])
    rng = random.Random(7)
    got = [choose(s, RouteRequest(T1, "m1"), rng).group for _ in range(5000)]
    assert 0.87 < got.count("g1") / len(got) < 0.93


def test_canary_split_by_tenant_share_and_permission() -> None:
    split = CanarySplit("g1", "g2", 0.0, early_percent=100.0, early_tenants=frozenset({"t1"}))
    s = snap([RouteRule("r1", (("g1", 1),))], canaries={"g1": split})
    assert choose(s, RouteRequest(T1, "m1"), random.Random(1)).group == "g2"  # early: all
    t2 = TenantAccess("t2")
    assert choose(s, RouteRequest(t2, "m1"), random.Random(1)).group == "g1"  # others: 0 %
    barred = TenantAccess("t1", groups=frozenset({"g1"}))  # may not use the canary
    assert choose(s, RouteRequest(barred, "m1"), random.Random(1)).group == "g1"


def test_failover_redirect_and_fallbacks_in_declared_order() -> None:
    rules = [RouteRule("r1", (("g1", 1),), fallback=("g4", "g2", "g3", "g1"))]
    s = snap(rules, redirects={"g1": "g2", "g3": "g4"})
    c = choose(s, RouteRequest(T1, "m1"), random.Random(1))
    assert (c.group, c.via) == ("g2", "failover g1->g2")
    # g1 is the route's own target, g2 serves it now, g3 is failed over itself
    assert c.fallbacks == ("g4",)


def test_fallbacks_the_tenant_may_not_use_or_that_lack_the_model_are_left_out() -> None:
    gm = {"g1": frozenset({"m1"}), "g2": frozenset({"m2"}), "g3": frozenset({"m1"})}
    s = snap([RouteRule("r1", (("g1", 1),), fallback=("g2", "g3", "g4"))], group_models=gm)
    t = TenantAccess("t1", groups=frozenset({"g1", "g2", "g4"}))
    assert choose(s, RouteRequest(t, "m1"), random.Random(1)).fallbacks == ()
    assert choose(s, RouteRequest(T1, "m1"), random.Random(1)).fallbacks == ("g3",)


def test_priority_header_only_for_tenants_that_may_set_it() -> None:
    s = snap([RouteRule("hi", (("g2", 1),), priorities=frozenset({"high"})), *default()])
    may = TenantAccess("t1", priority="low", priority_header=True)
    c = choose(s, RouteRequest(may, "m1", "high"), random.Random(1))
    assert (c.tag, c.priority) == ("hi", "high")
    assert choose(s, RouteRequest(may, "m1", "bogus"), random.Random(1)).priority == "low"
    may_not = TenantAccess("t1", priority="low")
    c = choose(s, RouteRequest(may_not, "m1", "high"), random.Random(1))
    assert (c.tag, c.priority) == ("d", "low")


def test_header_rules_see_the_headers() -> None:
    s = snap([RouteRule("beta", (("g3", 1),), headers=(("x-user", "b"),)), *default()])
    assert choose(s, RouteRequest(T1, "m1", headers={"x-user": "b"}), random.Random(1)).tag == (
        "beta"
    )
    assert choose(s, RouteRequest(T1, "m1"), random.Random(1)).tag == "d"


def test_operator_named_group_bypasses_rules_and_canaries_but_not_failover() -> None:
    split = CanarySplit("g3", "g4", 100.0)
    s = snap(default(), redirects={"g3": "g2"}, canaries={"g3": split})
    op = TenantAccess("ops", operator=True)
    c = choose(s, RouteRequest(op, "m1", group="g3"), random.Random(1))
    assert (c.tag, c.group, c.via, c.fallbacks) == (
        DIRECT_ROUTE_TAG,
        "g2",
        "failover g3->g2",
        (),
    )
    # another tenant's x-sluice-group is ignored: the rules route it
    assert choose(s, RouteRequest(T1, "m1", group="g3"), random.Random(1)).tag == "d"


def test_mirror_sample() -> None:
    s = snap([RouteRule("r1", (("g1", 1),), mirror=("g4", 30.0))])
    rng = random.Random(3)
    got = [choose(s, RouteRequest(T1, "m1"), rng).mirror for _ in range(4000)]
    assert set(got) == {None, "g4"} and 0.26 < got.count("g4") / len(got) < 0.34
    always = snap([RouteRule("r1", (("g1", 1),), mirror=("g4", 100.0))])
    assert plan(always, RouteRequest(T1, "m1")).fixed is not None
    assert choose(always, RouteRequest(T1, "m1"), random.Random(1)).mirror == "g4"


def test_refusals_are_the_snapshots() -> None:
    s = snap([RouteRule("r1", (("g1", 1),), models=frozenset({"m1"}))])
    with pytest.raises(NotFound):
        choose(s, RouteRequest(T1, "nope"), random.Random(1))
    with pytest.raises(NotFound):  # a model no rule routes
        choose(s, RouteRequest(T1, "m2"), random.Random(1))
    with pytest.raises(Forbidden):
        choose(s, RouteRequest(TenantAccess("t1", models=frozenset()), "m1"), random.Random(1))
    with pytest.raises(NotFound):
        choose(
            s, RouteRequest(TenantAccess("o", operator=True), "m1", group="gx"), random.Random(1)
        )


def default() -> list[RouteRule]:
    return [RouteRule("d", (("g1", 1),))]


# -- properties ------------------------------------------------------------------------------

group = st.sampled_from(GROUPS)
rule_lists = st.lists(
    st.builds(
        RouteRule,
        tag=st.sampled_from(["a", "b", "c"]),
        targets=st.lists(st.tuples(group, st.integers(1, 9)), min_size=1, max_size=3).map(tuple),
        tenants=st.frozensets(st.sampled_from(TENANTS), max_size=1),
        models=st.frozensets(st.sampled_from(MODELS), max_size=1),
        priorities=st.frozensets(st.sampled_from(["high", "normal", "low"]), max_size=1),
        headers=st.lists(st.tuples(st.just("x-a"), st.sampled_from(["1", "2"])), max_size=1).map(
            tuple
        ),
        fallback=st.lists(group, max_size=4, unique=True).map(tuple),
        mirror=st.none() | st.tuples(group, st.sampled_from([0.0, 25.0, 50.0, 100.0])),
    ),
    min_size=1,
    max_size=5,
)
snapshots = st.builds(
    snap,
    rule_lists,
    group_models=st.dictionaries(
        group, st.frozensets(st.sampled_from(MODELS), min_size=1), min_size=1
    ),
    redirects=st.dictionaries(group, group, max_size=2),
    canaries=st.lists(
        st.builds(
            CanarySplit,
            baseline=group,
            canary=group,
            percent=st.sampled_from([0.0, 10.0, 100.0]),
            early_percent=st.sampled_from([0.0, 50.0, 100.0]),
            early_tenants=st.frozensets(st.sampled_from(TENANTS), max_size=1),
        ),
        max_size=2,
    ).map(lambda splits: {split.baseline: split for split in splits}),  # as the controller keys
)
requests = st.builds(
    RouteRequest,
    tenant=st.builds(
        TenantAccess,
        name=st.sampled_from(TENANTS),
        priority=st.sampled_from(["high", "normal", "low"]),
        groups=st.none() | st.frozensets(group, min_size=2),
        priority_header=st.booleans(),
        operator=st.booleans(),
    ),
    model=st.sampled_from([*MODELS, "m-none"]),
    priority=st.none() | st.sampled_from(["high", "low", "junk"]),
    headers=st.dictionaries(st.just("x-a"), st.sampled_from(["1", "2"])),
    group=st.none() | group,
)


def outcome(s: RoutingSnapshot, r: RouteRequest, rng: random.Random) -> RouteChoice | str:
    try:
        return choose(s, r, rng)
    except SluiceError as err:
        return type(err).__name__


@settings(max_examples=300)
@given(snapshots, requests, st.integers(0, 2**32))
def test_same_inputs_and_seed_give_the_same_choices(
    s: RoutingSnapshot, r: RouteRequest, seed: int
) -> None:
    a, b = random.Random(seed), random.Random(seed)
    assert [outcome(s, r, a) for _ in range(5)] == [outcome(s, r, b) for _ in range(5)]


def snapshot_groups(s: RoutingSnapshot) -> set[str]:
    return {*s.group_models, *s.redirects.values()} | {c.canary for c in s.canaries.values()}


@settings(max_examples=300)
@given(snapshots, requests, st.integers(0, 2**32))
def test_a_choice_names_only_groups_of_the_snapshot(
    s: RoutingSnapshot, r: RouteRequest, seed: int
) -> None:
    rng = random.Random(seed)
    for _ in range(5):
        c = outcome(s, r, rng)
        if isinstance(c, str):
            continue
        assert c.group in snapshot_groups(s)
        assert set(c.fallbacks) <= set(s.group_models)  # they serve the model
        assert c.mirror is None or any(
            rule.mirror is not None and rule.mirror[0] == c.mirror for rule in s.routes.rules
        )


@settings(max_examples=300)
@given(snapshots, requests, st.integers(0, 2**32))
def test_fallbacks_keep_their_declared_order(
    s: RoutingSnapshot, r: RouteRequest, seed: int
) -> None:
    c = outcome(s, r, random.Random(seed))
    if isinstance(c, str) or c.tag == DIRECT_ROUTE_TAG:
        return
    route = s.routes.lookup(RequestMeta(r.tenant.name, r.model, c.priority, r.headers))
    assert route is not None and route.tag == c.tag
    declared = [g for g in route.fallback if g in c.fallbacks]
    assert list(c.fallbacks) == declared and len(set(c.fallbacks)) == len(c.fallbacks)
    assert c.group not in c.fallbacks
    assert not set(c.fallbacks) & set(s.redirects)


def reference(s: RoutingSnapshot, r: RouteRequest, rng: random.Random) -> RouteChoice:
    """The decision as `Exchange._proxy` and `_admit_slow` made it inline (before issue 34)."""
    tenant = r.tenant
    if tenant.priority_header and r.priority is not None:
        priority = tenant.priority_for(r.priority)
    else:
        priority = tenant.priority
    direct = r.group if tenant.operator else None
    if direct is None:
        route = s.resolve(tenant, RequestMeta(tenant.name, r.model, priority, r.headers))
    else:
        route = s.direct(tenant, direct, r.model)
    targets = route.targets
    group = targets[0][0] if len(targets) == 1 else route.pick_group(rng)
    if s.canaries and direct is None:
        split = s.canaries.get(group)
        if split is not None:
            picked = split.pick(tenant.name, rng)
            if tenant.may_use_group(picked):
                group = picked
    via = None
    if s.redirects:
        group, via = s.serving_group(group)
    fallbacks = tuple(
        n for n in s.fallbacks(route, tenant, r.model) if not (n == group or n in s.redirects)
    )
    mirror = None
    if route.mirror is not None and not rng.random() * 100.0 >= route.mirror[1]:
        mirror = route.mirror[0]
    return RouteChoice(route.tag, group, priority, via, fallbacks, mirror)


@settings(max_examples=500)
@given(snapshots, requests, st.floats(0.0, 1.0, exclude_max=True))
def test_choices_equal_the_gateways_former_inline_decision(
    s: RoutingSnapshot, r: RouteRequest, u: float
) -> None:
    try:
        expected: RouteChoice | str = reference(s, r, Fixed(u))
    except SluiceError as err:
        expected = type(err).__name__
    assert outcome(s, r, Fixed(u)) == expected
