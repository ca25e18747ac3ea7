"""Which of a group's ready instances serve, which wait as warm standby, which sleep.

The count in force serves; `autoscaling.warm_standby` more wait loaded and out of rotation
for a gateway to put in the moment requests wait; `autoscaling.sleeping_standby` more are
loaded and then put to sleep (vLLM's sleep mode: accelerator memory freed, woken in
seconds), for a gateway to wake when requests wait and no warm standby is left.

Awake instances fill the serving and warm places first, oldest first, so that an instance a
gateway woke is not put back to sleep while an older one is; asleep ones come last. An awake
instance in a sleeping place is kept out of the routing until it is asleep (a gateway must
not start requests on it while it is being put to sleep), unless a gateway still routes to it
(it woke it for a burst): then it waits as warm standby until that gateway lets it go. An
asleep instance in a serving or warm place is woken, and routed only once awake.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from sluice.policy.routing import Endpoint

__all__ = ["StandbySplit", "split_standby"]


@dataclass(frozen=True, slots=True)
class StandbySplit:
    """One group's ready instances, placed."""

    rotation: tuple[Endpoint, ...]
    warm: tuple[Endpoint, ...]
    """loaded, out of rotation: a gateway puts them in at once when requests wait"""
    sleeping: tuple[Endpoint, ...]
    """asleep: a gateway wakes one when requests wait and no warm standby is left"""
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
