"""Pick the instance for one request: power of two choices on outstanding requests, with
slow start for new instances and optional affinity (S3).

Power of two choices (Mitzenmacher) gets close to least-loaded without every gateway herding
onto the same instance. Slow start: an instance READY for `t` seconds of `slow_start_s`
counts its load divided by a weight that ramps from 10% to 100%, so it takes a small share
first and its full share once it has answered well for a while. The ramp listens
(`RampHold`): each request a ramping instance fails takes back a quarter of its ramp, and
while its latency is well above its peers' (`LatencyOutliers.slower`) its ramp stands
still, so an instance that answers badly or slowly stays at a small share (and outlier
ejection or the health probes take it out), while one that answers well and in time reaches
its full share on time.
"""

from __future__ import annotations

import zlib
from collections.abc import Container, Mapping, Sequence
from random import Random
from typing import Final

from sluice.policy.routing import Endpoint

__all__ = [
    "MIN_SLOW_START_WEIGHT",
    "RampHold",
    "pick_affinity",
    "pick_endpoint",
    "rendezvous_score",
    "slow_start_weight",
]

MIN_SLOW_START_WEIGHT: Final = 0.1
HOLD_BACK: Final = 0.25
"""Share of `slow_start_s` one failed request takes back from a ramping instance."""
MAX_HELD: Final = 5.0
"""At most this many `slow_start_s` are taken back from one instance: an instance still
failing or lagging then is outlier ejection's and the health probes' to judge, and the group
leaves slow start (whose balancing reads the clock on every pick)."""
_NOT_HELD: Mapping[str, float] = {}


def slow_start_weight(ep: Endpoint, now: float, slow_start_s: float, held_s: float = 0.0) -> float:
    """1.0 for a settled instance; MIN..1.0 linearly over its first `slow_start_s` seconds
    of ramp (its age less the `held_s` its failures and lags took back)."""
    if slow_start_s <= 0:
        return 1.0
    age = now - ep.ready_at - held_s
    if age >= slow_start_s:
        return 1.0
    return max(MIN_SLOW_START_WEIGHT, age / slow_start_s)


class RampHold:
    """Slow start that listens (S3): the seconds of ramp each instance's failures and slow
    answers took back. Mutable, one per group, fed by the data plane."""

    def __init__(self) -> None:
        self.held: dict[str, float] = {}
        self._seen: dict[str, float] = {}
        """When each ramping instance last answered (or became ready)."""

    def failed(self, ep: Endpoint, now: float, slow_start_s: float) -> bool:
        """Count a failed request of `ep`; True if it was ramping (its ramp moved back)."""
        held = self.held.get(ep.instance_id, 0.0)
        ramped = now - ep.ready_at - held
        if slow_start_s <= 0 or ramped >= slow_start_s:
            return False
        back = min(slow_start_s * HOLD_BACK, max(ramped, 0.0), MAX_HELD * slow_start_s - held)
        if back <= 0.0:
            return False
        self.held[ep.instance_id] = held + back
        return True

    def answered(self, ep: Endpoint, now: float, slow_start_s: float, lagging: bool) -> bool:
        """Count an answered request of `ep`; `lagging`: its latency is well above its peers'
        now. While it lags, its ramp stands still: the time since its previous answer (or
        since ready, for the first) is taken back, so its share stays where it was until its
        latency is back in line. True if its ramp moved back."""
        iid = ep.instance_id
        held = self.held.get(iid, 0.0)
        ramped = now - ep.ready_at - held
        if slow_start_s <= 0 or ramped >= slow_start_s:
            self._seen.pop(iid, None)
            return False
        since = self._seen.get(iid, ep.ready_at)
        self._seen[iid] = now
        back = min(now - since, ramped, MAX_HELD * slow_start_s - held) if lagging else 0.0
        if back <= 0.0:
            return False
        self.held[iid] = held + back
        return True

    def settle_at(self, endpoints: Sequence[Endpoint], slow_start_s: float) -> float:
        """When the last of `endpoints` reaches its full share, if nothing fails."""
        return (
            max((ep.ready_at + self.held.get(ep.instance_id, 0.0) for ep in endpoints), default=0.0)
            + slow_start_s
        )

    def forget(self, keep: Container[str]) -> None:
        for table in (self.held, self._seen):
            for iid in [i for i in table if i not in keep]:
                del table[iid]


