"""`sluice alerts [--group G]` (O2): firing and pending alerts with the group's owner, then
the messages not delivered yet; `sluice alerts rules`: the rules as a Prometheus rules file
(YAML, ready for `promtool check rules`)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
import yaml
from rich.table import Table

from sluice.cli.common import ControlOpt, HomeOpt, JsonOpt, client_for, out, run, ts

__all__ = ["alerts_app", "rules_yaml"]

alerts_app = typer.Typer(
    invoke_without_command=True,
    help="Alerts: what fires now, what was not delivered, the rules for Prometheus.",
)


def _value(v: float | None) -> str:
    return "no data" if v is None else f"{v:.4g}"


@alerts_app.callback()
def alerts(
    ctx: typer.Context,
    group: Annotated[str | None, typer.Option("--group", help="only this group")] = None,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    control: ControlOpt = None,
) -> None:
    """Firing and pending alerts (GROUP OWNER RULE SEVERITY SINCE VALUE), then the messages
    waiting for delivery or dead-lettered."""
    if ctx.invoked_subcommand is not None:
        return

    def render(x: dict[str, Any]) -> None:
        current = x["firing"] + x["pending"]
        if not current:
            out.print("no alert is firing or pending")
        else:
            t = Table("GROUP", "OWNER", "RULE", "SEVERITY", "STATE", "SINCE", "VALUE")
            for a in current:
                t.add_row(
                    a["group"],
                    a["owner"],
                    a["rule"],
                    a["severity"],
                    a["phase"],
                    ts(a["since"]),
                    f"{_value(a['value'])} ({a['series']} {a['op']} {a['threshold']:g})",
                )
            out.print(t)
        for h in x.get("starting", ()):
            until = ts(h["until"]) if h.get("until") is not None else "-"
            out.print(
                f"{h['group']}: starting since {ts(h['since'])}, held until {until} ({h['held']})"
            )
        if x["undelivered"]:
            u = Table("ID", "GROUP", "RULE", "STATE", "CREATED", "ATTEMPTS", "STATUS", "LAST ERROR")
            for d in x["undelivered"]:
                u.add_row(
                    str(d["id"]),
                    d["group"],
                    d["rule"],
                    d["state"],
                    ts(d["created_at"]),
                    str(d["attempts"]),
                    "dead-lettered" if d["dead"] else f"retry {ts(d['next_at'])}",
                    d["last_error"] or "-",
                )
            out.print("undelivered messages:")
            out.print(u)

    run(as_json, lambda: client_for(home, control)[1].get("/v1/alerts", group=group), render)


def rules_yaml(answer: dict[str, Any]) -> str:
    """The rules file: the skipped rules as comments on top, then the document."""
    lines = [
        "# Sluice alert rules for Prometheus (sluice alerts rules); left out, with why:",
        *(f"#   {s['group']}/{s['rule']} ({s['series']}): {s['why']}" for s in answer["skipped"]),
    ]
    if not answer["skipped"]:
        lines[-1] = "# Sluice alert rules for Prometheus (sluice alerts rules)"
    body = yaml.safe_dump(answer["rules"], sort_keys=False, allow_unicode=True, width=1000)
    return "\n".join(lines) + "\n" + body


@alerts_app.command("rules")
def rules(as_json: JsonOpt = False, home: HomeOpt = None, control: ControlOpt = None) -> None:
    """The spec's alert rules as a Prometheus rules file (YAML; --json: the document and
    the rules left out)."""

    def render(x: dict[str, Any]) -> None:
        print(rules_yaml(x), end="")

    run(as_json, lambda: client_for(home, control)[1].get("/v1/alerts/rules"), render)
