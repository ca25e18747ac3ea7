"""`sluice propose|proposals|proposal show|approve|reject` (R5): reviewed spec changes.

A proposal carries its diff and an impact preview: the gateway's recent requests replayed
through the current and the proposed route rules. Approval by another person applies it.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from sluice.cli.common import (
    ControlOpt,
    FileOpt,
    HomeOpt,
    JsonOpt,
    ReasonOpt,
    client_for,
    out,
    post,
    post_spec,
    run,
    ts,
)

__all__ = ["approve", "proposal_app", "proposals", "propose", "reject"]

proposal_app = typer.Typer(no_args_is_help=True, help="One proposal: its diff and preview.")
IdArg = Annotated[int, typer.Argument(help="the proposal's number")]


def propose(
    file: FileOpt,
    reason: ReasonOpt,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    control: ControlOpt = None,
) -> None:
    """Propose a spec change for review: diff and impact preview, applied once approved."""

    def do() -> Any:
        return post_spec(home, control, "/v1/proposals", file, reason)

    def render(p: dict[str, Any]) -> None:
        out.print(
            f"proposal {p['id']} by {p['author']} against revision {p['base_revision']}: "
            f"pending; another person approves it with `sluice approve {p['id']} --reason ...`"
        )
        _show(p)

    run(as_json, do, render)


def proposals(
    include_all: Annotated[bool, typer.Option("--all", help="approved and rejected too")] = False,
    limit: int = 50,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    control: ControlOpt = None,
) -> None:
    """Proposals waiting for review (newest first), with their preview."""

    def render(items: list[dict[str, Any]]) -> None:
        t = Table("ID", "WHEN", "AUTHOR", "STATE", "BASE", "SECTIONS", "MOVED", "REASON", "REVIEW")
        for p in items:
            pv, routes = p["preview"], p["preview"]["routes"]
            review = "-"
            if p["state"] != "pending":
                rev = f" -> revision {p['revision']}" if p["revision"] else ""
                review = f"{p['reviewer']}: {p['review_reason']}{rev}"
            t.add_row(
                str(p["id"]),
                ts(p["created_at"]),
                p["author"],
                p["state"],
                str(p["base_revision"]),
                ", ".join(pv["sections"]) or "-",
                f"{routes['moved']}/{routes['replayed']}",
                p["reason"],
                review,
            )
        out.print(t)

    def fetch() -> Any:
        return client_for(home, control)[1].get("/v1/proposals", all=include_all, limit=limit)

    run(as_json, fetch, render)


@proposal_app.command("show")
def show(
    id: IdArg, as_json: JsonOpt = False, home: HomeOpt = None, control: ControlOpt = None
) -> None:
    """A proposal's diff against its base revision and its impact preview."""

    def render(p: dict[str, Any]) -> None:
        out.print(
            f"proposal {p['id']} by {p['author']} at {ts(p['created_at'])}: {p['state']}; "
            f"{p['reason']}",
            highlight=False,
        )
        if p["state"] != "pending":
            out.print(
                f"{p['state']} by {p['reviewer']} at {ts(p['reviewed_at'])}: "
                f"{p['review_reason']}" + (f" (revision {p['revision']})" if p["revision"] else ""),
                highlight=False,
            )
        _show(p)

    run(as_json, lambda: client_for(home, control)[1].get(f"/v1/proposals/{id}"), render)


def approve(
    id: IdArg,
    reason: ReasonOpt,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    control: ControlOpt = None,
) -> None:
    """Approve someone else's proposal: it is applied now as a new revision."""

    def do() -> Any:
        return post(home, control, f"/v1/proposals/{id}/approve", {"reason": reason})

    run(
        as_json,
        do,
        lambda p: out.print(f"proposal {p['id']} approved: applied as revision {p['revision']}"),
    )


def reject(
    id: IdArg,
    reason: ReasonOpt,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    control: ControlOpt = None,
) -> None:
    """Reject a proposal (its author may withdraw it this way); nothing is applied."""

    def do() -> Any:
        return post(home, control, f"/v1/proposals/{id}/reject", {"reason": reason})

    run(as_json, do, lambda p: out.print(f"proposal {p['id']} rejected by {p['reviewer']}"))


def _show(p: dict[str, Any]) -> None:
    pv = p["preview"]
    r, log = pv["routes"], pv["log"]
    out.print(p["diff"] or "(no textual change)", markup=False, highlight=False)
    out.print(f"sections changed: {', '.join(pv['sections']) or '-'}", highlight=False)
    if pv["needs_review"]:
        out.print(f"under review rules: {', '.join(pv['needs_review'])}", highlight=False)
    out.print(
        f"impact: {r['replayed']} logged request(s) replayed ({log['lines']} lines of "
        f"{log['path'] or 'no access log'}): {r['moved']} would move, {r['unchanged']} stay"
        + (f", {r['unroutable']} would have no route" if r["unroutable"] else ""),
        highlight=False,
    )
    if r["moves"]:
        t = Table("REQUESTS", "FROM", "TO", "TAGS BEFORE", "TAGS AFTER")
        for m in r["moves"]:
            t.add_row(
                str(m["requests"]),
                m["from"],
                m["to"],
                ", ".join(m["from_tags"]),
                ", ".join(m["to_tags"]),
            )
        out.print(t)
    if r["groups"]:
        t = Table("GROUP", "REQUESTS BEFORE", "AFTER")
        for g, c in r["groups"].items():
            t.add_row(g, f"{c['before']:g}", f"{c['after']:g}")
        out.print(t)
    for change, n in r["tag_changes"].items():
        out.print(f"tag {change}: {n} request(s)", highlight=False)
    for note in r["notes"]:
        out.print(f"[yellow]note:[/yellow] {note}", highlight=False)