def pick_endpoint(
    candidates: Sequence[Endpoint],
    outstanding: Mapping[str, int],
    rng: Random,
    now: float,
    slow_start_s: float = 0.0,
    skip: Container[str] = (),
    held: Mapping[str, float] = _NOT_HELD,
) -> Endpoint | None:
    """Two random candidates (not in `skip`), the one with the lower weighted load wins.

    Load is (outstanding + 1) / slow_start_weight. If the winner is already at its
    `max_concurrency`, the least-loaded candidate with a free slot is taken instead (a scan,
    only then). None if every candidate is skipped. `now` and `slow_start_s` are seconds on
    the clock of `Endpoint.ready_at` (wall clock); `slow_start_s <= 0` turns slow start off;
    `held`: ramp seconds taken back per instance (`RampHold.held`).
    """
    pool = [ep for ep in candidates if ep.instance_id not in skip] if skip else candidates
    n = len(pool)
    if n == 0:
        return None
    if n == 1:
        return pool[0]
    if n == 2:  # both are the two choices; only the order (who wins a tie) is random
        a, b = (pool[0], pool[1]) if rng.random() < 0.5 else (pool[1], pool[0])
    else:
        i = int(rng.random() * n)
        j = int(rng.random() * (n - 1))
        if j >= i:
            j += 1
        a, b = pool[i], pool[j]
    out_a = outstanding.get(a.instance_id, 0)
    out_b = outstanding.get(b.instance_id, 0)
    if slow_start_s > 0:
        load_a = (out_a + 1) / slow_start_weight(a, now, slow_start_s, held.get(a.instance_id, 0))
        load_b = (out_b + 1) / slow_start_weight(b, now, slow_start_s, held.get(b.instance_id, 0))
        best, out = (a, out_a) if load_a <= load_b else (b, out_b)
    else:  # every weight is 1: compare the counts (the common, settled case)
        best, out = (a, out_a) if out_a <= out_b else (b, out_b)
    if out < best.max_concurrency:
        return best
    free = [ep for ep in pool if outstanding.get(ep.instance_id, 0) < ep.max_concurrency]
    if not free:
        return best
    return min(
        free,
        key=lambda ep: (
            (outstanding.get(ep.instance_id, 0) + 1)
            / slow_start_weight(ep, now, slow_start_s, held.get(ep.instance_id, 0.0))
        ),
    )


_M64: Final = (1 << 64) - 1


def _mix64(x: int) -> int:
    """splitmix64's finalizer: a bijection on 64 bits where every input bit flips about half
    of the output bits, so scores of different instances for one key are independent."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def rendezvous_score(instance_id: str, key: int) -> int:
    """An instance's rendezvous score for `key` (32 bits; wider keys are folded): the same
    on every gateway, independent across instances (`_mix64`)."""
    key = (key ^ (key >> 32)) & 0xFFFFFFFF
    return _mix64((zlib.crc32(instance_id.encode()) << 32) | key)


def pick_affinity(
    candidates: Sequence[Endpoint], key: str, skip: Container[str] = ()
) -> Endpoint | None:
    """Rendezvous hashing: the same key lands on the same instance while it is there, and
    only keys of a removed instance move. crc32 plus a fixed mixer keeps it identical across
    gateways (no per-process hash seed). The mixer matters: chained crc32 alone is affine,
    and its highest-score instance splits keys by bit patterns, not evenly."""
    best: Endpoint | None = None
    best_score = -1
    key_hash = zlib.crc32(key.encode())
    for ep in candidates:
        if ep.instance_id in skip:
            continue
        score = rendezvous_score(ep.instance_id, key_hash)
        if score > best_score:
            best, best_score = ep, score
    return best
