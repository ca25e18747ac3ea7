"""`sluice rollout plan|start|status|pause|resume|promote|abort|report NAME` (C1-C6); the
changes are audited. `start` first says how long the rollout will take at the current
traffic (`plan`), then starts it."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from sluice.cli.common import (
    ControlOpt,
    HomeOpt,
    JsonOpt,
    ReasonOpt,
    client_for,
    out,
    post,
    run,
    ts,
)

__all__ = ["rollout_app"]

rollout_app = typer.Typer(
    no_args_is_help=True, help="Canary rollouts: steps, analysis, rollback, archive."
)
NameArg = Annotated[str, typer.Argument(help="the rollout's name in the spec")]


def _act(action: str, help_text: str) -> None:
    def command(
        name: NameArg,
        reason: ReasonOpt,
        as_json: JsonOpt = False,
        home: HomeOpt = None,
        control: ControlOpt = None,
    ) -> None:
        def do() -> Any:
            return post(home, control, f"/v1/rollouts/{name}/{action}", {"reason": reason})

        def render(state: dict[str, Any]) -> None:
            last = state["transitions"][-1] if state["transitions"] else {"reason": ""}
            out.print(f"{name}: {state['phase']} at {state['percent']:g}% ({last['reason']})")

        run(as_json, do, render)

    command.__doc__ = help_text
    rollout_app.command(action)(command)


_act("pause", "Hold NAME at its current step (analysis still rolls back on failure).")
_act("resume", "Resume a paused NAME; the step's hold and analysis window restart.")
_act("promote", "Send all of the baseline's traffic to the canary now, skipping steps left.")
_act("abort", "Roll NAME back now: all traffic to the baseline; the canary keeps running.")


def _duration(seconds: float | None) -> str:
    if seconds is None or seconds == float("inf"):
        return "?"
    m = round(seconds / 60)
    if m < 1:
        return f"{seconds:.0f} s"
    return f"{m // 60} h {m % 60} min" if m >= 60 else f"{m} min"


def show_plan(plan: dict[str, Any]) -> None:
    """The plan for a person: the promise, the answers each step needs, the time it takes."""
    rate = plan["rate_rps"]
    at = (
        f"at {rate:.3g} req/s on '{plan['baseline']}' (the last minute)"
        if rate
        else "traffic on the baseline unknown yet (no requests in the last minute?)"
    )
    head = f"{plan['rollout']}: about {_duration(plan['total_s'])} {at}"
    if not rate:
        head = f"{plan['rollout']}: duration unknown, {at}"
    out.print(head, highlight=False)
    driver = plan["driver"]
    why = f"set by {driver}" if driver else "set by min_samples"
    out.print(
        f"false rollbacks <= {plan['false_rollback_rate']:.2%} per rollout; regressions of the "
        f"smallest size worth catching are caught with {plan['power']:.0%} by step "
        f"{plan['catch_steps']} ({plan['catch_samples']} canary answers by then); answers a "
        f"step needs: {why}; a look counts requests that arrived "
        f"{plan['horizon_s']:.3g} s before it (the slow tail of recent answers)",
        highlight=False,
    )
    t = Table("STEP", "CANARY %", "ANSWERS A SIDE", "LOOKS AT", "TIME")
    for s in plan["steps"]:
        t.add_row(
            str(s["step"] + 1),
            f"{s['percent']:g}",
            str(s["samples"]),
            ", ".join(str(n) for n in s["looks"]),
            _duration(s["seconds"]),
        )
    out.print(t)


@rollout_app.command("plan")
def plan(
    name: NameArg, as_json: JsonOpt = False, home: HomeOpt = None, control: ControlOpt = None
) -> None:
    """How NAME's analysis is designed (false rollbacks, looks, answers per step) and how long
    it will take at the baseline's current traffic."""
    run(as_json, lambda: client_for(home, control)[1].get(f"/v1/rollouts/{name}/plan"), show_plan)


