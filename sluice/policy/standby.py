"""Which of a group's ready instances serve, which wait as warm standby, which sleep.

The count in force serves; `autoscaling.warm_standby` more wait loaded and out of rotation
for a gateway to put in the moment requests wait; `autoscaling.sleeping_standby` more are
loaded and then put to sleep (vLLM's sleep mode: accelerator memory freed, woken in
seconds), for a gateway to wake when requests still wait once its warm standby is in
rotation: as many at once as the waiting requests need (`sleepers_to_wake`). A batching
group's gateway does both before anything waits, once its requests in flight pass the
capacity at the SLO per instance in rotation (`standby_level`, `over_level`). Of the count
in force, a group with sleeping standby serves with what the last `sleep_held_after_s`
asked for; the rest of what the scale-down stabilization holds takes sleeping places too
(`Decision.awake`; the caller passes the smaller `serving`), and is woken the same way.

Awake instances fill the serving and warm places first, oldest first, so that an instance a
gateway woke is not put back to sleep while an older one is; asleep ones come last. An awake
instance in a sleeping place is kept out of the routing until it is asleep (a gateway must
not start requests on it while it is being put to sleep), unless a gateway still routes to it
(it woke it for a burst): then it waits as warm standby until that gateway lets it go. An
asleep instance in a serving or warm place is woken, and routed only once awake.

A sleeper holds no accelerator memory, so its units can serve another group
(`sleeping_units`): those on the group's lendable guarantee are lent when the pool has a
group waiting for units. A gateway must then not wake it (the weights would load onto
units a borrower uses), so it is first taken out of the gateways' wakeable list (fenced);
once every gateway serves a snapshot without it, its units are idle guarantee, lent by the
quota allocator's borrowing and taken back by its reclaim; the controller wakes it when
the count needs it and quota grants its units again. Sleepers above the guarantee (on
borrowed or unassigned units) keep their units: nobody would reclaim them for it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from sluice.policy.routing import Endpoint

__all__ = [
    "SleepingUnits",
    "StandbySplit",
    "over_level",
    "sleepers_to_wake",
    "sleeping_units",
    "split_standby",
    "standby_level",
]

K = TypeVar("K")
"""an instance as the caller knows it: its endpoint at a gateway, its index in the simulator"""


@dataclass(frozen=True, slots=True)
class StandbySplit:
    """One group's ready instances, placed."""

    rotation: tuple[Endpoint, ...]
    warm: tuple[Endpoint, ...]
    """loaded, out of rotation: a gateway puts them in at once when requests wait"""
    sleeping: tuple[Endpoint, ...]
    """asleep: a gateway wakes as many as its waiting requests need (`sleepers_to_wake`)"""
    to_sleep: tuple[Endpoint, ...] = ()
    """awake instances in sleeping places that no gateway routes to: put them to sleep"""
    to_wake: tuple[Endpoint, ...] = ()
    """asleep instances the serving and warm places need: wake them"""


def split_standby(
    ready: Sequence[Endpoint],
    serving: int,
    warm: int,
    sleeping: int,
    asleep: Collection[str] = frozenset(),
    routed: Collection[str] = frozenset(),
) -> StandbySplit:
    """Place `ready` (one group's): `serving` in rotation, then `warm` warm standby; the rest
    are sleeping places when the group keeps sleeping standby (else warm standby, as every
    instance beyond the count is while the autoscaler's count catches up). `asleep`: the
    instances known to sleep; `routed`: those a gateway routes to now (it woke them)."""
    awake = sorted((e for e in ready if e.instance_id not in asleep), key=_age)
    dozing = sorted((e for e in ready if e.instance_id in asleep), key=_age)
    order = awake + dozing
    rest = order[serving:] if not sleeping else order[serving : serving + warm]
    beyond = order[serving + warm :] if sleeping else []
    to_wake = tuple(e for e in order[:serving] + rest if e.instance_id in asleep)
    keep_warm = [e for e in beyond if e.instance_id in routed and e.instance_id not in asleep]
    return StandbySplit(
        rotation=tuple(e for e in order[:serving] if e.instance_id not in asleep),
        warm=tuple(e for e in rest if e.instance_id not in asleep) + tuple(keep_warm),
        sleeping=tuple(e for e in order if e.instance_id in asleep),
        to_sleep=tuple(
            e for e in beyond if e.instance_id not in asleep and e.instance_id not in routed
        ),
        to_wake=to_wake,
    )


