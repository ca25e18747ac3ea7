"""One active controller at a time: the timing rules of a leader lease (Kubernetes' Lease
semantics, `client-go/tools/leaderelection`).

The lease is a row in the shared database: a holder, an `epoch` that grows at each change
of holder (the fencing token), and an expiry. The leader renews it every `retry_period_s`;
a standby tries to take it as often and may only once it has expired. The leader acts
(launches, stops, decides) only while its last successful renewal is younger than
`renew_deadline_s`, which is shorter than `lease_duration_s`: by the time a standby can
take an expired lease, a leader that could not renew has already stopped acting. The gap
(`lease_duration_s - renew_deadline_s`) must cover the clock skew between controller hosts
and a pause of the process (a GC, a stalled disk), as in Kubernetes.

Pure: times are handed in; the store does the compare-and-swap.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LeaseTiming", "may_act", "takeover_bound_s"]


@dataclass(frozen=True, slots=True)
class LeaseTiming:
    """Kubernetes' defaults: 15 s lease, 10 s renew deadline, 2 s retry period."""

    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError(
                "lease timing needs 0 < retry_period_s < renew_deadline_s < lease_duration_s "
                f"(got {self.retry_period_s:g}, {self.renew_deadline_s:g}, "
                f"{self.lease_duration_s:g}): a leader must stop acting before its lease "
                "can be taken"
            )


def may_act(last_renewed: float, now: float, timing: LeaseTiming) -> bool:
    """Whether a leader whose last successful renewal was at `last_renewed` may still act
    at `now` (both on its own monotonic clock)."""
    return 0.0 <= now - last_renewed < timing.renew_deadline_s


def takeover_bound_s(timing: LeaseTiming) -> float:
    """The longest a standby waits after the leader died without releasing the lease: the
    lease runs out, then the next try takes it."""
    return timing.lease_duration_s + timing.retry_period_s
