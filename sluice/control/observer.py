"""The platform watching itself (O2, O3, S12), in its own task, off the request path and
out of the controller's tick: once a second it reads the gateway's counters and the
controller's view of the fleet, and

- gathers each group's minute (`sluice.policy.history.Accumulator`) and stores it when it
  ends, merging every finished hour into an hour row (a restart loses at most the minute
  in progress: `close` stores even that);
- hands the series of the last `alerts.window_s` to the alert rules (`Alerting`);
- follows every scaling change and failover up (`Followups`: "did it help?").

`history` answers `sluice history` and the reports from the stored rows.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sluice.control.autoscaling import TrafficSource
from sluice.control.events import EventLog
from sluice.control.followups import Followups
from sluice.core import Clock, InstanceState, InstanceStatus
from sluice.core.instances import ALIVE_STATES
from sluice.policy.accelerators import GIB, AcceleratorView
from sluice.policy.autoscale.base import TrafficSample
from sluice.policy.gain import NoGainHold
from sluice.policy.history import (
    HOUR_S,
    MINUTE_S,
    Accumulator,
    Rollup,
    SeriesContext,
    bucket_start,
    merge,
    series,
)
from sluice.policy.quota import Allocation
from sluice.policy.quota.budget import budget_shares
from sluice.policy.quota.metering import Meter
from sluice.policy.startup import (
    StartupReading,
    StartupState,
    follow_startups,
    starting_groups,
)
from sluice.spec import GroupSpec, PlatformSpec
from sluice.store import RollupRow
from sluice.store.ports import RollupRecords, StateRecords

__all__ = [
    "Observation",
    "Observer",
    "group_gauges",
    "series_context",
    "startup_readings",
    "stored_history",
    "stored_rollups",
]

log = logging.getLogger("sluice.observer")

READ_S = 1.0
"""How often the counters are read: alert durations and windows are whole seconds."""
SLICE_MAX_S = 5.0
"""Windows are merged from slices of at most this (a twelfth of the shortest window): an
alert over the default 60 s reads 12 slices a second per group, exact to 5 s."""
COMPACT_BACK_S = 14 * 86_400.0
"""On start, hours this far back without an hour row are merged from their minutes."""


@dataclass(frozen=True, slots=True)
class Observation:
    """The controller's side of one reading: the spec, the instances, the last quota round,
    the meter, the count in force per group and the failovers in force."""

    spec: PlatformSpec
    instances: Sequence[InstanceStatus]
    allocation: Allocation | None
    meter: Meter
    counts: Mapping[str, int]
    failovers: Mapping[str, str]
    accelerators: AcceleratorView = field(default_factory=AcceleratorView)
    """NVML's devices attributed to instances (empty: no pool lists devices)"""


class AlertSink(Protocol):
    """What the observer hands each reading's series to (`sluice.control.alerts`)."""

    async def evaluate(
        self,
        spec: PlatformSpec,
        values_by_group: Mapping[str, Mapping[str, float | None]],
        now: float,
        starting: Mapping[str, StartupState] = ...,
    ) -> object: ...


_STARTING = (InstanceState.PENDING, InstanceState.STARTING, InstanceState.WARMING)


def series_context(g: GroupSpec | None) -> SeriesContext:
    if g is None or g.slo is None or g.slo.latency_ms is None:
        return SeriesContext()
    return SeriesContext(slo_latency_s=g.slo.latency_ms / 1000.0, slo_target=g.slo.target)


