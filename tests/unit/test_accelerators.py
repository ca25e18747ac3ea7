"""Accelerator memory attributed to instances by process (`sluice.policy.accelerators`),
and the edge's pieces that feed it: NVML through the seam (a fake module loaded where
pynvml would be), the process tree from a process table, the Prometheus gauges."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sluice.control.accelerators import (
    accelerator_metrics,
    load_nvml,
    process_trees,
    read_devices,
)
from sluice.policy.accelerators import (
    GIB,
    DeviceReading,
    InstanceDevices,
    attribute,
    far_above,
)

FAKE = str(Path(__file__).parents[1] / "e2e" / "fake_nvml.py")


def dev(
    index: str, procs: dict[int, int | None] | None, util: float | None = 50.0
) -> DeviceReading:
    return DeviceReading(index, f"GPU-{index}", 6 * GIB, 16 * GIB, util, procs)


def inst(
    iid: str, devices: tuple[str, ...], pids: set[int], est: float = 1.0, group: str = "chat"
) -> InstanceDevices:
    return InstanceDevices(iid, group, devices, frozenset(pids), int(est * GIB), "declared")


def test_two_instances_on_one_device_each_get_their_processes_memory() -> None:
    d0 = dev("0", {100: 1 * GIB, 101: GIB // 2, 200: 3 * GIB, 999: GIB})
    view = attribute([d0], [inst("a", ("0",), {100, 101}), inst("b", ("0",), {200})])
    assert view.instances is not None and view.groups is not None
    a, b = view.instances["a"], view.instances["b"]
    assert a.used_bytes == GIB + GIB // 2 and b.used_bytes == 3 * GIB
    assert a.utilization == b.utilization == 50.0  # the device's, shared
    assert not a.over_estimate and b.over_estimate  # 3 GiB against 1 GiB
    g = view.groups["chat"]
    assert (g.used_bytes, g.unknown, g.over_estimate, g.utilization) == (
        4 * GIB + GIB // 2,
        0,
        1,
        50.0,
    )
    doc = b.to_json()
    assert doc["memory"] == "measured" and doc["measured_over_estimate"] == 3.0


def test_an_instance_on_two_devices_sums_them_and_names_them_by_uuid_too() -> None:
    view = attribute(
        [dev("0", {7: GIB}, 20.0), dev("1", {8: 2 * GIB}, 60.0)],
        [inst("a", ("GPU-0", "1"), {7, 8}, est=2.0)],
    )
    assert view.instances is not None
    a = view.instances["a"]
    assert a.used_bytes == 3 * GIB and a.utilization == 40.0
    assert not a.over_estimate  # 1.5x but only 1 GiB over: not far above


def test_hidden_process_ids_make_memory_unknown_never_zero() -> None:
    view = attribute([dev("0", None)], [inst("a", ("0",), {1})])
    assert view.instances is not None and view.groups is not None
    a = view.instances["a"]
    assert a.used_bytes is None and "hidden" in a.note and not a.over_estimate
    assert a.to_json()["memory"] == "unknown"
    assert view.groups["chat"].unknown == 1 and view.groups["chat"].used_bytes == 0
    # no pid of its own (runs elsewhere), a device not read, NVML silent on bytes
    view = attribute(
        [dev("0", {5: None})],
        [inst("x", ("0",), set()), inst("y", ("3",), {5}), inst("z", ("0",), {5})],
    )
    assert view.instances is not None
    notes = {k: (m.used_bytes, m.note) for k, m in view.instances.items()}
    assert notes["x"][0] is None and "not visible" in notes["x"][1]
    assert notes["y"][0] is None and "not read" in notes["y"][1]
    assert notes["z"][0] is None and "does not say" in notes["z"][1]


def test_far_above_needs_both_the_ratio_and_the_margin() -> None:
    assert far_above(int(3.1 * GIB), 2 * GIB)  # 1.55x, 1.1 GiB over
    assert not far_above(int(2.9 * GIB), 2 * GIB)  # 1.45x
    assert not far_above(int(0.9 * GIB), GIB // 2)  # 1.8x but 0.4 GiB over
    assert not far_above(None, GIB) and not far_above(5 * GIB, None)


def test_process_trees_take_descendants_and_the_process_group() -> None:
    table = {10: (1, 10), 11: (10, 10), 12: (11, 12), 13: (1, 10), 20: (1, 20), 21: (20, 20)}
    trees = process_trees([10, 20], table)
    assert trees[10] == {10, 11, 12, 13} and trees[20] == {20, 21}


def test_the_seam_loads_a_fake_nvml_and_hides_pids_this_host_cannot_see(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "nvml.json"
    state.write_text(
        json.dumps(
            {
                "devices": [
                    {"uuid": "GPU-a", "memory_total": 16 * GIB, "memory_used": 4 * GIB,
                     "utilization": 30, "processes": [{"pid": 41, "used": GIB}]},
                    {"uuid": "GPU-b", "memory_total": 16 * GIB, "memory_used": 2 * GIB,
                     "utilization": None, "processes": [{"pid": 99999, "used": GIB}]},
                    {"uuid": "GPU-c", "memory_total": 16 * GIB, "memory_used": 0,
                     "utilization": 0, "processes": []},
                ]
            }
        )
    )  # fmt: skip
    monkeypatch.setenv("FAKE_NVML_STATE", str(state))
    nvml = load_nvml({"SLUICE_NVML_MODULE": FAKE})
    got = read_devices(nvml, ["0", "GPU-b", "2"], {41: (1, 41)})
    assert [(d.index, d.uuid) for d in got] == [("0", "GPU-a"), ("1", "GPU-b"), ("2", "GPU-c")]
    assert got[0].processes == {41: GIB} and got[0].utilization == 30.0
    assert got[1].processes is None and got[1].utilization is None  # pid 99999 not ours
    assert got[2].processes is None  # no pid listed at all: hidden, not "holds nothing"
    assert read_devices(nvml, ["GPU-c"], {})[0].index == "2"


def test_the_gauges_by_instance_group_and_device() -> None:
    view = attribute(
        [dev("0", {1: 3 * GIB, 2: GIB})], [inst("a", ("0",), {1}), inst("b", ("0",), {2})]
    )
    families = {
        f.name: f for f in text_string_to_metric_families(accelerator_metrics(view).decode())
    }
    samples = families["sluice_instance_accelerator_memory_bytes"].samples
    mem = {s.labels["instance"]: s.value for s in samples}
    assert mem == {"a": 3 * GIB, "b": GIB}
    over = families["sluice_group_accelerator_over_estimate_instances"].samples
    assert [(s.labels["group"], s.value) for s in over] == [("chat", 1.0)]
    util = families["sluice_device_utilization_percent"].samples
    assert util[0].labels == {"device": "0", "uuid": "GPU-0"} and util[0].value == 50.0


def test_the_history_gauges_and_the_alert_series_of_a_group_on_devices() -> None:
    from sluice.control.observer import Observation, group_gauges
    from sluice.policy.history import Rollup, series
    from sluice.policy.quota.metering import Meter
    from sluice.spec import load_spec_text

    spec = load_spec_text(
        "pools: [{name: gpu, accelerator: a, count: 2, memory_gb: 16, devices: [0],"
        " units_per_device: 2}]\n"
        "groups:\n  - {name: chat, owner: o@x, business: b, alert_channel: '#c',"
        " models: {m: {runtime: sim}}, replicas: 2,"
        " resources: {pool: gpu, accelerators: 1, fractional: true, memory_gb: 1}}\n"
    ).spec
    view = attribute(
        [dev("0", {1: 3 * GIB, 2: GIB})], [inst("a", ("0",), {1}), inst("b", ("0",), {2})]
    )
    obs = Observation(spec, (), None, Meter(), {"chat": 2}, {}, view)
    gauges = group_gauges(obs, {}, 0.0)["chat"]
    assert gauges["accelerator_memory_used_gb"] == 4.0
    assert gauges["accelerator_utilization"] == 50.0
    assert gauges["instances_over_estimate"] == 1.0
    values = series(Rollup.between(None, None, gauges, 60.0, 1.0))
    assert values["instances_over_estimate"] == 1.0  # what the default rule watches
    bare = group_gauges(Observation(spec, (), None, Meter(), {"chat": 2}, {}), {}, 0.0)
    assert "accelerator_memory_used_gb" not in bare["chat"]  # nothing read: no series
