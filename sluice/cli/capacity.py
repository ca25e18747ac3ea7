"""`sluice loadtest`, `sluice drill` and `sluice capacity`: capacity tests (O4) and peak
drills (O5) of a group, and their stored history. The engines are `sluice.tools.loadtest`
and `sluice.tools.drills`; this module reads options, prints, records and proposes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from sluice.cli.common import (
    ControlOpt,
    HomeOpt,
    JsonOpt,
    client_for,
    duration_s,
    err,
    gateway_endpoint,
    out,
    run,
    ts,
)
from sluice.core import SpecError, SpecIssue, verdict_exit

__all__ = ["capacity", "drill", "loadtest"]

EndpointOpt = Annotated[
    str | None, typer.Option("--endpoint", help="gateway URL (default: from control.json)")
]
ApiKeyOpt = Annotated[
    str | None,
    typer.Option(
        "--api-key", help="an operator tenant's key ($SLUICE_API_KEY)", show_default=False
    ),
]
AllowHostOpt = Annotated[
    list[str] | None,
    typer.Option("--allow-host", help="a non-loopback gateway host load may go to (repeatable)"),
]
ProfileOpt = Annotated[
    Path | None,
    typer.Option("--profile", help="request bodies: a trace CSV (token counts) or JSONL samples"),
]
ReportOpt = Annotated[Path | None, typer.Option("--report", help="write the plot(s) here")]
MaxLagOpt = Annotated[
    float,
    typer.Option(
        "--max-lag-ms",
        min=0,
        help="the generator's p99 lag behind its schedule past which the run is inconclusive",
    ),
]
DEFAULT_MAX_LAG_MS = 50.0
"""`sluice.policy.generator.BEHIND_LAG_S`, in ms (not imported: the CLI starts light)"""


def _target(
    home: str | None, endpoint: str | None, api_key: str | None, allow: list[str], group: str
) -> Any:
    from sluice.tools.loadgen import LoadTarget, check_target

    url = endpoint or gateway_endpoint(home)
    if url is None:
        raise SpecError(
            [SpecIssue("--endpoint", "no gateway URL: pass --endpoint or run `sluice up` here")]
        )
    check_target(url, allow, "--endpoint")
    key = api_key or os.environ.get("SLUICE_API_KEY") or None
    if key is None:
        raise SpecError(
            [
                SpecIssue(
                    "--api-key",
                    "the load goes through the gateway as an operator tenant (one with "
                    "`operator: true`, which may pin a group): pass --api-key or $SLUICE_API_KEY",
                )
            ]
        )
    return LoadTarget(url, api_key=key, group=group)


def _model(info: dict[str, Any]) -> str:
    return str(next(iter(info["models"])))


def loadtest(
    group: Annotated[str, typer.Argument(help="the group to measure")],
    slo_ms: Annotated[
        float | None,
        typer.Option("--slo-ms", min=1, help="latency target (ms): search the knee under it"),
    ] = None,
    profile: ProfileOpt = None,
    quantile: Annotated[
        str, typer.Option("--quantile", help="the latency judged: p50, p95 or p99")
    ] = "p95",
    step: Annotated[str, typer.Option("--step", help="how long each rate is offered")] = "10s",
    start_rps: Annotated[
        float | None, typer.Option("--start-rps", min=0.01, help="first rate (default: probe)")
    ] = None,
    max_rps: Annotated[
        float | None, typer.Option("--max-rps", min=0.01, help="highest rate offered")
    ] = None,
    max_steps: Annotated[int, typer.Option("--max-steps", min=2, max=64)] = 12,
    stream: Annotated[bool, typer.Option("--stream", help="streaming requests (TTFT)")] = False,
    propose: Annotated[
        bool, typer.Option("--propose", help="propose the recommended targets for the spec")
    ] = False,
    fit: Annotated[
        bool,
        typer.Option("--fit", help="fit the batching model's step time and prefill rate"),
    ] = False,
    fit_step: Annotated[
        str, typer.Option("--fit-step", help="--fit: how long each concurrency runs")
    ] = "4s",
    fit_levels: Annotated[
        str | None,
        typer.Option("--fit-levels", help="--fit: concurrencies, 1,2,4 (default: to max)"),
    ] = None,
    fit_prompts: Annotated[
        str, typer.Option("--fit-prompts", help="--fit: prompt lengths (words) at concurrency 1")
    ] = "128,1024,4096",
    max_lag_ms: MaxLagOpt = DEFAULT_MAX_LAG_MS,
    report: ReportOpt = None,
    endpoint: EndpointOpt = None,
    api_key: ApiKeyOpt = None,
    allow_host: AllowHostOpt = None,
    home: HomeOpt = None,
    control: ControlOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Find the rate one instance holds under the SLO (the knee) and the targets it implies;
    with --fit, fit the batching model's time parameters too (--fit alone: only those).
    Exits 8 when no rate held the SLO, 9 when the run is inconclusive (the generator fell
    behind its schedule: no knee, no targets, no proposal)."""

    def do() -> dict[str, Any]:
        from sluice.spec.edit import spec_with_targets
        from sluice.tools.capacity_report import write_loadtest_plot
        from sluice.tools.loadtest import (
            FitOptions,
            LoadtestOptions,
            loadtest,
            read_profile,
            stored_verdict,
        )

        if quantile not in ("p50", "p95", "p99"):
            raise SpecError([SpecIssue("--quantile", f"{quantile!r}: one of p50, p95, p99")])
        if slo_ms is None and not fit:
            why = "give the latency target the knee is searched under, or --fit"
            raise SpecError([SpecIssue("--slo-ms", why)])
        fit_opts = (
            FitOptions(
                levels=_ints("--fit-levels", fit_levels) if fit_levels else None,
                level_s=duration_s(fit_step),
                prompts=_ints("--fit-prompts", fit_prompts),
            )
            if fit
            else None
        )
        _, client = client_for(home, control)
        info = _group_info(client, group)
        target = _target(home, endpoint, api_key, allow_host or [], group)
        opts = (
            LoadtestOptions(
                slo_ms=slo_ms,
                quantile=quantile,  # type: ignore[arg-type]
                step_s=duration_s(step),
                start_rps=start_rps,
                max_rps=max_rps,
                max_steps=max_steps,
                max_lag_s=max_lag_ms / 1000.0,
            )
            if slo_ms is not None
            else None
        )
        body = read_profile(profile, _model(info), stream)
        say = (lambda _: None) if as_json else err.print
        result = loadtest(client, target, info, body, opts, err, say, fit_opts)
        _record(client, group, "loadtest", "live", stored_verdict(result), result)
        if report is not None and result["steps"]:
            result["plot"] = str(write_loadtest_plot(result, report))
        rec = result.get("recommendation")
        stale = result["stored"].get("stale")
        if stale:  # the knee moved: the control plane raised an alert, and filed a proposal
            result["stale"] = stale
            if stale.get("proposal"):
                result["proposal"] = {"id": stale["proposal"]}
        if propose and rec and slo_ms is not None and not (stale and stale.get("proposal")):
            yaml_text = client.get("/v1/revisions", limit=1)[0]["yaml_text"]
            try:
                proposed = spec_with_targets(yaml_text, group, rec["targets"])
            except ValueError as exc:
                raise SpecError([SpecIssue("--propose", str(exc))]) from None
            why = f"sluice loadtest: knee {result['knee']['rate_rps']:.1f} rps at {slo_ms:g} ms"
            result["proposal"] = client.post(
                "/v1/proposals", {"yaml": proposed, "source": "sluice loadtest", "reason": why}
            )
        return result

    run(as_json, do, _render_loadtest, _loadtest_exit)


