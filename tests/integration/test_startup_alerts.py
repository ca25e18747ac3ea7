"""No false alert on a first start (issue 38): the observer and the alerts' edge on a real
store, a group whose instances take 40 s to start: `no-ready-instance` is neither pending
nor firing through its start-up, nor after it (the window does not carry the start-up's
seconds), and `/v1/alerts`' report names the held group; a group that lost every ready
instance later still pages."""

from __future__ import annotations

import pytest

from sluice.control.alerts import Alerting
from sluice.control.events import EventLog
from sluice.control.observer import Observation, Observer
from sluice.core import InstanceState, InstanceStatus, ManualClock
from sluice.policy.quota.metering import Meter
from sluice.spec import PlatformSpec, load_spec_text
from sluice.store import Store

pytestmark = pytest.mark.asyncio

T0 = 1_796_000_400.0

SPEC = """
pools:
  - {name: gpu, count: 8, memory_gb: 16}
groups:
  - name: slow
    owner: sam@example.com
    business: search
    alert_channel: "#search"
    models: {m: {runtime: sim}}
    resources: {pool: gpu, memory_gb: 1}
    max_concurrency: 4
    replicas: 2
    health: {startup_timeout_s: 120}
"""


class Fleet:
    """The controller's view: `wanted` instances, each in `state`."""

    def __init__(self, spec: PlatformSpec, clock: ManualClock) -> None:
        self.spec = spec
        self.clock = clock
        self.wanted = 2
        self.state = InstanceState.STARTING
        self.launched = clock.now()

    def __call__(self) -> Observation:
        instances = [
            InstanceStatus(f"slow-{i}", "slow", "t", self.state, created_at=self.launched)
            for i in range(self.wanted)
        ]
        return Observation(self.spec, instances, None, Meter(), {"slow": self.wanted}, {})


async def run_for(
    observer: Observer, alerting: Alerting, clock: ManualClock, seconds: int
) -> set[str]:
    """Step once a second; every (phase, rule) seen on the way."""
    seen: set[str] = set()
    for _ in range(seconds):
        clock.advance(1.0)
        await observer.step()
        for a in alerting.firing():
            seen.add(f"{a['phase']} {a['rule']}")
    return seen


async def test_a_slow_first_start_raises_no_alert_and_a_later_outage_does(store: Store) -> None:
    clock = ManualClock(T0)
    events = EventLog(store, clock)
    alerting = Alerting(store, events, lambda g: f"sluice explain {g}")
    fleet = Fleet(load_spec_text(SPEC).spec, clock)
    observer = Observer(store, events, clock, None, fleet, alerts=alerting, host_load=lambda: None)
    await observer.load()
    await observer.step()

    seen = await run_for(observer, alerting, clock, 20)
    report = await alerting.report(fleet.spec)
    assert [h["group"] for h in report["starting"]] == ["slow"]
    assert report["starting"][0]["until"] == T0 + 120 + 60  # start-up + warm-up timeouts
    seen |= await run_for(observer, alerting, clock, 20)
    fleet.state = InstanceState.READY  # ready 40 s after the start
    seen |= await run_for(observer, alerting, clock, 120)
    assert seen == set()
    assert (await alerting.report(fleet.spec))["starting"] == []

    # every ready instance lost: this one pages (no-ready-instance: for 30 s)
    fleet.state = InstanceState.FAILED
    seen = await run_for(observer, alerting, clock, 90)
    assert "firing no-ready-instance" in seen

    # a scale to zero, then up from zero: held again while the new ones start
    fleet.wanted = 0
    await run_for(observer, alerting, clock, 120)
    fleet.wanted, fleet.state, fleet.launched = 1, InstanceState.STARTING, clock.now()
    seen = await run_for(observer, alerting, clock, 60)
    assert "pending no-ready-instance" not in seen and "firing no-ready-instance" not in seen
    assert [h["group"] for h in (await alerting.report(fleet.spec))["starting"]] == ["slow"]


async def test_a_start_that_runs_past_its_allowance_pages(store: Store) -> None:
    clock = ManualClock(T0)
    events = EventLog(store, clock)
    alerting = Alerting(store, events, lambda g: f"sluice explain {g}")
    fleet = Fleet(load_spec_text(SPEC).spec, clock)
    observer = Observer(store, events, clock, None, fleet, alerts=alerting, host_load=lambda: None)
    await observer.load()
    seen = await run_for(observer, alerting, clock, 179)
    assert seen == set()
    seen = await run_for(observer, alerting, clock, 90)
    assert "firing no-ready-instance" in seen
