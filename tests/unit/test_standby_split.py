"""`sluice.policy.standby.split_standby`: which ready instances serve, wait warm, or sleep."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sluice.policy.routing import Endpoint
from sluice.policy.standby import sleepers_to_wake, split_standby


def eps(n: int) -> list[Endpoint]:
    """n instances, i0 the oldest."""
    return [Endpoint(f"i{k}", "127.0.0.1", 9000 + k, 1, ready_at=float(k)) for k in range(n)]


def ids(endpoints: tuple[Endpoint, ...]) -> list[str]:
    return [e.instance_id for e in endpoints]


def test_without_sleeping_standby_every_instance_beyond_the_count_is_warm() -> None:
    split = split_standby(eps(4), serving=2, warm=1, sleeping=0)
    assert ids(split.rotation) == ["i0", "i1"] and ids(split.warm) == ["i2", "i3"]
    assert split.sleeping == split.to_sleep == split.to_wake == ()


def test_a_new_instance_in_a_sleeping_place_is_put_to_sleep_and_kept_out_meanwhile() -> None:
    split = split_standby(eps(3), serving=1, warm=1, sleeping=1)
    assert ids(split.rotation) == ["i0"] and ids(split.warm) == ["i1"]
    assert ids(split.to_sleep) == ["i2"] and split.sleeping == ()  # routed nowhere yet
    asleep = split_standby(eps(3), serving=1, warm=1, sleeping=1, asleep={"i2"})
    assert ids(asleep.sleeping) == ["i2"] and asleep.to_sleep == () and asleep.to_wake == ()


def test_a_woken_instance_is_not_put_back_to_sleep_in_place_of_an_older_one() -> None:
    # i1 slept and a gateway woke it; the count took it in: awake ones serve first, by age
    split = split_standby(eps(3), serving=2, warm=0, sleeping=1)
    assert ids(split.rotation) == ["i0", "i1"] and ids(split.to_sleep) == ["i2"]
    # while a gateway still routes to an awake instance in a sleeping place, it stays warm
    held = split_standby(eps(3), serving=1, warm=0, sleeping=1, routed={"i2", "i1"})
    assert ids(held.warm) == ["i1", "i2"] and held.to_sleep == ()


def test_an_asleep_instance_the_count_needs_is_woken_before_it_is_routed() -> None:
    split = split_standby(eps(2), serving=2, warm=0, sleeping=1, asleep={"i1"})
    assert ids(split.rotation) == ["i0"] and ids(split.to_wake) == ["i1"]
    assert ids(split.sleeping) == ["i1"]  # a gateway may wake it too: it is idempotent


@given(
    n=st.integers(0, 8),
    serving=st.integers(0, 8),
    warm=st.integers(0, 3),
    sleeping=st.integers(0, 3),
    asleep=st.sets(st.integers(0, 7)),
    routed=st.sets(st.integers(0, 7)),
)
def test_no_instance_is_in_two_places_and_no_asleep_one_is_routed(
    n: int, serving: int, warm: int, sleeping: int, asleep: set[int], routed: set[int]
) -> None:
    asleep_ids = {f"i{k}" for k in asleep}
    routed_ids = {f"i{k}" for k in routed} - asleep_ids  # a gateway routes only to awake ones
    split = split_standby(eps(n), serving, warm, sleeping, asleep_ids, routed_ids)
    places = [*ids(split.rotation), *ids(split.warm), *ids(split.sleeping), *ids(split.to_sleep)]
    assert len(places) == len(set(places)) == n  # each ready instance exactly once
    assert not {*ids(split.rotation), *ids(split.warm)} & asleep_ids
    assert {*ids(split.sleeping)} == {f"i{k}" for k in asleep if k < n}
    assert not set(ids(split.to_sleep)) & routed_ids
    assert len(split.rotation) <= serving
    assert set(ids(split.to_wake)) <= asleep_ids


def test_a_group_that_no_longer_keeps_sleeping_standby_has_its_sleepers_woken() -> None:
    split = split_standby(eps(3), serving=2, warm=0, sleeping=0, asleep={"i2"})
    assert ids(split.rotation) == ["i0", "i1"] and ids(split.to_wake) == ["i2"]
    assert split.warm == () and ids(split.sleeping) == ["i2"]


def test_a_gateway_wakes_as_many_sleepers_as_its_waiting_requests_need() -> None:
    sleepers = [("a", 4), ("b", 4), ("c", 4)]
    assert sleepers_to_wake(0, 0, sleepers) == []
    assert sleepers_to_wake(1, 0, sleepers) == ["a"]
    assert sleepers_to_wake(5, 0, sleepers) == ["a", "b"]
    assert sleepers_to_wake(5, 4, sleepers) == ["a"]  # one is waking already
    assert sleepers_to_wake(8, 8, sleepers) == []
    assert sleepers_to_wake(99, 0, sleepers) == ["a", "b", "c"]  # all there are


@given(
    st.integers(0, 60),
    st.integers(0, 20),
    st.lists(st.integers(0, 8), max_size=8),
)
def test_the_wakes_cover_the_waiting_with_none_to_spare(
    waiting: int, waking_slots: int, slots: list[int]
) -> None:
    sleepers = [(k, n) for k, n in enumerate(slots)]
    woken = sleepers_to_wake(waiting, waking_slots, sleepers)
    assert woken == list(range(len(woken)))  # oldest first
    covered = waking_slots + sum(max(n, 1) for _, n in sleepers[: len(woken)])
    if len(woken) < len(sleepers):
        assert covered >= waiting  # enough (unless every sleeper is woken)
    if woken:  # and not one more than it takes
        assert covered - max(sleepers[len(woken) - 1][1], 1) < waiting
