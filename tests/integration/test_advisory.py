"""Advisory mode in the controller, against a real SQLite store (issue 16): an advisory
autoscaler decides and journals every tick while its group keeps the count in force; a
manual scale drives that count; a switch of mode never moves the fleet by itself; the
journal survives a restart; an advisory quota journals what it would grant."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sluice.control import Controller, EventLog
from sluice.control.explain import advisory_view, explain_decisions
from sluice.core import InstanceState, InstanceStatus, ManualClock
from sluice.policy import Endpoint
from sluice.policy.autoscale.base import TrafficSample
from sluice.spec import GroupSpec, Sealer, load_spec_text
from sluice.store import Store

SPEC = """
pools:
  - {{name: local, count: 8, memory_gb: 16}}
groups:
  - name: chat
    owner: o@example.com
    business: search
    alert_channel: "#ops"
    models:
      m: {{runtime: sim}}
    resources: {{pool: local, memory_gb: 1}}
    max_concurrency: 2
    replicas: 1
    autoscaling: {{mode: {mode}, min: 1, max: 5}}
    quota: {{mode: {quota}, limit: {limit}}}
tenants:
  - {{name: t, api_keys: [sk-t-12ccad2ae47ed66b]}}
"""

SEALER = Sealer(bytes(range(64)))
"""a fixed secrets key: a test's controllers on one store read each other's revisions"""


def spec(mode: str = "advisory", quota: str = "active", limit: int = 8) -> Any:
    return load_spec_text(SPEC.format(mode=mode, quota=quota, limit=limit), "test.yaml")


class Supervisor:
    """Instances that are just statuses: a launch is ready at once."""

    def __init__(self) -> None:
        self.changed = asyncio.Event()
        self.instances: dict[str, InstanceStatus] = {}
        self.launched = 0
        self.withheld_env: frozenset[str] = frozenset()

    def add(self, group: GroupSpec, now: float) -> str:
        iid = f"{group.name}-{len(self.instances)}"
        self.instances[iid] = InstanceStatus(
            iid, group.name, group.template(), InstanceState.READY, now, url="http://x:9"
        )
        return iid

    def statuses(self) -> list[InstanceStatus]:
        return list(self.instances.values())

    def ready_endpoints(self) -> dict[str, list[Endpoint]]:
        out: dict[str, list[Endpoint]] = {}
        for s in self.instances.values():
            out.setdefault(s.group, []).append(Endpoint(s.id, "127.0.0.1", 9, 2))
        return out

    def launch(self, spec: GroupSpec, template: str, reason: str, pool: object = None) -> str:
        self.launched += 1
        return self.add(spec, 0.0)

    def drain(self, instance_id: str, reason: str) -> None:
        self.instances.pop(instance_id, None)

    def remove(self, instance_id: str, reason: str) -> None:
        self.instances.pop(instance_id, None)


class Load:
    """The gateway's counters of a group that gets far more than one instance can take."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.arrivals = 0

    def __call__(self) -> dict[str, TrafficSample]:
        self.arrivals += 40
        now = self.clock.now()
        return {"chat": TrafficSample(now, 2, 30, self.arrivals, self.arrivals - 30, (), ())}


@contextlib.asynccontextmanager
async def controller(
    home: Path, text: Any = None, clock: ManualClock | None = None
) -> AsyncIterator[tuple[Controller, Supervisor, Store, ManualClock]]:
    clock = clock or ManualClock(1_800_000_000.0)
    store = Store.for_home(home)
    sup = Supervisor()
    ctl = Controller(
        store, sup, EventLog(store, clock), clock, lambda _: None, Load(clock), sealer=SEALER
    )  # type: ignore[arg-type]
    await ctl.load_state()
    if text is not None:
        await ctl.apply(text, "tester", "test")
    for g in ctl.spec.groups:
        while len([i for i in sup.instances.values() if i.group == g.name]) < g.replicas:
            sup.add(g, clock.now())
    try:
        yield ctl, sup, store, clock
    finally:
        await ctl.close()
        store.close()


async def ticks(ctl: Controller, clock: ManualClock, n: int) -> None:
    for _ in range(n):
        clock.advance(1.0)
        await ctl.tick()


def chat_count(sup: Supervisor) -> int:
    return sum(1 for i in sup.instances.values() if i.group == "chat")