def _loadtest_exit(result: dict[str, Any]) -> int:
    from sluice.tools.loadtest import run_verdict

    return verdict_exit(run_verdict(result))


def _ints(option: str, text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise SpecError([SpecIssue(option, f"{text!r}: whole numbers, comma-separated")]) from None


def drill(
    group: Annotated[str, typer.Argument(help="the group to drill")],
    peak: Annotated[str, typer.Option("--peak", help="5x the base rate, or 40rps")] = "5x",
    base: Annotated[
        float | None, typer.Option("--base", min=0, help="base rate (default: last 10 min)")
    ] = None,
    ramp: Annotated[str, typer.Option("--ramp", help="how long the rise takes (ramp)")] = "60s",
    hold: Annotated[str, typer.Option("--hold", help="how long the peak lasts")] = "5m",
    warm: Annotated[str, typer.Option("--warm", help="base rate before the peak")] = "10s",
    cool: Annotated[str, typer.Option("--cool", help="base rate after the peak")] = "30s",
    shape: Annotated[str, typer.Option("--shape", help="step, ramp or trace")] = "step",
    trace: Annotated[
        Path | None, typer.Option("--trace", help="--shape trace: replay this CSV's arrivals")
    ] = None,
    simulate: Annotated[
        bool, typer.Option("--simulate", help="on the simulator: no load is sent")
    ] = False,
    file: Annotated[
        Path | None, typer.Option("-f", "--file", help="--simulate without a running fleet")
    ] = None,
    instances: Annotated[
        int | None,
        typer.Option("--instances", min=0, help="--simulate from this many (default: now)"),
    ] = None,
    max_time_to_scale: Annotated[
        str, typer.Option("--max-time-to-scale", help="criterion: peak -> first scale-up")
    ] = "30s",
    max_time_to_recover: Annotated[
        str, typer.Option("--max-time-to-recover", help="criterion: peak -> queue under target")
    ] = "2m",
    min_slo: Annotated[
        float, typer.Option("--min-slo", min=0, max=1, help="criterion: SLO attainment")
    ] = 0.9,
    max_shed: Annotated[
        float, typer.Option("--max-shed", min=0, max=1, help="criterion: shed share")
    ] = 0.05,
    seed: Annotated[int, typer.Option("--seed", help="the arrivals' random seed")] = 0,
    max_lag_ms: MaxLagOpt = DEFAULT_MAX_LAG_MS,
    profile: ProfileOpt = None,
    report: ReportOpt = None,
    endpoint: EndpointOpt = None,
    api_key: ApiKeyOpt = None,
    allow_host: AllowHostOpt = None,
    home: HomeOpt = None,
    control: ControlOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Send a synthetic peak (or simulate it) and judge how autoscaling reacted; a live
    drill then hands the group back to its autoscaler. Exits 8 when the verdict fails, 9
    when it is inconclusive (the generator fell behind its schedule)."""

    def do() -> dict[str, Any]:
        from sluice.policy.drills import DrillCriteria
        from sluice.spec import GroupSpec, load_spec_file, load_spec_text
        from sluice.tools.capacity_report import write_drill_plot
        from sluice.tools.drills import DrillOptions, live_drill, plan_drill, simulated_drill
        from sluice.tools.loadtest import read_profile

        if shape not in ("step", "ramp", "trace"):
            raise SpecError([SpecIssue("--shape", f"{shape!r}: one of step, ramp, trace")])
        if instances is not None and not simulate:
            why = "a live drill starts from the fleet as it is; --instances is for --simulate"
            raise SpecError([SpecIssue("--instances", why)])
        criteria = DrillCriteria(
            max_time_to_scale_s=duration_s(max_time_to_scale),
            max_time_to_recover_s=duration_s(max_time_to_recover),
            min_slo_attainment=min_slo,
            max_shed_rate=max_shed,
        )
        opts = DrillOptions(
            peak=peak,
            base_rps=base,
            shape=shape,  # type: ignore[arg-type]
            warm_s=duration_s(warm),
            ramp_s=duration_s(ramp),
            hold_s=duration_s(hold),
            cool_s=duration_s(cool),
            trace=trace,
            start_instances=instances,
            seed=seed,
            criteria=criteria,
            max_lag_s=max_lag_ms / 1000.0,
        )
        if simulate and file is not None:  # no fleet: the spec file alone
            spec = load_spec_file(file).spec
            g = spec.group(group)
            if g is None:
                known = ", ".join(x.name for x in spec.groups)
                raise SpecError(
                    [SpecIssue("GROUP", f"no group named {group!r} in {file} ({known})")]
                )
            info = _info_from_spec(g)
            return simulated_drill(spec, plan_drill(None, info, g, opts))
        _, client = client_for(home, control)
        info = _group_info(client, group)
        # the group's own spec: a token scoped to the group may read it (not the platform's)
        g = GroupSpec.model_validate(client.get(f"/v1/groups/{group}/spec"))
        setup = plan_drill(client, info, g, opts)
        if simulate:  # the whole fleet is simulated: the platform's spec (an unscoped token)
            live = client.get("/v1/revisions", limit=1)[0]
            spec = load_spec_text(live["yaml_text"], f"revision {live['number']}").spec
            result = simulated_drill(spec, setup)
        else:
            target = _target(home, endpoint, api_key, allow_host or [], group)
            result = live_drill(client, target, setup, read_profile(profile, _model(info)), err)
        _record(client, group, "drill", result["mode"], result["judgement"]["verdict"], result)
        if report is not None:
            result["plot"] = str(write_drill_plot(result, report))
        return result

    run(as_json, do, _render_drill, lambda r: verdict_exit(r["judgement"]["verdict"]))


def capacity(
    group: Annotated[str, typer.Argument(help="the group")],
    kind: Annotated[str | None, typer.Option("--kind", help="loadtest or drill")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000)] = 20,
    home: HomeOpt = None,
    control: ControlOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The group's stored load tests and drills, newest first, by model version."""

    def do() -> Any:
        if kind not in (None, "loadtest", "drill"):
            raise SpecError([SpecIssue("--kind", f"{kind!r}: loadtest or drill")])
        _, client = client_for(home, control)
        return client.get(f"/v1/groups/{group}/capacity", kind=kind, limit=limit, reports="true")

    def render(runs: list[dict[str, Any]]) -> None:
        table = Table(title=f"capacity runs of {group}")
        for col in ("id", "when", "kind", "mode", "version", "verdict", "result", "by"):
            table.add_column(col)
        for r in runs:
            rep = r["report"]
            fit = rep.get("fit") or {}
            if r["kind"] == "loadtest" and rep.get("knee"):
                what = f"knee {rep['knee']['rate_rps']:.1f} rps"
            elif r["kind"] == "loadtest" and fit.get("params"):
                p = fit["params"]
                what = (
                    f"step {1000 * p['step_base_s']:.1f} + {1000 * p['step_per_seq_s']:.2f} x b ms"
                )
            elif r["kind"] == "drill":
                first = rep["judgement"]["milestones"].get("first_scale_up_s")
                what = f"scale-up after {first:.0f} s" if first is not None else "no scale-up"
            else:
                what = "-"
            table.add_row(
                str(r["id"]),
                ts(r["created_at"]),
                r["kind"],
                r["mode"],
                r["version"],
                r["verdict"],
                what,
                r["actor"],
            )
        out.print(table)

    run(as_json, do, render)


def _record(
    client: Any, group: str, kind: str, mode: str, verdict: str, result: dict[str, Any]
) -> None:
    """Store the run in the group's capacity history; `result` gains the stored row."""
    row = {"kind": kind, "mode": mode, "verdict": verdict, "report": result}
    result["stored"] = client.post(f"/v1/groups/{group}/capacity", row)


def _group_info(client: Any, group: str) -> dict[str, Any]:
    groups = client.get("/v1/groups")
    for g in groups:
        if g["name"] == group:
            return dict(g)
    known = ", ".join(g["name"] for g in groups)
    raise SpecError([SpecIssue("GROUP", f"no group named {group!r} (groups: {known})")])


def _info_from_spec(g: Any) -> dict[str, Any]:
    """What `/v1/groups` says of a group, from the spec alone (a fleet that is not running)."""
    return {
        "name": g.name,
        "models": {k: {"runtime": m.runtime, "version": m.version} for k, m in g.models.items()},
        "version": g.version_label(),
        "max_concurrency": g.max_concurrency,
        "autoscaling": g.autoscaling.model_dump() if g.autoscaling else None,
        "desired": min(max(g.replicas, g.autoscaling.min), g.autoscaling.max)
        if g.autoscaling
        else g.replicas,
    }


def _render_loadtest(r: dict[str, Any]) -> None:
    if r.get("fit") is not None:
        _render_fit(r)
    if r.get("slo_ms") is None:
        return
    table = Table(
        title=f"{r['group']} ({r['version']}): one instance, SLO {r['slo_ms']:g} ms {r['quantile']}"
    )
    for col in ("offered rps", "achieved", "p50 ms", "p95 ms", "p99 ms", "errors", "verdict"):
        table.add_column(col, justify="right")
    for s in sorted(r["steps"], key=lambda s: s["offered_rps"]):
        table.add_row(
            f"{s['offered_rps']:.2f}",
            f"{s['achieved_rps']:.2f}",
            _ms(s["p50_ms"]),
            _ms(s["p95_ms"]),
            _ms(s["p99_ms"]),
            str(s["errors"]),
            "holds" if s["verdict"]["holds"] else s["verdict"]["why"],
        )
    out.print(table)
    knee, rec = r.get("knee"), r.get("recommendation")
    if r.get("inconclusive"):
        out.print(f"[yellow]inconclusive: {escape(r['inconclusive'])}[/yellow]", soft_wrap=True)
        return
    if knee is None:
        out.print(f"[red]{escape(r.get('no_knee') or 'no rate held the SLO')}[/red]")
        return
    out.print(
        f"knee: {knee['rate_rps']:.2f} rps per instance at {knee['concurrency']:.1f} in flight "
        f"({r['quantile']} {knee['latency_ms']:.0f} ms; limited by {knee['limited_by']})"
    )
    if rec:
        targets = ", ".join(f"{k}: {v}" for k, v in rec["targets"].items())
        out.print(f"recommended autoscaling.targets: {targets}")
    if r.get("compared_with"):
        c = r["compared_with"]
        out.print(f"vs {c['old_version']}: {c['verdict']} ({100 * c['rate_change']:+.0f}% rate)")
    if r.get("stale"):
        s = r["stale"]
        filed = f"; proposal #{s['proposal']} updates them" if s.get("proposal") else ""
        out.print(
            f"[yellow]the knee moved {100 * s['rate_change']:+.0f}% from the last load test "
            f"(margin {100 * s['margin']:.0f}%): its autoscaling targets are stale, an alert "
            f"went to the group's channel{filed}[/yellow]"
        )
    for key in ("plot", "proposal"):
        if r.get(key):
            out.print(f"{key}: {r[key] if key == 'plot' else r[key]['id']}")


FIT_ROWS = (
    ("step_base_s", "step base", 1000.0, "ms"),
    ("step_per_seq_s", "step per sequence", 1000.0, "ms"),
    ("step_per_kv_token_s", "step per KV token", 1e6, "us"),
    ("prefill_tps", "prefill rate", 1.0, "tokens/s"),
    ("ttft_intercept_s", "TTFT at no prompt", 1000.0, "ms"),
)


def _render_fit(r: dict[str, Any]) -> None:
    f = r["fit"]
    table = Table(title=f"{r['group']} ({r['version']}): batching model fitted on one instance")
    for col in ("concurrency", "answers used", "TPOT ms", "TTFT ms"):
        table.add_column(col, justify="right")
    for lv in f["levels"]:
        table.add_row(
            str(lv["concurrency"]), str(lv["used"]), _ms1(lv["tpot_ms"]), _ms1(lv["ttft_ms"])
        )
    out.print(table)
    prompts = Table(title="at concurrency 1")
    for col in ("prompt words", "prompt tokens", "answers", "TTFT ms", "TPOT ms"):
        prompts.add_column(col, justify="right")
    for p in f["prompts"]:
        prompts.add_row(
            str(p["words"]),
            "-" if p["prompt_tokens"] is None else f"{p['prompt_tokens']:.0f}",
            str(p["requests"]),
            _ms1(p["ttft_ms"]),
            _ms1(p["tpot_ms"]),
        )
    out.print(prompts)
    if f.get("error"):
        out.print(f"[red]no fit: {escape(f['error'])}[/red]")
        return
    params = Table(title="fitted parameters (least squares, standard errors)")
    for col in ("parameter", "value", "std. error", "rel. error"):
        params.add_column(col, justify="right")
    for key, label, scale, unit in FIT_ROWS:
        est = f.get(key)
        if est is None:
            params.add_row(label, "not identified", "-", "-")
            continue
        se, rel = est["stderr"], est["rel_err"]
        params.add_row(
            label,
            f"{_num(est['value'] * scale)} {unit}",
            "-" if se is None else f"{_num(se * scale)} {unit}",
            "-" if rel is None else f"{100 * rel:.1f}%",
        )
    out.print(params)
    out.print(f"KV term: {escape(f['kv_note'])}", soft_wrap=True)
    if f.get("prefill_tps") is None:
        out.print(f"prefill: {escape(f['prefill_note'])}", soft_wrap=True)
    res = f["residual"]
    out.print(
        f"residual: TPOT rms {res['tpot_rms_s'] * 1000:.2f} ms (R^2 {res['tpot_r2']:.3f}) over "
        f"{f['points']['tpot']} answers; TTFT rms {res['ttft_rms_s'] * 1000:.2f} ms (R^2 "
        f"{res['ttft_r2']:.3f}) over {f['points']['ttft']}; prompt tokens from "
        f"{f['prompt_tokens_from']}; {f['chunks']['note']}",
        soft_wrap=True,
    )


def _num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def _ms1(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _render_drill(r: dict[str, Any]) -> None:
    j, plan = r["judgement"], r["plan"]
    color = "green" if j["verdict"] == "pass" else "red"
    out.print(
        f"drill of {r['group']} ({r['mode']}): {plan['base_rps']:.1f} -> {plan['peak_rps']:.1f} "
        f"rps, {plan['shape']}; verdict [{color}]{j['verdict']}[/{color}]"
    )
    m = j["milestones"]
    out.print(
        f"  first scale-up {_s(m.get('first_scale_up_s'))}, instances ready "
        f"{', '.join(_s(x) for x in m.get('instances_ready_s') or []) or '-'}, queue back under "
        f"target {_s(m.get('queue_recovered_s'))} (from the peak's start)"
    )
    out.print(f"  SLO attainment {100 * (j['slo_attainment'] or 0):.1f}%, shed {j['shed']}")
    for key in ("did_the_metric_trigger", "did_the_instances_come_up", "did_traffic_reach_them"):
        section = j[key]
        mark = "yes" if section["answer"] else "no"
        out.print(f"  {key.replace('_', ' ')}? {mark}: {section['detail']}", soft_wrap=True)
    for why in j["reasons"]:
        out.print(f"  - {why}", soft_wrap=True)
    handed = r.get("handed_back")
    if handed is not None:
        done = handed["done"]
        color = "green" if done else "red"
        text = f"handed back: {handed['why']}" if done else handed["why"]
        out.print(f"[{color}]{escape(text)}[/{color}]", soft_wrap=True)
    if r.get("plot"):
        out.print(f"plot: {r['plot']}")


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f} s"
