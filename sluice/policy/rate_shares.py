"""A tenant's `rate_limit` held fleet-wide (issue 31): the controller splits each tenant's
rate among the live gateways by their recent share of that tenant's offered requests, and
each gateway enforces its part with its own token bucket (`sluice.policy.ratelimit`).

Why a split and not one shared bucket: a shared bucket costs a round trip per request on
the data plane's hot path and stops every limited tenant when its keeper is unreachable; the
controller already hears from every gateway once a second (`sluice.policy.gateways`), as it
does to split each instance's slots.

**Split rule** (`split_rate`), per tenant with limit L among n live gateways:
- a gateway with less than `HISTORY_S` of arrival history (just started) gets the fair
  share L / n;
- the rest goes to the others in proportion to their recent offered rate (arrivals counted
  before the bucket, refused ones included: an exponential average over `DEMAND_TAU_S`), but
  none gets less than a floor of `FLOOR_FRACTION` of the fair share, so the first request
  of a gateway with no recent demand is not refused for ever (its bucket keeps at least one
  token); with no demand anywhere the rest is split evenly;
- the bucket's burst is the tenant's burst times the gateway's part of the rate (at least
  one token, else no request could ever pass: `bucket_burst`).
Proportional to offered load means every request has the same chance to pass wherever it
arrives: with offered D > L each gateway admits about L * d_g / D, and with D <= L every
gateway's share covers its demand.

**Error bound.** At each rebalance a tenant's shares add up to L exactly (never more), so
in any window T the fleet admits at most L * T plus the buckets' bursts (at most the
tenant's burst + n tokens). Shares in force are at most one rebalance period plus one sync
old, so while demand moves between gateways, or a new one joins (it takes L / n at its
first sync while the others still hold their old shares for up to a sync), the sum may
exceed L by the change for about a second. It admits less than L by at most the floors of
gateways with no demand (`FLOOR_FRACTION` of L in all), after demand moves for the few
seconds the average takes to follow, and for up to `GATEWAY_TTL_S` the share of a gateway
that stopped (until the controller forgets it).

**A gateway that loses the controller** (`sluice.gateway.remote`) keeps its last share for
`RATE_HOLD_S` (usually the whole fleet lost it, and the shares still add up to L), then
falls back to L / n with n the number of gateways it last heard of (`even_share`): demand
may have moved meanwhile. Never the full limit per gateway. A gateway that alone is cut off
holds its share while the controller, after `GATEWAY_TTL_S`, gives it to the others: the
fleet may then admit L plus that gateway's share (L / n after `RATE_HOLD_S`) until it is
back.

`sluice gateway --workers N` runs N gateways as far as this is concerned (each worker syncs
under its own id); the in-process gateway of `sluice up` is one of the fleet too.

Pure: time comes in as an argument; the controller's edge keeps the book.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from sluice.policy.routing import RoutingSnapshot

__all__ = [
    "DEMAND_TAU_S",
    "FLOOR_FRACTION",
    "HISTORY_S",
    "RATE_HOLD_S",
    "REBALANCE_S",
    "DemandBook",
    "RateShare",
    "bucket_burst",
    "even_share",
    "rate_shares",
    "split_rate",
    "tenant_limits",
    "total_rps",
]

FLOOR_FRACTION = 0.05
"""A gateway's least part of a tenant's rate, as a fraction of the fair share L / n: the
floors of idle gateways together hold at most 5 % of the limit unused."""
DEMAND_TAU_S = 2.0
"""Time constant of the offered-rate average: a couple of syncs, so one second's noise does
not swing the shares, while demand that moves is followed within a few seconds."""
HISTORY_S = 2.0
"""Arrival history a gateway needs before its own demand counts; until then it gets L / n."""
REBALANCE_S = 0.5
"""How often the controller recomputes the shares (each sync reads the newest table): the
gateways sync once a second, so every sync gets a table at most half a sync old."""
RATE_HOLD_S = 10.0
"""How long a gateway that hears from no controller keeps its last share before it falls
back to `even_share`: longer than a leader handover, after which demand may have moved."""


@dataclass(frozen=True, slots=True)
class RateShare:
    """One gateway's token bucket for one tenant: `rps` tokens a second, up to `burst`."""

    rps: float
    burst: float


def bucket_burst(rps: float, limit_rps: float, limit_burst: float) -> float:
    """The burst of a bucket that gets `rps` of a tenant's `limit_rps`: its part of the
    tenant's burst, so the fleet's bursts add up to the tenant's; at least 1 (a bucket that
    can never hold a whole token refuses everything)."""
    return max(1.0, limit_burst * rps / limit_rps)


def even_share(limit_rps: float, limit_burst: float, count: int) -> RateShare:
    """The share of one of `count` gateways when demand is not known: L / n."""
    rps = limit_rps / max(1, count)
    return RateShare(rps, bucket_burst(rps, limit_rps, limit_burst))