def group_gauges(
    obs: Observation,
    traffic: Mapping[str, TrafficSample],
    now: float,
    starting: Collection[str] = (),
) -> dict[str, dict[str, float]]:
    """Each group's gauges now (`sluice.policy.history.GAUGES`). `starting`: groups in
    their start-up grace (`sluice.policy.startup`), whose `no_ready_instance` reads 0."""
    spec, alloc, meter = obs.spec, obs.allocation, obs.meter
    by_state = Counter((i.group, i.state) for i in obs.instances)
    alive = Counter(i.group for i in obs.instances if i.state in ALIVE_STATES)
    ready = {g: n for (g, state), n in by_state.items() if state is InstanceState.READY}
    lent: dict[str, int] = {}
    borrowed: dict[str, int] = {}
    for loan in alloc.loans if alloc else ():
        borrowed[loan.borrower] = borrowed.get(loan.borrower, 0) + loan.units
        if loan.lender is not None:
            lent[loan.lender] = lent.get(loan.lender, 0) + loan.units
    shares = budget_shares(spec, alloc, meter, now)
    out = {}
    for g in spec.groups:
        name, sample = g.name, traffic.get(g.name)
        grant = alloc.grants.get(name) if alloc else None
        held = float(grant.units_held) if grant else 0.0
        rate = grant.spend_per_hour if grant else 0.0
        in_flight = float(sample.in_flight) if sample else 0.0
        busy = min(in_flight / g.max_concurrency, float(ready.get(name, 0)))
        gauges = {
            "ready_instances": float(ready.get(name, 0)),
            "instances": float(alive[name]),
            "starting_instances": float(sum(by_state[name, st] for st in _STARTING)),
            "draining_instances": float(by_state[name, InstanceState.DRAINING]),
            "no_ready_instance": float(
                obs.counts.get(name, 0) > 0 and not ready.get(name) and name not in starting
            ),
            "held_units": held,
            "guaranteed_units": float(g.quota.guaranteed),
            "busy_units": busy * g.resources.accelerators,
            "borrowed_units": float(borrowed.get(name, 0)),
            "lent_units": float(lent.get(name, 0)),
            "memory_gb": held / g.resources.accelerators * g.resources.memory_gb,
            "spend_per_hour": rate,
            "quota_refused": float(bool(alloc and name in alloc.refusals)),
        }
        if sample is not None:
            gauges["queue_length"] = float(sample.queued)
            gauges["in_flight"] = in_flight
        if name in shares:
            gauges["budget_used"] = shares[name]
        accel = (obs.accelerators.groups or {}).get(name)
        if accel is not None:  # a pool with devices, read by NVML
            gauges["accelerator_memory_used_gb"] = accel.used_bytes / GIB
            gauges["instances_over_estimate"] = float(accel.over_estimate)
            if accel.utilization is not None:
                gauges["accelerator_utilization"] = accel.utilization
        out[name] = gauges
    return out


def startup_readings(obs: Observation) -> dict[str, StartupReading]:
    """Each group's start-up reading (`sluice.policy.startup`): the count in force, the
    ready instances, the launch time of the newest failed one, and the time its spec allows
    a start (launch to ready, plus the warm-up when it warms up)."""
    ready = Counter(i.group for i in obs.instances if i.state is InstanceState.READY)
    failed: dict[str, float] = {}
    for i in obs.instances:
        if i.state is InstanceState.FAILED:
            failed[i.group] = max(failed.get(i.group, i.created_at), i.created_at)
    out = {}
    for g in obs.spec.groups:
        warmup = g.warmup.timeout_s if g.warmup.requests > 0 else 0.0
        out[g.name] = StartupReading(
            wanted=obs.counts.get(g.name, 0),
            ready=ready[g.name],
            allowance_s=g.health.startup_timeout_s + warmup,
            newest_failed_at=failed.get(g.name),
        )
    return out


def _host_load() -> float | None:
    """The host's 1-minute run queue per core: names the host as a shared bottleneck."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        return None


class _ObserverStore(RollupRecords, StateRecords, Protocol):
    """The rollups it keeps, and the follow-ups' state."""


