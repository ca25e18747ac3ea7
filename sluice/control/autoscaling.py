"""The live sensor of autoscaling: each due group's `GroupLoad` from the gateway's counters.

The decisions are the tick kernel's (`sluice.policy.kernel`, which the simulator runs too:
it names the groups that are due and keeps each policy's memory); this module only keeps
what reading a live group's load needs: a short history of traffic samples (so p95
latency covers the last `LATENCY_WINDOW_S` exactly), the measured start-up time, and what
its servers said at the last reading.

Besides the gateway's counters, a group of command servers that expose metrics has their own
running and waiting counts (`ServerLoadSource`, scraped by `sluice.control.scraper`): they
set `GroupLoad.server_waiting` and, where larger, `in_flight` (`server_view`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields

from sluice.core import InstanceState, InstanceStatus
from sluice.policy.autoscale import GroupLoad, TokenLoad
from sluice.policy.autoscale.base import TrafficSample, window_quantile
from sluice.policy.server_metrics import ServerLoad, server_view
from sluice.spec import GroupSpec, PlatformSpec

__all__ = [
    "GroupScaling",
    "LiveAutoscaling",
    "ServerLoadSource",
    "TrafficSource",
    "with_tokens",
]

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
    """What reading one autoscaled group's load remembers."""

    samples: deque[TrafficSample] = field(default_factory=deque)
    startup_s: float | None = None
    timed: set[str] = field(default_factory=set)
    """instances whose launch -> ready time is already in `startup_s`"""
    server: ServerLoad | None = None
    """what the group's servers said at its last decision, when scraped"""


class LiveAutoscaling:
    """Reads the load of the autoscaled groups the kernel says are due."""

    def __init__(
        self, traffic: TrafficSource | None, servers: ServerLoadSource | None = None
    ) -> None:
        self._traffic = traffic
        self._servers = servers
        self._groups: dict[str, GroupScaling] = {}

    def state(self, group: str) -> GroupScaling | None:
        return self._groups.get(group)

    def read(
        self,
        spec: PlatformSpec,
        observed: Sequence[InstanceStatus],
        due: Collection[str],
        now: float,
        current: Callable[[str], int],
    ) -> dict[str, GroupLoad]:
        """The load of each group in `due`, with `current(group)` its count in force (the
        kernel's to check)."""
        scaled = {g.name: g for g in spec.groups if g.autoscaling is not None}
        self._groups = {n: st for n, st in self._groups.items() if n in scaled}
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
        for name in due:
            g = scaled.get(name)
            if g is None:
                continue
            st = self._groups.setdefault(name, GroupScaling())
            theirs = mine.get(name, [])
            self._time_startups(st, theirs)
            st.server = self._servers(name, now) if self._servers is not None else None
            sample = traffic.get(name)
            loads[name] = self._load(g, st, sample, theirs, current(name), now, st.server)
        return loads

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
        load = GroupLoad(
            at=src.at,
            current=current,
            ready=ready,
            slots_per_instance=g.max_concurrency,
            in_flight=in_flight,
            queued=src.queued,
            arrivals=src.arrivals,
            completions=src.completions,
            latency_p95_s=window_quantile(samples[0], sample, 0.95) if sample else None,
            ttft_p95_s=window_quantile(samples[0], sample, 0.95, "ttfb") if sample else None,
            tpot_p95_s=window_quantile(samples[0], sample, 0.95, "tpot") if sample else None,
            kv_cache_usage=server.kv_cache_usage if server is not None else None,
            startup_s=startup,
            draining=draining,
            fresh=sample is not None,
            server_waiting=server_waiting,
            served_s=src.served_s,
            served_sq_s=src.served_sq_s,
            standby_in_rotation=sample.standby_in_rotation if sample else 0,
        )
        return with_tokens(load, src)


def with_tokens(load: GroupLoad, sample: TrafficSample) -> GroupLoad:
    """`load` as a `TokenLoad` when the gateway read the usage of some of the group's
    answers (`sample.usage_answers`): a batching group is then sized on its server's
    capacity at the mean lengths (`SluicePolicy`); else `load` as it is (the value it was
    before tokens were counted). The means are those of the answers that carried usage: a
    stream answered without it (a group that does not ask for it, a server that ignores
    `stream_options`) has its chunks counted in the completion tokens but no prompt count,
    so it is left out of both (had its chunks counted against the usage answers alone, a
    group of mostly such streams would read its output many times too long). A gateway
    that does not count the usage answers' own completion tokens (an older one) gives all
    of them: long, on the safe side."""
    if sample.usage_answers <= 0:
        return load
    values = {f: getattr(load, f) for f in _LOAD_FIELDS}
    values["token_requests"] = sample.usage_answers
    values["prompt_tokens"] = sample.prompt_tokens
    values["output_tokens"] = sample.usage_completion_tokens or sample.completion_tokens
    return TokenLoad(**values)


_LOAD_FIELDS = tuple(f.name for f in fields(GroupLoad))
