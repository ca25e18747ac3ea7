"""One group as the data plane serves it: its instances, admission, outlier state (failures
and latency), settings.

A `GroupRuntime` lives across snapshots while its group exists, so queues, slots in use and
ejections survive a live update; `configure()` applies each new snapshot's view of it.

Clocks: `now` arguments named `now` are `time.monotonic()` seconds (admission, ejection);
slow start compares `Endpoint.ready_at` with the wall clock (`time.time()`), because
`ready_at` is the controller's wall-clock time.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from random import Random
from typing import TYPE_CHECKING, Final, Protocol

from sluice.gateway.metrics import DURATION_BUCKETS_S, GroupMetrics
from sluice.policy.admission import GroupAdmission
from sluice.policy.autoscale.base import TrafficSample
from sluice.policy.balance import RampHold, pick_affinity, pick_endpoint
from sluice.policy.latency import LatencyOutliers
from sluice.policy.outlier import Ejection, OutlierDetector
from sluice.policy.prefix import PrefixIndex, pick_prefix, prompt_blocks
from sluice.policy.reachability import Reachability
from sluice.policy.routing import STANDBY_HOLD_S, Endpoint, GroupTraffic, PrefixRouting
from sluice.policy.standby import over_level

if TYPE_CHECKING:
    from sluice.core.errors import SluiceError
    from sluice.gateway.samples import SampleRing

__all__ = ["GroupRuntime", "Waiter", "header_value"]

_NO_EJECTIONS: dict[str, Ejection] = {}
NO_PREFIX: Final = 1 << 62
"""`prefix_min_bytes` of a group without prefix-cache-aware choice: no body is that long."""


class Waiter(Protocol):
    """A request that waits in a group's queue for a slot (an `exchange.Exchange`, its own
    admission ticket): what the gateway state does with it once admission let it go."""

    def leave_queue(self, now: float) -> float:
        """Out of the queue (with a slot, or refused); the seconds it waited."""
        ...

    def resume(self) -> None:
        """It got a slot: proceed (on the next loop iteration)."""
        ...

    def refused_in_queue(self, err: SluiceError, reason: str, now: float) -> None:
        """Admission dropped it from the queue (`reason`): answer `err`."""
        ...


def _outlier_settings(t: GroupTraffic) -> tuple[int, float, int, float]:
    """What an OutlierDetector is built from; a change of it starts a fresh detector."""
    return (
        t.outlier_failures,
        t.outlier_base_ejection_s,
        t.outlier_max_ejected_percent,
        t.outlier_max_ejection_s,
    )


def _latency_settings(t: GroupTraffic) -> tuple[float, int]:
    """What a LatencyOutliers is built from; a change of it starts fresh estimates."""
    return (t.outlier_latency_ratio, t.outlier_latency_min_requests)


def _index_settings(p: PrefixRouting | None) -> tuple[int, int] | None:
    """What a PrefixIndex is built from; a change of it starts an empty index."""
    return None if p is None else (p.block_bytes, p.index_blocks)


class GroupRuntime:
    """Mutable per-group state of one gateway. Single-threaded (the event loop's)."""

    __slots__ = (
        "admission",
        "affinity",
        "candidates",
        "down_since",
        "endpoints",
        "latency",
        "metrics",
        "name",
        "outlier",
        "prefix",
        "prefix_index",
        "prefix_min_bytes",
        "promoted_until",
        "ramp",
        "ramping",
        "reach",
        "rotation",
        "samples",
        "settle_at",
        "sleeping",
        "sleeping_given",
        "slow_start_s",
        "standby",
        "standby_at",
        "standby_given",
        "timeout_s",
        "traffic",
        "unejects_at",
        "wake_refused",
        "waking",
        "was_up",
        "woken",
    )

    def __init__(self, name: str, metrics: GroupMetrics) -> None:
        self.name = name
        self.metrics = metrics
        self.traffic = GroupTraffic()
        self.admission: GroupAdmission[Waiter] = GroupAdmission(
            self.traffic.max_queue, self.traffic.max_wait_s
        )
        self.outlier = self._detector(self.traffic)
        self.reach = Reachability()
        """Instances that refused a connection: out of rotation, no panic (see `refresh`)."""
        self.latency = self._latency(self.traffic)
        """Per-instance latency estimates; None when latency ejection is off."""
        self.ramp = RampHold()
        """Ramp seconds each new instance's failures took back (slow start that listens)."""
        self.endpoints: tuple[Endpoint, ...] = ()
        """Its instances in rotation: the snapshot's, and its standby while promoted."""
        self.rotation: tuple[Endpoint, ...] = ()
        """The snapshot's instances in rotation."""
        self.standby: tuple[Endpoint, ...] = ()
        """Its warm standby, out of rotation until requests wait (`promote`): the snapshot's,
        and the sleeping standby this gateway woke."""
        self.standby_given: tuple[Endpoint, ...] = ()
        """The snapshot's warm standby."""
        self.sleeping_given: tuple[Endpoint, ...] = ()
        """The snapshot's sleeping standby."""
        self.sleeping: tuple[Endpoint, ...] = ()
        """The snapshot's sleeping standby that this gateway has not woken."""
        self.woken: set[str] = set()
        """Sleeping standby this gateway woke (requests waited), reported while promoted."""
        self.waking: dict[str, float] = {}
        """Sleeping standby being woken (wake calls under way): instance -> its slots (or
        its standby level)."""
        self.standby_at: float | None = None
        """The snapshot's standby level (`GroupTraffic.standby_at`) while it lists standby
        to take in, else None: what an admitted request checks (`over_level`)."""
        self.wake_refused: set[str] = set()
        """Sleeping standby that did not wake: passed over until the next snapshot."""
        self.promoted_until = 0.0
        """Monotonic time the promoted standby may leave rotation again; 0.0: not promoted."""
        self.candidates: tuple[Endpoint, ...] = ()
        """What the balancer picks from: endpoints reachable and not ejected (all reachable
        ones in panic mode); none when every instance refused a connection."""
        self.unejects_at = 0.0
        """Monotonic time the earliest ejection (or unreachable mark) ends; 0.0 if none."""
        self.down_since = 0.0
        """Monotonic time the group lost its last working instance; 0.0 while it has one, or
        never had one (see `holds`)."""
        self.was_up = False
        """It has had a working instance: one that never had any is not down (start-up)."""
        self.settle_at = 0.0
        """Wall-clock time the youngest instance leaves slow start."""
        self.ramping = False
        """Some instance may still be in slow start (so the balancer must read the clock)."""
        self.slow_start_s = 0.0
        self.timeout_s = self.traffic.timeout_s
        self.affinity: bytes | None = None
        self.prefix: PrefixRouting | None = None
        self.prefix_index: PrefixIndex | None = None
        """What this gateway sent each instance, for prefix-cache-aware choice (if on)."""
        self.prefix_min_bytes = NO_PREFIX
        """Bodies shorter than this hold no whole prompt block: the exchange passes no
        payload to `pick` for them (a JSON body is never shorter than its rendered prompt)."""
        self.samples: SampleRing | None = None
        """Where its answers are recorded while it is under canary analysis (else None)."""

    @staticmethod
    def _detector(t: GroupTraffic) -> OutlierDetector:
        return OutlierDetector(*_outlier_settings(t))

    @staticmethod
    def _latency(t: GroupTraffic) -> LatencyOutliers | None:
        ratio, min_requests = _latency_settings(t)
        return LatencyOutliers(ratio, min_requests) if ratio > 0 else None

    def configure(
        self,
        traffic: GroupTraffic,
        endpoints: tuple[Endpoint, ...],
        now: float,
        standby: tuple[Endpoint, ...] = (),
        sleeping: tuple[Endpoint, ...] = (),
    ) -> list[Waiter]:
        """Apply a snapshot's settings, instances in rotation, warm standby (promoted ones
        stay in while their hold lasts) and sleeping standby (what this gateway woke counts
        as warm); returns waiters admitted by new slots."""
        if _outlier_settings(self.traffic) != _outlier_settings(traffic):
            self.outlier = self._detector(traffic)
        if _latency_settings(self.traffic) != _latency_settings(traffic):
            self.latency = self._latency(traffic)
        self.traffic = traffic
        self.admission.max_queue = traffic.max_queue
        self.admission.max_wait_s = traffic.max_wait_s
        self.timeout_s = traffic.timeout_s
        self.slow_start_s = traffic.slow_start_s
        self.affinity = (
            traffic.affinity_header.lower().encode() if traffic.affinity_header else None
        )
        if traffic.prefix is None:
            self.prefix_index = None
        elif self.prefix_index is None or _index_settings(self.prefix) != _index_settings(
            traffic.prefix
        ):  # other blocks, or another size: what it holds no longer applies
            self.prefix_index = PrefixIndex(traffic.prefix.index_blocks)
        self.prefix = traffic.prefix
        self.prefix_min_bytes = NO_PREFIX if traffic.prefix is None else traffic.prefix.block_bytes
        self.rotation, self.standby_given, self.sleeping_given = endpoints, standby, sleeping
        self.standby_at = traffic.standby_at if standby or sleeping else None
        self.wake_refused.clear()
        self._place_standby()
        if not self.standby:  # the count took it all in: the promotion is over
            self.promoted_until = 0.0
            self.woken.clear()  # (one listed asleep again later is not this gateway's)
        self.endpoints = endpoints + self.standby if self.promoted_until else endpoints
        keep = {ep.instance_id for ep in endpoints + standby + sleeping}  # (kept for its turn)
        self.reach.forget(keep)
        self.ramp.forget(keep)
        self.settle_at = self.ramp.settle_at(self.endpoints, traffic.slow_start_s)
        self.ramping = traffic.slow_start_s > 0 and time.time() < self.settle_at
        self.outlier.forget(keep)
        self.metrics.prune(keep, now)  # per-instance counters of instances long gone
        if self.latency is not None:
            self.latency.forget(keep)
        if self.prefix_index is not None:
            self.prefix_index.forget(keep)
        return self.refresh(now)

    def _place_standby(self) -> None:
        """Warm standby: the snapshot's, and what this gateway woke of its sleeping standby
        (the controller lists that as sleeping until the gateway's report reaches it)."""
        listed = {ep.instance_id for ep in self.rotation + self.standby_given}
        self.woken &= listed | {ep.instance_id for ep in self.sleeping_given}
        woke = tuple(ep for ep in self.sleeping_given if ep.instance_id in self.woken)
        self.standby = self.standby_given + woke
        self.sleeping = tuple(ep for ep in self.sleeping_given if ep.instance_id not in self.woken)

    def over_level(self) -> float:
        """Requests beyond what its rotation serves within the SLO: positive, take the
        standby in (`sluice.policy.standby.over_level`)."""
        adm = self.admission
        return over_level(
            adm.in_use, adm.queue_length, self.traffic.standby_at, len(self.endpoints)
        )

    def awake(self, instance_id: str, now: float) -> list[Waiter]:
        """The sleeping standby `instance_id` answered its wake: it joins the warm standby,
        which requests waiting put in rotation (`promote`). Returns the waiters admitted."""
        self.woken.add(instance_id)
        self._place_standby()
        if self.promoted_until:
            self.endpoints = self.rotation + self.standby
            return self.refresh(now)
        return self.promote(now)

    def promote(self, now: float) -> list[Waiter]:
        """Requests wait: the warm standby joins the rotation at once, before the controller
        has seen the burst (the fast tier: loaded instances, no start-up), and stays in for
        `STANDBY_HOLD_S` after the last request that had to wait. Returns the waiters its
        slots admit."""
        if not self.standby:
            return []
        promoted = bool(self.promoted_until)
        self.promoted_until = now + STANDBY_HOLD_S
        if promoted:
            return []
        self.metrics.standby_promotions += 1
        self.endpoints = self.rotation + self.standby
        return self.refresh(now)

    def demote(self, now: float) -> bool:
        """The standby leaves the rotation again once its hold is over and nothing waits
        (requests it holds run to their end). Whether it is still promoted."""
        if not self.promoted_until:
            return False
        if now < self.promoted_until or self.admission.queue_length:
            return True
        self.promoted_until = 0.0
        self.woken.clear()  # the controller has placed them by now: awake, or to sleep again
        self._place_standby()
        self.endpoints = self.rotation
        self.refresh(now)  # (fewer slots: admits nobody)
        return False

    def refresh(self, now: float) -> list[Waiter]:
        """Recompute candidates and slots from the ejections in force at `now`; returns the
        waiters that slots freed by this admit.

        An instance that refused a connection is left out even in panic mode: it can serve
        nobody. So a group whose every instance refused has no candidates and no slots, and
        its requests wait (`holds`) until an instance is back, instead of failing.
        """
        ejected = self.outlier.ejected(now)
        unreachable = self.reach.unreachable(now)
        endpoints = self.endpoints
        if unreachable:
            endpoints = tuple(ep for ep in endpoints if ep.instance_id not in unreachable)
        if ejected:
            alive = tuple(ep for ep in endpoints if ep.instance_id not in ejected)
            self.candidates = alive or endpoints  # all ejected: panic mode, use them all
            self.unejects_at = min(e.until for e in ejected.values())
        else:
            self.candidates = endpoints
            self.unejects_at = 0.0
        if unreachable:
            soonest = min(unreachable.values())
            self.unejects_at = min(self.unejects_at, soonest) if self.unejects_at else soonest
        self._track_outage(now)
        return self.admission.set_slots(sum(ep.max_concurrency for ep in self.candidates))

    def _track_outage(self, now: float) -> None:
        """`down_since`: set when no candidate is left that is not suspect (see
        `Reachability`), cleared when one is; a group that never had one is not down."""
        reach = self.reach
        working = any(not reach.suspect(ep.instance_id) for ep in self.candidates)
        if working:
            self.down_since = 0.0
        elif not self.down_since and self.was_up:
            self.down_since = now
        self.was_up = self.was_up or working

    def holds(self, now: float) -> bool:
        """Whether a request with no instance to go to waits in the queue (else it is
        refused at once): in a scale-to-zero group always; in any other for `max_wait_s`
        after it lost its last working instance (every one refused a connection, or the
        controller's table has none left), so an outage shorter than a request may wait
        costs latency, not errors, and a longer one is refused without waiting."""
        if self.traffic.buffer_when_cold:
            return True
        return bool(self.down_since) and now - self.down_since < self.traffic.max_wait_s

    def unreachable(self, instance_id: str, now: float) -> list[Waiter]:
        """A connection to the instance failed (refused, unreachable, timed out): out of
        rotation at once (see `refresh`). Returns the waiters admitted if this changed the
        slots (it never adds any, but keep it uniform)."""
        if not any(ep.instance_id == instance_id for ep in self.endpoints):
            return []  # gone from the group since the request started
        if self.reach.failed(instance_id, now):
            return self.refresh(now)
        return []

    def reached(self, instance_id: str) -> list[Waiter]:
        """A connection to the instance succeeded; returns waiters admitted if it was out."""
        if self.reach.connected(instance_id):
            return self.refresh(time.monotonic())
        return []

    def ejected_now(self, now: float) -> dict[str, Ejection]:
        return self.outlier.ejected(now) if self.unejects_at else _NO_EJECTIONS

    # -- balancing ------------------------------------------------------------------------------

    def pick(
        self,
        headers: list[bytes],
        outstanding: Mapping[str, int],
        rng: Random,
        payload: object = None,
    ) -> Endpoint | None:
        """The instance for one request: affinity if configured and asked for, else by the
        prompt's cached prefix if configured and the prompt (`payload`, the parsed body) has
        a whole block, else p2c. A prefix-routed group's index learns from a lone instance
        too: what it holds still counts once the group grows."""
        candidates = self.candidates
        prefix = self.prefix
        if len(candidates) <= 1 and (payload is None or prefix is None or not candidates):
            return candidates[0] if candidates else None
        if self.affinity is not None:
            key = header_value(headers, self.affinity)
            if key is not None:
                ep = pick_affinity(candidates, key)
                if ep is not None and outstanding.get(ep.instance_id, 0) < ep.max_concurrency:
                    return ep
        if prefix is not None and payload is not None and self.prefix_index is not None:
            blocks = prompt_blocks(payload, prefix.block_bytes, prefix.max_blocks)
            if blocks:
                chosen = pick_prefix(
                    candidates, blocks, outstanding, self.prefix_index, prefix.epsilon
                )
                if chosen is not None:
                    self.prefix_index.sent(chosen.endpoint.instance_id, blocks)
                    self.metrics.prefix_blocks += len(blocks)
                    self.metrics.prefix_cached_blocks += chosen.cached
                    return chosen.endpoint
        if len(candidates) == 1:
            return candidates[0]
        if not self.ramping:  # the common case: no clock read, plain p2c
            return pick_endpoint(candidates, outstanding, rng, 0.0)
        wall = time.time()
        if wall >= self.settle_at:
            self.ramping = False
        return pick_endpoint(
            candidates, outstanding, rng, wall, self.slow_start_s, held=self.ramp.held
        )

    def pick_other(self, failed: Endpoint, outstanding: Mapping[str, int], rng: Random) -> Endpoint:
        """Another instance for a retry, or `failed` itself if it is the only one."""
        wall = time.time()
        slow_start = self.slow_start_s if self.ramping else 0.0
        other = pick_endpoint(
            self.candidates,
            outstanding,
            rng,
            wall,
            slow_start,
            skip=(failed.instance_id,),
            held=self.ramp.held,
        )
        return other if other is not None else failed

    # -- outcomes -------------------------------------------------------------------------------

    def failure(self, instance_id: str, reason: str, now: float) -> list[Waiter]:
        """An instance failed a request (connect error, broken response, 5xx); returns the
        waiters admitted if this changed the slots (it never adds any, but keep it uniform)."""
        ep = next((e for e in self.endpoints if e.instance_id == instance_id), None)
        if ep is None:
            return []  # gone from the group since the request started
        if self.ramping and self.ramp.failed(ep, time.time(), self.slow_start_s):
            self.settle_at = self.ramp.settle_at(self.endpoints, self.slow_start_s)
        ejection = self.outlier.record_failure(instance_id, now, len(self.endpoints), reason)
        if ejection is None:
            return []
        return self._ejected(instance_id, now)

    def answered(self, instance_id: str, status: int, latency_s: float) -> list[Waiter]:
        """An instance answered a request in full in `latency_s` seconds (from its first byte,
        less its queue wait); feeds latency ejection and slow start (which listens to latency
        only while latency ejection is on). A 5xx is a failure, counted by `failure`.
        Answers of an ejected instance (sent before it was ejected) are not counted: it is
        judged afresh on what it does once back. Returns the waiters admitted if an ejection
        changed the slots (panic mode can give them back)."""
        latency = self.latency
        if latency is None or status >= 500:
            return []
        if self.unejects_at and instance_id in self.ejected_now(time.monotonic()):
            return []
        why = latency.observe(instance_id, latency_s)
        if self.ramping:
            self._ramp_answered(instance_id, latency)
        if why is None:
            return []
        if not any(e.instance_id == instance_id for e in self.endpoints):
            return []  # gone from the group since the request started
        now = time.monotonic()
        if self.outlier.eject(instance_id, now, len(self.endpoints), why) is None:
            return []
        return self._ejected(instance_id, now)

    def _ramp_answered(self, instance_id: str, latency: LatencyOutliers) -> None:
        """Slow start that listens to latency: a ramping instance well above its peers'
        latency stops gaining share (`RampHold.answered`)."""
        ep = next((e for e in self.endpoints if e.instance_id == instance_id), None)
        if ep is None:
            return
        wall = time.time()
        ramping = wall - ep.ready_at < self.slow_start_s + self.ramp.held.get(instance_id, 0.0)
        lagging = ramping and latency.slower(instance_id)
        if self.ramp.answered(ep, wall, self.slow_start_s, lagging):
            self.settle_at = self.ramp.settle_at(self.endpoints, self.slow_start_s)

    def _ejected(self, instance_id: str, now: float) -> list[Waiter]:
        """`instance_id` was just ejected: its latency is judged afresh when it is back."""
        if self.latency is not None:
            self.latency.reset(instance_id)
        return self.refresh(now)

    def traffic_sample(self, at: float) -> TrafficSample:
        """The autoscaler's view of this group (read once a second, so summing is fine)."""
        counts = [0] * (len(DURATION_BUCKETS_S) + 1)
        server_errors = too_many = client_errors = 0
        for stats in self.metrics.routes.values():
            for i, n in enumerate(stats.duration.counts):
                counts[i] += n
            for status, n in stats.statuses.items():
                if status >= 500:
                    server_errors += n
                elif status == 429:
                    too_many += n
                elif status >= 400:
                    client_errors += n
        m = self.metrics
        return TrafficSample(
            at=at,
            in_flight=self.admission.in_use,
            queued=self.admission.queue_length,
            arrivals=self.metrics.arrivals,
            completions=sum(counts),
            latency_bounds=DURATION_BUCKETS_S,
            latency_counts=tuple(counts),
            served_s=m.served_s,
            served_sq_s=m.served_sq_s,
            server_errors=server_errors,
            too_many=too_many,
            client_errors=client_errors,
            shed=sum(m.shed.values()),
            queue_wait_bounds=m.queue_wait.bounds,
            queue_wait_counts=tuple(m.queue_wait.counts),
            ttfb_bounds=m.ttfb.bounds,
            ttfb_counts=tuple(m.ttfb.counts),
            tpot_bounds=m.tpot.bounds,
            tpot_counts=tuple(m.tpot.counts),
            prompt_tokens=sum(t[0] for t in m.tokens.values()),
            completion_tokens=sum(t[1] for t in m.tokens.values()),
            usage_answers=m.usage_answers,
            usage_completion_tokens=m.usage_completion,
            standby_in_rotation=len(self.endpoints) if self.promoted_until else 0,
            woken=tuple(sorted(self.woken)) if self.promoted_until else (),
        )

    def status(self, now: float) -> dict[str, object]:
        stats = self.admission.statistics()
        return {
            "slots": stats.slots,
            "in_use": stats.in_use,
            "queued": stats.queued,
            "instances": len(self.endpoints),
            "standby": len(self.standby),
            "standby_at": self.standby_at,
            "sleeping": len(self.sleeping),
            "woken": sorted(self.woken),
            "standby_promoted_s": round(max(0.0, self.promoted_until - now), 3)
            if self.promoted_until
            else None,
            "unreachable": sorted(self.reach.unreachable(now)),
            "ejected": [
                {
                    "instance": e.instance_id,
                    "until_s": round(max(0.0, e.until - now), 3),
                    "times": e.times,
                    "reason": e.reason,
                }
                for e in sorted(self.ejected_now(now).values(), key=lambda e: e.instance_id)
            ],
        }


def header_value(headers: list[bytes], name: bytes) -> str | None:
    """The value of request header `name` (lower-case) from the forwardable header pieces
    (name, ": ", value, CRLF), or None."""
    for i in range(0, len(headers), 4):
        if headers[i].lower() == name:
            return headers[i + 2].decode("latin-1")
    return None