class Observer:
    def __init__(
        self,
        store: _ObserverStore,
        events: EventLog,
        clock: Clock,
        traffic: TrafficSource | None,
        observe: Callable[[], Observation | None],
        alerts: AlertSink | None = None,
        host_load: Callable[[], float | None] = _host_load,
    ) -> None:
        """`observe`: the controller's view now (None before any spec); `alerts`: where the
        series go each reading (None: no alerting); `host_load`: run queue per core of the
        machine the instances run on (local runtime), for naming a shared bottleneck."""
        self._store = store
        self._clock = clock
        self._traffic = traffic
        self._observe = observe
        self._alerts = alerts
        self._host_load = host_load
        self._acc = Accumulator(keep_s=60.0)
        self.followups = Followups(store, events)
        self._hours_done: float | None = None
        """start of the newest hour already merged into an hour row"""
        self._unstored: list[tuple[str, float, Rollup]] = []
        self._startups: dict[str, StartupState] = {}
        """each group's start-up: while one is `starting`, no alert reads it as down"""

    async def load(self) -> None:
        await self.followups.load()
        latest = await asyncio.to_thread(self._store.latest_rollup, HOUR_S)
        self._hours_done = latest

    def holds(self) -> Mapping[str, NoGainHold]:
        """Groups whose scale-up is held because more instances did not help (S12)."""
        return self.followups.holds

    async def run(self) -> None:
        """Read once a second until cancelled; a failed reading is logged and the next one
        goes on (the history keeps what it could)."""
        while True:
            try:
                await self.step()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("observer reading failed; next one in %gs", READ_S)
            await asyncio.sleep(READ_S)

    async def step(self) -> None:
        obs = self._observe()
        if obs is None:
            return
        spec, now = obs.spec, self._clock.now()
        try:
            traffic = dict(self._traffic()) if self._traffic is not None else {}
        except Exception:  # the gateway's counters are unreadable: missing, not zero
            traffic = {}
        # the arithmetic runs in a worker thread: the gateway shares this event loop
        closed, values = await asyncio.to_thread(self._gather, obs, traffic, now)
        await self._keep(closed, now)
        if self._alerts is not None:
            starting = {g: s for g, s in self._startups.items() if s.phase == "starting"}
            await self._alerts.evaluate(spec, values, now, starting)

        def window(group: str, window_s: float) -> Mapping[str, float | None]:
            return self.values(spec.group(group), now, window_s, name=group)

        # the counts as they are now, read with no await before the follow-ups' look: a
        # no-gain hold set there covers every scale-up the controller has decided so far
        fresh = self._observe() or obs
        await self.followups.step(
            spec, fresh.counts, fresh.failovers, window, now, self._host_load()
        )

    def _gather(
        self, obs: Observation, traffic: Mapping[str, TrafficSample], now: float
    ) -> tuple[list[tuple[str, float, Rollup]], dict[str, dict[str, float | None]]]:
        """Take the reading; return the minutes it ended and each group's series over the
        alerts' window (a group not read yet is absent: its alerts stay as they are)."""
        spec = obs.spec
        o = spec.observability
        self._acc.keep_s = max(o.alerts.window_s, o.followup.window_s) + 2 * READ_S
        shortest = min(o.alerts.window_s, o.followup.window_s)
        self._acc.slice_s = min(SLICE_MAX_S, max(READ_S, shortest / 12))
        self._startups = follow_startups(self._startups, startup_readings(obs), now)
        starting = starting_groups(self._startups)
        for name, gauges in group_gauges(obs, traffic, now, starting).items():
            self._acc.observe(name, traffic.get(name), gauges, now)
        self._acc.forget(g.name for g in spec.groups)
        values = {}
        if self._alerts is not None:
            for g in spec.groups:
                w = self._acc.window(g.name, now, o.alerts.window_s)
                if w is not None and w.seconds > 0:
                    values[g.name] = series(w, series_context(g))
        return self._acc.closed(), values

    def values(
        self, g: GroupSpec | None, now: float, window_s: float, name: str | None = None
    ) -> dict[str, float | None]:
        """The group's series over the last `window_s` seconds (all None before a reading)."""
        rollup = self._acc.window(name or (g.name if g else ""), now, window_s)
        return series(rollup or Rollup(start=now), series_context(g))

    async def close(self) -> None:
        """Store the minutes in progress too (a stop loses nothing observed)."""
        await self._keep(self._acc.flush(), self._clock.now(), final=True)

    async def _keep(
        self, closed: list[tuple[str, float, Rollup]], now: float, final: bool = False
    ) -> None:
        """Store finished minutes (kept in memory, up to an hour's, while the store refuses
        writes), then merge every hour that ended into its hour row."""
        self._unstored += closed
        if self._unstored:
            try:
                await asyncio.to_thread(self._store_minutes, self._unstored)
            except Exception:
                if final:
                    raise
                groups = len({g for g, _, _ in self._unstored})
                self._unstored = self._unstored[-60 * max(1, groups) :]
                minutes = len({m for _, m, _ in self._unstored})
                log.warning("metrics history not stored yet (%d minutes wait)", minutes)
                return
            self._unstored = []
        this_hour = bucket_start(now, HOUR_S)
        if self._hours_done is None:
            self._hours_done = bucket_start(now - COMPACT_BACK_S, HOUR_S) - HOUR_S
        while self._hours_done + HOUR_S < this_hour:
            hour = self._hours_done + HOUR_S
            await asyncio.to_thread(self._compact, hour)
            self._hours_done = hour

    def _store_minutes(self, minutes: Sequence[tuple[str, float, Rollup]]) -> None:
        """Write minutes, merged with any row already stored for the same minute (the part
        of it a stopped observer kept, or a second observer's: nothing is counted twice,
        since each counts only what grew after its own first reading)."""
        first, last = min(m[1] for m in minutes), max(m[1] for m in minutes)
        stored = {
            (r.group, r.start): Rollup.from_json(r.start, r.data)
            for r in self._store.read_rollups(MINUTE_S, first, last + MINUTE_S)
        }
        rows = {}
        for group, start, rollup in minutes:
            before = stored.get((group, start))
            both = merge([before, rollup], start=start) if before is not None else rollup
            assert both is not None
            stored[group, start] = both
            rows[group, start] = RollupRow(group, MINUTE_S, start, both.to_json())
        self._store.write_rollups(list(rows.values()))

    def _compact(self, hour: float) -> None:
        """Merge the minutes of `hour` into one row per group (none: nothing observed)."""
        by_group: dict[str, list[Rollup]] = {}
        for row in self._store.read_rollups(MINUTE_S, hour, hour + HOUR_S):
            by_group.setdefault(row.group, []).append(Rollup.from_json(row.start, row.data))
        rows = []
        for group, minutes in by_group.items():
            merged = merge(minutes, start=hour)
            assert merged is not None
            rows.append(RollupRow(group, HOUR_S, hour, merged.to_json()))
        self._store.write_rollups(rows)


