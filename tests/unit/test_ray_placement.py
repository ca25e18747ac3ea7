"""What an instance's Ray actor asks the cluster for, read from its group and pool; the
pool inventory a cluster reports; the spec's `instances` block. No Ray needed."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sluice.control.servers import placement_of
from sluice.core import SpecError
from sluice.runtime import Placement
from sluice.runtime.ray import GPU_MARKER, accelerator_inventory, actor_resources
from sluice.spec import GroupSpec, PlatformSpec, PoolSpec, load_spec_text

SPEC = """
instances: {runtime: ray, ray: {address: "ray://head:10001", namespace: fleet-a}}
pools:
  - {name: gpu, accelerator: h200, accelerator_type: H200, count: 8, memory_gb: 141}
  - {name: cpu, accelerator_type: B, count: 4, memory_gb: 1}
groups:
  - name: chat
    owner: a
    business: b
    alert_channel: c
    models: {m: {runtime: sim}}
    resources: {pool: gpu, accelerators: 2, memory_gb: 1}
"""


def group(pool: str, accelerators: int) -> GroupSpec:
    return GroupSpec.model_validate(
        {
            "name": "g",
            "owner": "a",
            "business": "b",
            "alert_channel": "c",
            "models": {"m": {"runtime": "sim"}},
            "resources": {"pool": pool, "accelerators": accelerators, "memory_gb": 1},
        }
    )


def test_a_gpu_pool_asks_for_gpus_and_a_sliver_of_the_nodes_type_marker() -> None:
    """Ray marks a GPU node `accelerator_type:<type>` = 1, one per node: asking for one
    per accelerator would never place an instance of 2 GPUs."""
    pool = PoolSpec(name="gpu", accelerator="h200", accelerator_type="H200", count=8, memory_gb=1)
    placement = placement_of(group("gpu", 2), pool)
    assert placement == Placement(2, "H200", gpu=True)
    assert actor_resources(placement) == (2.0, {"accelerator_type:H200": GPU_MARKER})


def test_a_pool_of_virtual_units_asks_for_one_unit_of_its_type_per_accelerator() -> None:
    pool = PoolSpec(name="cpu", accelerator_type="B", count=4, memory_gb=1)
    placement = placement_of(group("cpu", 3), pool)
    assert placement == Placement(3, "B", gpu=False)
    assert actor_resources(placement) == (0.0, {"accelerator_type:B": 3.0})


def test_a_pool_without_a_type_places_anywhere() -> None:
    assert actor_resources(placement_of(group("p", 1), None)) == (0.0, {})
    untyped = PoolSpec(name="p", accelerator="a100", count=1, memory_gb=1)
    assert actor_resources(placement_of(group("p", 1), untyped)) == (1.0, {})


def test_inventory_counts_declared_units_and_gpus_of_one_type() -> None:
    declared = {"CPU": 4.0, "accelerator_type:A": 2.0, "accelerator_type:B": 2.0}
    assert accelerator_inventory(declared) == {"A": 2, "B": 2}
    gpu_nodes = {"CPU": 64.0, "GPU": 16.0, "accelerator_type:H200": 2.0}  # two 8-GPU nodes
    assert accelerator_inventory(gpu_nodes) == {"H200": 16}
    assert accelerator_inventory({"CPU": 2.0}) == {}


def test_the_instances_block_selects_the_runtime_and_defaults_to_local() -> None:
    spec = load_spec_text(SPEC, "ray.yaml").spec
    assert spec.instances.runtime == "ray"
    assert (spec.instances.ray.address, spec.instances.ray.namespace) == (
        "ray://head:10001",
        "fleet-a",
    )
    plain = PlatformSpec.model_validate({"pools": [{"name": "p", "count": 1, "memory_gb": 1}]})
    assert plain.instances.runtime == "local"
    with pytest.raises(ValidationError):
        PlatformSpec.model_validate(
            {"instances": {"runtime": "k8s"}, "pools": [{"name": "p", "count": 1, "memory_gb": 1}]}
        )


def test_device_ids_are_refused_on_ray() -> None:
    """This machine's device ids mean nothing on a Ray node: Ray pins the GPUs itself."""
    text = SPEC.replace(
        "memory_gb: 141}", "memory_gb: 141, devices: ['0','1','2','3','4','5','6','7']}"
    )
    with pytest.raises(SpecError) as caught:
        load_spec_text(text, "ray.yaml")
    assert any("Ray pins each instance" in str(i) for i in caught.value.issues)
    load_spec_text(text.replace("runtime: ray", "runtime: local"), "local.yaml")
