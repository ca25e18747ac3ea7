"""How many slots a group needs to hold its latency objective: the queueing model behind the
Sluice policy's sizing (issue 16), pure and timescale-free.

The model. A group is a pool of `c` identical slots (instances x `max_concurrency`) fed by
one FIFO queue. Requests arrive at rate `lam` and hold a slot for a service time of mean
`s` and squared coefficient of variation `cs2`; the offered load is `a = lam x s` busy
slots (Erlangs). A request of service `x` meets a slowdown objective when it waits at most
`(slowdown - 1) x x + slack_s`, a fixed one (`latency_ms`) when it waits at most
`latency_ms - x`.

Two needs, both in slots; the policy takes the larger:

- **steady (G/G/c)**: in a stationary stretch, the share of requests that wait past their
  allowance is `C(c, a) x exp(-theta x slack) x (1 + theta x (slowdown - 1) x cs2) ^
  (-1 / cs2)`, where
  - `C(c, a)` is Erlang C, the chance of waiting at all (exact for M/M/c, close for M/G/c);
  - `theta = (c - a) / s x 2 / (ca2 + cs2)`: the wait of a waiting request is taken as
    exponential with the Allen-Cunneen mean, `(ca2 + cs2) / 2` times M/M/c's, `ca2` the
    arrivals' squared CV (1 for Poisson; the policy passes the measured dispersion);
  - the last factor averages `exp(-theta (slowdown - 1) x)` over service times `x` drawn
    from a gamma distribution with the measured mean and `cs2`: short requests have short
    allowances, so the mean allowance alone would be optimistic (Jensen).
  A fixed bound uses `exp(-theta x (latency_ms - s))`; with both, the worse. The need is
  the smallest `c` that keeps the share under `miss`, the part of the error budget
  (1 - target) given to steady-state queueing. It is what buys the margin Poisson noise
  demands: about `a + beta sqrt(a)` for large `a`, far more in relative terms when `a` is
  small. Checked against the simulator (fixed fleets, Poisson arrivals, the reference
  model's lognormal service, 4-96 slots at 40-95 % busy): where the measured share is over
  0.1 %, the model gives 0.8-2.3x of it (0.8x at 95 % busy and with cs2 0.68, 22 % low);
  below 0.1 % it is higher still, which costs nothing: those counts are not the binding ones.
- **burst (fluid envelope)**: work that arrives within any `T` seconds must be served
  within `T + w` (`w` the mean request's allowance): `c >= work(T) / (T + w)` for every
  `T`. Short bursts are absorbed by the wait the objective allows, long ones need their
  mean rate; the envelope takes the worst `T` of the recent arrivals, so it reads any
  trace's burst shape instead of assuming one.

Assumptions, and what they cost when wrong:
- Within a stretch the rate is steady and arrivals are no burstier than `ca2` says; a
  surge is the steady rate's and the envelope's business, a heavy service tail beyond the
  gamma fit makes real waits longer than predicted.
- Slots are independent (no slowdown when an instance is busy): true of the reference
  simulator, roughly true of batched LLM servers below their batch limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

# the Cython entry of scipy.special.pdtr: the same C function on the same doubles (the
# ufunc's loop for (int, float) is dd->d), without the ufunc's per-call dispatch (~1 us)
from scipy.special.cython_special import pdtr

from sluice.core.frozen import fast_init

__all__ = ["Objective", "burst_slots", "erlang_c", "steady_slots", "wait_allowance_s"]

_LOAD_STEP: Final = 0.01
"""offered load is rounded up to 1 % (log scale) before sizing, so the cached solver sees
few distinct inputs; rounding up keeps the answer on the safe side"""
_LOG_STEP: Final = math.log1p(_LOAD_STEP)
_MAX_SLOTS: Final = 1_000_000
_STEPS: Final = 20
"""objective terms are rounded to 1/20 (of a service time, of a squared CV)"""
_MIN_CV2, _MAX_CV2 = 0.02, 20.0
_RECURSE_UP_TO: Final = 24
"""below this many slots the recursion is cheaper than the closed form's special function"""


