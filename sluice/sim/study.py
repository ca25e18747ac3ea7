"""One what-if study: a spec, a trace (windowed and scaled), a policy -> the summary document
(and optionally the HTML report). `sluice simulate` and the benchmarks call this. A
one-group study (`simulate_spec`) runs the group alone on its pool, a fleet of one
(`sluice.sim.single`); a fleet study (`simulate_fleet_spec`) runs every group of the spec,
a trace per group (`--trace GROUP=FILE`, or one CSV with a `group` column). Both go
through the one simulator, `sluice.sim.fleet`, and the kernel's `step` every tick.

`warm=True` begins the run (any policy, the oracle and the causal reference too) with
the oracle's instance count at t = 0 ready (`sluice.sim.warm.warm_start`); without it a
live policy starts at its spec's count and the oracle at its own t = 0 need, as before."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice.core.errors import SpecError, SpecIssue
from sluice.sim.causal import HINDSIGHT_NOTE, causal
from sluice.sim.families import FAMILY_PREFIX, load_trace_or_family
from sluice.sim.fleet import FleetOptions, run_fleet
from sluice.sim.fleet_report import FleetResult, write_fleet_report
from sluice.sim.model import InstanceModel, group_batching, pick_group, with_fitted_batching
from sluice.sim.oracle import oracle
from sluice.sim.report import write_report
from sluice.sim.result import SimResult
from sluice.sim.routed import route_trace, routed_outcomes
from sluice.sim.single import SimOptions, make_policy, run
from sluice.sim.trace import Trace, has_group_column, load_group_traces
from sluice.sim.warm import warm_start
from sluice.sim.workload import Workload, prepare
from sluice.spec import PlatformSpec
from sluice.spec.loader import load_spec_file

__all__ = [
    "TraceShape",
    "fleet_traces",
    "parse_pool_counts",
    "simulate_fleet_spec",
    "simulate_spec",
    "split_group_ref",
    "wants_fleet",
]

DEFAULT_PREFILL_TPS = 10_000.0
"""prompt tokens/s an instance prefills in a block-trace study when neither `--prefill-tps`
nor the group's `sim.batching` says"""

_GROUP_REF = re.compile(r"^([a-z0-9](?:[a-z0-9._-]{0,61}[a-z0-9])?)=(.+)$")


@dataclass(frozen=True)
class TraceShape:
    """Windowing and scaling applied to the trace before the run (see `Trace.transform`)."""

    start: float = 0.0
    duration: float | None = None
    speedup: float = 1.0
    rate_scale: float = 1.0

    def of(self, trace: Trace, seed: int) -> Trace:
        """`trace` windowed and scaled; `seed` draws the copies of a rate scale above 1."""
        return trace.transform(
            start=self.start,
            duration=self.duration,
            speedup=self.speedup,
            rate_scale=self.rate_scale,
            seed=seed,
        )


Fit = tuple[Mapping[str, Any], str]
"""A load test's report with a fitted batching model (`sluice loadtest --fit`), and where it
was read from (a file, a stored run)."""


