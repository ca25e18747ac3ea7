"""`sluice drills`: the spec's scheduled drills (O5) with their next firing and last result;
`sluice drills run NAME`: fire one now (`--wait`: for its verdict, and exit by it);
`sluice drills fires [NAME]`: what each firing did. The control plane runs them
(`sluice.control.drills`); this module reads and asks."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer
from rich.table import Table

from sluice.cli.common import ControlOpt, HomeOpt, JsonOpt, client_for, err, out, run, ts
from sluice.core import EXIT_FAILED, EXIT_INCONCLUSIVE

FIRE_EXIT = {"running": 0, "passed": 0, "failed": EXIT_FAILED, "inconclusive": EXIT_INCONCLUSIVE}
"""A firing's status -> `sluice drills run`'s exit code (`sluice.core.verdicts`); any other
(error: the drill could not run or report) exits 1."""
WAIT_SLACK_S = 300.0
"""How long past its planned length `--wait` waits for a firing (the control plane stops a
drill 180 s past it)."""

__all__ = ["drills_app"]

drills_app = typer.Typer(
    invoke_without_command=True,
    help="Scheduled peak drills: when they run next, how the last one went, run one now.",
)


def _result(fire: dict[str, Any] | None) -> str:
    if fire is None:
        return "never run"
    detail = fire["detail"]
    why = detail.get("error") or detail.get("reason") or "; ".join(detail.get("reasons", []))
    run_ref = f" (run {fire['run_id']})" if fire.get("run_id") else ""
    handed = detail.get("handed_back")
    back = "" if not handed else "; handed back" if handed.get("done") else "; NOT handed back"
    return f"{fire['status']}{run_ref}{back}" + (f": {why}" if why else "")


@drills_app.callback()
def drills(
    ctx: typer.Context,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    control: ControlOpt = None,
) -> None:
    """Each scheduled drill: NAME GROUP CRON NEXT LAST (its status and why)."""
    if ctx.invoked_subcommand is not None:
        return

    def render(found: list[dict[str, Any]]) -> None:
        if not found:
            out.print("no scheduled drill (add a `drills:` list to the spec)")
            return
        t = Table("NAME", "GROUP", "CRON", "NEXT", "LAST", "RESULT")
        for d in found:
            last = d["last"]
            nxt = "disabled" if not d["enabled"] else ts(d["next_at"])
            if d["running_fire"] is not None:
                nxt = f"running (firing {d['running_fire']})"
            t.add_row(
                d["name"],
                d["group"],
                f"{d['cron']} {d['timezone']}",
                nxt,
                ts(last["started_at"]) if last else "-",
                _result(last),
            )
        out.print(t)

    run(as_json, lambda: client_for(home, control)[1].get("/v1/drills"), render)


@drills_app.command("run")
def run_now(
    name: Annotated[str, typer.Argument(help="the scheduled drill")],
    wait: Annotated[
        bool,
        typer.Option("--wait", help="wait for the drill's verdict; exit 8 failed, 9 inconclusive"),
    ] = False,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    control: ControlOpt = None,
) -> None:
    """Fire a scheduled drill now; it runs in the control plane (see `sluice drills fires`).
    With --wait, the firing's result when it ends, and its exit code (0 passed, 8 failed, 9
    inconclusive, 1 when it could not run); without, 0 once it started."""

    def do() -> dict[str, Any]:
        client = client_for(home, control)[1]
        fire: dict[str, Any] = client.post(f"/v1/drills/{name}/run", {})
        if not wait or fire["status"] != "running":
            return fire
        drills: list[dict[str, Any]] = client.get("/v1/drills")
        planned = next((d for d in drills if d["name"] == name), {})
        deadline = time.monotonic() + float(planned.get("duration_s") or 0) + WAIT_SLACK_S
        if not as_json:
            err.print(f"drill {name} started on {fire['group']} (firing {fire['id']}); waiting")
        while fire["status"] == "running" and time.monotonic() < deadline:
            time.sleep(2.0)
            found = client.get("/v1/drills/fires", schedule=name, limit=50)
            fire = next((f for f in found if f["id"] == fire["id"]), fire)
        return fire

    def render(fire: dict[str, Any]) -> None:
        if fire["status"] == "running" and not wait:
            out.print(
                f"drill {name} started on {fire['group']} (firing {fire['id']}, token "
                f"{fire['token']}); follow it with `sluice drills fires {name}`"
            )
        elif fire["status"] == "running":
            out.print(f"drill {name} (firing {fire['id']}) still runs; gave up waiting")
        elif wait:
            out.print(f"drill {name} (firing {fire['id']}) ended: {_result(fire)}", soft_wrap=True)
        else:
            out.print(f"drill {name} did not start: {_result(fire)}", soft_wrap=True)

    def exit_code(fire: dict[str, Any]) -> int:
        if fire["status"] == "running" and wait:
            return EXIT_INCONCLUSIVE  # no verdict came in time
        return FIRE_EXIT.get(fire["status"], 1)

    run(as_json, do, render, exit_code)


@drills_app.command("fires")
def fires(
    name: Annotated[str | None, typer.Argument(help="only this scheduled drill")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000)] = 20,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    control: ControlOpt = None,
) -> None:
    """The firings, newest first: ID DRILL TRIGGER BY STARTED ENDED RESULT."""

    def render(found: list[dict[str, Any]]) -> None:
        t = Table("ID", "DRILL", "GROUP", "TRIGGER", "BY", "STARTED", "ENDED", "RESULT")
        for f in found:
            t.add_row(
                str(f["id"]),
                f["schedule"],
                f["group"],
                f["trigger"],
                f["actor"],
                ts(f["started_at"]),
                ts(f["finished_at"]),
                _result(f),
            )
        out.print(t)

    def do() -> Any:
        return client_for(home, control)[1].get("/v1/drills/fires", schedule=name, limit=limit)

    run(as_json, do, render)
