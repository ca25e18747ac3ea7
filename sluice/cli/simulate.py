"""`sluice simulate`: replay a request trace through a spec's group with the live policies on a
virtual clock, and report SLO attainment, latency, instance-seconds and cost. Every run goes
through the controller's own kernel step (`sluice.sim.fleet`): one group runs alone on its
pool (a fleet of one); with a trace per group (`--trace GROUP=FILE`, a CSV with a `group`
column, or `--fleet`) the whole spec runs together: shared pools, borrowing, reclaims,
budgets, with `--pool NAME=COUNT` for a what-if pool size."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import typer

from sluice.cli.common import ControlOpt, HomeOpt, client_for, out, run

__all__ = ["simulate"]


def simulate(
    spec: Annotated[Path, typer.Option("--spec", help="spec YAML")],
    trace: Annotated[
        list[str],
        typer.Option(
            "--trace",
            help="CSV: t_s,input_tokens,output_tokens,model; or family:NAME[@SEED], a "
            "generated trace (sluice.sim.families: poisson-4, mmpp-onoff, flash-crowd, ...); "
            "GROUP=FILE (repeatable) or a CSV with a group column: the fleet simulation; "
            "FILE.jsonl with hash_ids (Mooncake): the group's prefix-cache-aware choice",
        ),
    ],
    group: Annotated[str | None, typer.Option("--group", help="group to simulate")] = None,
    policy: Annotated[
        str | None,
        typer.Option(
            "--policy",
            help="sluice | hpa | kpa | fixed:N | oracle | causal (default: spec)",
        ),
    ] = None,
    slo_ms: Annotated[
        float | None, typer.Option("--slo-ms", help="fixed latency SLO instead of the spec's")
    ] = None,
    report: Annotated[
        Path | None, typer.Option("--report", help="write index.html + PNG plots here")
    ] = None,
    start: Annotated[float, typer.Option("--start", help="window start, trace seconds")] = 0.0,
    duration: Annotated[
        float | None, typer.Option("--duration", help="window length, trace seconds")
    ] = None,
    speedup: Annotated[float, typer.Option("--speedup", help="divide times by this")] = 1.0,
    rate_scale: Annotated[
        float, typer.Option("--rate-scale", help="thin (<1) or replicate (>1) requests")
    ] = 1.0,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    crash_rate: Annotated[
        float, typer.Option("--crash-rate", help="instance crashes per instance-hour")
    ] = 0.0,
    slow_start_prob: Annotated[
        float, typer.Option("--slow-start-prob", help="share of launches that start slowly")
    ] = 0.0,
    slow_start_factor: Annotated[
        float, typer.Option("--slow-start-factor", help="x start-up time when slow")
    ] = 3.0,
    warm: Annotated[
        bool,
        typer.Option(
            "--warm-start",
            help="start with the oracle's t=0 instance count ready (default: the spec's count)",
        ),
    ] = False,
    fleet: Annotated[
        bool, typer.Option("--fleet", help="simulate every group of the spec together")
    ] = False,
    routed: Annotated[
        bool,
        typer.Option(
            "--routed",
            help="one trace of callers (tenant, model, priority): route each request by "
            "the spec's rules and rate limits, run the fleet, report per route and tenant",
        ),
    ] = False,
    pool: Annotated[
        list[str] | None,
        typer.Option("--pool", help="NAME=COUNT: the pool's size instead of the spec's (fleet)"),
    ] = None,
    rollout: Annotated[
        list[str] | None,
        typer.Option(
            "--rollout",
            help="GROUP@START[-END]: a rollout of GROUP runs from START to END seconds (to "
            "the end of the run without one): GROUP keeps at least its count at START (the "
            "baseline's floor; the canary is not simulated)",
        ),
    ] = None,
    prefill_tps: Annotated[
        float | None,
        typer.Option(
            "--prefill-tps",
            help="prompt tokens/s an instance prefills (.jsonl; default: the group's "
            "sim.batching prefill_tps, else 10000)",
        ),
    ] = None,
    fit: Annotated[
        str | None,
        typer.Option(
            "--fit",
            help="run the fitted group's instances as the server `sluice loadtest GROUP --fit` "
            "measured: FILE (that command's --json, or a stored run's) or `latest` (the "
            "group's newest stored fit, read from the control API)",
        ),
    ] = None,
    home: HomeOpt = None,
    control: ControlOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document")] = False,
) -> None:
    """What would happen with this spec on that traffic? (trace-driven simulation)"""
    from sluice.core.errors import SpecError, SpecIssue
    from sluice.sim import SimOptions
    from sluice.sim.fleet import FleetOptions
    from sluice.sim.study import (
        TraceShape,
        parse_pool_counts,
        simulate_fleet_spec,
        simulate_prefix_spec,
        simulate_routed_spec,
        simulate_spec,
        wants_fleet,
    )
    from sluice.spec.loader import located

    def do() -> dict[str, Any]:
        try:
            return simulated()
        except SpecError as exc:  # a check of what the spec says: name its file and line
            try:
                text = spec.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                raise exc from None
            raise located(exc, text, str(spec)) from None

    def simulated() -> dict[str, Any]:
        if speedup <= 0 or rate_scale <= 0:
            raise SpecError([SpecIssue("--speedup/--rate-scale", "must be > 0")])
        shape = TraceShape(start, duration, speedup, rate_scale)
        rollouts = _rollouts(rollout or [])
        fleet_options = FleetOptions(
            rollouts=rollouts,
            seed=seed,
            crash_rate_per_hour=crash_rate,
            slow_start_prob=slow_start_prob,
            slow_start_factor=slow_start_factor,
        )
        fleet_args: dict[str, Any] = {
            "policy": policy,
            "slo_ms": slo_ms,
            "shape": shape,
            "pools": parse_pool_counts(pool or []),
            "options": fleet_options,
            "report_dir": report,
        }
        fitted = _fit(fit, group, home, control) if fit is not None else None
        if fitted is not None:
            fleet_args["fit"] = fitted
        if len(trace) == 1 and trace[0].endswith(".jsonl"):
            return simulate_prefix_spec(
                spec, trace[0], group=group, prefill_tps=prefill_tps, seed=seed
            )
        if routed:
            if len(trace) != 1 or warm:
                fix = "give one --trace of callers (no GROUP= prefix) and no --warm-start"
                raise SpecError([SpecIssue("--routed", f"a routed run reads one trace; {fix}")])
            return simulate_routed_spec(spec, trace[0], **fleet_args)
        if wants_fleet(trace, fleet):
            if warm:
                why = "the one-group simulation's option (the oracle's count); leave it out"
                raise SpecError([SpecIssue("--warm-start", why)])
            return simulate_fleet_spec(spec, trace, group=group, **fleet_args)
        if pool:
            fix = "add --fleet (or --trace GROUP=FILE) to run the fleet simulation"
            raise SpecError([SpecIssue("--pool", f"a pool size is a fleet what-if; {fix}")])
        return simulate_spec(
            spec,
            trace[0],
            group=group,
            policy=policy,
            slo_ms=slo_ms,
            shape=shape,
            options=SimOptions(
                rollouts=rollouts,
                seed=seed,
                crash_rate_per_hour=crash_rate,
                slow_start_prob=slow_start_prob,
                slow_start_factor=slow_start_factor,
            ),
            report_dir=report,
            warm=warm,
            fit=fitted,
        )

    def render(r: dict[str, Any]) -> None:
        if r.get("mode") == "prefix":
            from sluice.sim.prefix import render_comparison

            out.print(
                f"group {r['group']}, prefix_routing from the {r['prefix_routing']}, "
                f"prefill {r['prefill_tps']:g} tokens/s ({r['prefill_from']})"
            )
            for line in render_comparison(r):
                out.print(line, soft_wrap=True)
            return
        if r.get("fitted"):
            f, b = r["fitted"], r["fitted"]["batching"]
            prefill = f"{b['prefill_tps']:g} tok/s" if b["prefill_tps"] else "free"
            out.print(
                f"{f['group']}: the server fitted by {f['from']} (step {b['step_base_s']:g} s + "
                f"{b['step_per_seq_s']:g} s/seq, prefill {prefill}, start-up {f['startup_s']:g} s)",
                soft_wrap=True,
            )
        if r.get("mode") == "fleet":
            render_fleet(r)
            if "routed" in r:
                render_routed(r["routed"])
            return
        out.print(
            f"{r['group']} / {r['policy']} ({r['start']} start, "
            f"{r['initial_instances']} ready at t=0): {r['requests']} requests, "
            f"SLO {r['slo_attainment']:.4f} (target {r['slo_target']}), "
            f"p50 {r['p50_ms'] or 0:.0f} ms, p99 {r['p99_ms'] or 0:.0f} ms, "
            f"{r['instance_seconds']:.0f} instance-s (cost {r['cost']:.3f}), "
            f"peak {r['peak_instances']}, {r['scale_events']} scale events, "
            f"{r['rejected']} rejected",
            soft_wrap=True,
        )
        if "ttft_p50_ms" in r:
            out.print(_token_line(r), soft_wrap=True)
        if "causal_best" in r:
            b = r["causal_best"]
            out.print(
                f"best causal of the family: window {b['window_s']:g} s, rule {b['rule']}, "
                f"headroom {b['headroom']:g} ({r['causal_chosen_for']}; a hindsight pick "
                f"among {len(r['causal_candidates'])} candidates)",
                soft_wrap=True,
            )
        if "report" in r:
            out.print(f"report: {r['report']}")

    run(as_json, do, render)


def render_fleet(r: dict[str, Any]) -> None:
    """A row per group and the totals: SLO vs target, p99, instance-hours, cost, borrowed and
    lent unit-hours, reclaims (max latency), peak."""
    from rich import box
    from rich.table import Column, Table

    t = Table(
        *(Column("GROUP", no_wrap=True), "REQS", Column("SLO/TGT %", no_wrap=True), "P99 MS"),
        *("INST-H", "COST", "BORROW", "LENT", Column("RECLAIM", no_wrap=True), "PEAK"),
        title=f"fleet simulation, {r['duration_s']:.0f} s",
        caption="BORROW, LENT: unit-hours; RECLAIM: for the group's units (max latency)",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=(0, 1, 0, 0),
    )
    for g in r["groups"]:
        reclaims = str(g["reclaims"])
        if g["reclaim_max_latency_s"] is not None:
            reclaims += f" ({g['reclaim_max_latency_s']:.0f}s)"
        slo = "-"
        if g["requests"]:
            color = "green" if g["slo_attainment"] >= g["slo_target"] else "red"
            slo = f"[{color}]{100 * g['slo_attainment']:.2f}[/]/{100 * g['slo_target']:g}"
        t.add_row(
            *(g["group"], str(g["requests"]), slo),
            f"{g['p99_ms']:.0f}" if g["p99_ms"] is not None else "-",
            *(f"{g['instance_seconds'] / 3600:.2f}", f"{g['cost']:.2f}"),
            *(f"{g['borrowed_unit_hours']:.2f}", f"{g['lent_unit_hours']:.2f}"),
            *(reclaims, str(g["peak_instances"])),
        )
    tot = r["totals"]
    t.add_section()
    t.add_row(
        *("total", str(tot["requests"]), f"{100 * tot['slo_attainment']:.2f}", ""),
        *(f"{tot['instance_seconds'] / 3600:.2f}", f"{tot['cost']:.2f}"),
        *(f"{tot['borrowed_unit_hours']:.2f}", "", str(tot["reclaims"]), ""),
    )
    out.print(t)
    for g in r["groups"]:
        if "ttft_p50_ms" in g:
            out.print(f"{g['group']}: {_token_line(g)}", soft_wrap=True)
    pools = ", ".join(f"{p['name']} {p['count']} units" for p in r["pools"])
    out.print(f"pools: {pools}; {len(r['ledger'])} loans in the ledger", soft_wrap=True)
    if "report" in r:
        out.print(f"report: {r['report']}")


def _token_line(r: dict[str, Any]) -> str:
    """A batching group's TTFT and TPOT percentiles, KV-cache use and preemptions."""

    def ms(key: str) -> str:
        v = r.get(key)
        return "-" if v is None else f"{v:.0f}"

    def three(what: str) -> str:
        return "/".join(ms(f"{what}_p{q}_ms") for q in (50, 95, 99))

    kv = r.get("kv_cache_usage_mean")
    kv_max = r.get("kv_cache_usage_max")
    use = "-" if kv is None else f"{100 * kv:.0f}% mean, {100 * (kv_max or 0):.0f}% max"
    return (
        f"batching instances: TTFT p50/p95/p99 {three('ttft')} ms, TPOT {three('tpot')} ms, "
        f"KV cache {use}, {r.get('preemptions', 0)} preemptions"
    )


