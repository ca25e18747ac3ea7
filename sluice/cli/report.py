"""`sluice report usage` (O3, Q3) and `sluice groups doc` (G4): reports read from the state
directory's store alone, so they work whether or not the fleet is running."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from sluice.cli.common import ControlOpt, HomeOpt, JsonOpt, out, point_in_time, post, run

__all__ = ["groups_app", "report_app"]

report_app = typer.Typer(no_args_is_help=True, help="Reports from the stored history.")
groups_app = typer.Typer(no_args_is_help=True, help="The groups directory.")

HtmlOpt = Annotated[
    Path | None, typer.Option("--html", help="also write index.html, PNGs and JSON into DIR")
]


@report_app.command("usage")
def usage(
    since: Annotated[str, typer.Option("--from", help="from: 30d, 2h or an ISO time")] = "30d",
    until: Annotated[str | None, typer.Option("--to", help="to (default: now)")] = None,
    html_dir: HtmlOpt = None,
    propose: Annotated[
        bool,
        typer.Option(
            "--propose",
            help="file a proposal lowering the guarantee of each chronically under-used group",
        ),
    ] = False,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    control: ControlOpt = None,
) -> None:
    """Per group over the span: busiest hours of the week, use against guarantee, idle
    quota that could return to the shared pool, loans, spend against budget, errors, p95.
    Each group's reclaim verdict: with --propose the control plane files, per chronically
    under-used group, a proposal lowering its guarantee by the returnable units (evidence
    in its reason; reviewed as any spec change; none while one is pending)."""

    def build() -> dict[str, Any]:
        start = point_in_time(since)
        end = point_in_time(until) or time.time()
        assert start is not None
        from sluice.cli.report_data import open_store, usage_document
        from sluice.tools.usage_report import write_usage_report

        store = open_store(home)
        try:
            doc = usage_document(store, start, end)
        finally:
            store.close()
        if propose:  # the control plane judges again and files, one check at a time
            done = post(home, control, "/v1/reports/usage/propose", {"since": start, "until": end})
            doc["reclaim"] = done["groups"]
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
        for v in doc.get("reclaim", []):
            out.print(_reclaim_line(v), highlight=False, soft_wrap=True)
        if doc.get("html"):
            out.print(f"report: {doc['html']}")

    run(as_json, build, render)


@groups_app.command("doc")
def doc(
    html_dir: HtmlOpt = None,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
) -> None:
    """The one-page directory: group -> business, owner, alert channel (redacted), models,
    resources, quota, instances now, last hour's health and the last day's alerts."""

    def build() -> dict[str, Any]:
        from sluice.cli.report_data import groups_document, open_store
        from sluice.tools.groups_doc import write_groups_doc

        store = open_store(home)
        try:
            d = groups_document(store, time.time())
        finally:
            store.close()
        if html_dir is not None:
            d["html"] = str(html_dir / "index.html")
            write_groups_doc(d, html_dir)
        return d

    def render(d: dict[str, Any]) -> None:
        from sluice.tools.groups_doc import HEADINGS, group_cells

        out.print(f"groups of spec revision {d['revision']}", highlight=False)
        for g in d["groups"]:
            name, *rest = group_cells(g)
            out.print(f"\n[bold]{escape(name)}[/bold]", highlight=False)
            for heading, text in zip(HEADINGS[1:], rest, strict=True):
                out.print(f"  {heading.lower()}: {text}", markup=False, highlight=False)
        if d.get("html"):
            out.print(f"directory: {d['html']}")

    run(as_json, build, render)


def _reclaim_line(v: dict[str, Any]) -> str:
    """`reclaim batch: proposal #4 ...`, `reclaim batch: would propose ...` or why not."""
    change = (
        f"guarantee {v['guaranteed']} -> {v['new_guaranteed']} ({v['returnable']} unit(s) "
        f"back; {v['weeks_observed']} week(s) observed, p99 of hourly peaks "
        f"{v['hourly_peak_p99']:.2f})"
        if v["hourly_peak_p99"] is not None
        else ""
    )
    if v.get("proposal"):
        return f"reclaim {v['group']}: proposal #{v['proposal']}: {change}"
    if v["propose"]:
        return f"reclaim {v['group']}: would propose {change} (--propose files it)"
    return f"reclaim {v['group']}: no proposal: {v['why']}"


def _c(value: Any, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)
