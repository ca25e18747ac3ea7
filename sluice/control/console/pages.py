"""What each console page shows, shaped from the control API's JSON answers (no I/O here:
the routes fetch, these functions arrange). Numbers the page prints come from the same API
an operator's script reads, so the console and the CLI never disagree."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from sluice.control.console.charts import line_chart

__all__ = [
    "CHARTS",
    "NO_VALUE",
    "SPANS",
    "RouteShare",
    "audit_filters",
    "charts",
    "failover_rows",
    "match_text",
    "overview_rows",
    "step_rows",
]

NO_VALUE = "\N{EN DASH}"
"""What a page shows where there is no number (no data yet, not applicable)."""

SPANS: dict[str, tuple[float, int]] = {"1h": (3600.0, 60), "1d": (86_400.0, 900)}
"""A group page's chart spans: seconds shown, seconds per point."""

CHARTS: tuple[tuple[str, str, str], ...] = (
    ("requests_per_s", "Load", "req/s"),
    ("prompt_tokens_per_s", "Prompt tokens", "tokens/s"),
    ("completion_tokens_per_s", "Completion tokens", "tokens/s"),
    ("p95_ms", "Latency p95", "ms"),
    ("queue_length", "Queue", "waiting"),
    ("ready_instances", "Ready instances (minute mean)", "instances"),
)
ACCELERATOR_CHARTS: tuple[tuple[str, str, str], ...] = (
    ("accelerator_memory_used_gb", "Accelerator memory (NVML)", "GiB"),
    ("accelerator_utilization", "Accelerator utilization", "%"),
)
"""Shown where the group's history has them (its pool lists devices)."""


