"""The `--html DIR` page of `sluice report usage` (O3, Q3): index.html with an hour-of-week
heatmap per group, each group's use against its guarantee over time, spend per group, and
usage.json, the same document `--json` prints (the quarterly review's artifact)."""

from __future__ import annotations

import html
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sluice.policy.usage import WEEKDAYS

__all__ = ["write_usage_report"]


def write_usage_report(doc: dict[str, Any], out_dir: Path) -> Path:
    """Write usage.json, index.html and its PNGs into `out_dir` (created); returns the page."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "usage.json").write_text(json.dumps(doc, indent=1) + "\n")
    groups: list[dict[str, Any]] = doc["groups"]
    pngs: list[tuple[str, str]] = []

    def save(fig: Any, name: str, title: str) -> None:
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=80)
        plt.close(fig)
        pngs.append((name, title))

    span = _dates([doc["since"], doc["until"]])  # the asked span, however little was seen
    n = max(1, len(groups))
    fig, axes = plt.subplots(n, 1, figsize=(9, 2.4 * n), squeeze=False)
    for ax, g in zip(axes[:, 0], groups, strict=False):
        grid = [[float("nan") if v is None else v for v in row] for row in g["heatmap"]]
        im = ax.imshow(grid, aspect="auto", cmap="viridis", interpolation="nearest")
        ax.set_yticks(range(7), WEEKDAYS)
        ax.set_xticks(range(0, 24, 2), [f"{h:02d}" for h in range(0, 24, 2)])
        ax.set_title(f"{g['group']}: mean requests/s by hour of week (UTC)")
        fig.colorbar(im, ax=ax, label="req/s")
    save(fig, "heatmap.png", "Busiest hours (hour of week, UTC)")

    fig, axes = plt.subplots(n, 1, figsize=(9, 2.4 * n), squeeze=False, sharex=True)
    for ax, g in zip(axes[:, 0], groups, strict=False):
        tl = g["timeline"]
        when = _dates(tl["start"])
        dots = {"marker": ".", "ms": 3}  # an hour seen alone still shows
        ax.plot(when, _nan(tl["held_units"]), color="#3465a4", label="held units (mean)", **dots)
        ax.plot(when, _nan(tl["busy_units_peak"]), color="#cc0000", lw=0.8, label="busy (peak)")
        ax.plot(when, _nan(tl["busy_units"]), color="#f57900", label="busy units (mean)", **dots)
        if g["guaranteed_units"] is not None:
            ax.axhline(g["guaranteed_units"], color="#555", ls="--", label="guarantee")
        ax.set_ylabel("units")
        ax.set_xlim(*span)
        ax.set_title(g["group"])
        ax.legend(loc="upper right", fontsize=7)
    fig.autofmt_xdate()
    save(fig, "use.png", "Use against guarantee, per hour")

    fig, ax = plt.subplots(figsize=(9, 3))
    for g in groups:
        tl = g["timeline"]
        total, cumulative = 0.0, []
        for s in tl["spend"]:
            total += s or 0.0
            cumulative.append(total)
        when = _dates(tl["start"])
        ax.plot(when, cumulative, label=g["group"])
    ax.set_ylabel("spend (price units, cumulative)")
    ax.set_xlim(*span)
    if groups:
        ax.legend(loc="upper left", fontsize=8)
    fig.autofmt_xdate()
    save(fig, "spend.png", "Spend over the span")

    path = out_dir / "index.html"
    path.write_text(_page(doc, pngs))
    return path


def _dates(starts: list[float]) -> Any:
    """UTC datetimes for matplotlib's date axis (its stubs take only numbers)."""
    return [datetime.fromtimestamp(t, tz=UTC) for t in starts]


def _nan(values: list[float | None]) -> list[float]:
    return [float("nan") if v is None else v for v in values]


def _f(v: Any, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")


def _page(doc: dict[str, Any], pngs: list[tuple[str, str]]) -> str:
    esc = html.escape
    rows = []
    for g in doc["groups"]:
        busiest = ", ".join(b["hour"] for b in g["busiest_hours"][:3]) or "-"
        verdict = (
            f"not judged ({g['not_judged_why']})"
            if not g["judged"]
            else ("under-using" if g["under_using"] else "ok")
        )
        budget = (
            f"{_f(g['projected_month_spend'])} / {_f(g['budget_per_month'])}"
            if g["budget_per_month"]
            else _f(g["projected_month_spend"])
        )
        cells = [
            g["group"],
            g["owner"] or "-",
            _f(g["coverage"], "{:.0%}"),
            busiest,
            _f(g["requests"], "{:d}"),
            _f(g["error_rate"], "{:.2%}"),
            _f(g["p95_ms"], "{:.0f}"),
            _f(g["guaranteed_units"], "{:d}"),
            f"{_f(g['held_units']['mean'])} / {_f(g['held_units']['peak'], '{:.0f}')}",
            f"{_f(g['busy_units']['mean'])} / {_f(g['busy_units']['peak'])}",
            _f(g["returnable_units"], "{:d}"),
            verdict,
            f"{_f(g['borrowed_unit_hours'], '{:.1f}')} / {_f(g['lent_unit_hours'], '{:.1f}')}",
            _f(g["spend"]),
            budget,
        ]
        rows.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in cells) + "</tr>")
    head = (
        "group",
        "owner",
        "observed",
        "busiest hours",
        "requests",
        "errors",
        "p95 ms",
        "guarantee",
        "held mean / peak",
        "busy mean / peak",
        "returnable",
        "verdict",
        "borrowed / lent unit-h",
        "spend",
        "projected month / budget",
    )
    plots = "\n".join(
        f'<h2>{esc(title)}</h2><img src="{name}" alt="{esc(title)}">' for name, title in pngs
    )
    under = ", ".join(f"{u['group']} ({u['returnable_units']} units)" for u in doc["under_using"])
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Sluice usage report</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:3px 6px;font-size:13px}}img{{max-width:100%}}</style>
</head><body>
<h1>Usage, {esc(_when(doc["since"]))} to {esc(_when(doc["until"]))}</h1>
<p>Under-using: {esc(under or "none")}. Returnable units in all: {doc["returnable_units"]}.
Not judged: {esc(", ".join(doc["not_judged"]) or "none")}.</p>
<p><small>{esc(doc["rule"])}</small></p>
<table><tr>{"".join(f"<th>{esc(h)}</th>" for h in head)}</tr>
{chr(10).join(rows)}
</table>
{plots}
</body></html>
"""
