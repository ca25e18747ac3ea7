"""The live side of autoscaling: turn gateway counters into `GroupLoad`s, once per interval.

The decisions are the pure policies of `sluice.policy.autoscale` (the simulator runs the
same objects); this module only keeps what a live run must remember between ticks: each
group's policy instance (rebuilt when its spec changes), a short history of traffic samples
(so p95 latency covers the last `LATENCY_WINDOW_S` exactly), and the measured start-up time.

Besides the gateway's counters, a group of command servers that expose metrics has their own
running and waiting counts (`ServerLoadSource`, scraped by `sluice.control.scraper`): they
set `GroupLoad.server_waiting` and, where larger, `in_flight` (`server_view`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from sluice.core import InstanceState, InstanceStatus
from sluice.policy.autoscale import Autoscaler, GroupLoad, build_autoscaler
from sluice.policy.autoscale.base import TrafficSample, window_quantile
from sluice.policy.server_metrics import ServerLoad, server_view
from sluice.spec import GroupSpec, PlatformSpec

__all__ = ["GroupScaling", "LiveAutoscaling", "ServerLoadSource", "TrafficSource"]

TrafficSource = Callable[[], Mapping[str, TrafficSample]]
"""The gateway's per-group counters (`Gateway.traffic`)."""
ServerLoadSource = Callable[[str, float], ServerLoad | None]
"""(group, now) -> what its servers' own metrics say, None when nothing fresh was scraped
(`ServerScraper.load`)."""

LATENCY_WINDOW_S = 10.0
"""p95 latency is taken over requests that finished in about this many seconds."""
STARTUP_EWMA = 0.3
"""Weight of the newest launch -> ready time in the group's start-up estimate."""


@dataclass
class GroupScaling:
    """What one autoscaled group's loop remembers."""

    policy: Autoscaler
    spec_key: str
    samples: deque[TrafficSample] = field(default_factory=deque)
    startup_s: float | None = None
    timed: set[str] = field(default_factory=set)
    """instances whose launch -> ready time is already in `startup_s`"""
    next_at: float = 0.0
    server: ServerLoad | None = None
    """what the group's servers said at its last decision, when scraped"""


class LiveAutoscaling:
    """Runs every autoscaled group's policy at its `interval_s`."""

    def __init__(
        self, traffic: TrafficSource | None, servers: ServerLoadSource | None = None
    ) -> None:
        self._traffic = traffic
        self._servers = servers
        self._groups: dict[str, GroupScaling] = {}

    def state(self, group: str) -> GroupScaling | None:
        return self._groups.get(group)

    def due(
        self,
        spec: PlatformSpec,
        observed: Sequence[InstanceStatus],
        target: Callable[[str], int],
        now: float,
    ) -> dict[str, GroupLoad]:
        """The load of every autoscaled group whose interval has come (its policy, in
        `scalers`, decides on it in the tick's decision step); `target(group)` is the count
        the previous decision set (what the policy calls `current`): for an advisory group,
        the count in force (`sluice.control.decisions`)."""
        scaled = [g for g in spec.groups if g.autoscaling is not None]
        self._groups = {g.name: self._groups[g.name] for g in scaled if g.name in self._groups}
        due = [g for g in scaled if now >= self._state_for(g, spec).next_at]
        if not due:
            return {}
        try:
            traffic = self._traffic() if self._traffic is not None else {}
        except Exception:  # the gateway's counters are unreadable: missing, not zero
            traffic = {}
        mine: dict[str, list[InstanceStatus]] = {}
        for inst in observed:
            mine.setdefault(inst.group, []).append(inst)
        loads = {}
        for g in due:
            st = self._groups[g.name]
            assert g.autoscaling is not None
            st.next_at = now + g.autoscaling.interval_s
            theirs = mine.get(g.name, [])
            self._time_startups(st, theirs)
            st.server = self._servers(g.name, now) if self._servers is not None else None
            loads[g.name] = self._load(
                g, st, traffic.get(g.name), theirs, target(g.name), now, st.server
            )
        return loads

    @property
    def scalers(self) -> dict[str, Autoscaler]:
        """Each autoscaled group's policy object (it keeps its own memory between ticks)."""
        return {name: st.policy for name, st in self._groups.items()}

    def _state_for(self, g: GroupSpec, spec: PlatformSpec) -> GroupScaling:
        assert g.autoscaling is not None
        # a switch of `mode` keeps the policy: what it learned while advising carries over
        knobs = g.autoscaling.model_dump_json(exclude={"mode"})
        key = knobs + repr(sorted(spec.schedule_templates.items()))
        st = self._groups.get(g.name)
        if st is None or st.spec_key != key:
            policy = build_autoscaler(g, spec.schedule_templates)
            st = GroupScaling(policy, key, startup_s=st.startup_s if st else None)
            self._groups[g.name] = st
        return st

    @staticmethod
    def _time_startups(st: GroupScaling, mine: Sequence[InstanceStatus]) -> None:
        for inst in mine:
            if inst.ready_at is None or inst.id in st.timed:
                continue
            st.timed.add(inst.id)
            took = inst.ready_at - inst.created_at
            st.startup_s = (
                took
                if st.startup_s is None
                else (1 - STARTUP_EWMA) * st.startup_s + STARTUP_EWMA * took
            )
        st.timed &= {i.id for i in mine}

    @staticmethod
    def _load(
        g: GroupSpec,
        st: GroupScaling,
        sample: TrafficSample | None,
        mine: Sequence[InstanceStatus],
        current: int,
        now: float,
        server: ServerLoad | None = None,
    ) -> GroupLoad:
        assert g.autoscaling is not None
        ready = sum(1 for i in mine if i.state is InstanceState.READY)
        draining = sum(1 for i in mine if i.state is InstanceState.DRAINING)
        startup = g.autoscaling.lead_time_s
        if startup is None:
            startup = st.startup_s if st.startup_s is not None else g.declared_startup_s()
        samples = st.samples
        if sample is not None:
            samples.append(sample)
            while len(samples) > 2 and samples[1].at <= sample.at - LATENCY_WINDOW_S:
                samples.popleft()
        # no counters this tick: the newest we have, marked as not fresh (never read as zero)
        src = sample or (samples[-1] if samples else TrafficSample(now, 0, 0, 0, 0, (), ()))
        in_flight, server_waiting = server_view(src.in_flight, server)
        return GroupLoad(
            at=src.at,
            current=current,
            ready=ready,
            slots_per_instance=g.max_concurrency,
            in_flight=in_flight,
            queued=src.queued,
            arrivals=src.arrivals,
            completions=src.completions,
            latency_p95_s=window_quantile(samples[0], sample, 0.95) if sample else None,
            startup_s=startup,
            draining=draining,
            fresh=sample is not None,
            server_waiting=server_waiting,
            served_s=src.served_s,
            served_sq_s=src.served_sq_s,
        )
