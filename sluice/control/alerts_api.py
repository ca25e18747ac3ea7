"""The alerts' routes on the control API (O2): what fires, what waits to be delivered, and
the rules as a Prometheus rules document. Reading them needs any valid token (viewer)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fastapi import APIRouter

from sluice.control.alerts import Alerting
from sluice.control.api_deps import Me
from sluice.core import NotFound
from sluice.policy.alerts import prometheus_rules
from sluice.spec import PlatformSpec

__all__ = ["alert_routes"]


def alert_routes(
    api: APIRouter,
    alerting: Alerting,
    spec: Callable[[], PlatformSpec],
    latency_bounds: Sequence[float] = (),
) -> None:
    """Add `GET /v1/alerts` and `GET /v1/alerts/rules` to `api` (before the app includes
    it). `latency_bounds`: the gateway's request-duration buckets, which an SLO rule's
    PromQL needs (`sluice.gateway.metrics.DURATION_BUCKETS_S`)."""

    @api.get("/v1/alerts")
    async def alerts(me: Me, group: str | None = None) -> dict[str, Any]:
        """Firing and pending alerts (group, owner, rule, severity, since, value), recent
        transitions, and the messages not delivered yet or dead-lettered (a token scoped
        to groups: its groups')."""
        me.require_sees(group, "reading alerts")
        s = spec()
        # A group that left the spec keeps its alerts' history, as it keeps its events.
        if group is not None and s.group(group) is None and not alerting.knows(group):
            known = ", ".join(g.name for g in s.groups)
            raise NotFound(f"no group named {group!r} (groups: {known})", group=group)
        report = await alerting.report(s, group)
        if me.scoped:
            report = {
                key: [a for a in found if me.sees(str(a.get("group", "")))]
                if isinstance(found, list)
                else found
                for key, found in report.items()
            }
        return report

    @api.get("/v1/alerts/rules")
    async def alert_rules(me: Me) -> dict[str, Any]:
        """The spec's alert rules as a Prometheus rules file (`rules`, for promtool and
        Prometheus) and the rules it leaves out, with why (`skipped`); a token scoped to
        groups: its groups' rules."""
        document, skipped = prometheus_rules(spec(), latency_bounds)
        if me.scoped:
            document = {
                **document,
                "groups": [
                    {**g, "rules": [r for r in g["rules"] if me.sees(r["labels"]["group"])]}
                    for g in document["groups"]
                ],
            }
            skipped = [s for s in skipped if me.sees(s["group"])]
        return {"rules": document, "skipped": skipped}
