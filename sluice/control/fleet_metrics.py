"""The control plane's per-group gauges on `/metrics` (O2, O3): instances by state and by
tier, quota units (guaranteed, held, borrowed, lent), the spend rate, month-to-date spend
and accelerator-hours, the share of the budget cap in force, whether quota refuses a start,
and each rollout's phase and canary share, read from the controller's last tick on every
scrape (a prometheus-client collector: nothing is copied per tick, and a group removed from
the spec disappears from the next scrape)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from sluice.core import InstanceState, InstanceStatus
from sluice.policy.quota import Allocation
from sluice.policy.quota.budget import budget_shares
from sluice.policy.quota.metering import Meter
from sluice.policy.tick import BURST, STABLE
from sluice.spec import PlatformSpec

__all__ = ["FleetView", "fleet_metrics"]


@dataclass(frozen=True, slots=True)
class FleetView:
    """What the gauges read: the spec, the instances, their tiers, the last quota round,
    the meter, and the rollouts (name -> baseline group, phase, canary percent)."""

    spec: PlatformSpec
    instances: Sequence[InstanceStatus]
    tiers: Mapping[str, str]
    allocation: Allocation | None
    meter: Meter
    rollouts: Mapping[str, tuple[str, str, float]]


class _FleetCollector(Collector):
    def __init__(self, view: FleetView) -> None:
        self._view = view

    def collect(self) -> Iterator[GaugeMetricFamily]:
        v = self._view
        by_state = GaugeMetricFamily(
            "sluice_group_instances",
            "Instances per group by lifecycle state.",
            labels=["group", "state"],
        )
        by_tier = GaugeMetricFamily(
            "sluice_group_tier_instances",
            "Running instances per group by tier (stable: on its guaranteed units).",
            labels=["group", "tier"],
        )
        units = GaugeMetricFamily(
            "sluice_group_quota_units",
            "Accelerator units per group: guaranteed, held (running and draining), borrowed, lent.",
            labels=["group", "pool", "kind"],
        )
        spend = GaugeMetricFamily(
            "sluice_group_spend_per_hour",
            "Spend rate per group (pool price units).",
            labels=["group"],
        )
        month = GaugeMetricFamily(
            "sluice_group_spent_this_month",
            "Month-to-date spend per group (UTC month).",
            labels=["group"],
        )
        hours = GaugeMetricFamily(
            "sluice_group_accelerator_hours_this_month",
            "Month-to-date accelerator-hours per group (UTC month).",
            labels=["group"],
        )
        budget = GaugeMetricFamily(
            "sluice_group_budget_used",
            "Share of the tightest budget cap in force on the group (1: at the cap).",
            labels=["group"],
        )
        refused = GaugeMetricFamily(
            "sluice_group_quota_refused",
            "1 while quota (or a budget) refuses the group a start it wants.",
            labels=["group"],
        )
        shares = budget_shares(v.spec, v.allocation, v.meter, time.time())
        lent: dict[str, int] = {}
        borrowed: dict[str, int] = {}
        for loan in v.allocation.loans if v.allocation else ():
            borrowed[loan.borrower] = borrowed.get(loan.borrower, 0) + loan.units
            if loan.lender is not None:
                lent[loan.lender] = lent.get(loan.lender, 0) + loan.units
        states = Counter((i.group, i.state) for i in v.instances)
        tiers = Counter((i.group, v.tiers.get(i.id)) for i in v.instances)
        for g in v.spec.groups:
            for state in InstanceState:
                by_state.add_metric([g.name, state.value], states[g.name, state])
            for tier in (STABLE, BURST):
                by_tier.add_metric([g.name, tier], tiers[g.name, tier])
            grant = v.allocation.grants.get(g.name) if v.allocation else None
            pool = g.resources.pool
            units.add_metric([g.name, pool, "guaranteed"], g.quota.guaranteed)
            units.add_metric([g.name, pool, "held"], grant.units_held if grant else 0)
            units.add_metric([g.name, pool, "borrowed"], borrowed.get(g.name, 0))
            units.add_metric([g.name, pool, "lent"], lent.get(g.name, 0))
            spend.add_metric([g.name], grant.spend_per_hour if grant else 0.0)
            month.add_metric([g.name], v.meter.spent_by(g.name))
            hours.add_metric([g.name], v.meter.hours_by(g.name))
            if g.name in shares:
                budget.add_metric([g.name], shares[g.name])
            refusals = v.allocation.refusals if v.allocation else {}
            refused.add_metric([g.name], float(g.name in refusals))
        yield from (by_state, by_tier, units, spend, month, hours, budget, refused)
        phase = GaugeMetricFamily(
            "sluice_rollout_phase",
            "1 for each rollout's current phase (pending, running, paused, promoted, ...).",
            labels=["rollout", "group", "phase"],
        )
        share = GaugeMetricFamily(
            "sluice_rollout_canary_percent",
            "The canary's share of its baseline's traffic.",
            labels=["rollout", "group"],
        )
        for name, (group, now, percent) in sorted(v.rollouts.items()):
            phase.add_metric([name, group, now], 1)
            share.add_metric([name, group], percent)
        yield from (phase, share)


def fleet_metrics(view: FleetView) -> bytes:
    """The gauges above in Prometheus text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_FleetCollector(view))
    return generate_latest(registry)
