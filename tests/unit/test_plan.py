"""The planner: scaling, rolling updates and replacement, stepped with a simulated world."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.core import InstanceState, InstanceStatus
from sluice.policy import Drain, GroupTarget, Launch, Remove, plan_group

READY = InstanceState.READY


def inst(i: int, state: InstanceState = READY, template: str = "t1") -> InstanceStatus:
    return InstanceStatus(
        id=f"g-{i}", group="g", template=template, state=state, created_at=float(i)
    )


def kinds(actions: list) -> list[str]:
    return sorted(type(a).__name__ for a in actions)


def test_scale_up_launches_the_shortfall() -> None:
    actions = plan_group(GroupTarget("g", "t1", 3), [inst(1)])
    assert kinds(actions) == ["Launch", "Launch"]


def test_scale_down_stops_unready_first_then_drains_newest_ready() -> None:
    observed = [inst(1), inst(2), inst(3), inst(4, InstanceState.STARTING)]
    actions = plan_group(GroupTarget("g", "t1", 1), observed)
    assert [(type(a).__name__, a.instance_id) for a in actions] == [
        ("Remove", "g-4"),
        ("Drain", "g-3"),
        ("Drain", "g-2"),
    ]


def test_failed_instance_is_removed_and_replaced() -> None:
    actions = plan_group(GroupTarget("g", "t1", 2), [inst(1), inst(2, InstanceState.FAILED)])
    assert kinds(actions) == ["Launch", "Remove"]


def test_rolling_update_keeps_ready_count_and_respects_surge() -> None:
    old = [inst(1, template="old"), inst(2, template="old")]
    first = plan_group(GroupTarget("g", "new", 2, max_surge=1), old)
    assert kinds(first) == ["Launch"]  # surge 1: no old instance drains yet
    half = [*old, inst(3, template="new")]
    second = plan_group(GroupTarget("g", "new", 2, max_surge=1), half)
    assert [(type(a).__name__, getattr(a, "instance_id", None)) for a in second] == [
        ("Drain", "g-1")
    ]  # the oldest old one goes once the new one is ready


def test_rolling_update_without_room_to_surge_replaces_one_at_a_time() -> None:
    target = GroupTarget("g", "new", 2, max_surge=0, max_unavailable=1)
    old = [inst(1, template="old"), inst(2, template="old")]
    first = plan_group(target, old)
    assert [(type(a).__name__, getattr(a, "instance_id", None)) for a in first] == [
        ("Drain", "g-1")
    ]  # no launch: there is no unit for a third instance
    draining = [replace(old[0], state=InstanceState.DRAINING), old[1]]
    assert kinds(plan_group(target, draining)) == ["Launch"]  # its replacement, in its place
    starting = [*draining, inst(3, InstanceState.STARTING, template="new")]
    assert plan_group(target, starting) == []  # never two down at once
    up = [old[1], inst(3, template="new")]
    assert [getattr(a, "instance_id", None) for a in plan_group(target, up)] == ["g-2"]


def test_other_groups_are_ignored() -> None:
    other = replace(inst(1), group="h")
    assert kinds(plan_group(GroupTarget("g", "t1", 1), [other])) == ["Launch"]


class World:
    """A tiny simulated world: launched instances become ready the next step, drained ones
    disappear. Used to check the planner converges and never drops below the ready floor."""

    def __init__(self, instances: list[InstanceStatus]) -> None:
        self.instances = list(instances)
        self.next_id = 100

    def settled(self) -> bool:
        return all(i.state is READY for i in self.instances)

    def apply(self, actions: list) -> None:
        gone = {a.instance_id for a in actions if isinstance(a, Drain | Remove)}
        self.instances = [i for i in self.instances if i.id not in gone]
        self.instances = [
            replace(i, state=READY) if i.state is InstanceState.STARTING else i
            for i in self.instances
        ]
        for a in actions:
            if isinstance(a, Launch):
                self.next_id += 1
                self.instances.append(inst(self.next_id, InstanceState.STARTING, a.template))


@settings(max_examples=200, deadline=None)
@given(
    n_old=st.integers(0, 6),
    n_new=st.integers(0, 6),
    replicas=st.integers(0, 6),
    surge=st.integers(1, 3),
)
def test_converges_without_dropping_below_the_ready_floor(
    n_old: int, n_new: int, replicas: int, surge: int
) -> None:
    world = World(
        [inst(i, template="old") for i in range(n_old)]
        + [inst(10 + i, template="new") for i in range(n_new)]
    )
    target = GroupTarget("g", "new", replicas, surge)
    floor = min(replicas, n_old + n_new)
    for _ in range(30):
        actions = plan_group(target, world.instances)
        if not actions and world.settled():
            break
        world.apply(actions)
        ready = sum(1 for i in world.instances if i.state is READY)
        # maxUnavailable=0: a rolling update never leaves fewer READY than it started with
        assert ready >= floor or n_new > replicas
        alive = len(world.instances)
        assert alive <= max(replicas + surge, n_old + n_new)
    assert not plan_group(target, world.instances)
    assert sorted(i.template for i in world.instances) == ["new"] * replicas
