"""The fitted batching servers a live controller sizes its groups on (issue 36): each
autoscaled group's newest live load test with a fit (`sluice loadtest GROUP --fit`) stored
under the group's current model version, read from the store and handed to the tick kernel
as values (`sluice.policy.kernel.compile_spec`'s `servers`: the kernel reads no store).

The store is read at most every `REFRESH_S` seconds, and at the next tick after a load test
is recorded through this controller (`recorded`): a fit recorded through another controller
(or straight into a shared store) is seen within `REFRESH_S`. A new model version has no
fit until one is stored under it: the group sizes on its slots again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Protocol

from sluice.policy.autoscale.batching import ServerModel
from sluice.policy.kernel import FittedServer
from sluice.spec import GroupSpec, PlatformSpec
from sluice.store import CapacityRun

__all__ = ["REFRESH_S", "StoredFits", "fitted_server"]

log = logging.getLogger("sluice.fits")

REFRESH_S = 60.0
"""how often the store is read again for fits recorded elsewhere"""
LOOK_BACK = 20
"""a group's newest load tests looked through for one with a fit"""


class _Runs(Protocol):
    def list_capacity_runs(
        self, *, group: str | None = None, kind: str | None = None, limit: int = 20
    ) -> list[CapacityRun]: ...


def fitted_server(g: GroupSpec, runs: list[CapacityRun]) -> FittedServer | None:
    """The server of the newest of `runs` (newest first) that is a live load test of `g`'s
    current model version with a fitted step time (`ServerModel.from_fit`, at most
    `max_concurrency` sequences: the gateway sends no more); None where none is."""
    version = g.version_label()
    for r in runs:
        if r.kind != "loadtest" or r.mode != "live" or r.version != version:
            continue
        fit = r.report.get("fit")
        params = fit.get("params") if isinstance(fit, Mapping) else None
        if not isinstance(params, Mapping):
            continue
        try:
            server = ServerModel.from_fit(
                {k: float(v) for k, v in params.items() if isinstance(v, int | float)},
                g.max_concurrency,
            )
        except (TypeError, ValueError):
            continue
        if server is not None:
            return FittedServer(server, f"load test #{r.id} ({r.version})")
    return None


class StoredFits:
    """Each autoscaled group's newest stored fit (module docstring)."""

    def __init__(self, store: _Runs, refresh_s: float = REFRESH_S) -> None:
        self._store = store
        self._refresh_s = refresh_s
        self._next_at = float("-inf")
        self._servers: dict[str, FittedServer] = {}
        self._versions: dict[str, str] = {}
        """the model version each group's fits were read for"""

    def recorded(self) -> None:
        """A load test was just recorded: read the store again at the next tick."""
        self._next_at = float("-inf")

    async def refresh(self, spec: PlatformSpec, now: float) -> None:
        """Read the fits again when `REFRESH_S` has passed, a load test was recorded, or a
        group's model version changed; a store that cannot be read keeps the last ones."""
        scaled = [g for g in spec.groups if g.autoscaling is not None]
        versions = {g.name: g.version_label() for g in scaled}
        if now < self._next_at and versions == self._versions:
            return
        self._next_at = now + self._refresh_s
        try:
            found = await asyncio.to_thread(self._read, scaled) if scaled else {}
        except Exception as exc:  # the store is away: the fits we had stand, until the next
            log.warning("stored fits not read: %s", exc)
            return
        if found != self._servers:
            self._servers = found
        self._versions = versions

    def _read(self, groups: list[GroupSpec]) -> dict[str, FittedServer]:
        out = {}
        for g in groups:
            runs = self._store.list_capacity_runs(group=g.name, kind="loadtest", limit=LOOK_BACK)
            fitted = fitted_server(g, runs)
            if fitted is not None:
                out[g.name] = fitted
        return out

    def servers(self) -> Mapping[str, FittedServer]:
        """group -> its fitted server, as last read (the same mapping until a read)."""
        return self._servers
