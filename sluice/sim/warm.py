"""Warm starts (issue 16): every policy, the oracle too, begins with the instance count the
oracle holds at t = 0, ready, so that no policy pays a cold start the oracle never pays.

Without a warm start a live policy starts at its spec's count (`SimOptions.initial` None)
and the oracle at its own t = 0 need, as before; `warm_start(work).options` are the
options that start every run (`run`, `oracle`, `causal`, `best_fixed`) at the warm count.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sluice.sim.oracle import OracleResult, oracle
from sluice.sim.single import SimOptions
from sluice.sim.workload import Workload

__all__ = ["WarmStart", "warm_start", "warm_start_count"]


@dataclass(frozen=True)
class WarmStart:
    """A warm start for one workload (issue 16): every policy begins with `count` instances
    ready at t = 0, the count the oracle holds at t = 0."""

    count: int
    options: SimOptions
    """the caller's options with `initial=count`: pass them to `run`, `oracle`, `causal`"""
    oracle: OracleResult
    """the search that defined `count` (`oracle(work)` from each candidate's own need); its
    run begins with `count` ready, so it is also a warm run of the oracle"""


def warm_start(work: Workload, opts: SimOptions | None = None) -> WarmStart:
    """The oracle's instance count at t = 0, and the options that start every policy there.

    The circularity (the oracle's plan depends on its initial fleet, and the warm start is
    the oracle's initial fleet) is cut by defining the count on the oracle as it runs
    without a warm start: each candidate begins with its own t = 0 need ready, i.e. a plan
    with the most it asks for over [0, startup_s + 1 s] (`PlanPolicy.start`, so that
    capacity launched later is ready in time), a fixed fleet with its N. The count is what
    the winning run holds at t = 0, so that run is a warm run of the oracle as it stands
    (`WarmStart.oracle`). `oracle(work, ws.options)` searches again with every candidate
    starting from the count; the old winner would run unchanged there (it started there
    already); one that needs more at t = 0 starts short of it, one that needs less drains
    the rest at once (on the shared traces it finds the same plan at the same cost).
    `opts.initial` is ignored here.

    When no candidate reaches the target the oracle reports its fleet at `max`, and the
    count is `max`."""
    base = opts or SimOptions()
    found = oracle(work, replace(base, initial=None))
    count = found.initial
    return WarmStart(count, replace(base, initial=count), found)


def warm_start_count(work: Workload, opts: SimOptions | None = None) -> int:
    """The oracle's instance count at t = 0 (see `warm_start`)."""
    return warm_start(work, opts).count
