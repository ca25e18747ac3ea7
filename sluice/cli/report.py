"""`sluice report usage` (O3, Q3) and `sluice groups doc` (G4): reports read from the state
directory's store alone, so they work whether or not the fleet is running."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from sluice.cli.common import HomeOpt, JsonOpt, out, point_in_time, run
from sluice.config import Settings
from sluice.control.observer import stored_rollups
from sluice.core import NotFound
from sluice.policy.history import HOUR_S, MINUTE_S, merge
from sluice.policy.usage import usage_report
from sluice.spec import PlatformSpec, load_spec_text
from sluice.store import Store
from sluice.tools.groups_doc import HEADINGS, group_cells, groups_directory, write_groups_doc
from sluice.tools.usage_report import write_usage_report

__all__ = ["groups_app", "report_app"]

report_app = typer.Typer(no_args_is_help=True, help="Reports from the stored history.")
groups_app = typer.Typer(no_args_is_help=True, help="The groups directory.")

HtmlOpt = Annotated[
    Path | None, typer.Option("--html", help="also write index.html, PNGs and JSON into DIR")
]
ALERT_KINDS = ("alert_firing", "alert_resolved")
ALERT_EVENTS_READ = 10_000
"""At most this many alert events are read for the 24 h counts (newest first)."""


def _open_store(home: str | None) -> Store:
    """The state directory's store; NotFound (exit 4) when it has none: a report must not
    create an empty state directory."""
    settings = Settings.from_env(home)
    db = settings.home / "state.db"
    if not db.is_file():
        raise NotFound(
            f"no state database at {db}: run `sluice up` first, or point --home / "
            "$SLUICE_HOME at a state directory",
            home=str(settings.home),
        )
    return Store.for_home(settings.home)


def _latest_spec(store: Store) -> tuple[PlatformSpec | None, int | None]:
    rev = store.latest_revision()
    if rev is None:
        return None, None
    return load_spec_text(rev.yaml_text, f"revision {rev.number}").spec, rev.number


def usage_document(store: Store, since: float, until: float) -> dict[str, Any]:
    """The usage report over [since, until) from the stored hour rows (plus the minutes of
    the hours not merged yet), against the latest revision's spec."""
    spec, number = _latest_spec(store)
    hours = stored_rollups(store, None, since, until, HOUR_S)
    doc = usage_report(spec, hours, since, until)
    return {"revision": number, **doc}


