"""Pools sized by the cluster (`inventory: cluster`): which specs may ask for it, each
pool's count from a cluster reading, and the decision step on a pool that lost a node
(the allocator's shrink path: reserved groups keep theirs, the newest others drain)."""

from __future__ import annotations

import pytest

from sluice.core import InstanceState, InstanceStatus, SpecError
from sluice.policy import Drain
from sluice.policy.inventory import cluster_counts, inventory_changes, with_pool_counts
from sluice.policy.tick import TickInput, decide
from sluice.spec import PlatformSpec, load_spec_text

SPEC = """
instances: {runtime: ray, ray: {address: auto}}
pools:
  - {name: gpu, accelerator: h200, accelerator_type: H200, inventory: cluster, count: 6,
     memory_gb: 141}
  - {name: cpu, accelerator_type: B, count: 4, memory_gb: 1}
groups:
  - name: core
    owner: o
    business: core
    alert_channel: c
    models: {m-a: {runtime: sim}}
    resources: {pool: gpu, memory_gb: 1}
    replicas: 2
    quota: {guaranteed: 2, reserved: true}
  - name: batch
    owner: o
    business: ads
    alert_channel: c
    models: {m-b: {runtime: sim}}
    resources: {pool: gpu, memory_gb: 1}
    replicas: 4
    quota: {guaranteed: 4}
"""


def spec(text: str = SPEC) -> PlatformSpec:
    return load_spec_text(text, "platform.yaml").spec


def test_a_pool_counts_what_the_cluster_has_of_its_type() -> None:
    s = spec()
    assert cluster_counts(s, {"H200": 16, "B": 9}) == {"gpu": 16}  # cpu is declared
    assert cluster_counts(s, {"B": 9}) == {"gpu": 0}  # the last H200 node left
    sized = with_pool_counts(s, cluster_counts(s, {"H200": 4}))
    assert [(p.name, p.count) for p in sized.pools] == [("gpu", 4), ("cpu", 4)]
    assert inventory_changes({}, {"gpu": 6}) == [("gpu", None, 6)]
    assert inventory_changes({"gpu": 6}, {"gpu": 6}) == []
    assert inventory_changes({"gpu": 6}, {"gpu": 4}) == [("gpu", 6, 4)]


@pytest.mark.parametrize(
    ("edit", "field", "fix"),
    [
        (
            ("runtime: ray, ray: {address: auto}", "runtime: local"),
            "pools[0].inventory",
            "runtime: ray",
        ),
        (
            ("accelerator_type: H200, inventory", "inventory"),
            "pools[0].accelerator_type",
            "name it",
        ),
        (
            ("accelerator_type: B,", "accelerator_type: H200, inventory: cluster,"),
            "pools[1].accelerator_type",
            "one pool per accelerator type",
        ),
    ],
)
def test_a_cluster_sized_pool_needs_ray_a_type_and_a_type_of_its_own(
    edit: tuple[str, str], field: str, fix: str
) -> None:
    with pytest.raises(SpecError) as err:
        spec(SPEC.replace(*edit))
    text = str(err.value)
    assert field in text and fix in text, text


def test_replicas_beyond_the_fallback_count_are_not_refused_the_cluster_sizes_the_pool() -> None:
    assert spec(SPEC.replace("replicas: 4", "replicas: 9")).group("batch") is not None


def test_a_node_leaving_shrinks_the_pool_and_the_newest_unreserved_instances_drain() -> None:
    s = spec()
    fleet = [
        InstanceStatus(
            f"{g}-{k}", g, grp.template(), InstanceState.READY, 1000.0 + k + 10 * (g == "batch")
        )
        for g, n in (("core", 2), ("batch", 4))
        if (grp := s.group(g)) is not None
        for k in range(n)
    ]
    counts = {"core": 2, "batch": 4}
    whole = decide(TickInput(with_pool_counts(s, {"gpu": 6}), fleet, counts, now=2000.0))
    assert not [a for a in whole.actions if isinstance(a, Drain)]
    # a 2-GPU node left: 4 remain; core (reserved) keeps its 2, batch's newest 2 drain
    shrunk = decide(
        TickInput(with_pool_counts(s, cluster_counts(s, {"H200": 4})), fleet, counts, now=2000.0)
    )
    drained = sorted(a.instance_id for a in shrunk.actions if isinstance(a, Drain))
    assert drained == ["batch-2", "batch-3"], shrunk.actions
