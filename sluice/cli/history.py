"""`sluice history GROUP...` (O3): a group's stored series over a span, a row per step."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from sluice.cli.common import (
    ControlOpt,
    HomeOpt,
    JsonOpt,
    client_for,
    duration_s,
    out,
    point_in_time,
    run,
    ts,
)

__all__ = ["history"]

_COLUMNS = (
    ("REQ/S", "requests_per_s", "{:.2f}"),
    ("PROMPT TOK/S", "prompt_tokens_per_s", "{:.1f}"),
    ("COMPL TOK/S", "completion_tokens_per_s", "{:.1f}"),
    ("ERR", "error_rate", "{:.1%}"),
    ("P50 MS", "p50_ms", "{:.0f}"),
    ("P95 MS", "p95_ms", "{:.0f}"),
    ("P99 MS", "p99_ms", "{:.0f}"),
    ("QUEUE", "queue_length", "{:.1f}"),
    ("WAIT P95", "queue_wait_p95_ms", "{:.0f}"),
    ("READY", "ready_instances", "{:.1f}"),
    ("UNITS", "held_units", "{:.1f}"),
    ("BORROWED", "borrowed_units", "{:.1f}"),
    ("SPEND/H", "spend_per_hour", "{:.3g}"),
)


def history(
    groups: Annotated[list[str], typer.Argument(help="the groups to show")],
    since: Annotated[str, typer.Option(help="from: 2h, 7d or an ISO time")] = "1h",
    until: Annotated[str | None, typer.Option(help="to (default: now)")] = None,
    step: Annotated[str, typer.Option(help="one row per: 1m, 5m, 1h, 1d ...")] = "1m",
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    control: ControlOpt = None,
) -> None:
    """Stored metrics history: requests, prompt and completion tokens, errors, latency
    quantiles (merged from histograms), queue, instances, units and spend, one row per
    step."""

    def render(x: dict[str, Any]) -> None:
        for group, points in x["groups"].items():
            t = Table("FROM", *(c[0] for c in _COLUMNS), title=group)
            for p in points:
                t.add_row(ts(p["start"]), *(_cell(p.get(key), fmt) for _, key, fmt in _COLUMNS))
            out.print(t)
        if not x["groups"]:
            out.print("no history in that span yet (rows are written as each minute ends)")

    def fetch() -> Any:
        params = {
            "group": groups,
            "since": point_in_time(since),
            "until": point_in_time(until),
            "step_s": int(duration_s(step)),
        }
        return client_for(home, control)[1].get("/v1/history", **params)

    run(as_json, fetch, render)


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)
