"""`sluice drills`: the spec's scheduled drills (O5) with their next firing and last result;
`sluice drills run NAME`: fire one now; `sluice drills fires [NAME]`: what each firing did.
The control plane runs them (`sluice.control.drills`); this module reads and asks."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from sluice.cli.common import ControlOpt, HomeOpt, JsonOpt, client_for, out, run, ts

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
    return f"{fire['status']}{run_ref}" + (f": {why}" if why else "")


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
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    control: ControlOpt = None,
) -> None:
    """Fire a scheduled drill now; it runs in the control plane (see `sluice drills fires`)."""

    def render(fire: dict[str, Any]) -> None:
        if fire["status"] == "running":
            out.print(
                f"drill {name} started on {fire['group']} (firing {fire['id']}, token "
                f"{fire['token']}); follow it with `sluice drills fires {name}`"
            )
        else:
            out.print(f"drill {name} did not start: {_result(fire)}")

    run(as_json, lambda: client_for(home, control)[1].post(f"/v1/drills/{name}/run", {}), render)


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