def simulate_spec(
    spec_path: str | Path,
    trace_path: str | Path,
    *,
    group: str | None = None,
    policy: str | None = None,
    slo_ms: float | None = None,
    shape: TraceShape | None = None,
    options: SimOptions | None = None,
    report_dir: str | Path | None = None,
    warm: bool = False,
    fit: Fit | None = None,
) -> dict[str, Any]:
    """Run one simulation and return its summary (the `--json` document). `policy` is a live
    policy name (see `make_policy`), 'oracle' or 'causal' (`sluice.sim.causal`); `warm`
    starts it with the oracle's t = 0 count ready (`start: warm`, `initial_instances`);
    `fit`: a load test's fitted server for its group (`with_fitted_batching`)."""
    spec, fitted = _load(spec_path, fit)
    g = pick_group(spec, group if group or fitted is None else fitted["group"], str(spec_path))
    model = InstanceModel.from_spec(spec, g, slo_ms)
    sh = shape or TraceShape()
    o = options or SimOptions()
    _check_rollouts(o.rollouts, {g.name})
    trace = sh.of(load_trace_or_family(trace_path), o.seed)
    work = prepare(model, trace)
    extra: dict[str, Any] = {}
    result: SimResult
    scaler = None
    if policy not in ("oracle", "causal"):
        try:
            scaler = make_policy(model, policy, spec.schedule_templates)
        except ValueError as exc:
            raise SpecError([SpecIssue("--policy", f"{exc}; or 'oracle', 'causal'")]) from None
    ws = warm_start(work, o) if warm else None
    run_opts = ws.options if ws is not None else o
    if scaler is not None:
        result = run(work, scaler, run_opts)
    elif policy == "oracle":
        # the warm start is defined on this search: its run begins with that count ready
        o_res = ws.oracle if ws is not None else oracle(work, o)
        result = o_res.result
        extra = {
            "oracle_plan": o_res.plan,
            "oracle_candidates": o_res.evaluated,
            "best_fixed_n": o_res.best_fixed_n,
            "best_fixed_instance_seconds": (
                o_res.best_fixed.instance_seconds if o_res.best_fixed else None
            ),
        }
    else:
        c_res = causal(work, run_opts)
        result = c_res.result
        extra = {
            "causal_best": c_res.best.describe(),
            "causal_chosen_for": c_res.chosen_for,
            "causal_candidates": [c.describe() for c in c_res.candidates],
            "causal_note": HINDSIGHT_NOTE,
        }
    summary = result.summary()
    summary.update(extra)
    summary["start"] = "warm" if warm else "cold"
    # the count changes, as the live controller's `autoscale` events say them
    summary["scale_decisions"] = [d for d in result.decisions if d["changed"]]
    if ws is not None:
        summary["warm_start_oracle_plan"] = ws.oracle.plan
    summary["policy"] = policy or (g.autoscaling.policy if g.autoscaling else "fixed")
    summary["group"] = g.name
    summary["instance_model"] = model.describe()
    summary["fitted"] = fitted
    if report_dir is not None:
        summary["report"] = str(write_report(result, report_dir, summary))
    return summary


def split_group_ref(ref: str) -> tuple[str | None, str]:
    """`GROUP=FILE` -> (GROUP, FILE); a plain FILE or `family:NAME[@SEED]` -> (None, ref)."""
    m = _GROUP_REF.match(ref)
    if m is None or ref.startswith(FAMILY_PREFIX) or Path(ref).exists():
        return None, ref
    return m.group(1), m.group(2)


def wants_fleet(refs: Sequence[str], fleet: bool = False) -> bool:
    """The fleet simulation runs when asked, for several traces or a `GROUP=` prefix, and
    for one CSV with a `group` column; else one group alone (a fleet of one), as before."""
    if fleet or len(refs) != 1:
        return True
    group, ref = split_group_ref(refs[0])
    return group is not None or (not ref.startswith(FAMILY_PREFIX) and has_group_column(ref))


def parse_pool_counts(values: Sequence[str]) -> dict[str, int]:
    """`--pool NAME=COUNT` (repeatable) -> {NAME: COUNT}."""
    out: dict[str, int] = {}
    for v in values:
        name, _, count = v.partition("=")
        if not name or not count.strip().isdigit():
            fix = "write NAME=COUNT with a whole number, e.g. --pool gpu=40"
            raise SpecError([SpecIssue("--pool", f"bad value {v!r}: {fix}")])
        out[name.strip()] = int(count)
    return out