def split_rate(
    limit: float, demand: Mapping[str, float | None], floor_fraction: float = FLOOR_FRACTION
) -> dict[str, float]:
    """Per gateway, its part of `limit` (see the module's split rule). `demand[g]`: its
    recent offered rate, None while it has no history (it gets limit / n). The parts add up
    to `limit` (to float rounding; never more than that)."""
    n = len(demand)
    if n == 0:
        return {}
    fair = limit / n
    out = {g: fair for g, d in demand.items() if d is None}
    free = {g: max(0.0, d) for g, d in demand.items() if d is not None and math.isfinite(d)}
    free.update({g: 0.0 for g, d in demand.items() if d is not None and not math.isfinite(d)})
    if not free:
        return out
    rest = limit - fair * len(out)
    floor = min(floor_fraction * fair, rest / len(free))
    pinned = 0
    while free:
        left = rest - floor * pinned
        total = sum(free.values())
        if total <= 0.0:  # no demand among them: evenly
            out.update(dict.fromkeys(free, left / len(free)))
            break
        low = [g for g, d in free.items() if left * (d / total) < floor]
        if not low:
            out.update({g: left * (d / total) for g, d in free.items()})  # d / total first: a
            # subnormal d times `left` would round to 0 or skew the sum
            break
        for g in low:  # below the floor: pinned to it, the rest shared again without them
            out[g] = floor
            del free[g]
            pinned += 1
    return out


@dataclass
class _Arrivals:
    boot: str
    first: float
    at: float
    counts: dict[str, int]
    rates: dict[str, float] = field(default_factory=dict)


@dataclass
class DemandBook:
    """Per gateway and tenant, the recent offered rate, from the cumulative arrival counts
    each gateway reports with its sync (a new `boot`: it counts from zero again)."""

    tau_s: float = DEMAND_TAU_S
    history_s: float = HISTORY_S
    gateways: dict[str, _Arrivals] = field(default_factory=dict)

    def observe(self, gateway: str, boot: str, counts: Mapping[str, int], now: float) -> None:
        """Record `gateway`'s cumulative arrivals per tenant at `now`."""
        old = self.gateways.get(gateway)
        if old is None or old.boot != boot:
            self.gateways[gateway] = _Arrivals(boot, now, now, dict(counts))
            return
        dt = now - old.at
        if dt <= 0.0:
            return
        alpha = 1.0 - math.exp(-dt / self.tau_s)
        for tenant, count in counts.items():
            before = old.counts.get(tenant)
            arrived = count - (before or 0)
            if arrived < 0:  # its counter started again: what it counted since
                arrived = count
            rate = arrived / dt
            prev = old.rates.get(tenant)
            old.rates[tenant] = rate if prev is None else prev + alpha * (rate - prev)
        for tenant in old.rates.keys() - counts.keys():  # not reported: nothing arrived
            old.rates[tenant] -= alpha * old.rates[tenant]
        old.counts.update(counts)
        old.at = now

    def forget(self, live: Collection[str]) -> None:
        """Drop what is kept of gateways not in `live`."""
        for gone in [g for g in self.gateways if g not in live]:
            del self.gateways[gone]

    def demand(self, gateway: str, tenant: str) -> float | None:
        """`gateway`'s recent offered rate of `tenant` (requests a second); None while it
        has less than `history_s` of history."""
        seen = self.gateways.get(gateway)
        if seen is None or seen.at - seen.first < self.history_s:
            return None
        return seen.rates.get(tenant, 0.0)


def tenant_limits(snapshot: RoutingSnapshot) -> dict[str, tuple[float, float]]:
    """Tenant name -> (rps, burst) of every tenant with a rate limit in `snapshot`."""
    return {
        t.name: (float(t.rate_limit[0]), float(t.rate_limit[1]))
        for t in snapshot.tenants_by_key.values()
        if t.rate_limit is not None
    }


def rate_shares(
    limits: Mapping[str, tuple[float, float]], gateways: Sequence[str], book: DemandBook
) -> dict[str, dict[str, RateShare]]:
    """Gateway -> tenant -> its bucket, for every tenant in `limits` and every one of the
    live `gateways` (the split rule, with each gateway's demand from `book`)."""
    out: dict[str, dict[str, RateShare]] = {g: {} for g in gateways}
    for tenant, (rps, burst) in limits.items():
        parts = split_rate(rps, {g: book.demand(g, tenant) for g in gateways})
        for g, part in parts.items():
            out[g][tenant] = RateShare(part, bucket_burst(part, rps, burst))
    return out


def total_rps(shares: Iterable[Mapping[str, RateShare]], tenant: str) -> float:
    """The rate of `tenant` the gateways of `shares` admit in all (for checks and tests)."""
    return sum(s[tenant].rps for s in shares if tenant in s)