@report_app.command("usage")
def usage(
    since: Annotated[str, typer.Option("--from", help="from: 30d, 2h or an ISO time")] = "30d",
    until: Annotated[str | None, typer.Option("--to", help="to (default: now)")] = None,
    html_dir: HtmlOpt = None,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
) -> None:
    """Per group over the span: busiest hours of the week, use against guarantee, idle
    quota that could return to the shared pool, loans, spend against budget, errors, p95."""

    def build() -> dict[str, Any]:
        start = point_in_time(since)
        end = point_in_time(until) or time.time()
        assert start is not None
        store = _open_store(home)
        try:
            doc = usage_document(store, start, end)
        finally:
            store.close()
        if html_dir is not None:  # usage.json then holds what --json prints
            doc["html"] = str(html_dir / "index.html")
            write_usage_report(doc, html_dir)
        return doc

    def render(doc: dict[str, Any]) -> None:
        use = Table(
            "GROUP", "SEEN", "GUAR", "HELD", "BUSY", "RETURN", "UNDER-USE", "LOANS",
            title="use against guarantee (units: mean/max; loans: +borrowed/-lent unit-h)",
        )  # fmt: skip
        service = Table(
            "GROUP", "REQUESTS", "REQ/S", "ERR", "P95 MS", "SPEND", "MONTH/BUDGET",
            title="traffic and spend",
        )  # fmt: skip
        for g in doc["groups"]:
            under = "not judged" if not g["judged"] else ("yes" if g["under_using"] else "no")
            month = _c(g["projected_month_spend"], "{:.2f}")
            if g["budget_per_month"]:
                month += f" / {g['budget_per_month']:g}"
            held, busy = g["held_units"], g["busy_units"]
            use.add_row(
                g["group"],
                _c(g["coverage"], "{:.0%}"),
                _c(g["guaranteed_units"], "{}"),
                f"{_c(held['mean'], '{:.1f}')}/{_c(held['peak'], '{:g}')}",
                f"{_c(busy['mean'], '{:.2f}')}/{_c(busy['peak'], '{:.2f}')}",
                _c(g["returnable_units"], "{}"),
                under,
                f"+{_c(g['borrowed_unit_hours'], '{:.0f}')}/-{_c(g['lent_unit_hours'], '{:.0f}')}",
            )
            service.add_row(
                g["group"],
                str(g["requests"]),
                _c(g["requests_per_s"], "{:.2f}"),
                _c(g["error_rate"], "{:.1%}"),
                _c(g["p95_ms"], "{:.0f}"),
                _c(g["spend"], "{:.2f}"),
                month,
            )
        out.print(use)
        out.print(service)
        for g in doc["groups"]:
            busiest = ", ".join(b["hour"] for b in g["busiest_hours"]) or "no traffic"
            out.print(f"{g['group']} busiest: {busiest}", highlight=False, soft_wrap=True)
        under = ", ".join(f"{u['group']} ({u['returnable_units']})" for u in doc["under_using"])
        out.print(
            f"under-using: {under or 'none'}; returnable units: {doc['returnable_units']}",
            highlight=False,
            soft_wrap=True,
        )
        out.print(doc["rule"], highlight=False)
        if doc.get("html"):
            out.print(f"report: {doc['html']}")

    run(as_json, build, render)


def groups_document(store: Store, now: float) -> dict[str, Any]:
    """The groups directory as the store knows it at `now`."""
    spec, number = _latest_spec(store)
    if spec is None:
        raise NotFound("no spec revision in the store yet: `sluice up -f SPEC` first")
    instances: dict[str, dict[str, int]] = {}
    for rec in store.list_instances():
        states = instances.setdefault(rec.group, {})
        states[rec.state] = states.get(rec.state, 0) + 1
    minutes = stored_rollups(store, None, now - HOUR_S, now, MINUTE_S)
    recent = {g: m for g, rs in minutes.items() if (m := merge(rs)) is not None}
    alerts: dict[str, dict[str, int]] = {}
    for e in store.list_events(kinds=ALERT_KINDS, limit=ALERT_EVENTS_READ):
        if e.at >= now - 86_400:
            counts = alerts.setdefault(e.group, {})
            counts[e.kind] = counts.get(e.kind, 0) + 1
    return groups_directory(spec, number, instances, recent, alerts, now)


@groups_app.command("doc")
def doc(
    html_dir: HtmlOpt = None,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
) -> None:
    """The one-page directory: group -> business, owner, alert channel (redacted), models,
    resources, quota, instances now, last hour's health and the last day's alerts."""

    def build() -> dict[str, Any]:
        store = _open_store(home)
        try:
            d = groups_document(store, time.time())
        finally:
            store.close()
        if html_dir is not None:
            d["html"] = str(html_dir / "index.html")
            write_groups_doc(d, html_dir)
        return d

    def render(d: dict[str, Any]) -> None:
        out.print(f"groups of spec revision {d['revision']}", highlight=False)
        for g in d["groups"]:
            name, *rest = group_cells(g)
            out.print(f"\n[bold]{escape(name)}[/bold]", highlight=False)
            for heading, text in zip(HEADINGS[1:], rest, strict=True):
                out.print(f"  {heading.lower()}: {text}", markup=False, highlight=False)
        if d.get("html"):
            out.print(f"directory: {d['html']}")

    run(as_json, build, render)


def _c(value: Any, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)
