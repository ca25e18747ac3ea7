"""Whose accelerator memory is whose: device readings (NVML's, read at the edge by
`sluice.control.accelerators`) attributed to instances by process, and judged against
each instance's estimate.

An instance runs pinned to its devices (CUDA_VISIBLE_DEVICES); its memory on a device is
what NVML's running compute processes of that device hold whose pid is in the instance's
process tree. Where NVML names no process, or only pids this host cannot see (a container
hides the host's pids), the memory is "unknown", never zero. Utilization is NVML's per
device, not per process: an instance shows the mean over its devices, shared with whoever
else is on them.

Pure: readings, pids and estimates in, values out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "GIB",
    "OVER_MARGIN_BYTES",
    "OVER_RATIO",
    "AcceleratorView",
    "DeviceReading",
    "GroupAccelerators",
    "InstanceDevices",
    "InstanceMemory",
    "attribute",
    "far_above",
]

GIB = 1024**3
OVER_RATIO = 1.5
"""An instance is far above its estimate when it holds more than this times it ..."""
OVER_MARGIN_BYTES = GIB
"""... and more than this above it (a small model's 0.3 GiB over is noise)."""


@dataclass(frozen=True, slots=True)
class DeviceReading:
    """One device as NVML reads it. `processes`: pid -> bytes of its running compute
    processes (bytes None: NVML did not say); None when the platform hides them (no pid
    listed, or none this host can see)."""

    index: str
    uuid: str
    used_bytes: int
    total_bytes: int
    utilization: float | None
    """percent of the last sample period a kernel ran (None: not supported)"""
    processes: Mapping[int, int | None] | None

    def named(self, device: str) -> bool:
        """Whether `device` (as a pool lists it: index or UUID) is this one."""
        return device in (self.index, self.uuid)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "memory_used_bytes": self.used_bytes,
            "memory_total_bytes": self.total_bytes,
            "utilization": self.utilization,
            "processes": None if self.processes is None else len(self.processes),
        }


@dataclass(frozen=True, slots=True)
class InstanceDevices:
    """An instance, the devices it is pinned to and the pids of its process tree (none:
    its process runs where this host cannot see it)."""

    instance_id: str
    group: str
    devices: tuple[str, ...]
    pids: frozenset[int]
    estimate_bytes: int | None = None
    estimate_source: str = ""
    """'estimate' (the model's config, as `sluice estimate` reads it) or 'declared'
    (the group's resources.memory_gb)"""


@dataclass(frozen=True, slots=True)
class InstanceMemory:
    instance_id: str
    group: str
    devices: tuple[str, ...]
    used_bytes: int | None
    """None: unknown (`note` says why)"""
    utilization: float | None
    estimate_bytes: int | None
    estimate_source: str
    over_estimate: bool
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.used_bytes is None or not self.estimate_bytes:
            return None
        return self.used_bytes / self.estimate_bytes

    def to_json(self) -> dict[str, Any]:
        def gib(b: int | None) -> float | None:
            return None if b is None else round(b / GIB, 3)

        ratio = self.ratio
        return {
            "devices": list(self.devices),
            "memory_used_bytes": self.used_bytes,
            "memory_used_gib": gib(self.used_bytes),
            "memory": "unknown" if self.used_bytes is None else "measured",
            "utilization": self.utilization,
            "estimate_bytes": self.estimate_bytes,
            "estimate_gib": gib(self.estimate_bytes),
            "estimate_source": self.estimate_source,
            "measured_over_estimate": None if ratio is None else round(ratio, 3),
            "over_estimate": self.over_estimate,
            "note": self.note,
        }


@dataclass(frozen=True, slots=True)
class GroupAccelerators:
    """A group's instances together: memory they are known to hold, how many are unknown,
    the mean utilization of the devices they are on, and how many are far above their
    estimate."""

    group: str
    used_bytes: int
    unknown: int
    utilization: float | None
    over_estimate: int


@dataclass(frozen=True, slots=True)
class AcceleratorView:
    devices: tuple[DeviceReading, ...] = ()
    instances: Mapping[str, InstanceMemory] | None = None
    groups: Mapping[str, GroupAccelerators] | None = None
    error: str = ""
    """why the last read failed ('' when it did not)"""


def far_above(used_bytes: int | None, estimate_bytes: int | None) -> bool:
    """More than OVER_RATIO x the estimate and more than OVER_MARGIN_BYTES above it."""
    if used_bytes is None or not estimate_bytes:
        return False
    return used_bytes > OVER_RATIO * estimate_bytes and (
        used_bytes - estimate_bytes > OVER_MARGIN_BYTES
    )


def _mean(values: Iterable[float]) -> float | None:
    v = list(values)
    return sum(v) / len(v) if v else None


def _one(inst: InstanceDevices, readings: Sequence[DeviceReading]) -> InstanceMemory:
    mine = [r for d in inst.devices for r in readings if r.named(d)]
    util = _mean(r.utilization for r in mine if r.utilization is not None)
    used: int | None = None
    note = ""
    missing = [d for d in inst.devices if not any(r.named(d) for r in readings)]
    if missing:
        note = f"device(s) {', '.join(missing)} not read"
    elif not inst.pids:
        note = "its process ids are not visible here"
    else:
        total = 0
        for r in mine:
            if r.processes is None:
                note = f"device {r.index} shows no process ids (hidden by the platform)"
                break
            held = [b for pid, b in r.processes.items() if pid in inst.pids]
            if any(b is None for b in held):
                note = f"NVML does not say what its process holds on device {r.index}"
                break
            total += sum(b for b in held if b is not None)
        else:
            used = total
    return InstanceMemory(
        inst.instance_id,
        inst.group,
        inst.devices,
        used,
        util,
        inst.estimate_bytes,
        inst.estimate_source,
        far_above(used, inst.estimate_bytes),
        note,
    )


def attribute(
    readings: Sequence[DeviceReading], instances: Iterable[InstanceDevices]
) -> AcceleratorView:
    """Each instance's memory and utilization, and each group's sums."""
    each = {i.instance_id: _one(i, readings) for i in instances}
    groups: dict[str, GroupAccelerators] = {}
    for name in sorted({m.group for m in each.values()}):
        members = [m for m in each.values() if m.group == name]
        devices = {d for m in members for d in m.devices}
        utils = [
            r.utilization
            for r in readings
            if r.utilization is not None and any(r.named(d) for d in devices)
        ]
        groups[name] = GroupAccelerators(
            name,
            sum(m.used_bytes or 0 for m in members),
            sum(m.used_bytes is None for m in members),
            _mean(utils),
            sum(m.over_estimate for m in members),
        )
    return AcceleratorView(tuple(readings), each, groups)
