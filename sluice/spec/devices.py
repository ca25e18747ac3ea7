"""Real accelerators behind a pool: which device ids it owns, and who may share one.

A pool that lists `devices` pins every instance to devices of its own
(`CUDA_VISIBLE_DEVICES`, `{gpu_ids}`); without them its units stay virtual and nothing is
pinned. `units_per_device` splits each device into quota units (fractional accelerators);
only a group with `resources.fractional: true` takes part of a device, and then shares it
only with other fractional instances (`sluice.policy.devices`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BeforeValidator, Field

if TYPE_CHECKING:
    from sluice.spec.models import PlatformSpec

__all__ = ["DeviceId", "device_problems", "pool_devices_problem"]

Problem = tuple[tuple[str | int, ...], str]


def _as_text(value: Any) -> Any:
    """YAML reads `devices: [0, 1]` as ints; CUDA_VISIBLE_DEVICES takes indices or UUIDs."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


DeviceId = Annotated[
    str,
    BeforeValidator(_as_text),
    Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_:./-]{0,127}$", description="index or UUID"),
]


def pool_devices_problem(count: int, devices: list[str] | None, units_per_device: int) -> str:
    """Why a pool's `devices` do not add up ('' when they do)."""
    if devices is None:
        if units_per_device != 1:
            return "units_per_device splits real devices: list the pool's `devices` too"
        return ""
    twice = sorted({d for d in devices if devices.count(d) > 1})
    if twice:
        return f"device(s) listed twice: {', '.join(twice)}"
    if len(devices) * units_per_device != count:
        return (
            f"count = {count} but {len(devices)} device(s) x units_per_device "
            f"{units_per_device} = {len(devices) * units_per_device}; make them match"
        )
    return ""


def device_problems(spec: PlatformSpec) -> Iterator[Problem]:
    """No device belongs to two pools; groups take whole devices unless fractional; a
    command that passes `{gpu_ids}` on runs in a pool that has devices."""
    owner: dict[str, str] = {}
    for i, pool in enumerate(spec.pools):
        for d in pool.devices or ():
            first = owner.setdefault(d, pool.name)
            if first != pool.name:
                yield (
                    ("pools", i, "devices"),
                    f"device {d!r} is already in pool {first!r}; a device belongs to one pool",
                )
    for i, g in enumerate(spec.groups):
        gpool = spec.pool(g.resources.pool)
        if gpool is None:
            continue  # reported with the group's resources
        pool = gpool
        path: tuple[str | int, ...] = ("groups", i, "resources")
        per, units = pool.units_per_device, g.resources.accelerators
        if g.resources.fractional:
            if pool.devices is None:
                yield (
                    (*path, "fractional"),
                    f"pool {pool.name!r} lists no devices, so there is nothing to share; "
                    "remove fractional or list the pool's devices",
                )
            elif units > per:
                yield (
                    (*path, "accelerators"),
                    f"a fractional instance takes part of one device: at most {per} units of "
                    f"pool {pool.name!r} (its units_per_device), not {units}",
                )
        elif pool.devices is not None and units % per:
            yield (
                (*path, "accelerators"),
                f"pool {pool.name!r} splits each device into {per} units and this group takes "
                f"whole devices: ask for a multiple of {per}, or set resources.fractional: true "
                "to share a device",
            )
        for mid, m in g.models.items():
            cmd = getattr(m, "command", None)  # duck-typed, like the model-directory checks
            if cmd is not None and pool.devices is None and cmd.uses("gpu_ids"):
                yield (
                    ("groups", i, "models", mid, "command", "argv"),
                    f"the command uses {{gpu_ids}} but pool {pool.name!r} lists no devices; "
                    "list them (pools[].devices) so each instance gets its own",
                )
