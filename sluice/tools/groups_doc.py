"""`sluice groups doc` (G4): the one-page directory of groups: business, owner, alert
channel, models, resources, quota, instances now and a line of recent health, built from
what the store keeps (a fleet need not be running), as JSON and as one HTML table."""

from __future__ import annotations

import html
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sluice.core.urls import redact_channel
from sluice.policy.history import Rollup, series
from sluice.spec import PlatformSpec

__all__ = ["HEADINGS", "group_cells", "groups_directory", "write_groups_doc"]


def _r(v: float | None, digits: int = 4) -> float | None:
    return None if v is None else round(v, digits)


def groups_directory(
    spec: PlatformSpec,
    revision: int | None,
    instances: Mapping[str, Mapping[str, int]],
    recent: Mapping[str, Rollup],
    alerts: Mapping[str, Mapping[str, int]],
    now: float,
) -> dict[str, Any]:
    """The directory document. `instances`: group -> state -> count (the store's instance
    records); `recent`: group -> its last hour of history merged; `alerts`: group ->
    {"alert_firing": n, "alert_resolved": n} over the last 24 h."""
    rows = []
    for g in spec.groups:
        pool = spec.pool(g.resources.pool)
        r = recent.get(g.name)
        health: dict[str, Any] = {"observed_s": 0.0}
        if r is not None and r.seconds > 0:
            v = series(r)
            health = {
                "observed_s": round(r.seconds, 1),
                "requests_per_s": _r(v["requests_per_s"]),
                "error_rate": _r(v["error_rate"]),
                "p95_ms": _r(v["p95_ms"], 1),
            }
        fired = alerts.get(g.name, {})
        q = g.quota
        rows.append(
            {
                "group": g.name,
                "business": g.business,
                "owner": g.owner,
                "alert_channel": redact_channel(g.alert_channel),
                "description": g.description,
                "models": {
                    mid: {"runtime": m.runtime, "version": m.version} for mid, m in g.models.items()
                },
                "resources": {
                    "pool": g.resources.pool,
                    "accelerator": pool.accelerator if pool else None,
                    "accelerators": g.resources.accelerators,
                    "memory_gb": g.resources.memory_gb,
                },
                "quota": {
                    "guaranteed": q.guaranteed,
                    "limit": q.limit,
                    "borrow_limit": q.borrow_limit,
                    "reserved": q.reserved,
                },
                "instances": dict(sorted(instances.get(g.name, {}).items())),
                "health_last_hour": health,
                "alerts_24h": {
                    "firing": fired.get("alert_firing", 0),
                    "resolved": fired.get("alert_resolved", 0),
                },
            }
        )
    return {"at": now, "revision": revision, "groups": rows}


def _health_line(h: Mapping[str, Any]) -> str:
    if not h.get("observed_s"):
        return "no history in the last hour"
    rps, err, p95 = h.get("requests_per_s"), h.get("error_rate"), h.get("p95_ms")
    return (
        f"{'-' if rps is None else f'{rps:.2f}'} req/s, "
        f"errors {'-' if err is None else f'{err:.2%}'}, "
        f"p95 {'-' if p95 is None else f'{p95:.0f} ms'}"
    )


def _quota_text(q: Mapping[str, Any]) -> str:
    limit = q["limit"] if q["limit"] is not None else "pool size"
    borrow = q["borrow_limit"] if q["borrow_limit"] is not None else "up to limit"
    return f"guaranteed {q['guaranteed']}, limit {limit}, borrow {borrow}" + (
        ", reserved" if q["reserved"] else ""
    )


HEADINGS = (
    "Group",
    "Business",
    "Owner",
    "Alert channel",
    "Models",
    "Resources",
    "Quota",
    "Instances",
    "Last hour",
    "Alerts 24 h",
)


def group_cells(g: Mapping[str, Any]) -> list[str]:
    """One directory row as text, a cell per `HEADINGS` entry (the page and the CLI)."""
    res = g["resources"]
    return [
        g["group"] + (f" — {g['description']}" if g["description"] else ""),
        g["business"],
        g["owner"],
        g["alert_channel"],
        ", ".join(f"{m} ({v['runtime']} {v['version']})" for m, v in g["models"].items()),
        f"{res['pool']} ({res['accelerator'] or '?'}): {res['accelerators']} x "
        f"{res['memory_gb']:g} GiB per instance",
        _quota_text(g["quota"]),
        ", ".join(f"{s} {n}" for s, n in g["instances"].items()) or "none",
        _health_line(g["health_last_hour"]),
        f"{g['alerts_24h']['firing']} fired, {g['alerts_24h']['resolved']} resolved",
    ]


def write_groups_doc(doc: dict[str, Any], out_dir: Path) -> Path:
    """Write index.html (one table, every value escaped) and groups.json into `out_dir`."""
    esc = html.escape
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "groups.json").write_text(json.dumps(doc, indent=1) + "\n")
    rows = [
        "<tr>" + "".join(f"<td>{esc(c)}</td>" for c in group_cells(g)) + "</tr>"
        for g in doc["groups"]
    ]
    at = datetime.fromtimestamp(doc["at"], tz=UTC).strftime("%Y-%m-%d %H:%M UTC")
    rev = doc["revision"]
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Sluice groups</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:3px 6px;font-size:13px;vertical-align:top}}</style>
</head><body>
<h1>Groups</h1>
<p>Spec revision {esc(str(rev))}, as of {esc(at)}.</p>
<table><tr>{"".join(f"<th>{esc(h)}</th>" for h in HEADINGS)}</tr>
{chr(10).join(rows)}
</table>
</body></html>
"""
    path = out_dir / "index.html"
    path.write_text(page)
    return path
