"""Read the real accelerators behind pools that list `devices`, through NVML, and keep
each instance's and group's share (`sluice.policy.accelerators` attributes and judges).

The side effects live here and only here: NVML (`nvidia-ml-py`, module `pynvml`, imported
only once a pool lists devices; `pip install 'sluice[gpu]'`), the process table
(/proc: an instance's process tree is its pid, its descendants and its process group), and
the model directories the estimates come from. The NVML module is the seam: with
`SLUICE_NVML_MODULE=/path/to/file.py` set, that file is loaded in its place (for tests: a
fake that answers the few `nvml*` calls below from a JSON file; see
tests/e2e/fake_nvml.py). Nothing else reads it.

Reads run in a thread of their own task, every `POLL_S`, never in the controller's tick:
the tick says what to read (`watch`). A failed read (no NVML, no driver) is said once in
the log and in `status()`, and leaves every instance's memory unknown.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from sluice.core import ALIVE_STATES, InstanceState, InstanceStatus
from sluice.policy.accelerators import (
    GIB,
    AcceleratorView,
    DeviceReading,
    InstanceDevices,
    InstanceMemory,
    attribute,
)
from sluice.spec import GroupSpec, PlatformSpec, estimate_memory, read_model_dir

__all__ = [
    "NVML_MODULE_ENV",
    "AcceleratorWatch",
    "accelerator_metrics",
    "group_estimate",
    "load_nvml",
    "process_trees",
    "read_devices",
]

log = logging.getLogger("sluice.accelerators")

NVML_MODULE_ENV = "SLUICE_NVML_MODULE"
POLL_S = 2.0
_WATCHED = (*ALIVE_STATES, InstanceState.DRAINING)


def load_nvml(environ: Mapping[str, str] | None = None) -> ModuleType:
    """`pynvml`, or the file `SLUICE_NVML_MODULE` names (tests). ImportError with the fix
    when neither is there."""
    env = os.environ if environ is None else environ
    path = env.get(NVML_MODULE_ENV)
    if path:
        spec = importlib.util.spec_from_file_location("sluice_nvml_stand_in", path)
        if spec is None or spec.loader is None:
            raise ImportError(f"{NVML_MODULE_ENV}={path}: not a Python file")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        raise ImportError(
            "a pool lists devices but nvidia-ml-py is not installed "
            "(pip install 'sluice[gpu]'): accelerator memory is unknown"
        ) from None


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def read_devices(
    nvml: ModuleType, wanted: Iterable[str], visible: Mapping[int, object]
) -> list[DeviceReading]:
    """The devices named in `wanted` (index or UUID). `visible`: the pids this host shows
    (/proc); a device whose processes are none of them shows none (hidden)."""
    names = set(wanted)
    out = []
    for i in range(int(nvml.nvmlDeviceGetCount())):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        uuid = _text(nvml.nvmlDeviceGetUUID(h))
        if str(i) not in names and uuid not in names:
            continue
        mem = nvml.nvmlDeviceGetMemoryInfo(h)
        try:
            util: float | None = float(nvml.nvmlDeviceGetUtilizationRates(h).gpu)
        except nvml.NVMLError:
            util = None
        try:
            listed = list(nvml.nvmlDeviceGetComputeRunningProcesses(h))
        except nvml.NVMLError:
            listed = []
        procs: dict[int, int | None] = {}
        for p in listed:
            b = getattr(p, "usedGpuMemory", None)
            procs[int(p.pid)] = None if b is None else int(b)
        seen = any(pid in visible for pid in procs)  # none: hidden (a container)
        reading = DeviceReading(
            str(i), uuid, int(mem.used), int(mem.total), util, procs if seen else None
        )
        out.append(reading)
    return out


def _proc_table(root: Path) -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, process group) of every process this host shows."""
    table = {}
    for entry in root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        fields = stat[stat.rfind(")") + 2 :].split()
        table[int(entry.name)] = (int(fields[1]), int(fields[2]))
    return table


