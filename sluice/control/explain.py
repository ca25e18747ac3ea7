"""`sluice explain GROUP` (S11): the autoscaler's recent decisions, each with the signals that
drove it, the instances it launched (did they come up, how long did they take) and whether
traffic reached them. An advisory decision (issue 16) launched nothing: it shows the advised
count (`desired`) against the count in force (`current`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sluice.core import InstanceStatus
from sluice.policy.quota import Allocation
from sluice.policy.tick import BURST, STABLE
from sluice.spec import GroupSpec
from sluice.store import Event, ScalingDecision

__all__ = ["advisory_view", "explain_decisions", "tier_counts"]


def tier_counts(
    g: GroupSpec,
    instances: Sequence[InstanceStatus],
    tiers: Mapping[str, str],
    allocation: Allocation | None,
) -> dict[str, Any]:
    """S9: the group's stable part (on its guaranteed units) and burst part (above)."""
    mine = [i.id for i in instances if i.group == g.name]
    grant = allocation.grants.get(g.name) if allocation else None
    return {
        "stable": sum(1 for i in mine if tiers.get(i) == STABLE),
        "burst": sum(1 for i in mine if tiers.get(i) == BURST),
        "guaranteed_units": g.quota.guaranteed,
        "own_units": grant.own_units if grant else 0,
        "borrowed_units": grant.borrowed_units if grant else 0,
    }


def explain_decisions(
    decisions: Sequence[ScalingDecision],
    events: Sequence[Event],
    served: Mapping[str, int],
) -> list[dict[str, Any]]:
    """`decisions` and `events` newest first (as the store lists them); `served` counts
    requests the gateway sent to each instance. A scale-up owns the launches made between
    it and the next decision."""
    launched: dict[str, float] = {}
    outcome: dict[str, tuple[str, float, dict[str, Any]]] = {}
    for e in reversed(events):  # oldest first: the latest outcome wins
        if e.instance is None:
            continue
        if e.kind == "launch":
            launched[e.instance] = e.at
        elif e.kind in ("ready", "failed", "stopped", "drain"):
            if e.kind != "ready" and outcome.get(e.instance, ("",))[0] == "ready":
                continue  # it came up; a later drain does not undo that
            outcome[e.instance] = (e.kind, e.at, e.detail)
    out = []
    until = float("inf")
    for d in decisions:  # newest first, so `until` is the next (newer) decision's time
        item = d.to_json()
        item["mode"] = d.detail.get("mode", "active")
        item["launched"] = [
            _instance(iid, at, outcome.get(iid), served.get(iid))
            for iid, at in sorted(launched.items(), key=lambda kv: kv[1])
            if item["mode"] == "active" and d.desired > d.current and d.at <= at < until
        ]
        out.append(item)
        until = d.at
    return out


def advisory_view(
    state: dict[str, Any],
    decisions: Sequence[ScalingDecision],
    events: Sequence[Event],
    limit: int,
) -> dict[str, Any]:
    """explain's advisory fields: the latest advice (in memory; after a restart, until the
    first tick, the newest journaled one) and quota's recent `quota-advice` events."""
    view = dict(state)
    if view.get("mode") == "advisory" and view.get("advised") is None:
        last = next((d for d in decisions if d.detail.get("mode") == "advisory"), None)
        if last is not None:
            view["advised"] = {
                "at": last.at,
                "policy": last.policy,
                "desired": last.desired,
                "actual": last.current,
                "reason": last.reason,
                "winner": last.winner,
                "clipped_by": list(last.detail.get("clipped_by", [])),
            }
    quota = dict(view.get("quota") or {})
    if quota.get("mode") == "advisory":
        recent = [e for e in events if e.kind == "quota-advice"][:limit]
        quota["recent"] = [e.to_json() for e in recent]
    view["quota"] = quota
    return view


def _instance(
    iid: str,
    launched_at: float,
    outcome: tuple[str, float, dict[str, Any]] | None,
    served: int | None,
) -> dict[str, Any]:
    kind, at, detail = outcome if outcome is not None else ("starting", None, {})
    return {
        "instance": iid,
        "launched_at": launched_at,
        "outcome": "came up" if kind == "ready" else kind,
        "startup_s": detail.get("startup_s") if kind == "ready" else None,
        "outcome_at": at,
        "requests_served": served or 0,
    }