def _latest_minute(rows: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The newest stored minute of a group's history ({} before the first one closes)."""
    return rows[-1] if rows else {}


def overview_rows(
    groups: Sequence[Mapping[str, Any]],
    dataplane: Mapping[str, Any],
    history: Mapping[str, Any],
    quota: Mapping[str, Any],
    alerts: Mapping[str, Any],
) -> list[dict[str, Any]]:
    """One row per group: who owns it, instances, load, latency, queue, SLO, quota, alerts."""
    by_quota = {q["name"]: q for q in quota.get("groups", [])}
    live = dataplane.get("groups", {})
    firing: dict[str, list[str]] = {}
    for a in alerts.get("firing", []):
        firing.setdefault(a["group"], []).append(f"{a['rule']} ({a['severity']})")
    rows = []
    for g in groups:
        name = g["name"]
        last = _latest_minute(history.get("groups", {}).get(name, []))
        now = live.get(name, {})
        q = by_quota.get(name, {})
        rows.append(
            {
                "name": name,
                "business": g["business"],
                "owner": g["owner"],
                "ready": g["ready"],
                "desired": g["desired"],
                "instances": g["instances"],
                "autoscaled": g.get("autoscaling") is not None,
                "rps": last.get("requests_per_s"),
                "p95_ms": last.get("p95_ms"),
                "slo": last.get("slo_attainment"),
                "queued": sum(now.get("queued", {}).values()),
                "in_use": now.get("in_use", 0),
                "slots": now.get("slots", 0),
                "held": q.get("held_units"),
                "guaranteed": q.get("quota", {}).get("guaranteed"),
                "borrowed": q.get("borrowed_units"),
                "alerts": firing.get(name, []),
            }
        )
    return rows


def charts(rows: Sequence[Mapping[str, Any]], start: float, end: float) -> list[dict[str, Any]]:
    """The group page's charts: each series over the span, with its latest value."""
    out = []
    shown = [
        *CHARTS,
        *(c for c in ACCELERATOR_CHARTS if any(r.get(c[0]) is not None for r in rows)),
    ]
    for key, title, unit in shown:
        points = [(r["start"], r.get(key)) for r in rows]
        last = next((v for _, v in reversed(points) if v is not None), None)

        def fmt(v: float, unit: str = unit) -> str:
            return f"{v:.3g}" if unit != "instances" else f"{v:.1f}"

        svg = line_chart(points, label=f"{title} ({unit})", start=start, end=end, fmt=fmt)
        out.append({"title": title, "unit": unit, "last": last, "svg": svg})
    return out


def match_text(rule: Mapping[str, Any]) -> str:
    """What a route rule matches, in words."""
    parts = [
        f"{label} {', '.join(rule[key])}"
        for key, label in (("tenants", "tenants"), ("models", "models"), ("priorities", "priority"))
        if rule.get(key)
    ]
    parts += [f"{h} = {v}" for h, v in rule.get("headers", {}).items()]
    parts += [f"{h} starts {v}" for h, v in rule.get("header_prefixes", {}).items()]
    return "; ".join(parts) or "every request"


def failover_rows(
    groups: Sequence[Mapping[str, Any]], failovers: Mapping[str, str]
) -> list[dict[str, Any]]:
    """Every group that can fail over (it names a backup) or has: where its traffic goes."""
    rows = []
    for g in groups:
        name = g["name"]
        if g.get("backup") is None and name not in failovers:
            continue
        rows.append({"name": name, "backup": g.get("backup"), "to": failovers.get(name)})
    return rows


class RouteShare:
    """Each route rule's share of the traffic over the last minute, from the gateway's
    cumulative per-rule counters read at every look (a page view or live refresh). Until
    a minute of readings exists, the share is over what has been seen."""

    def __init__(self, window_s: float = 60.0) -> None:
        self._window_s = window_s
        self._readings: deque[tuple[float, dict[str, int]]] = deque()

    def share(self, counts: Mapping[str, Mapping[str, int]], now: float) -> dict[str, Any]:
        totals = {tag: sum(by_group.values()) for tag, by_group in counts.items()}
        self._readings.append((now, totals))
        while len(self._readings) > 2 and self._readings[1][0] <= now - self._window_s:
            self._readings.popleft()
        since, before = self._readings[0]
        if len(self._readings) == 1:
            before = {}
        grown = {tag: n - before.get(tag, 0) for tag, n in totals.items()}
        grown = {tag: max(n, 0) for tag, n in grown.items()}  # a restarted gateway
        total = sum(grown.values())
        seconds = max(now - since, 0.0)
        return {
            "seconds": seconds,
            "total": total,
            "tags": {
                tag: {"requests": n, "share": n / total if total else None}
                for tag, n in grown.items()
            },
        }


def step_rows(state: Mapping[str, Any], spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A rollout's steps as planned, with what happened at each: outcome, analysis verdict
    and the criterion that failed (or the one closest to it)."""
    done = {s["step"]: s for s in state.get("steps", [])}
    rows = []
    for i, percent in enumerate(spec.get("steps", [])):
        ran = done.get(i, {})
        analysis = ran.get("analysis") or {}
        criteria = analysis.get("criteria", [])
        failing = [c for c in criteria if c.get("verdict") == "fail"]
        rows.append(
            {
                "step": i + 1,
                "percent": percent,
                "current": state.get("step") == i and state.get("phase") in ("stepping", "paused"),
                "outcome": ran.get("outcome", "not reached"),
                "started_at": ran.get("started_at"),
                "ended_at": ran.get("ended_at"),
                "verdict": analysis.get("verdict"),
                "reason": analysis.get("reason", ""),
                "failing": failing,
                "criteria": criteria,
            }
        )
    return rows


def audit_filters(query: Mapping[str, str], now: float) -> dict[str, Any]:
    """The audit page's filter form -> `GET /v1/audit` parameters. A bare group name is a
    group's target (`group/NAME`); `since` is one of the offered spans."""
    params: dict[str, Any] = {"limit": 200}
    for key in ("actor", "action"):
        if query.get(key):
            params[key] = query[key].strip()
    target = query.get("target", "").strip()
    if target:
        params["target"] = target if "/" in target else f"group/{target}"
    since = AUDIT_SPANS.get(query.get("since", ""))
    if since is not None:
        params["since"] = now - since
    return params


AUDIT_SPANS = {"1h": 3600.0, "24h": 86_400.0, "7d": 7 * 86_400.0, "30d": 30 * 86_400.0}