def render_routed(r: dict[str, Any]) -> None:
    """A row per route (the groups it reached), then per tenant (what the gateway refused
    itself: rate limits, no route): requests, SLO attainment, p50/p99, rejected and failed
    in the groups."""
    from rich import box
    from rich.table import Column, Table

    def table(what: str, extra: str) -> Table:
        return Table(
            *(Column(what, no_wrap=True), Column(extra, no_wrap=True), "REQS", "SLO %"),
            *("P50 MS", "P99 MS", "WAIT P95", "REJ", "FAIL"),
            title=f"by {what.lower()}",
            caption="WAIT P95: ms in its group's queue; REJ: shed or expired in its group's "
            "queue; FAIL: failed at an instance",
            box=box.SIMPLE_HEAD,
            show_edge=False,
            padding=(0, 1, 0, 0),
        )

    def numbers(o: dict[str, Any]) -> tuple[str, ...]:
        return (
            *(str(o["requests"]), f"{100 * o['slo_attainment']:.2f}"),
            f"{o['p50_ms']:.0f}" if o["p50_ms"] is not None else "-",
            f"{o['p99_ms']:.0f}" if o["p99_ms"] is not None else "-",
            f"{o['wait_p95_ms']:.0f}" if o["wait_p95_ms"] is not None else "-",
            *(str(o["rejected"]), str(o["failed"])),
        )

    routes = table("ROUTE", "TO")
    for tag, o in r["routes"].items():
        routes.add_row(tag, ", ".join(o["groups"]), *numbers(o))
    out.print(routes)
    tenants = table("TENANT", "REFUSED")
    for name, o in r["tenants"].items():
        refused = ", ".join(f"{k} {v}" for k, v in o["refused"].items()) or "-"
        tenants.add_row(name, refused, *numbers(o))
    out.print(tenants)