def wait_allowance_s(
    service_s: float, slowdown: float | None, slack_s: float, latency_ms: float | None
) -> float:
    """How long a request of the mean service time may wait and still meet its objective:
    the smaller of the slowdown and the fixed bound; never negative."""
    if slowdown is not None:
        allowance = (slowdown - 1.0) * service_s + slack_s
        if latency_ms is not None:
            allowance = min(allowance, latency_ms / 1000.0 - service_s)
    elif latency_ms is not None:
        allowance = latency_ms / 1000.0 - service_s
    else:
        return service_s
    return max(0.0, allowance)


def erlang_c(c: int, a: float) -> float:
    """Probability that an arrival waits at all in M/M/c with offered load `a` (1.0 when the
    queue is unstable, c <= a). Erlang B (`_erlang_b`), then C from B."""
    if a <= 0:
        return 0.0
    if c <= a:
        return 1.0
    b = _erlang_b(c, a)
    return c * b / (c - a * (1.0 - b))


def _erlang_b(c: int, a: float) -> float:
    """Erlang B (blocking probability of M/M/c/c): by its stable recursion for small `c` or
    an overloaded pool (c <= a, where the cdf below underflows), else in closed form, the
    Poisson pmf at `c` over its cdf: O(1) instead of O(c), as a batching server's group
    holds thousands of slots; the two agree to ~1e-12."""
    if c <= _RECURSE_UP_TO or c <= a:
        b = 1.0
        for k in range(1, c + 1):
            b = a * b / (k + a * b)
        return b
    return math.exp(c * math.log(a) - a - math.lgamma(c + 1)) / float(pdtr(c, a))


@fast_init
@dataclass(frozen=True, slots=True)
class Objective:
    """A latency objective in units of the mean service time `s`, and the variability the
    sizing assumes. A request of service `x` may wait `slowdown_wait x x + slack` (slowdown
    objective; `slowdown_wait` = slowdown - 1) and at most `fixed_wait` (fixed bound less
    `s`); None: that bound is not set."""

    slack: float
    slowdown_wait: float | None
    fixed_wait: float | None
    arrival_cv2: float
    """squared coefficient of variation of inter-arrival times (1: Poisson)"""
    service_cv2: float
    """squared coefficient of variation of service times (1: exponential)"""

    @classmethod
    def of(
        cls,
        service_s: float,
        slowdown: float | None,
        slack_s: float,
        latency_ms: float | None,
        arrival_cv2: float = 1.0,
        service_cv2: float = 1.0,
    ) -> Objective:
        """The objective for mean service `service_s`, rounded to the safe side (shorter
        waits, more variability) on coarse steps so the cached solver sees few inputs."""
        if slowdown is None and latency_ms is None:
            slowdown = 2.0  # no objective stated: a request may wait its own service time
        # waits rounded down and variability up to 1/_STEPS, the fields by position (every
        # group, every tick)
        floor, ceil = math.floor, math.ceil
        return cls(
            floor(slack_s / service_s * _STEPS) / _STEPS if slowdown is not None else 0.0,
            None if slowdown is None else floor((slowdown - 1.0) * _STEPS) / _STEPS,
            None
            if latency_ms is None
            else floor(max(0.0, latency_ms / 1000.0 / service_s - 1.0) * _STEPS) / _STEPS,
            ceil(max(arrival_cv2, 1.0) * _STEPS) / _STEPS,
            ceil(min(max(service_cv2, _MIN_CV2), _MAX_CV2) * _STEPS) / _STEPS,
        )

    def miss(self, c: int, load: float) -> float:
        """Share of requests that wait past their allowance with `c` slots (model above)."""
        if c <= load:
            return 1.0
        return self.miss_given_b(c, load, _erlang_b(c, load))

    def miss_given_b(self, c: int, load: float, b: float) -> float:
        """`miss` for c > load, given Erlang B of (c, load)."""
        waits = c * b / (c - load * (1.0 - b))
        cs2 = self.service_cv2
        # Allen-Cunneen: the wait tail of G/G/c decays (ca^2 + cs^2) / 2 times slower
        theta = (c - load) * 2.0 / (self.arrival_cv2 + cs2)  # per mean service time
        worst = 0.0
        if self.slowdown_wait is not None:
            # the allowance grows with the request's own service, gamma-distributed with the
            # measured mean and cs^2: E[exp(-theta k X)] = (1 + theta k cs^2)^(-1/cs^2)
            share = (1.0 + theta * self.slowdown_wait * cs2) ** (-1.0 / cs2)
            worst = max(worst, waits * math.exp(-theta * self.slack) * share)
        if self.fixed_wait is not None:
            worst = max(worst, waits * math.exp(-theta * self.fixed_wait))
        return worst