def fleet_traces(
    spec: PlatformSpec, refs: Sequence[str], group: str | None = None, source: str = "<spec>"
) -> dict[str, Trace]:
    """Each group's trace: `GROUP=FILE` (FILE may be `family:NAME[@SEED]`), one CSV with a
    `group` column (split by it), or one plain trace for `group` (`pick_group`'s default).
    `source`: the spec's file, named by the errors."""
    known = {g.name for g in spec.groups}
    names = ", ".join(sorted(known)) or "none"
    out: dict[str, Trace] = {}
    for raw in refs:
        name, ref = split_group_ref(raw)
        if name is None and len(refs) == 1 and has_group_column(ref):
            return load_group_traces(ref, known)
        if name is None and len(refs) > 1:
            fix = "prefix each with its group: --trace GROUP=FILE"
            why = f"{raw!r} has no group and is not alone; {fix}"
            raise SpecError([SpecIssue("--trace", why, source)])
        if name is None:
            name = pick_group(spec, group, source).name
        if name not in known:
            fix = f"use one of the spec's groups: {names}, or add {name!r} to the spec"
            why = f"no group named {name!r} in the spec; {fix}"
            raise SpecError([SpecIssue("--trace", why, source)])
        if name in out:
            why = f"two traces for group {name!r}; give one"
            raise SpecError([SpecIssue("--trace", why, source)])
        out[name] = load_trace_or_family(ref)
    return out


def simulate_routed_spec(
    spec_path: str | Path,
    ref: str,
    *,
    policy: str | None = None,
    slo_ms: float | None = None,
    shape: TraceShape | None = None,
    pools: Mapping[str, int] | None = None,
    options: FleetOptions | None = None,
    report_dir: str | Path | None = None,
    fit: Fit | None = None,
) -> dict[str, Any]:
    """One trace of callers (tenant, model, priority per request) through the spec's own
    rate limits and route choice (`sluice.sim.routed`), then the whole fleet; the summary
    adds `routed`: outcomes per route and per tenant (`fit`: as `simulate_fleet_spec`)."""
    spec, fitted = _load(spec_path, fit)
    o = options or FleetOptions()
    routed = route_trace(
        spec, (shape or TraceShape()).of(load_trace_or_family(ref), o.seed), o.seed
    )
    groups = {g.name: g for g in spec.groups}
    works = {
        name: prepare(InstanceModel.from_spec(spec, groups[name], slo_ms), part)
        for name, part in routed.groups.items()
    }
    extra = lambda r: {"routed": routed_outcomes(routed, r), "fitted": fitted}  # noqa: E731
    return _fleet_run(spec, works, o, policy, pools, report_dir, extra)


def simulate_prefix_spec(
    spec_path: str | Path,
    trace_path: str | Path,
    *,
    group: str | None = None,
    prefill_tps: float | None = None,
    seed: int = 1,
) -> dict[str, Any]:
    """A block trace (Mooncake JSONL: `hash_ids`) through one group's instances with KV
    caches (`sluice.sim.prefix`): its prefix-cache-aware choice (`GroupSpec.prefix_choice`;
    the defaults where it is off) against power of two choices and affinity, `replicas`
    instances each caching `index_blocks` blocks. `group`: default the first group with
    `prefix_routing` written, else the first group that has it on, else the first group.
    `prefill_tps`: default the group's batching server's (`sim.batching.prefill_tps`), else
    `DEFAULT_PREFILL_TPS`; the result says which (`prefill_from`)."""
    from sluice.core.errors import SpecError, SpecIssue
    from sluice.sim.prefix import CacheModel, compare_pickers, load_block_trace
    from sluice.spec.models import PrefixRoutingSpec

    spec = load_spec_file(spec_path).spec
    if group is not None:
        chosen = next((g for g in spec.groups if g.name == group), None)
        if chosen is None:
            names = ", ".join(g.name for g in spec.groups)
            raise SpecError([SpecIssue("--group", f"no group {group!r} (groups: {names})")])
    else:
        chosen = next(
            (g for g in spec.groups if g.prefix_routing),
            next((g for g in spec.groups if g.prefix_choice()), spec.groups[0]),
        )
    prefill_from = "--prefill-tps"
    if prefill_tps is None:
        b = group_batching(chosen)
        if b is not None and b.prefill_tps != math.inf:
            prefill_tps, prefill_from = b.prefill_tps, "sim.batching"
        else:
            prefill_tps, prefill_from = DEFAULT_PREFILL_TPS, "default"
    if prefill_tps <= 0:
        raise SpecError([SpecIssue("--prefill-tps", "must be > 0")])
    try:
        trace = load_block_trace(Path(trace_path))
    except (OSError, ValueError) as exc:
        raise SpecError([SpecIssue("--trace", str(exc))]) from None
    settings = chosen.prefix_choice() or PrefixRoutingSpec()
    model = CacheModel(
        instances=max(1, chosen.replicas),
        cache_blocks=settings.index_blocks,
        prefill_tps=prefill_tps,
        max_concurrency=chosen.max_concurrency,
    )
    result = compare_pickers(trace, model, settings.epsilon, seed)
    return {
        "mode": "prefix",
        "group": chosen.name,
        "prefix_routing": "spec" if chosen.prefix_routing else "defaults",
        "prefill_tps": prefill_tps,
        "prefill_from": prefill_from,
        **result,
    }


