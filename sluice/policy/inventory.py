"""Pools sized by the cluster (`inventory: cluster`, issue 21): the count a decision uses is
what the Ray cluster's nodes of the pool's accelerator type hold now, not a number in the
spec. A node joining grows the pool; a node leaving shrinks it, and the quota allocator's
shrink path then takes back the newest instances above their guarantees, reserved groups
keeping theirs first. Pure: the controller reads the cluster and passes the reading in.
"""

from __future__ import annotations

from collections.abc import Mapping

from sluice.core import SpecError, SpecIssue
from sluice.spec import PlatformSpec

__all__ = ["cluster_counts", "inventory_changes", "with_pool_counts"]


def cluster_counts(spec: PlatformSpec, inventory: Mapping[str, int]) -> dict[str, int]:
    """Each cluster-sized pool's count from a reading (accelerator type -> count): a type
    the cluster no longer has counts 0."""
    return {
        p.name: int(inventory.get(p.accelerator_type or "", 0))
        for p in spec.pools
        if p.inventory == "cluster"
    }


def with_pool_counts(spec: PlatformSpec, counts: Mapping[str, int]) -> PlatformSpec:
    """The spec with some pools' counts replaced; an unknown pool is a `SpecError`."""
    names = {p.name for p in spec.pools}
    bad = [
        SpecIssue("--pool", f"no pool named {n!r}; pools: {', '.join(sorted(names))}")
        for n in counts
        if n not in names
    ]
    bad += [
        SpecIssue("--pool", f"{n}={c}: a count must be >= 0") for n, c in counts.items() if c < 0
    ]
    if bad:
        raise SpecError(bad)
    if not counts:
        return spec
    pools = [p.model_copy(update={"count": counts.get(p.name, p.count)}) for p in spec.pools]
    return spec.model_copy(update={"pools": pools})


def inventory_changes(
    before: Mapping[str, int], after: Mapping[str, int]
) -> list[tuple[str, int | None, int]]:
    """(pool, count before (None: first reading), count now) for each pool that changed."""
    return [(p, before.get(p), n) for p, n in sorted(after.items()) if before.get(p) != n]