def _fit(
    value: str, group: str | None, home: str | None, control: str | None
) -> tuple[dict[str, Any], str]:
    """The load test report whose fitted server `--fit` names, and where it came from: a
    JSON file (`sluice loadtest --fit --json`, or a stored run, whose `report` it is), or
    `latest`: the group's newest stored load test with a fit, from the control API."""
    from sluice.core.errors import NotFound, SpecError, SpecIssue

    if value == "latest":
        if group is None:
            raise SpecError([SpecIssue("--fit", "`latest` of which group? add --group GROUP")])
        _, client = client_for(home, control)
        runs = client.get(f"/v1/groups/{group}/capacity", kind="loadtest", limit=50, reports="true")
        for stored in runs:
            report = stored.get("report") or {}
            if isinstance(report.get("fit"), dict) and report["fit"].get("params"):
                return report, f"load test #{stored['id']} ({stored['version']})"
        raise NotFound(
            f"no stored load test of {group} has a fit; run `sluice loadtest {group} --fit`",
            group=group,
        )
    try:
        doc = json.loads(Path(value).read_text())
    except OSError as exc:
        raise NotFound(f"--fit {value}: {exc.strerror or exc}", file=value) from None
    except ValueError as exc:
        raise SpecError([SpecIssue("--fit", f"{value} is not JSON: {exc}")]) from None
    report = doc.get("report", doc) if isinstance(doc, dict) else None
    if not isinstance(report, dict):
        raise SpecError([SpecIssue("--fit", f"{value}: a JSON object, a load test's report")])
    return report, value


def _rollouts(values: list[str]) -> dict[str, tuple[float, float]]:
    """`--rollout GROUP@START[-END]` values: group -> (start, end) seconds (end: inf)."""
    from sluice.core.errors import SpecError, SpecIssue

    out: dict[str, tuple[float, float]] = {}
    for value in values:
        name, sep, when = value.rpartition("@")
        start, dash, end = when.partition("-")
        try:
            out[name] = (float(start), float(end) if dash else math.inf)
        except ValueError:
            name = ""
        if not sep or not name:
            fix = "write GROUP@START or GROUP@START-END in seconds, e.g. chat@20-75"
            raise SpecError([SpecIssue("--rollout", f"{value!r}: {fix}")])
    return out