@rollout_app.command("start")
def start(
    name: NameArg,
    reason: ReasonOpt,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    control: ControlOpt = None,
) -> None:
    """Start NAME: the canary gets the first step's share of the baseline's traffic. Says
    first how long the rollout will take at the current traffic (`--json`: under "plan")."""
    client = client_for(home, control)[1]

    def do() -> Any:
        planned = client.get(f"/v1/rollouts/{name}/plan")
        if not as_json:
            show_plan(planned)
        state = client.post(f"/v1/rollouts/{name}/start", {"reason": reason})
        return {**state, "plan": planned}

    def render(state: dict[str, Any]) -> None:
        last = state["transitions"][-1] if state["transitions"] else {"reason": ""}
        out.print(f"{name}: {state['phase']} at {state['percent']:g}% ({last['reason']})")

    run(as_json, do, render)


@rollout_app.command("status")
def status(as_json: JsonOpt = False, home: HomeOpt = None, control: ControlOpt = None) -> None:
    """Every rollout in the spec with its latest run."""

    def render(items: list[dict[str, Any]]) -> None:
        t = Table("ROLLOUT", "BASELINE", "CANARY", "RUN", "PHASE", "CANARY %", "CONCLUSION")
        for r in items:
            t.add_row(
                r["name"],
                r["baseline"],
                r["canary"],
                str(r["run"] or "-"),
                r["phase"],
                f"{r['percent']:g}",
                r["conclusion"] or "",
            )
        out.print(t)

    run(as_json, lambda: client_for(home, control)[1].get("/v1/rollouts"), render)


@rollout_app.command("report")
def report(
    name: NameArg,
    run_id: Annotated[int | None, typer.Option("--run", help="an older run's id")] = None,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    control: ControlOpt = None,
) -> None:
    """The archived record of a run: timeline, each step's analysis, compare, conclusion."""

    def render(r: dict[str, Any]) -> None:
        state = r["state"]
        out.print(
            f"[bold]{r['name']}[/bold] run {r['id']}: {r['baseline']} -> {r['canary']}, "
            f"started {ts(r['started_at'])} by {r['started_by']}; {r['phase']}"
        )
        if r["conclusion"]:
            out.print(f"conclusion: {r['conclusion']}", highlight=False)
        t = Table("WHEN", "FROM", "TO", "STEP", "%", "BY", "REASON")
        for x in state["transitions"]:
            t.add_row(
                ts(x["at"]),
                x["from"],
                x["to"],
                str(x["step"] + 1),
                f"{x['percent']:g}",
                x["by"],
                x["reason"],
            )
        out.print(t)
        for step in state["steps"]:
            analysis = step.get("analysis")
            head = f"step {step['step'] + 1} ({step['percent']:g}%): {step['outcome']}"
            if not analysis:
                out.print(head + ", no analysis")
                continue
            out.print(
                f"{head}, {analysis['baseline_samples']} vs {analysis['canary_samples']} "
                f"samples: {analysis['verdict']}"
            )
            t = Table("CRITERION", "VERDICT", "BASELINE", "CANARY", "STAT", "LIMIT", "WHY")
            for c in analysis["criteria"]:
                t.add_row(
                    c["name"],
                    c["verdict"],
                    _num(c["baseline"]),
                    _num(c["canary"]),
                    _num(c["statistic"]),
                    _num(c["threshold"]),
                    c["reason"],
                )
            out.print(t)
        cmp = r.get("compare")
        if cmp and "summary" in cmp:
            s = cmp["summary"]
            out.print(
                f"compare ({cmp['suite']['items']} items): exact match "
                f"{_num(s.get('exact_match_rate'))}, errors {s.get('errors')}"
            )
        elif cmp:
            out.print(f"compare: {cmp.get('error')}")

    run(
        as_json,
        lambda: client_for(home, control)[1].get(f"/v1/rollouts/{name}", run=run_id),
        render,
    )


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"
