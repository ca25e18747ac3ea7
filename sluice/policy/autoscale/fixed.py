"""A fixed instance count: the baseline every other policy is measured against."""

from __future__ import annotations

from sluice.policy.autoscale.base import Decision, GroupLoad

__all__ = ["FixedPolicy"]


class FixedPolicy:
    """Always asks for `n` instances, whatever the load (benchmark baseline, manual groups)."""

    name = "fixed"

    def __init__(self, n: int) -> None:
        if n < 0:
            raise ValueError(f"fixed instance count = {n}, must be >= 0")
        self.n = n

    def decide(self, load: GroupLoad, now: float) -> Decision:
        """`n` instances; `load` and `now` are ignored."""
        return Decision(desired=self.n, reason=f"fixed at {self.n}", winner="fixed")
