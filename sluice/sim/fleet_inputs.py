"""The fleet simulator's inputs from a spec (`sluice.sim.fleet.run_fleet`): the spec with
other pool counts (the "what if the pool shrinks to 40"), each group's workload, and each
autoscaled group's policy; every mistake in them is a `SpecError` naming the option."""

from __future__ import annotations

from collections.abc import Mapping

from sluice.core.errors import SpecError, SpecIssue
from sluice.policy.autoscale import Autoscaler, build_autoscaler
from sluice.policy.inventory import with_pool_counts
from sluice.sim.engine import Workload, prepare
from sluice.sim.model import InstanceModel
from sluice.sim.trace import trace_from_rows
from sluice.spec import PlatformSpec

__all__ = ["scalers_for", "with_pool_counts", "workloads_for"]


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


def scalers_for(spec: PlatformSpec, policies: Mapping[str, str]) -> dict[str, Autoscaler]:
    """Each autoscaled group's policy, built once (`policies` may name another per group)."""
    auto = {g.name: g for g in spec.groups if g.autoscaling is not None}
    out: dict[str, Autoscaler] = {}
    issues = [
        SpecIssue("--policy", f"group {n!r} is not autoscaled; only autoscaled groups take one")
        for n in policies
        if n not in auto
    ]
    for name, g in auto.items():
        try:
            out[name] = build_autoscaler(g, spec.schedule_templates, policies.get(name))
        except ValueError as exc:
            issues.append(SpecIssue("--policy", f"group {name!r}: {exc}"))
    if issues:
        raise SpecError(issues)
    return out