def steady_slots(load: float, objective: Objective, miss: float, at_least: int = 0) -> int:
    """Smallest slot count that keeps the share of requests waiting past their allowance
    <= `miss` at offered load `load` (Erlangs), by the model above. `at_least`: a count the
    answer is known not to be under, e.g. the answer at a smaller load for the same
    objective and `miss` (the share grows with the load at every count): the search skips
    the counts below it; the answer is the same."""
    if load <= 0:
        return 0
    rounded = math.exp(math.ceil(math.log(load) / _LOG_STEP) * _LOG_STEP)
    o = objective  # its terms, not itself, key the cache: a tuple of floats hashes in C
    terms = (o.slack, o.slowdown_wait, o.fixed_wait, o.arrival_cv2, o.service_cv2)
    return _steady_slots(rounded, *terms, miss, at_least)


@lru_cache(maxsize=16_384)
def _steady_slots(
    load: float,
    slack: float,
    slowdown_wait: float | None,
    fixed_wait: float | None,
    arrival_cv2: float,
    cs2: float,
    miss: float,
    at_least: int,
) -> int:
    """`steady_slots` at a rounded `load`, for the `Objective` with these terms."""
    # the miss share falls in c: scan up from the first stable count, carrying Erlang B
    # along (B(c) from B(c-1) is O(1)), so a search costs its steps, not O(load) per count.
    # Counts under `at_least` miss (the caller knows): B is carried past them unread, by
    # the same recursion, so every B read is the one the full scan would read.
    c = max(1, math.floor(load) + 1)
    b = _erlang_b(c, load)
    while c < at_least and c < _MAX_SLOTS:
        c += 1
        b = load * b / (c + load * b)
    # `Objective.miss_given_b` inlined (a call per count was half the search): the same
    # operations in the same order, so the same floats; max(worst, x) is `x > worst`
    spread = arrival_cv2 + cs2
    power = -1.0 / cs2
    exp = math.exp
    while c < _MAX_SLOTS:
        waits = c * b / (c - load * (1.0 - b))
        theta = (c - load) * 2.0 / spread
        worst = 0.0
        if slowdown_wait is not None:
            x = waits * exp(-theta * slack) * (1.0 + theta * slowdown_wait * cs2) ** power
            if x > worst:
                worst = x
        if fixed_wait is not None:
            x = waits * exp(-theta * fixed_wait)
            if x > worst:
                worst = x
        if not worst > miss:
            break
        c += 1
        b = load * b / (c + load * b)
    return min(c, _MAX_SLOTS)


def burst_slots(work_by_window: list[tuple[float, float]], wait_s: float) -> tuple[float, float]:
    """The fluid envelope: max over windows of work(T) / (T + wait). `work_by_window` holds
    (T seconds, request-seconds that arrived within the last T). Returns (slots, T) of the
    binding window; (0, 0) when nothing arrived."""
    best, best_t = 0.0, 0.0
    for span, work in work_by_window:
        need = work / (span + wait_s) if span + wait_s > 0 else 0.0
        if need > best:
            best, best_t = need, span
    return best, best_t
