"""Which devices of a pool a new instance gets: distinct ones, never shared by accident.

A pool with real devices splits each into `units_per_device` quota units. An instance holds
some units on each device it was given. The rule that keeps instances apart:

    exclusive instance (units a multiple of units_per_device): takes whole devices that
        hold nothing, so no other instance can fit on them while it lives;
    fractional instance (the group allows it): takes `units` on ONE device that has room,
        the fullest such device first (best fit keeps whole devices free for exclusive ones).

So a device is shared only between fractional instances, and a device's held units never
exceed `units_per_device` (pre: the holds passed in obey this).

A sleeping standby whose units are lent (`sluice.policy.standby`) holds no device while it
sleeps: a borrower may be placed on its devices (last, after every free one), and it wakes
only where it lives, once nothing is `in_the_way` there. The quota allocator counts
units, not devices, so free units may still be scattered (fragmentation): then the answer
says so and the caller waits for a device to free up instead of oversubscribing one.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "DeviceGrant",
    "DeviceHold",
    "assign_devices",
    "held_units",
    "in_the_way",
    "may_wake",
    "place_beside_lent",
    "units_on_each",
]


@dataclass(frozen=True, slots=True)
class DeviceHold:
    """A live instance (any state until its process is gone) holding `units` quota units on
    each of `devices`."""

    instance_id: str
    devices: tuple[str, ...]
    units: int


@dataclass(frozen=True, slots=True)
class DeviceGrant:
    """`devices` in the pool's order, each holding `units` of the instance; empty with a
    `reason` when no placement exists now."""

    devices: tuple[str, ...]
    units: int
    reason: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.devices)


def held_units(devices: Sequence[str], holds: Sequence[DeviceHold]) -> Mapping[str, int]:
    """Units held on each device of the pool (devices not in the pool are ignored)."""
    used = dict.fromkeys(devices, 0)
    for h in holds:
        for d in h.devices:
            if d in used:
                used[d] += h.units
    return used


def assign_devices(
    devices: Sequence[str],
    units_per_device: int,
    holds: Sequence[DeviceHold],
    units: int,
    fractional: bool,
) -> DeviceGrant:
    """Devices for an instance needing `units` quota units.

    pre: devices are distinct; units >= 1; units_per_device >= 1; not fractional implies
    units % units_per_device == 0; fractional implies units <= units_per_device (the spec
    checks refuse the rest)."""
    used = held_units(devices, holds)
    if fractional and units < units_per_device:
        fits = [d for d in devices if units_per_device - used[d] >= units]
        if not fits:
            return DeviceGrant(
                (), units, _why(used, units_per_device, f"device with {units} free unit(s)")
            )
        best = max(fits, key=lambda d: used[d])  # fullest; max keeps the first of a tie
        return DeviceGrant((best,), units)
    whole = max(1, units // units_per_device)
    free = [d for d in devices if used[d] == 0]
    if len(free) < whole:
        return DeviceGrant(
            (), units_per_device, _why(used, units_per_device, f"{whole} free device(s)")
        )
    return DeviceGrant(tuple(free[:whole]), units_per_device)


def _why(used: Mapping[str, int], per: int, wanted: str) -> str:
    busy = ", ".join(f"{d}: {n}/{per}" for d, n in used.items())
    return f"no {wanted} now (units held per device: {busy})"


def units_on_each(units: int, units_per_device: int, fractional: bool) -> int:
    """The units an instance needing `units` holds on each of its devices (as
    `assign_devices` grants them)."""
    return units if fractional and units < units_per_device else units_per_device


def in_the_way(
    devices: Sequence[str], units: int, units_per_device: int, holds: Sequence[DeviceHold]
) -> tuple[str, ...]:
    """The holds that keep an instance from taking `units` on each of exactly `devices` (a
    sleeper waking where its process lives): none when every one of them has room, else
    every hold on a device without room."""
    used = held_units(devices, holds)
    full = {d for d in devices if units_per_device - used[d] < units}
    return tuple(h.instance_id for h in holds if full.intersection(h.devices))


def place_beside_lent(
    devices: Sequence[str],
    units_per_device: int,
    holds: Sequence[DeviceHold],
    units: int,
    fractional: bool,
    lent: Collection[str],
) -> DeviceGrant:
    """Devices for a new instance as the supervisor (and the simulator) place it:
    `assign_devices` where the sleepers whose units are lent (`lent`, instance ids) hold
    nothing, and with their devices taken last, so that a sleeper wakes sooner where
    nobody was placed."""
    if not lent:
        return assign_devices(devices, units_per_device, holds, units, fractional)
    theirs = {d for h in holds if h.instance_id in lent for d in h.devices}
    order = sorted(devices, key=lambda d: d in theirs)
    holding = [h for h in holds if h.instance_id not in lent]
    return assign_devices(order, units_per_device, holding, units, fractional)


def may_wake(
    sleeper: DeviceHold, units_per_device: int, holds: Sequence[DeviceHold], lent: Collection[str]
) -> bool:
    """Whether a sleeper may wake where it lives: no other instance but the lent sleepers
    holds its devices beyond their room (`in_the_way`)."""
    others = [
        h for h in holds if h.instance_id != sleeper.instance_id and h.instance_id not in lent
    ]
    return not in_the_way(sleeper.devices, sleeper.units, units_per_device, others)
