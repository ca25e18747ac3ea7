"""Leave-one-out for bench/autoscale.py: could the Sluice defaults have been fitted to the
traces they are judged on?

The policy's free knobs (the ones not read from the traffic or the spec) span a small grid.
For each trace, the configuration that scores best on all the *other* traces is picked and
then scored on the one left out; the report shows the held-out scores next to the shipped
defaults' on the same trace, and which configuration each pick was. Scores: first the
number of the issue's targets met (bench/autoscale.py: SLO on the shared traces, cost over
the oracle or the best fixed fleet where one applies), then the total SLO shortfall under
the target, then the geometric mean of cost over the oracle's. Every run starts warm.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

from sluice.policy.autoscale import ScalingPolicy, build_policy
from sluice.sim import InstanceModel, SimOptions, Workload, run

GRID: dict[str, tuple[float, ...]] = {
    "slo_budget_share": (0.5, 1.0),
    "rate_arrivals": (100, 400, 1600),
    "tolerance": (0.05, 0.1, 0.2),
}
"""targets.* knobs tried; the shipped defaults are one point of the grid"""


@dataclass(frozen=True)
class Case:
    """One trace, ready to replay warm, with the targets that apply to it."""

    name: str
    work: Workload
    options: SimOptions
    oracle_instance_seconds: float
    slo_required: bool
    """a shared trace: its SLO attainment must reach the target"""
    cost_cap: tuple[str, float, float] | None = None
    """(the target's name, the reference instance-seconds, the most sluice may cost over
    it), e.g. ('cost_vs_oracle_le_1.3', oracle, 1.3)"""

    def targets(self, slo: float, instance_seconds: float, target: float) -> dict[str, bool]:
        """The issue's targets that apply to this trace, met or not."""
        out: dict[str, bool] = {}
        if self.slo_required:
            out["slo"] = slo >= target
        if self.cost_cap is not None:
            name, ref, cap = self.cost_cap
            out[name] = instance_seconds <= cap * ref
        return out


def _configs() -> list[dict[str, float]]:
    keys = list(GRID)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*GRID.values())]


def _policy(model: InstanceModel, knobs: dict[str, float]) -> ScalingPolicy[Any]:
    """The group's own Sluice policy (`build_policy`, so its schedules and latency
    target too) with these `targets.*` knobs."""
    auto = model.group.autoscaling
    assert auto is not None
    targets = auto.targets.model_copy(
        update={k: (int(v) if k == "rate_arrivals" else v) for k, v in knobs.items()}
    )
    update = {"autoscaling": auto.model_copy(update={"targets": targets})}
    return build_policy(model.group.model_copy(update=update), {}, "sluice")


def _score(results: list[tuple[float, float, int]], target: float) -> tuple[int, float, float]:
    """(-the issue's targets met, the total SLO shortfall under the target to 0.1 %, the
    geometric mean of cost / oracle): lower is better."""
    met = sum(m for _, _, m in results)
    short = round(sum(max(0.0, target - slo) for slo, _, _ in results), 3)
    gmean = math.exp(sum(math.log(max(c, 1e-9)) for _, c, _ in results) / len(results))
    return -met, short, gmean


def leave_one_out(model: InstanceModel, cases: list[Case]) -> dict[str, Any]:
    """The held-out scores of the picks, per trace, and the shipped defaults' beside them."""
    auto = model.group.autoscaling
    assert auto is not None
    configs = _configs()
    target = model.slo.target
    shipped = {k: getattr(auto.targets, k) for k in GRID}
    # every configuration on every trace: (slo attainment, cost / oracle, targets met)
    table: list[list[tuple[float, float, int]]] = []
    for knobs in configs:
        cells = []
        for c in cases:
            res = run(c.work, _policy(model, knobs), c.options)
            slo = res.summary()["slo_attainment"]
            cells.append(
                (
                    slo,
                    res.instance_seconds / c.oracle_instance_seconds,
                    sum(c.targets(slo, res.instance_seconds, target).values()),
                )
            )
        table.append(cells)
    default_i = next(
        (i for i, k in enumerate(configs) if all(k[n] == shipped[n] for n in GRID)), None
    )
    per_trace: dict[str, Any] = {}
    same = 0
    for j, c in enumerate(cases):
        others = [
            _score([cells[x] for x in range(len(cases)) if x != j], target) for cells in table
        ]
        pick = min(range(len(configs)), key=lambda i: others[i])
        slo, cost, _ = table[pick][j]
        entry: dict[str, Any] = {
            "picked": configs[pick],
            "held_out_slo_attainment": round(slo, 5),
            "held_out_cost_vs_oracle": round(cost, 4),
        }
        if default_i is not None:
            d_slo, d_cost, _ = table[default_i][j]
            entry["defaults_slo_attainment"] = round(d_slo, 5)
            entry["defaults_cost_vs_oracle"] = round(d_cost, 4)
            same += pick == default_i
        per_trace[c.name] = entry
    in_sample = min(range(len(configs)), key=lambda i: _score(table[i], target))
    return {
        "grid": {k: list(v) for k, v in GRID.items()},
        "shipped_defaults": shipped,
        "picked_on_all_traces": configs[in_sample],
        "traces": per_trace,
        "summary": (
            f"{same} of {len(cases)} held-out picks are the shipped defaults; "
            f"picked on all traces: {configs[in_sample]}"
        ),
    }
