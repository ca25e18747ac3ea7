"""The garbage collector's settings for the controller's process (`sluice up`, `sluice controller`).

CPython's defaults (a young collection every 700 container allocations, a full one every
100 young ones) suit short scripts. A controller's tick builds tens of thousands of
short-lived values (one frozen memory per autoscaled group, the plan, the records), so at
1,000 groups the defaults run a full collection, which walks every object the process
holds (the spec, the instances, every group's windows), every couple of ticks. Measured
with `bench/decide.py` (1,000 groups, 10,000 instances, 38 launches and drains a tick):
CPython's defaults, a median tick of 76.7 ms and a max of 175 ms; settled as here, 71.0 ms
and 85.9 ms (bench/README.md).

`settle()` runs once the process holds what it keeps for its lifetime (modules, the first
spec): it collects, then freezes what is left (`gc.freeze`: never walked again, still
freed by reference counting when dropped), and raises the thresholds. Cyclic garbage
waits longer for its collection, which costs memory only where cycles are made per tick
(none on the hot paths: frozen values and slotted objects).

A gateway on its own (`sluice gateway`) keeps CPython's defaults: settled the same way,
`bench/gateway.py`'s gateway served 2 % fewer requests a second (26,530 against 27,038 in
alternating 5 s rounds), and its objects live one request, not a tick. Under `sluice up`
the gateway shares the controller's process and its settings: there a full collection of
the controller's objects would pause requests too.
"""

from __future__ import annotations

import gc

__all__ = ["MIDDLE", "OLD", "YOUNG", "settle"]

YOUNG = 20_000
"""container allocations (less deallocations) between young collections"""
MIDDLE = 20
"""young collections between collections of the middle generation"""
OLD = 20
"""middle collections between full collections (CPython also waits for a quarter of the
long-lived objects to be new)"""


def settle() -> None:
    """Collect, freeze what survives, raise the thresholds (module docstring). Idempotent."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG, MIDDLE, OLD)
