"""One group's run, a fleet of one: `run(work, policy, opts)` replays one group's workload
through the simulator (`sluice.sim.fleet.run_fleet`) with the group alone on its pool
(`alone`), so every tick goes through the kernel's `step` as the live controller's does:
the policy (the spec's, one by name from `make_policy`, or one given: a tuned HPA, the
oracle's plan, the causal reference's windows), then quota (the pool's count, the spec's
budget), warm standby, the plan and crash-loop backoff. `SimOptions` are a study's knobs:
seed, injected crashes and slow starts, the fleet at t = 0, the decision log."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sluice.policy.autoscale import FixedPolicy, ScalingPolicy, build_policy
from sluice.policy.tick import spec_count, standby
from sluice.sim.fleet import FleetOptions, run_fleet
from sluice.sim.model import InstanceModel
from sluice.sim.result import SimResult
from sluice.sim.workload import EPOCH, Workload
from sluice.spec import PlatformSpec
from sluice.spec.autoscaling import AutoscalingSpec
from sluice.spec.models import PoolSpec

__all__ = ["SimOptions", "alone", "make_policy", "run", "start_count"]


@dataclass(frozen=True)
class SimOptions:
    seed: int = 0
    """seeds the injected crashes and slow starts"""
    crash_rate_per_hour: float = 0.0
    """per instance; 0 = no crashes"""
    slow_start_prob: float = 0.0
    """chance that one launch takes `slow_start_factor` x the normal start-up"""
    slow_start_factor: float = 3.0
    initial: int | None = None
    """instances ready at t = 0, and the count in force the first tick starts from (less
    warm standby); None: `start_count` plus warm standby"""
    epoch: float = EPOCH
    decision_log: int = 1000
    """most count-changing decisions kept (all are counted in `scale_events`); every 300th
    tick's decision is also kept, up to 100 of them, marked `changed: false`"""
    rollouts: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    """the group -> (start, end) of a rollout of it, virtual seconds (`FleetOptions.rollouts`)"""


def make_policy(
    model: InstanceModel, policy: str | None, templates: Any = None
) -> ScalingPolicy[Any]:
    """The live policy for the group (`policy` overrides the spec's choice, `build_policy`);
    `templates`: the schedule templates, by default the model's spec's. Raises ValueError
    for an unknown policy name."""
    if templates is None:
        templates = model.platform.schedule_templates if model.platform is not None else {}
    return build_policy(model.group, templates, policy)


def start_count(
    model: InstanceModel, opts: SimOptions, policy: ScalingPolicy[Any] | None = None
) -> int:
    """The count in force at t = 0: `opts.initial`, else a fixed policy's N, else the
    group's `replicas` within [min, max] (`spec_count`, as the controller starts it)."""
    if opts.initial is not None:
        return opts.initial
    if isinstance(policy, FixedPolicy):
        return policy.n
    return spec_count(model.group)


def alone(model: InstanceModel) -> PlatformSpec:
    """The fleet of one `run` simulates: the model's group alone on its pool (the spec's
    count and price), under the spec's budget and schedule templates. A group without an
    `autoscaling` block gets one that leaves its count as it is (min 0, max its replicas),
    so that the policy a study gives it can run."""
    g = model.group
    if g.autoscaling is None:
        g = g.model_copy(update={"autoscaling": AutoscalingSpec(min=0, max=max(1, g.replicas))})
    src = model.platform
    pool = src.pool(g.resources.pool) if src is not None else None
    if src is None or pool is None:  # no spec: a pool that holds the group at its max
        assert g.autoscaling is not None
        units = g.resources.accelerators
        pool = PoolSpec.model_construct(
            name=g.resources.pool,
            count=(g.autoscaling.max + standby(g)) * units,
            memory_gb=1.0,
            price_per_hour=model.price_per_hour / units,
        )
        return PlatformSpec.model_construct(pools=[pool], groups=[g])
    return src.model_copy(
        update={
            "pools": [pool],
            "groups": [g],
            "tenants": [],
            "routes": [],
            "rollouts": [],
            "drills": [],
        }
    )


def run(work: Workload, policy: ScalingPolicy[Any], opts: SimOptions | None = None) -> SimResult:
    """Replay `work` under `policy` until every request has finished or been turned away
    (module docstring)."""
    o = opts or SimOptions()
    spec = alone(work.model)
    g = spec.groups[0]
    initial = o.initial
    if initial is None:
        initial = start_count(work.model, o, policy) + standby(g)
    fleet = FleetOptions(
        seed=o.seed,
        epoch=o.epoch,
        initial={g.name: initial},
        scalers={g.name: policy},
        crash_rate_per_hour=o.crash_rate_per_hour,
        slow_start_prob=o.slow_start_prob,
        slow_start_factor=o.slow_start_factor,
        decision_log=o.decision_log,
        rollouts=o.rollouts,
    )
    return run_fleet(spec, {g.name: work}, fleet).groups[g.name].sim
