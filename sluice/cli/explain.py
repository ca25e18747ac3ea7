"""`sluice explain GROUP` (S11): why a group has the instances it has. For an advisory
autoscaler or quota (issue 16): what it advised against what actually runs."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from sluice.cli.common import ControlOpt, HomeOpt, JsonOpt, client_for, out, run, ts

__all__ = ["explain"]


def explain(
    group: Annotated[str, typer.Argument(help="the group whose scaling to explain")],
    limit: int = 10,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    control: ControlOpt = None,
) -> None:
    """Why a group has the instances it has: the autoscaler's latest decisions (advised vs
    actual where it only advises)."""

    def render(x: dict[str, Any]) -> None:
        for line in summary(group, x):
            out.print(line, markup=False, highlight=False, soft_wrap=True)
        t = Table("WHEN", "MODE", "FROM", "TO", "WON", "CLIPPED BY", "WHY", "LAUNCHED")
        for d in x["decisions"]:
            launches = "; ".join(
                f"{i['instance']}: {i['outcome']}"
                + (f" in {i['startup_s']:.1f}s" if i["startup_s"] is not None else "")
                + f", {i['requests_served']} requests"
                for i in d["launched"]
            )
            t.add_row(
                ts(d["at"]),
                "advised" if d.get("mode") == "advisory" else "acted",
                str(d["current"]),
                str(d["desired"]),
                d["winner"] or "-",
                ", ".join(d["detail"]["clipped_by"]) or "-",
                d["reason"],
                launches or "-",
            )
        out.print(t)

    run(
        as_json,
        lambda: client_for(home, control)[1].get(f"/v1/groups/{group}/explain", limit=limit),
        render,
    )


def summary(group: str, x: dict[str, Any]) -> list[str]:
    """The lines above the table: the policy and count, and any advice vs what runs."""
    lines = []
    if not x["autoscaled"]:
        lines.append(f"{group} is not autoscaled: it runs {x['desired']} instance(s) as set")
    else:
        startup = x["startup_s"]
        advisory = x.get("mode") == "advisory"
        lines.append(
            f"{group}: policy {x['policy']}"
            + (" (advisory: it decides, the count stays as set)" if advisory else "")
            + f", {x['desired']} instance(s) wanted, measured "
            f"start-up {'-' if startup is None else f'{startup:.1f}s'}"
        )
        advised = x.get("advised")
        if advisory and advised is not None:
            lines.append(
                f"autoscaling: advised {advised['desired']} ({advised['reason']}) vs actual "
                f"{advised['actual']}"
            )
        elif advisory:
            lines.append("autoscaling: advised nothing yet (no decision since the start)")
    tiers = x.get("tiers")
    if tiers and tiers["stable"] + tiers["burst"]:
        lines.append(
            f"tiers: {tiers['stable']} stable on its guaranteed units "
            f"({tiers['own_units']} of {tiers['guaranteed_units']} used), {tiers['burst']} "
            f"burst ({tiers['borrowed_units']} units above its guarantee, borrowed or "
            "unassigned); burst instances go first on scale-down, reclaim and budget cuts"
        )
    held = x.get("held_tier")
    if held and held["why"] != "no sleeping standby":
        lines.append(
            f"held tier: what the scale-down keeps beyond the last {held['after_s']:g}s' need "
            f"sleeps ({held['why']})"
            if held["after_s"]
            else f"held tier off: all the count serves awake ({held['why']})"
        )
    hold = x.get("no_gain_hold")
    if hold:
        lines.append(
            f"scale-up held at {hold['count']} since {ts(hold['since'])}: {hold['reason']}; "
            f"until the demand moves from {hold['rate']:g} req/s"
            + (f" or {ts(hold['until'])}" if hold["until"] else "")
        )
    for f in x.get("followups", [])[:3]:
        lines.append(f"did it help? {ts(f['at'])}: {f['message']}")
    quota = x.get("quota") or {}
    told = quota.get("advice")
    if quota.get("mode") == "advisory" and told is not None:
        lines.append(
            f"quota (advisory): advised {told['advised']} ({told['reason']}) vs actual "
            f"{told['granted']}"
        )
        lines += [
            f"  would reclaim {', '.join(r['instances'])}: {r['reason']}" for r in told["reclaims"]
        ]
    return lines