def stored_history(
    store: RollupRecords,
    spec: PlatformSpec | None,
    groups: Sequence[str] | None,
    since: float,
    until: float,
    step_s: int,
) -> dict[str, Any]:
    """`Observer.history`, from the store alone (a fleet need not be running)."""
    step_s = max(MINUTE_S, int(step_s) // MINUTE_S * MINUTE_S)
    out: dict[str, Any] = {}
    for group, rollups in stored_rollups(store, groups, since, until, step_s).items():
        ctx = series_context(spec.group(group) if spec else None)
        out[group] = [{"start": r.start, **_rounded(series(r, ctx))} for r in rollups]
    return {"since": since, "until": until, "step_s": step_s, "groups": out}


def stored_rollups(
    store: RollupRecords,
    groups: Sequence[str] | None,
    since: float,
    until: float,
    step_s: int,
) -> dict[str, list[Rollup]]:
    """Each group's stored rollups from `since` to `until`, one per `step_s` bucket (a
    multiple of 60; oldest first, groups by name): hour rows where the step is an hour or
    more, plus the minutes of the hours not merged yet; minute rows otherwise. What the
    history and the reports (`sluice report usage`) read."""
    step_s = max(MINUTE_S, int(step_s) // MINUTE_S * MINUTE_S)
    rows: list[RollupRow]
    if step_s >= HOUR_S:
        rows = store.read_rollups(HOUR_S, since, until, groups)
        done = max((r.start for r in rows), default=None)
        tail_from = since if done is None else done + HOUR_S
        rows += store.read_rollups(MINUTE_S, tail_from, until, groups)
    else:
        rows = store.read_rollups(MINUTE_S, since, until, groups)
    buckets: dict[str, dict[float, list[Rollup]]] = {}
    for row in rows:
        b = bucket_start(row.start, step_s)
        buckets.setdefault(row.group, {}).setdefault(b, []).append(
            Rollup.from_json(row.start, row.data)
        )
    out: dict[str, list[Rollup]] = {}
    for group, by_start in sorted(buckets.items()):
        merged = [merge(by_start[start], start=start) for start in sorted(by_start)]
        out[group] = [r for r in merged if r is not None]
    return out


def _rounded(values: Mapping[str, float | None]) -> dict[str, float | None]:
    return {k: None if v is None else round(v, 4) for k, v in values.items()}