def _age(e: Endpoint) -> tuple[float, str]:
    return e.ready_at, e.instance_id


def sleepers_to_wake(
    waiting: float, waking_slots: float, sleepers: Iterable[tuple[K, float]]
) -> list[K]:
    """The sleeping standby a gateway wakes now, all at once: of `sleepers` (instance, its
    slots, or its `standby_level`; in the order to wake them, oldest first, none already
    waking), as many as it takes for the slots of those waking (`waking_slots` already) to
    cover the `waiting` requests (or those `over_level`). One wake at a time would serve a
    burst larger than one instance a wake time later for every instance it needs; as the
    queue grows during a wake, the next request that asks sees it again."""
    out: list[K] = []
    short = waiting - waking_slots
    for key, slots in sleepers:
        if short <= 0:
            break
        out.append(key)
        short -= slots if slots > 0 else 1
    return out


def standby_level(signals: Mapping[str, float], max_concurrency: int) -> float | None:
    """The requests in flight per instance in rotation past which a gateway takes a group's
    standby in, before any request waits: the concurrency its autoscaler sizes an instance
    for (`slots_per_instance`: a batching server's capacity at the SLO times its service
    time, `sluice.policy.autoscale.batching`), where that is under `max_concurrency`. A
    batching server admits hundreds of requests and queues them inside, so the gateway's
    own queue, the trigger of slot servers, forms too late or never. None: only waiting
    requests take the standby in. At least 1: a request alone on an instance meets the SLO
    wherever the instance has any capacity at it (a level under 1 would have every lone
    request take the standby in). Two significant digits: the routing snapshot carries it,
    and one republished for every tick's noise would cost each gateway a reload."""
    level = signals.get("slots_per_instance")
    if level is None or not 0 < level < max_concurrency:
        return None
    return max(1.0, float(f"{level:.2g}"))


def over_level(in_flight: int, waiting: int, level: float | None, in_rotation: int) -> float:
    """The requests beyond what the instances in rotation serve within the SLO: those
    waiting, or where a `standby_level` is known, the in-flight ones past it too (what
    `sleepers_to_wake` covers, at `level` per sleeper). Positive: take the standby in."""
    if level is None:
        return float(waiting)
    return in_flight + waiting - level * in_rotation


@dataclass(frozen=True, slots=True)
class SleepingUnits:
    """What one group's asleep instances hold in quota this tick (`sluice.policy.tick`)."""

    released: frozenset[str]
    """fenced sleepers: out of the group's claim (their units are idle guarantee)"""
    placed: int
    """of them, in sleeping places: out of what the group wants too"""
    to_wake: tuple[str, ...]
    """released sleepers the serving and warm places need, oldest first: each is woken
    only on a start quota grants (a reclaim frees its units first, when they are lent)"""
    lendable: tuple[str, ...]
    """sleepers in sleeping places on the group's lendable guarantee: fenced to be lent"""


def sleeping_units(
    asleep: Sequence[tuple[float, str]],
    awake: int,
    serving: int,
    warm: int,
    units: int,
    guaranteed: int,
    lendable: int | None,
    fenced: Collection[str],
) -> SleepingUnits:
    """One group's sleepers in quota. `asleep`: its ready asleep instances as (ready time,
    id); `awake`: its ready instances awake; `serving`, `warm`: the places awake instances
    fill first (`split_standby`: the oldest sleepers are woken for them); `units` per
    instance; `guaranteed`, `lendable`: its quota; `fenced`: sleepers no gateway may wake
    any more (every gateway serves a snapshot that leaves them out)."""
    order = [iid for _, iid in sorted(asleep)]
    needed = min(len(order), max(0, serving + warm - awake))
    placed = order[needed:]
    lend = guaranteed if lendable is None else min(lendable, guaranteed)
    room = min(max(0, guaranteed - (serving + warm) * units), lend) // units
    return SleepingUnits(
        released=frozenset(i for i in order if i in fenced),
        placed=sum(1 for i in placed if i in fenced),
        to_wake=tuple(i for i in order[:needed] if i in fenced),
        lendable=tuple(placed[len(placed) - min(room, len(placed)) :]),
    )
