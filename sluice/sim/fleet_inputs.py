"""The fleet simulator's inputs from a spec (`sluice.sim.fleet.run_fleet`): the spec with
other pool counts (the "what if the pool shrinks to 40"), each group's workload, and the
spec compiled for the kernel with each autoscaled group's policy; every mistake in them is
a `SpecError` naming the option."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from sluice.core.errors import SpecError, SpecIssue
from sluice.policy.autoscale import ScalingPolicy, build_policy
from sluice.policy.inventory import with_pool_counts
from sluice.policy.kernel import Compiled, compile_spec, policy_key
from sluice.sim.model import InstanceModel
from sluice.sim.result import sleeping_cost_ratio
from sluice.sim.trace import trace_from_rows
from sluice.sim.workload import Workload, prepare
from sluice.spec import GroupSpec, PlatformSpec
from sluice.spec.models import PoolSpec
from sluice.spec.runtimes import SimParams

__all__ = ["SleepParams", "compiled_for", "sleep_params", "with_pool_counts", "workloads_for"]


@dataclasses.dataclass(frozen=True, slots=True)
class SleepParams:
    """A group's sleeping standby as the simulator runs it (`sluice.sim.fleet`)."""

    sleep_s: float
    """an idle instance put to sleep is asleep this long after"""
    wake_s: float
    """a wake serves this long after"""
    ratio: float
    """an asleep instance-second's price, as a share of an awake one's"""


def sleep_params(g: GroupSpec, pool: PoolSpec | None = None) -> SleepParams:
    """The group's models' `sim` sleep and wake times (the longest of them) and the host
    memory they hold asleep (all of them: one instance holds every model), priced at the
    pool's prices where it prices both host memory (`host_memory_price_per_gb_hour`) and
    its accelerators, else at the public prices `sleeping_cost_ratio` assumes."""
    params = [m.sim or SimParams() for m in g.models.values()]
    host = sum(p.memory_gb if p.host_memory_gb is None else p.host_memory_gb for p in params)
    units = max(1, g.resources.accelerators)
    if pool is not None and pool.host_memory_price_per_gb_hour > 0 and pool.price_per_hour > 0:
        ratio = host * pool.host_memory_price_per_gb_hour / (units * pool.price_per_hour)
    else:
        ratio = sleeping_cost_ratio(host, units)
    return SleepParams(
        sleep_s=max((p.sleep_s for p in params), default=SimParams().sleep_s),
        wake_s=max((p.wake_s for p in params), default=SimParams().wake_s),
        ratio=ratio,
    )


def workloads_for(spec: PlatformSpec, given: Mapping[str, Workload]) -> dict[str, Workload]:
    """Each group's workload; a group without a trace gets an empty one (it still holds
    instances: a lender)."""
    unknown = sorted(set(given) - {g.name for g in spec.groups})
    if unknown:
        names = ", ".join(g.name for g in spec.groups)
        raise SpecError(
            [
                SpecIssue("--trace", f"no group named {n!r} in the spec; groups: {names}")
                for n in unknown
            ]
        )
    out: dict[str, Workload] = {}
    for g in spec.groups:
        if g.name in given:
            out[g.name] = given[g.name]
        else:  # no traffic: the SLO is never read, so any will do for a group without one
            model = InstanceModel.from_spec(spec, g, None if g.slo else 1000.0)
            out[g.name] = prepare(model, trace_from_rows([], "<no traffic>"))
    return out


def compiled_for(
    spec: PlatformSpec,
    policies: Mapping[str, str],
    scalers: Mapping[str, ScalingPolicy[Any]] | None = None,
) -> Compiled:
    """`spec` compiled for the kernel, each autoscaled group with its policy (`policies` may
    name another per group; `scalers` give one itself, e.g. a study's clairvoyant plan)."""
    given = scalers or {}
    auto = {g.name: g for g in spec.groups if g.autoscaling is not None}
    issues = [
        SpecIssue("--policy", f"group {n!r} is not autoscaled; only autoscaled groups take one")
        for n in (*policies, *given)
        if n not in auto
    ]
    named = {n: p for n, p in policies.items() if n not in given}
    for name, g in auto.items():
        if name in given:
            continue
        try:
            build_policy(g, spec.schedule_templates, named.get(name))
        except ValueError as exc:
            issues.append(SpecIssue("--policy", f"group {name!r}: {exc}"))
    if issues:
        raise SpecError(issues)
    compiled = compile_spec(spec, named)
    if not given:
        return compiled
    return dataclasses.replace(
        compiled,
        policies={**compiled.policies, **given},
        keys={
            **compiled.keys,
            **{n: f"{policy_key(auto[n], spec)}|given:{p.name}" for n, p in given.items()},
        },
    )
