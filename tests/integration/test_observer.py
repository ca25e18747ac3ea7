"""The observer on a real store (SQLite, then PostgreSQL; O3, S12): minutes stored as they end,
hours merged from them, a restart loses at most the minute in progress, and a scale-up that
buys nothing is followed up as `no_gain` with a hold the next tick's decision obeys."""

from __future__ import annotations

import pytest

from sluice.control.events import EventLog
from sluice.control.observer import Observation, Observer, stored_history
from sluice.core import ManualClock
from sluice.policy.autoscale.base import TrafficSample
from sluice.policy.quota.metering import Meter
from sluice.spec import PlatformSpec, load_spec_text
from sluice.store import Store

pytestmark = pytest.mark.asyncio

T0 = 1_796_000_400.0  # a whole hour (UTC)
BOUNDS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

SPEC = """
pools:
  - {name: gpu, count: 8, memory_gb: 16}
observability:
  followup: {settle_s: 30, window_s: 20, hold_s: 600}
groups:
  - name: db
    owner: dana@example.com
    business: billing
    alert_channel: "#billing"
    models: {m: {runtime: sim}}
    resources: {pool: gpu, memory_gb: 1}
    max_concurrency: 4
    autoscaling: {min: 1, max: 8}
"""


class Traffic:
    """A group's cumulative counters as the gateway would report them: `rate` requests a
    second, each `latency_s` long, `in_flight` and `queued` as set."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.rate = 10.0
        self.latency_bucket = 2
        self.in_flight = 8
        self.queued = 20
        self.served_s = 0.4
        self._arrivals = 0.0
        self._counts = [0] * (len(BOUNDS) + 1)
        self._served = 0.0
        self._at = clock.now()

    def __call__(self) -> dict[str, TrafficSample]:
        now = self.clock.now()
        n = self.rate * (now - self._at)
        self._at = now
        self._arrivals += n
        self._counts[self.latency_bucket] += round(n)
        self._served += round(n) * self.served_s
        return {
            "db": TrafficSample(
                at=now,
                in_flight=self.in_flight,
                queued=self.queued,
                arrivals=round(self._arrivals),
                completions=sum(self._counts),
                latency_bounds=BOUNDS,
                latency_counts=tuple(self._counts),
                served_s=self._served,
            )
        }


class Fleet:
    def __init__(self, spec: PlatformSpec) -> None:
        self.spec = spec
        self.count = 2
        self.failovers: dict[str, str] = {}

    def __call__(self) -> Observation:
        return Observation(self.spec, [], None, Meter(), {"db": self.count}, self.failovers)


@pytest.fixture
def parts(store: Store) -> tuple[Store, ManualClock, EventLog, Traffic, Fleet]:
    clock = ManualClock(T0)
    return store, clock, EventLog(store, clock), Traffic(clock), Fleet(load_spec_text(SPEC).spec)


async def run_for(observer: Observer, clock: ManualClock, seconds: int) -> None:
    for _ in range(seconds):
        clock.advance(1.0)
        await observer.step()


async def test_minutes_are_stored_as_they_end_and_hours_merged_from_them(parts) -> None:
    store, clock, events, traffic, fleet = parts
    observer = Observer(store, events, clock, traffic, fleet, host_load=lambda: None)
    await observer.load()
    await observer.step()
    await run_for(observer, clock, 3 * 3600 + 90)
    minutes = store.read_rollups(60, T0, T0 + 4 * 3600)
    assert len(minutes) == 3 * 60 + 1  # the minute in progress is not stored yet
    hours = store.read_rollups(3600, T0, T0 + 4 * 3600)
    assert [h.start for h in hours] == [T0, T0 + 3600, T0 + 7200]
    assert hours[1].data["requests"] == 36_000
    doc = stored_history(store, fleet.spec, None, T0, T0 + 4 * 3600, 3600)
    points = doc["groups"]["db"]
    assert [p["requests"] for p in points[:3]] == [35_990, 36_000, 36_000]  # 1st: its 1st s
    assert points[3]["requests"] == 600  # the current hour, from its minutes
    assert 100 < points[1]["p95_ms"] <= 250  # the 0.1-0.25 s bucket, merged


async def test_a_restart_loses_at_most_the_minute_in_progress(parts) -> None:
    store, clock, events, traffic, fleet = parts
    observer = Observer(store, events, clock, traffic, fleet, host_load=lambda: None)
    await observer.load()
    await observer.step()
    await run_for(observer, clock, 150)
    await observer.close()  # a clean stop stores the minute in progress too
    stored = sum(r.data["requests"] for r in store.read_rollups(60, T0, T0 + 3600))
    assert stored == 1500
    again = Observer(store, events, clock, traffic, fleet, host_load=lambda: None)
    await again.load()
    await again.step()  # a baseline: nothing counted twice
    await run_for(again, clock, 60)
    await again.close()
    rows = store.read_rollups(60, T0, T0 + 3600)
    assert sum(r.data["requests"] for r in rows) == 1500 + 600
    assert len({r.start for r in rows}) == len(rows)


async def test_a_scale_up_that_buys_nothing_is_a_no_gain_and_holds_scale_up(parts) -> None:
    store, clock, events, traffic, fleet = parts
    observer = Observer(store, events, clock, traffic, fleet, host_load=lambda: 0.2)
    await observer.load()
    await observer.step()
    await run_for(observer, clock, 30)  # 2 instances, busy: 8 in flight, 20 queued
    fleet.count = 4  # the autoscaler adds two; the shared backend still does 10 req/s
    traffic.latency_bucket = 3
    traffic.served_s = 0.8
    traffic.in_flight = 16
    await run_for(observer, clock, 31)
    (followup,) = store.list_events(group="db", kinds=["followup"])
    assert followup.detail["verdict"] == "no_gain", followup.message
    assert "share outside the group" in followup.detail["bottleneck"]
    assert followup.detail["change"] == {
        "kind": "scale",
        "at": T0 + 31,
        "from": 2,
        "to": 4,
        "note": "",
    }
    assert observer.holds()["db"].count == 4
    # the hold survives a restart, and ends once the demand moves
    again = Observer(store, events, clock, traffic, fleet, host_load=lambda: 0.2)
    await again.load()
    assert again.holds()["db"].count == 4
    await again.step()
    traffic.rate = 20.0
    await run_for(again, clock, 25)
    assert "db" not in again.holds()
    (released,) = store.list_events(group="db", kinds=["no_gain_released"])
    assert "demand moved" in released.message


async def test_what_is_in_force_at_a_start_is_no_change_to_follow_up(parts) -> None:
    store, clock, events, traffic, fleet = parts
    fleet.failovers = {"db": "db"}  # in force since before this observer began
    observer = Observer(store, events, clock, traffic, fleet, host_load=lambda: None)
    await observer.load()
    await run_for(observer, clock, 40)
    assert store.list_events(group="db", kinds=["followup"]) == []
    fleet.failovers = {}  # a restore now is a change
    await run_for(observer, clock, 31)
    (restore,) = store.list_events(group="db", kinds=["followup"])
    assert restore.detail["change"]["kind"] == "restore"
