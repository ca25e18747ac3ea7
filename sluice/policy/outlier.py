"""Outlier ejection for one group, after Envoy's consecutive-5xx detector, and the ejection
rules every detector shares.

An instance that fails `consecutive_failures` requests in a row (connection errors, 5xx) is
ejected for `base_ejection_s x times_ejected`, never longer than `max_ejection_s` (Envoy's
`max_ejection_time`); one success resets its count. The multiplier decays as in Envoy: for
every `base_ejection_s` an instance spends back in rotation without being ejected again, it
drops by one, so an instance that failed once a day ago starts again at the base. At most
`max_ejected_percent` of the group (but at least one instance, as Envoy) is ejected at once,
and if every candidate is ejected the balancer ignores ejection (panic mode) rather than
failing all requests.

Other detectors (`policy.latency`: slow, not failing) decide *that* an instance is an outlier
and call `eject`, so every ejection, whatever its cause, counts against the same cap and the
same decaying multiplier, as Envoy's detectors share one ejection state per host.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Ejection", "OutlierDetector"]


@dataclass(frozen=True, slots=True)
class Ejection:
    instance_id: str
    until: float
    times: int
    reason: str


class OutlierDetector:
    def __init__(
        self,
        consecutive_failures: int,
        base_ejection_s: float,
        max_ejected_percent: int,
        max_ejection_s: float = 300.0,
    ) -> None:
        self._threshold = consecutive_failures
        self._base = base_ejection_s
        self._max_pct = max_ejected_percent
        self._max_s = max(max_ejection_s, base_ejection_s)
        self._failures: dict[str, int] = {}
        self._times: dict[str, tuple[int, float]] = {}  # (multiplier, when it last ended)
        self._ejected: dict[str, Ejection] = {}

    def record_success(self, instance_id: str) -> None:
        if self._failures:
            self._failures.pop(instance_id, None)

    def record_failure(
        self, instance_id: str, now: float, group_size: int, reason: str
    ) -> Ejection | None:
        """Count a failure; returns the ejection if this one crossed the threshold."""
        count = self._failures.get(instance_id, 0) + 1
        self._failures[instance_id] = count
        if count < self._threshold:
            return None
        return self.eject(
            instance_id, now, group_size, f"{count} failures in a row, last: {reason}"
        )

    def eject(self, instance_id: str, now: float, group_size: int, reason: str) -> Ejection | None:
        """Eject `instance_id` for `base x times` (capped, decayed), unless it already is or
        the group has its `max_ejected_percent` out (at least one, as Envoy); `now`: seconds
        (monotonic); `group_size`: the group's ready instances, ejected ones included."""
        if instance_id in self.ejected(now):
            return None
        cap = max(1, self._max_pct * group_size // 100) if self._max_pct > 0 else 0
        if len(self._ejected) >= cap:
            return None
        times = self._decayed(instance_id, now) + 1
        until = now + min(self._base * times, self._max_s)
        self._times[instance_id] = (times, until)
        ejection = Ejection(instance_id, until, times, reason)
        self._ejected[instance_id] = ejection
        self._failures.pop(instance_id, None)
        return ejection

    def _decayed(self, instance_id: str, now: float) -> int:
        """The multiplier, less one per `base_ejection_s` healthy since the last ejection."""
        times, ended = self._times.get(instance_id, (0, now))
        healthy = max(0.0, now - ended)
        return max(0, times - int(healthy // self._base))

    def ejected(self, now: float) -> dict[str, Ejection]:
        """Instances ejected now (expired ejections are dropped here)."""
        if self._ejected:
            for iid in [i for i, e in self._ejected.items() if e.until <= now]:
                del self._ejected[iid]
        return self._ejected

    def forget(self, keep: set[str]) -> None:
        """Drop state of instances no longer in the group."""
        for table in (self._failures, self._times, self._ejected):
            for iid in [i for i in table if i not in keep]:
                del table[iid]