def process_trees(
    roots: Iterable[int], table: Mapping[int, tuple[int, int]]
) -> dict[int, frozenset[int]]:
    """Each root's process tree: itself, its descendants, and its process group (an
    instance runs in a session of its own, so the group holds what it forked)."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out = {}
    for root in roots:
        seen = {root} | {p for p, (_, pgrp) in table.items() if pgrp == root}
        todo = list(seen)
        while todo:
            for c in children.get(todo.pop(), ()):
                if c not in seen:
                    seen.add(c)
                    todo.append(c)
        out[root] = frozenset(seen)
    return out


def group_estimate(g: GroupSpec) -> tuple[int, str]:
    """What one instance of `g` should hold: `sluice estimate` of its models' directories
    (at the group's max_concurrency, over its accelerators), else its declared
    resources.memory_gb. Reads the directories: call it off the event loop."""
    total = 0
    for m in g.models.values():
        params = getattr(m, m.runtime, None)
        path = getattr(params, "model_path", None)
        if not isinstance(path, str) or not path:
            break
        try:
            mdir = read_model_dir(path)
            est = estimate_memory(
                mdir.config,
                concurrency=g.max_concurrency,
                devices=g.resources.accelerators,
                weight_bytes=mdir.weight_bytes,
            )
        except Exception:  # no directory, an unreadable config: the declared figure
            break
        total += est.total_bytes
    else:
        if total:
            return total, "estimate"
    return round(g.resources.memory_gb * GIB), "declared"


class AcceleratorWatch:
    """`watch(spec, observed)` from each tick; `view` the latest attribution."""

    def __init__(self, poll_s: float = POLL_S, proc: Path = Path("/proc")) -> None:
        self._poll_s = poll_s
        self._proc = proc
        self._spec: PlatformSpec | None = None
        self._targets: list[tuple[InstanceDevices, int | None]] = []
        self._watched: set[str] = set()
        self._wanted: tuple[str, ...] = ()
        self._estimates: dict[str, tuple[int, str]] = {}
        self._estimated_for: PlatformSpec | None = None
        self._nvml: ModuleType | None = None
        self._task: asyncio.Task[None] | None = None
        self.view = AcceleratorView()
        self.rounds = 0
        self._said = ""

    def watch(self, spec: PlatformSpec, observed: Sequence[InstanceStatus]) -> None:
        pools = {p.name: p for p in spec.pools if p.devices}
        self._wanted = tuple(d for p in pools.values() for d in p.devices or ())
        if not pools:
            self._targets = []
            self.view = AcceleratorView()
            return
        groups = {g.name: g for g in spec.groups if g.resources.pool in pools}
        self._spec = spec
        self._targets = targets = [
            (
                InstanceDevices(i.id, i.group, tuple(i.labels["devices"].split(",")), frozenset()),
                i.pid,
            )
            for i in observed
            if i.group in groups and i.state in _WATCHED and i.labels.get("devices")
        ]
        self._watched = {t.instance_id for t, _ in targets}
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="accelerators")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while self._wanted:
            try:
                self.view = await asyncio.to_thread(self._read, list(self._targets))
            except Exception as exc:  # no NVML, no driver: unknown, said once
                msg = f"{type(exc).__name__}: {exc}"
                if msg != self._said:
                    log.warning("accelerators not read: %s", msg)
                    self._said = msg
                self.view = AcceleratorView(error=msg)
            self.rounds += 1
            await asyncio.sleep(self._poll_s)

    def _read(self, targets: list[tuple[InstanceDevices, int | None]]) -> AcceleratorView:
        spec = self._spec
        if spec is not None and spec is not self._estimated_for:
            self._estimates = {g.name: group_estimate(g) for g in spec.groups}
            self._estimated_for = spec
        if self._nvml is None:
            self._nvml = load_nvml()
            self._nvml.nvmlInit()
        table = _proc_table(self._proc)
        trees = process_trees([pid for _, pid in targets if pid is not None], table)
        readings = read_devices(self._nvml, self._wanted, table)
        insts = []
        for inst, pid in targets:
            est, source = self._estimates.get(inst.group, (None, ""))
            pids = trees.get(pid, frozenset()) if pid is not None else frozenset()
            insts.append(
                InstanceDevices(inst.instance_id, inst.group, inst.devices, pids, est, source)
            )
        self._said = ""
        return attribute(readings, insts)

    def instance_json(self, instance_id: str) -> dict[str, Any] | None:
        """For `sluice get instances`: None where nothing is read (no devices)."""
        insts = self.view.instances
        m = (insts or {}).get(instance_id)
        if m is None and self.view.error and instance_id in self._watched:
            m = InstanceMemory(instance_id, "", (), None, None, None, "", False, self.view.error)
        return m.to_json() if m is not None else None

    def status(self) -> dict[str, Any]:
        return {
            "rounds": self.rounds,
            "error": self.view.error,
            "devices": [d.to_json() for d in self.view.devices],
        }

    def prometheus_text(self) -> bytes:
        return accelerator_metrics(self.view) if self._wanted else b""


class _Collector(Collector):
    def __init__(self, view: AcceleratorView) -> None:
        self._view = view

    def collect(self) -> Any:
        v = self._view

        def g(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=labels)

        il = ["group", "instance"]
        i_mem = g(
            "sluice_instance_accelerator_memory_bytes",
            "Accelerator memory the instance's processes hold (NVML; absent when unknown).",
            il,
        )
        i_unknown = g(
            "sluice_instance_accelerator_memory_unknown",
            "1 when the instance's accelerator memory is unknown (process ids hidden).",
            il,
        )
        i_util = g(
            "sluice_instance_accelerator_utilization_percent",
            "Mean utilization of the devices the instance is pinned to (NVML, per device).",
            il,
        )
        i_est = g(
            "sluice_instance_accelerator_memory_estimate_bytes",
            "What the instance should hold: sluice estimate, else resources.memory_gb.",
            il,
        )
        i_over = g(
            "sluice_instance_accelerator_over_estimate",
            "1 when the instance holds over 1.5x its estimate and over 1 GiB more.",
            il,
        )
        for m in (v.instances or {}).values():
            key = [m.group, m.instance_id]
            if m.used_bytes is not None:
                i_mem.add_metric(key, m.used_bytes)
            i_unknown.add_metric(key, float(m.used_bytes is None))
            if m.utilization is not None:
                i_util.add_metric(key, m.utilization)
            if m.estimate_bytes is not None:
                i_est.add_metric(key, m.estimate_bytes)
            i_over.add_metric(key, float(m.over_estimate))
        g_mem = g(
            "sluice_group_accelerator_memory_bytes",
            "Accelerator memory the group's instances are known to hold.",
            ["group"],
        )
        g_unknown = g(
            "sluice_group_accelerator_memory_unknown_instances",
            "The group's instances whose accelerator memory is unknown.",
            ["group"],
        )
        g_util = g(
            "sluice_group_accelerator_utilization_percent",
            "Mean utilization of the devices the group's instances are on.",
            ["group"],
        )
        g_over = g(
            "sluice_group_accelerator_over_estimate_instances",
            "The group's instances far above their memory estimate.",
            ["group"],
        )
        for a in (v.groups or {}).values():
            g_mem.add_metric([a.group], a.used_bytes)
            g_unknown.add_metric([a.group], a.unknown)
            if a.utilization is not None:
                g_util.add_metric([a.group], a.utilization)
            g_over.add_metric([a.group], a.over_estimate)
        dl = ["device", "uuid"]
        d_used = g("sluice_device_memory_used_bytes", "Device memory in use (NVML).", dl)
        d_total = g("sluice_device_memory_total_bytes", "Device memory (NVML).", dl)
        d_util = g("sluice_device_utilization_percent", "Device utilization (NVML).", dl)
        for d in v.devices:
            d_used.add_metric([d.index, d.uuid], d.used_bytes)
            d_total.add_metric([d.index, d.uuid], d.total_bytes)
            if d.utilization is not None:
                d_util.add_metric([d.index, d.uuid], d.utilization)
        yield from (i_mem, i_unknown, i_util, i_est, i_over, g_mem, g_unknown, g_util, g_over)
        yield from (d_used, d_total, d_util)


def accelerator_metrics(view: AcceleratorView) -> bytes:
    """The gauges above in Prometheus text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(view))
    return generate_latest(registry)
