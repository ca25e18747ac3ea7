"""Advisory mode at the edges (issue 16): what a switch between `autoscaling.mode: active`
and `advisory` does to a group's count, and the desired vs advised gauges.

A switch never moves the fleet by itself:

- active -> advisory: the group keeps the count its autoscaler had reached (as a manual
  override, audited);
- advisory -> active: the autoscaler starts from the count in force (clamped to min/max),
  and the override the operator drove it with is dropped (an active group has none);

unless the same apply changes `replicas`, which then rules (as it always drops an override).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from sluice.control.decisions import Advice
from sluice.policy.tick import is_advisory
from sluice.spec import PlatformSpec

__all__ = ["ModeSwitch", "scaling_metrics", "switched_modes"]


@dataclass(frozen=True, slots=True)
class ModeSwitch:
    """`group`'s autoscaler turns `to` a mode; `count`: the instances it keeps, or None
    where the new spec's `replicas` rules (set in the same apply)."""

    group: str
    to: Literal["active", "advisory"]
    count: int | None


def switched_modes(
    old: PlatformSpec | None, new: PlatformSpec, counts: Mapping[str, int]
) -> list[ModeSwitch]:
    """The groups of `new` whose autoscaler starts or stops acting; `counts`: each old
    group's count in force before the apply."""
    if old is None:
        return []
    out = []
    for g in new.groups:
        before = old.group(g.name)
        if before is None or before.autoscaling is None or g.autoscaling is None:
            continue
        if is_advisory(before) == is_advisory(g):
            continue
        count = None if before.replicas != g.replicas else counts.get(g.name)
        if is_advisory(g):
            out.append(ModeSwitch(g.name, "advisory", count))
        else:
            start = g.replicas if count is None else count
            start = min(max(start, g.autoscaling.min), g.autoscaling.max)
            out.append(ModeSwitch(g.name, "active", start))
    return out


def scaling_metrics(
    spec: PlatformSpec,
    desired: Callable[[str], int],
    advice: Mapping[str, Advice],
    quota_advice: Callable[[str], dict[str, Any] | None],
) -> bytes:
    """`sluice_group_desired_instances` (the count in force) per group, and
    `sluice_group_advised_instances` by `source` (autoscaling, quota) for advisory groups,
    in Prometheus text format 0.0.4."""
    lines = [
        "# HELP sluice_group_desired_instances Serving instances the controller keeps per group.",
        "# TYPE sluice_group_desired_instances gauge",
    ]
    lines += [
        f'sluice_group_desired_instances{{group="{_label(g.name)}"}} {desired(g.name)}'
        for g in spec.groups
    ]
    advised = []
    for g in spec.groups:
        if g.name in advice:
            advised.append((g.name, "autoscaling", advice[g.name].advised))
        told = quota_advice(g.name)
        if told is not None:
            advised.append((g.name, "quota", told["advised"]))
    if advised:
        lines += [
            "# HELP sluice_group_advised_instances What an advisory autoscaler or quota would "
            "run per group (not acted on); compare with sluice_group_desired_instances.",
            "# TYPE sluice_group_advised_instances gauge",
        ]
        lines += [
            f'sluice_group_advised_instances{{group="{_label(name)}",source="{src}"}} {n}'
            for name, src, n in advised
        ]
    return ("\n".join(lines) + "\n").encode()


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
