"""A pool sized by the cluster, live in the controller (`control.inventory`): each tick
decides on the cluster's count, read every few seconds, a change is a `pool-size` event,
and `sluice scale` is checked against the count the cluster has, not the declared one."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.control import Controller, EventLog
from sluice.control.inventory import INVENTORY_S
from sluice.core import Conflict, ManualClock
from sluice.spec import Sealer, load_spec_text
from sluice.store import Store
from tests.integration.test_advisory import Supervisor

SPEC = """
instances: {runtime: ray, ray: {address: auto}}
pools:
  - {name: y, accelerator_type: Y, inventory: cluster, count: 1, memory_gb: 8}
groups:
  - name: chat
    owner: o
    business: b
    alert_channel: c
    models: {m: {runtime: sim}}
    resources: {pool: y, accelerators: 1, memory_gb: 1}
    replicas: 1
"""


@pytest.mark.asyncio
async def test_scale_is_checked_against_the_clusters_count_as_it_changes(tmp_path: Path) -> None:
    clock = ManualClock(1_800_000_000.0)
    store = Store.for_home(tmp_path)
    cluster = {"Y": 4}
    ctl = Controller(
        store,
        Supervisor(),  # type: ignore[arg-type]
        EventLog(store, clock),
        clock,
        lambda _: None,
        inventory=lambda: dict(cluster),
        sealer=Sealer(bytes(range(64))),
    )
    try:
        await ctl.load_state()
        await ctl.apply(load_spec_text(SPEC, "platform.yaml"), "tester", "test")
        await ctl.tick()
        assert await ctl.scale("chat", 4, "tester", "the cluster has 4") == 1  # declared: 1
        cluster["Y"] = 2  # two nodes left
        clock.advance(INVENTORY_S)
        await ctl.tick()
        with pytest.raises(Conflict, match="has 2 accelerators"):
            await ctl.scale("chat", 3, "tester", "more than the cluster has")
        sizes = [
            (e.detail["before"], e.detail["after"])
            for e in reversed(store.list_events(group="chat", limit=50))
            if e.kind == "pool-size"
        ]
        assert sizes == [(None, 4), (4, 2)]
    finally:
        await ctl.close()
        store.close()