def simulate_fleet_spec(
    spec_path: str | Path,
    refs: Sequence[str],
    *,
    group: str | None = None,
    policy: str | None = None,
    slo_ms: float | None = None,
    shape: TraceShape | None = None,
    pools: Mapping[str, int] | None = None,
    options: FleetOptions | None = None,
    report_dir: str | Path | None = None,
    fit: Fit | None = None,
) -> dict[str, Any]:
    """Run the whole spec on its traces (`fleet_traces`), each windowed and scaled by
    `shape`; `policy` replaces every autoscaled group's, `pools` the pools' counts; `fit` a
    load test's fitted server for its group. Returns `FleetResult.summary()` (the `--json`
    document)."""
    spec, fitted = _load(spec_path, fit)
    sh = shape or TraceShape()
    o = options or FleetOptions()
    groups = {g.name: g for g in spec.groups}
    works = {
        name: prepare(InstanceModel.from_spec(spec, groups[name], slo_ms), sh.of(trace, o.seed))
        for name, trace in fleet_traces(spec, refs, group, str(spec_path)).items()
    }
    return {**_fleet_run(spec, works, o, policy, pools, report_dir), "fitted": fitted}


def _load(spec_path: str | Path, fit: Fit | None) -> tuple[PlatformSpec, dict[str, Any] | None]:
    """The spec, with `fit`'s group as the server the load test fitted (and what was used)."""
    spec = load_spec_file(spec_path).spec
    return (spec, None) if fit is None else with_fitted_batching(spec, *fit)


def _fleet_run(
    spec: PlatformSpec,
    works: Mapping[str, Workload],
    options: FleetOptions,
    policy: str | None,
    pools: Mapping[str, int] | None,
    report_dir: str | Path | None,
    more: Callable[[FleetResult], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """`run_fleet` with `policy` for every autoscaled group and `pools` as the pools' counts;
    its summary, with what `more` reads from the result, and the report if asked."""
    if policy in ("oracle", "causal"):
        fix = "the fleet runs the live policies; use the one-group simulation for it"
        raise SpecError([SpecIssue("--policy", f"{policy!r}: {fix}")])
    o = options
    _check_rollouts(o.rollouts, set(works))
    if policy is not None:
        every = {g.name: policy for g in spec.groups if g.autoscaling is not None}
        o = dataclasses.replace(o, policies=every)
    if pools:
        o = dataclasses.replace(o, pool_counts={**o.pool_counts, **pools})
    result = run_fleet(spec, works, o)
    summary = result.summary()
    if more is not None:
        summary.update(more(result))
    if report_dir is not None:
        summary["report"] = str(write_fleet_report(result, report_dir, summary))
    return summary


def _check_rollouts(rollouts: Mapping[str, tuple[float, float]], groups: Set[str]) -> None:
    """`--rollout GROUP@START[-END]` names a group of the run, at 0 <= START < END."""
    issues = [
        SpecIssue("--rollout", f"{name!r} is not a group of this run ({', '.join(sorted(groups))})")
        for name in rollouts
        if name not in groups
    ]
    issues += [
        SpecIssue(
            "--rollout", f"{name}@{start:g}-{end:g}: a rollout starts at >= 0, before it ends"
        )
        for name, (start, end) in rollouts.items()
        if not 0 <= start < end
    ]
    if issues:
        raise SpecError(issues)
