"""A fixed instance count: the baseline every other policy is measured against."""

from __future__ import annotations

from dataclasses import dataclass

from sluice.policy.autoscale.base import Decision, GroupLoad

__all__ = ["FixedPolicy", "NoMemory"]


@dataclass(frozen=True, slots=True)
class NoMemory:
    """The memory of a policy that remembers nothing."""


_NONE = NoMemory()


class FixedPolicy:
    """Always asks for `n` instances, whatever the load (benchmark baseline, manual groups).

    It remembers nothing, so it is both a `ScalingPolicy` (memory `NoMemory`) and, as it
    is, an `Autoscaler` (`decide`): it needs no `Stateful` adapter."""

    name = "fixed"

    def __init__(self, n: int) -> None:
        if n < 0:
            raise ValueError(f"fixed instance count = {n}, must be >= 0")
        self.n = n

    def initial(self) -> NoMemory:
        return _NONE

    def step(self, memory: NoMemory, load: GroupLoad, now: float) -> tuple[Decision, NoMemory]:
        """`n` instances; `load` and `now` are ignored, `memory` is passed on."""
        return self.decide(load, now), memory

    def decide(self, load: GroupLoad, now: float) -> Decision:
        """`n` instances; `load` and `now` are ignored."""
        return Decision(desired=self.n, reason=f"fixed at {self.n}", winner="fixed")
