"""Desired vs observed -> actions, for one group: scaling, rolling updates, replacement.

The rolling rule is Kubernetes' Deployment with maxUnavailable=0: new instances (of the
desired `template`) start first, at most `max_surge` beyond `replicas`, and an old instance
drains only once the READY count stays >= `replicas` without it (S2). With no room to surge
(max_surge 0, max_unavailable 1) one old instance drains first and its replacement starts
in its place. Failed instances are
removed, and the count shortfall starts their replacements (S10). Scale-down drains READY
instances (S6) but stops not-yet-ready ones at once, newest first.

| instance                        | action                                      |
|---------------------------------|---------------------------------------------|
| failed                          | Remove                                      |
| old template, not ready         | Remove (serves nothing)                     |
| old template, ready             | Drain once ready_total - replicas > 0       |
| desired template, over replicas | Remove if not ready, else Drain             |
| desired template, short         | Launch (bounded by max_surge while rolling) |
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sluice.core.frozen import fast_init
from sluice.core.instances import ALIVE_STATES, InstanceState, InstanceStatus

__all__ = ["Action", "Drain", "GroupTarget", "Launch", "Remove", "plan_group"]


@fast_init
@dataclass(frozen=True, slots=True)
class GroupTarget:
    """What one group should run: `replicas` instances of `template`."""

    group: str
    template: str
    replicas: int
    max_surge: int = 1
    max_unavailable: int = 0
    """Ready instances a rolling update may take away before their replacements are up;
    used when there is no room to surge (a full pool): max_surge 0, max_unavailable 1."""


@fast_init
@dataclass(frozen=True, slots=True)
class Launch:
    group: str
    template: str
    reason: str


@fast_init
@dataclass(frozen=True, slots=True)
class Drain:
    """Stop sending new requests, let in-flight ones finish, then stop."""

    group: str
    instance_id: str
    reason: str


@fast_init
@dataclass(frozen=True, slots=True)
class Remove:
    """Stop at once: the instance serves nothing (not ready, or failed)."""

    group: str
    instance_id: str
    reason: str


Action = Launch | Drain | Remove


def plan_group(target: GroupTarget, observed: Sequence[InstanceStatus]) -> list[Action]:
    """Actions that move one group toward `target`. pre: target.replicas >= 0.

    Idempotent: applying the actions and planning again on the new observation yields only
    the next step, so the controller may call this every tick.
    """
    actions: list[Action] = []
    mine = [i for i in observed if i.group == target.group]
    for inst in mine:
        if inst.state is InstanceState.FAILED:
            actions.append(Remove(target.group, inst.id, f"instance failed: {inst.reason}"))

    alive = [i for i in mine if i.state in ALIVE_STATES]
    current = [i for i in alive if i.template == target.template]
    old = [i for i in alive if i.template != target.template]
    old_ready = _oldest_first([i for i in old if i.state is InstanceState.READY])
    for inst in old:
        if inst.state is not InstanceState.READY:
            actions.append(
                Remove(
                    target.group, inst.id, f"superseded by template {target.template} before ready"
                )
            )

    shortfall = target.replicas - len(current)
    if shortfall > 0:
        room = shortfall
        if old_ready:  # rolling: cap the total at replicas + max_surge
            room = min(
                shortfall, target.replicas + target.max_surge - len(current) - len(old_ready)
            )
        for _ in range(max(room, 0)):
            why = (
                f"rolling to template {target.template}"
                if old_ready
                else f"{len(current)} of {target.replicas} replicas"
            )
            actions.append(Launch(target.group, target.template, why))
    elif shortfall < 0:
        excess = -shortfall
        not_ready = _newest_first([i for i in current if i.state is not InstanceState.READY])
        ready = _newest_first([i for i in current if i.state is InstanceState.READY])
        why = f"scale down to {target.replicas} replicas"
        for inst in not_ready[:excess]:
            actions.append(Remove(target.group, inst.id, why))
        for inst in ready[: max(excess - len(not_ready), 0)]:
            actions.append(Drain(target.group, inst.id, why))

    ready_current = sum(1 for i in current if i.state is InstanceState.READY)
    floor = target.replicas - target.max_unavailable
    retire = min(len(old_ready), ready_current + len(old_ready) - floor)
    for inst in old_ready[: max(retire, 0)]:
        actions.append(Drain(target.group, inst.id, f"replaced by template {target.template}"))
    return actions


def _oldest_first(items: list[InstanceStatus]) -> list[InstanceStatus]:
    return sorted(items, key=lambda i: (i.created_at, i.id))


def _newest_first(items: list[InstanceStatus]) -> list[InstanceStatus]:
    return sorted(items, key=lambda i: (i.created_at, i.id), reverse=True)
