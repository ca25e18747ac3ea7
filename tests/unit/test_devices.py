"""Device placement (`policy.devices`): distinct devices per instance, a device shared only
by fractional instances, never more units on a device than it has."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.policy import DeviceHold, assign_devices
from sluice.policy.devices import held_units, may_wake, place_beside_lent

GPUS = ("0", "1", "2", "3")


def test_exclusive_instances_get_distinct_free_devices_in_pool_order() -> None:
    a = assign_devices(GPUS, 1, [], 1, False)
    assert a.devices == ("0",)
    b = assign_devices(GPUS, 1, [DeviceHold("a", a.devices, a.units)], 2, False)
    assert b.devices == ("1", "2")
    holds = [DeviceHold("a", ("0",), 1), DeviceHold("b", ("1", "2"), 1)]
    assert assign_devices(GPUS, 1, holds, 1, False).devices == ("3",)
    full = assign_devices(GPUS, 1, [*holds, DeviceHold("c", ("3",), 1)], 1, False)
    assert not full.ok and "no 1 free device(s)" in full.reason and "3: 1/1" in full.reason


def test_fractional_instances_share_the_fullest_device_and_never_an_exclusive_one() -> None:
    # 2 devices of 4 units: an exclusive instance takes device 0 whole
    devices, per = ("0", "1"), 4
    whole = assign_devices(devices, per, [], 4, False)
    assert whole.devices == ("0",) and whole.units == 4
    holds = [DeviceHold("x", ("0",), 4)]
    first = assign_devices(devices, per, holds, 1, True)
    assert first.devices == ("1",)
    holds.append(DeviceHold("f1", first.devices, first.units))
    second = assign_devices(devices, per, holds, 2, True)
    assert second.devices == ("1",)  # packed beside f1, not spread
    holds.append(DeviceHold("f2", second.devices, second.units))
    third = assign_devices(devices, per, holds, 2, True)
    assert not third.ok and "device with 2 free unit(s)" in third.reason


def test_fragmented_units_are_refused_not_oversubscribed() -> None:
    # quota sees 2 free units of 4; but each device has one fractional instance on it
    holds = [DeviceHold("f1", ("0",), 1), DeviceHold("f2", ("1",), 1)]
    grant = assign_devices(("0", "1"), 2, holds, 2, False)
    assert not grant.ok and "0: 1/2, 1: 1/2" in grant.reason


def test_devices_of_other_pools_are_ignored() -> None:
    grant = assign_devices(GPUS, 1, [DeviceHold("elsewhere", ("7",), 1)], 4, False)
    assert grant.devices == GPUS


@st.composite
def scenario(draw: st.DrawFn) -> tuple[int, int, list[tuple[int, bool]], int]:
    per = draw(st.integers(1, 4))
    n = draw(st.integers(1, 6))
    asks = draw(
        st.lists(
            st.one_of(
                st.integers(1, 3).map(lambda k: (k * per, False)),
                st.integers(1, per).map(lambda u: (u, True)),
            ),
            max_size=30,
        )
    )
    return per, n, asks, draw(st.integers(0, 2**32 - 1))


@settings(max_examples=200, deadline=None)
@given(scenario())
def test_no_device_is_oversubscribed_and_exclusive_ones_are_never_shared(
    case: tuple[int, int, list[tuple[int, bool]], int],
) -> None:
    """Any sequence of launches and stops: units per device <= units_per_device; a device
    that an exclusive instance holds has exactly one holder; a grant refused only when no
    placement exists."""
    per, n, asks, seed = case
    rng = random.Random(seed)
    devices = tuple(str(i) for i in range(n))
    holds: dict[str, tuple[DeviceHold, bool]] = {}
    for k, (units, fractional) in enumerate(asks):
        if holds and rng.random() < 0.3:
            del holds[rng.choice(sorted(holds))]
        current = [h for h, _ in holds.values()]
        grant = assign_devices(devices, per, current, units, fractional)
        used = held_units(devices, current)
        if not grant.ok:
            if fractional and units < per:
                assert all(per - used[d] < units for d in devices)
            else:
                assert sum(1 for d in devices if used[d] == 0) < units // per
            continue
        assert len(set(grant.devices)) == len(grant.devices)
        holds[f"i{k}"] = (
            DeviceHold(f"i{k}", grant.devices, grant.units),
            fractional and units < per,
        )
        after = held_units(devices, [h for h, _ in holds.values()])
        assert all(v <= per for v in after.values())
        for d in devices:
            holders = [(h, frac) for h, frac in holds.values() if d in h.devices]
            if any(not frac for _, frac in holders):
                assert len(holders) == 1


def test_a_lent_sleepers_device_is_taken_last_and_it_wakes_once_that_one_is_gone() -> None:
    holds = [DeviceHold("chat-0", ("0",), 1), DeviceHold("sleeper", ("1",), 1)]
    lent = {"sleeper"}
    # device 2 is free: taken first; then the sleeper's, not a wait
    first = place_beside_lent(GPUS[:3], 1, holds, 1, False, lent)
    assert first.devices == ("2",)
    holds.append(DeviceHold("batch-0", first.devices, 1))
    second = place_beside_lent(GPUS[:3], 1, holds, 1, False, lent)
    assert second.devices == ("1",)
    assert not place_beside_lent(GPUS[:3], 1, holds, 1, False, set()).ok  # not lent: it holds
    holds.append(DeviceHold("batch-1", second.devices, 1))
    me = holds[1]
    assert not may_wake(me, 1, holds, lent)  # batch-1 sits on its device
    assert may_wake(me, 1, [h for h in holds if h.instance_id != "batch-1"], lent)


@given(
    st.lists(st.tuples(st.integers(0, 3), st.booleans()), max_size=6),
    st.integers(1, 2),
)
def test_placement_beside_lent_sleepers_never_overfills_a_device_that_others_hold(
    placed: list[tuple[int, bool]], units: int
) -> None:
    """Whatever is lent, a new instance lands only where the instances that hold their
    devices (all but the lent sleepers) leave room."""
    holds = [DeviceHold(f"i{n}", (GPUS[d],), 2) for n, (d, _) in enumerate(placed)]
    lent = {f"i{n}" for n, (_, is_lent) in enumerate(placed) if is_lent}
    grant = place_beside_lent(GPUS, 2, holds, units, True, lent)
    holding = [h for h in holds if h.instance_id not in lent]
    if grant.ok:
        used = held_units(GPUS, holding)
        assert all(used[d] + grant.units <= 2 for d in grant.devices)
    else:
        assert all(held_units(GPUS, holding)[d] + units > 2 for d in GPUS)