@pytest.mark.asyncio
async def test_an_advisory_autoscaler_journals_its_advice_and_the_count_stays(
    tmp_path: Path,
) -> None:
    async with controller(tmp_path, spec()) as (ctl, sup, store, clock):
        for _ in range(8):
            await ticks(ctl, clock, 1)
            assert chat_count(sup) == 1 and ctl.desired_replicas("chat") == 1
        assert sup.launched == 0
        rows = store.list_decisions(group="chat", limit=50)
        assert rows and all(d.detail["mode"] == "advisory" for d in rows)
        assert all(d.current == 1 and d.detail["actual"] == 1 for d in rows)
        assert max(d.desired for d in rows) > 1  # what it would have done
        assert all(d.detail["signals"] for d in rows)  # the same reasons as an active one
        state = ctl.explain_state("chat")
        assert state["mode"] == "advisory" and state["desired"] == 1
        assert state["advised"]["desired"] > 1 and state["advised"]["actual"] == 1
        kinds = [e.kind for e in store.list_events(group="chat", limit=200)]
        assert "advice" in kinds and "autoscale" not in kinds
        explained = explain_decisions(rows, store.list_events(group="chat"), {})
        assert all(d["mode"] == "advisory" and d["launched"] == [] for d in explained)
        metrics = ctl.server_metrics().decode()
        assert 'sluice_group_desired_instances{group="chat"} 1' in metrics
        advised = state["advised"]["desired"]
        assert f'sluice_group_advised_instances{{group="chat",source="autoscaling"}} {advised}' in (
            metrics
        )

        # the operator still drives the count: `sluice scale` is allowed, and it is `current`
        assert await ctl.scale("chat", 2, "ops", "more") == 1
        await ticks(ctl, clock, 3)
        assert chat_count(sup) == 2 and sup.launched == 1
        assert store.list_decisions(group="chat", limit=1)[0].current == 2


@pytest.mark.asyncio
async def test_advice_survives_a_restart_and_an_active_switch_starts_from_the_real_count(
    tmp_path: Path,
) -> None:
    async with controller(tmp_path, spec()) as (ctl, sup, store, clock):
        await ctl.scale("chat", 2, "ops", "more")
        await ticks(ctl, clock, 5)
        newest = store.list_decisions(group="chat", limit=1)[0]
    async with controller(tmp_path, clock=clock) as (ctl, sup, store, clock):
        assert ctl.desired_replicas("chat") == 2  # the override, not the advice
        state = ctl.explain_state("chat")
        assert state["advised"] is None  # not decided since the restart: the journal's
        view = advisory_view(state, store.list_decisions(group="chat"), [], 10)
        assert view["advised"]["desired"] == newest.desired and view["advised"]["actual"] == 2

        await ctl.apply(spec("active"), "ops", "let it drive")
        assert ctl.desired_replicas("chat") == 2  # the count in force, not replicas (1)
        assert store.replicas_overrides() == {}  # an active group has none
        await ticks(ctl, clock, 4)
        assert ctl.desired_replicas("chat") > 2  # it learned while advising, and acts now
        assert chat_count(sup) == ctl.desired_replicas("chat")
        kinds = [e.kind for e in store.list_events(group="chat", limit=200)]
        assert "mode" in kinds and "autoscale" in kinds
        scaled = ctl.desired_replicas("chat")

        await ctl.apply(spec("advisory"), "ops", "watch again")
        assert ctl.desired_replicas("chat") == scaled  # kept, as an audited override
        assert store.replicas_overrides() == {"chat": scaled}
        await ticks(ctl, clock, 3)
        assert chat_count(sup) == scaled
        newest = store.list_decisions(group="chat", limit=1)[0]
        assert newest.detail["mode"] == "advisory" and newest.current == scaled


@pytest.mark.asyncio
async def test_an_advisory_quota_journals_its_clip_and_does_not_enforce_it(
    tmp_path: Path,
) -> None:
    async with controller(tmp_path, spec("active", quota="advisory", limit=2)) as (
        ctl,
        sup,
        store,
        clock,
    ):
        await ticks(ctl, clock, 6)
        assert ctl.desired_replicas("chat") > 2  # its limit is only advice
        assert chat_count(sup) == ctl.desired_replicas("chat")
        advice = ctl.explain_state("chat")["quota"]
        assert advice["mode"] == "advisory"
        assert advice["advice"]["advised"] == 2
        assert advice["advice"]["granted"] == ctl.desired_replicas("chat")
        assert "limit 2 units reached" in advice["advice"]["reason"]
        said = [e for e in store.list_events(group="chat", limit=200) if e.kind == "quota-advice"]
        assert said and said[0].detail["advised"] == 2
        assert "not enforced" in said[0].message
        assert len({e.message for e in said}) == len(said)  # said once per change
        metrics = ctl.server_metrics().decode()
        assert 'sluice_group_advised_instances{group="chat",source="quota"} 2' in metrics
        quota = await ctl.quota_report(3600, 0.5)
        assert quota["groups"][0]["mode"] == "advisory"
        assert quota["groups"][0]["advice"]["advised"] == 2


@pytest.mark.asyncio
async def test_an_advisory_autoscaler_meets_the_quota_it_would_have_met(tmp_path: Path) -> None:
    async with controller(tmp_path, spec(limit=2)) as (ctl, sup, store, clock):
        await ticks(ctl, clock, 6)
        rows = store.list_decisions(group="chat", limit=50)
        assert max(d.desired for d in rows) == 2  # clipped as an active one would be
        clipped = [d for d in rows if "quota" in d.detail["clipped_by"]]
        assert clipped and "limit 2 units reached" in clipped[0].reason
        assert chat_count(sup) == 1
