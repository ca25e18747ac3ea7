"""Pools sized by the cluster (`inventory: cluster`, issue 21), live: the cluster's
accelerators are read every INVENTORY_S in a worker thread (Ray's call blocks), and each
tick decides on the spec with those counts (`sluice.policy.inventory`). A count that
changes is an event of every group in the pool."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from sluice.control.events import EventLog
from sluice.policy.inventory import cluster_counts, inventory_changes, with_pool_counts
from sluice.spec import PlatformSpec

__all__ = ["INVENTORY_S", "ClusterPools"]

log = logging.getLogger("sluice.inventory")

INVENTORY_S = 5.0
"""How often the cluster is read: a node that joins or leaves changes its pool within this
plus one tick."""


class ClusterPools:
    def __init__(self, read: Callable[[], Mapping[str, int]] | None, events: EventLog) -> None:
        """`read`: the cluster's accelerators per type now (None: no cluster to read)."""
        self._read = read
        self._events = events
        self._read_at = -INVENTORY_S
        self.counts: dict[str, int] = {}
        """pool -> the cluster's count at the last reading (cluster-sized pools only)"""

    async def sized(self, spec: PlatformSpec, now: float) -> PlatformSpec:
        """`spec` with each cluster-sized pool at the cluster's count: the last reading
        while the cluster does not answer, the spec's `count` before the first."""
        if self._read is None or not any(p.inventory == "cluster" for p in spec.pools):
            return spec
        if now - self._read_at >= INVENTORY_S:
            self._read_at = now
            try:
                reading = await asyncio.to_thread(self._read)
            except Exception as exc:
                log.warning("cluster inventory unread (%s): pools keep their last counts", exc)
            else:
                await self._take(spec, cluster_counts(spec, reading))
        return self.with_counts(spec)

    def with_counts(self, spec: PlatformSpec) -> PlatformSpec:
        sized = {p.name for p in spec.pools if p.inventory == "cluster"}
        return with_pool_counts(spec, {p: n for p, n in self.counts.items() if p in sized})

    async def _take(self, spec: PlatformSpec, counts: dict[str, int]) -> None:
        for pool, old, new in inventory_changes(self.counts, counts):
            was = "" if old is None else f" (was {old})"
            for g in spec.groups:
                if g.resources.pool == pool:
                    await self._events.emit(
                        g.name,
                        None,
                        "pool-size",
                        f"pool {pool!r} has {new} accelerators, the cluster's{was}",
                        pool=pool,
                        before=old,
                        after=new,
                    )
        self.counts = counts
