"""The `sluice` command (Typer + Rich). Every reporting command takes --json and then prints
exactly one JSON document on stdout; errors exit with the error's exit code."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.table import Table

from sluice.cli.alerts import alerts_app
from sluice.cli.capacity import capacity, drill, loadtest
from sluice.cli.common import (
    ControlOpt,
    FileOpt,
    HomeOpt,
    JsonOpt,
    ReasonOpt,
    client_for,
    duration_s,
    out,
    point_in_time,
    post,
    post_spec,
    run,
    set_token,
    ts,
)
from sluice.cli.compare import compare
from sluice.cli.control_plane import controller, down, up
from sluice.cli.drills import drills_app
from sluice.cli.estimate import estimate
from sluice.cli.explain import explain
from sluice.cli.gateway import gateway
from sluice.cli.history import history
from sluice.cli.report import groups_app, report_app
from sluice.cli.review import approve, proposal_app, proposals, propose, reject
from sluice.cli.rollouts import rollout_app
from sluice.cli.simulate import simulate
from sluice.spec import load_spec_file

__all__ = ["app", "main"]

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,  # a crash report must never print API keys
    help="Sluice: shared inference fleets behind one endpoint.",
)
get_app = typer.Typer(no_args_is_help=True, help="List groups, instances or routes.")
app.add_typer(get_app, name="get")
route_app = typer.Typer(no_args_is_help=True, help="The escape hatch: failover and restore.")
app.add_typer(route_app, name="route")
app.add_typer(rollout_app, name="rollout")
app.add_typer(proposal_app, name="proposal")
token_app = typer.Typer(no_args_is_help=True, help="API tokens: who may drive the control API.")
app.add_typer(token_app, name="token")
app.add_typer(alerts_app, name="alerts")
app.add_typer(report_app, name="report")
app.add_typer(groups_app, name="groups")
app.add_typer(drills_app, name="drills")
app.command("up")(up)
app.command("controller")(controller)
app.command("down")(down)
app.command("gateway")(gateway)


@app.callback()
def _global_options(
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            help="API token (default: $SLUICE_TOKEN, else $SLUICE_HOME/admin.token)",
            show_default=False,
        ),
    ] = None,
) -> None:
    set_token(token)


@app.command()
def validate(file: FileOpt, as_json: JsonOpt = False) -> None:
    """Check a spec without applying it: every problem with file:line and field."""

    def check() -> dict[str, Any]:
        spec = load_spec_file(file).spec
        return {
            "valid": True,
            "file": str(file),
            "groups": [g.name for g in spec.groups],
            "templates": {g.name: g.template() for g in spec.groups},
        }

    def render(r: dict[str, Any]) -> None:
        n = len(r["groups"])
        out.print(f"{r['file']}: valid ({n} group{'' if n == 1 else 's'})")

    run(as_json, check, render)


@app.command()
def apply(
    file: FileOpt,
    reason: ReasonOpt,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    control: ControlOpt = None,
) -> None:
    """Record a new spec revision (with its diff) and reconcile toward it."""

    def do() -> Any:
        return post_spec(home, control, "/v1/revisions", file, reason)

    def render(r: dict[str, Any]) -> None:
        if not r["changed"]:
            out.print(f"unchanged: revision {r['revision']} is already this spec")
            return
        out.print(f"applied revision {r['revision']}")
        out.print(r["diff"], markup=False, highlight=False)

    run(as_json, do, render)


@app.command()
def scale(
    group: str,
    replicas: int,
    reason: ReasonOpt,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    control: ControlOpt = None,
) -> None:
    """Set a group's replica count by hand; audited with who, when and why."""

    def do() -> Any:
        body = {"replicas": replicas, "reason": reason}
        return post(home, control, f"/v1/groups/{group}/scale", body)

    run(as_json, do, lambda r: out.print(f"{r['group']}: {r['from']} -> {r['to']} replicas"))


@route_app.command("failover")
def route_failover(
    group: str,
    reason: ReasonOpt,
    to: Annotated[str | None, typer.Option("--to", help="backup group (default: spec)")] = None,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    control: ControlOpt = None,
) -> None:
    """Send ALL of GROUP's traffic to its backup group at once (until `route restore`)."""

    def do() -> Any:
        body = {"to": to, "reason": reason}
        return post(home, control, f"/v1/groups/{group}/failover", body)

    run(as_json, do, lambda r: out.print(f"{r['group']}: all traffic -> {r['to']}"))


@route_app.command("restore")
def route_restore(
    group: str,
    reason: ReasonOpt,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    control: ControlOpt = None,
) -> None:
    """Undo a failover: GROUP serves its own traffic again."""

    def do() -> Any:
        body = {"reason": reason}
        return post(home, control, f"/v1/groups/{group}/restore", body)

    def render(r: dict[str, Any]) -> None:
        if r["changed"]:
            out.print(f"{r['group']}: traffic back from {r['from']}")
        else:
            out.print(f"{r['group']}: no failover was in force")

    run(as_json, do, render)


@get_app.command("routes")
def get_routes(as_json: JsonOpt = False, home: HomeOpt = None, control: ControlOpt = None) -> None:
    """Route rules in match order, and the failovers in force."""

    def render(r: dict[str, Any]) -> None:
        t = Table("#", "TAG", "MATCH", "TO", "FALLBACK", "MIRROR")
        for i, rule in enumerate(r["rules"]):
            match = [
                f"{k}={','.join(rule[k])}" for k in ("tenants", "models", "priorities") if rule[k]
            ]
            match += [f"{k}:{v}" for k, v in rule["headers"].items()]
            match += [f"{k}:{v}*" for k, v in rule["header_prefixes"].items()]
            to = ", ".join(
                f"{x['group']}({x['weight']})" if len(rule["to"]) > 1 else x["group"]
                for x in rule["to"]
            )
            mirror = rule["mirror"]
            t.add_row(
                str(i),
                rule["tag"],
                " ".join(match) or "*",
                to,
                ", ".join(rule["fallback"]) or "-",
                f"{mirror['group']} {mirror['percent']:g}%" if mirror else "-",
            )
        out.print(t)
        for group, backup in r["failovers"].items():
            out.print(f"[yellow]failover in force:[/yellow] {group} -> {backup}")

    run(as_json, lambda: client_for(home, control)[1].get("/v1/routes"), render)


@get_app.command("dataplane")
def get_dataplane(
    as_json: JsonOpt = False, home: HomeOpt = None, control: ControlOpt = None
) -> None:
    """The gateway now: slots, in use and queued per group, and ejected instances (why)."""

    def render(r: dict[str, Any]) -> None:
        t = Table("GROUP", "SLOTS", "IN USE", "QUEUED h/n/l", "INSTANCES", "EJECTED")
        for name, g in sorted(r.get("groups", {}).items()):
            q = g["queued"]
            ejected = (
                "; ".join(
                    f"{e['instance']} ({e['reason']}, {e['until_s']:.0f}s left)"
                    for e in g["ejected"]
                )
                or "-"
            )
            t.add_row(
                name,
                str(g["slots"]),
                str(g["in_use"]),
                f"{q['high']}/{q['normal']}/{q['low']}",
                str(g["instances"]),
                ejected,
            )
        out.print(t)
        out.print(f"routing snapshot version {r.get('version')}")

    run(as_json, lambda: client_for(home, control)[1].get("/v1/dataplane"), render)


@get_app.command("groups")
def get_groups(as_json: JsonOpt = False, home: HomeOpt = None, control: ControlOpt = None) -> None:
    """Groups with owner, business, models and ready/desired instances."""

    def render(groups: list[dict[str, Any]]) -> None:
        t = Table("GROUP", "BUSINESS", "OWNER", "MODELS", "READY", "DESIRED", "POOL")
        for g in groups:
            models = ", ".join(f"{k}@{v['version']}" for k, v in g["models"].items())
            t.add_row(
                g["name"],
                g["business"],
                g["owner"],
                models,
                str(g["ready"]),
                str(g["desired"]),
                g["resources"]["pool"],
            )
        out.print(t)

    run(as_json, lambda: client_for(home, control)[1].get("/v1/groups"), render)


@get_app.command("instances")
def get_instances(
    group: Annotated[str | None, typer.Option(help="only this group")] = None,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    control: ControlOpt = None,
) -> None:
    """Instances with state (a sleeping standby's: "ready, asleep", and "units lent" once
    its accelerator units may serve other groups), tier (stable: on the
    group's guaranteed units; burst: above them, first to go), address and the reason for
    their last change."""

    def render(items: list[dict[str, Any]]) -> None:
        accel = any(i.get("accelerator") for i in items)  # a pool lists devices
        extra = ("ACCEL MEM / EST", "UTIL") if accel else ()
        t = Table("INSTANCE", "GROUP", "STATE", "TIER", "URL", "PID", *extra, "SINCE", "REASON")
        for i in items:
            t.add_row(
                i["id"],
                i["group"],
                _state_of(i),
                i.get("tier") or "-",
                i["url"] or "-",
                str(i["pid"] or "-"),
                *(accelerator_cells(i.get("accelerator")) if accel else ()),
                ts(i["created_at"]),
                i["reason"],
            )
        out.print(t)

    run(as_json, lambda: client_for(home, control)[1].get("/v1/instances", group=group), render)


def _state_of(instance: dict[str, Any]) -> str:
    """The state, and a sleeping standby's "asleep" (", units lent" while others may use
    its accelerator units)."""
    if not instance.get("asleep"):
        return str(instance["state"])
    lent = ", units lent" if instance.get("units_lent") else ""
    return f"{instance['state']}, asleep{lent}"


def accelerator_cells(a: dict[str, Any] | None) -> tuple[str, str]:
    """'3.0 / 1.0 GiB !' (measured / estimate, '!' far above it), 'unknown / 1.0 GiB'."""
    if not a:
        return "-", "-"
    used = "unknown" if a.get("memory_used_gib") is None else f"{a['memory_used_gib']:.1f}"
    est = "-" if a.get("estimate_gib") is None else f"{a['estimate_gib']:.1f}"
    util = "-" if a.get("utilization") is None else f"{a['utilization']:.0f}%"
    return f"{used} / {est} GiB" + (" !" if a.get("over_estimate") else ""), util


@app.command()
def audit(
    target: Annotated[str | None, typer.Option(help="e.g. group/chat")] = None,
    actor: Annotated[str | None, typer.Option(help="a token's name")] = None,
    action: Annotated[str | None, typer.Option(help="e.g. scale, apply, approve")] = None,
    since: Annotated[str | None, typer.Option(help="e.g. 2h, 7d, or 2026-12-01T09:00")] = None,
    until: Annotated[str | None, typer.Option(help="same forms as --since")] = None,
    limit: int = 50,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    control: ControlOpt = None,
) -> None:
    """Who changed what, when and why (newest first): ACTOR is the token, PERSON who holds
    it (`-` for the platform itself: `sluice up`, a drill schedule)."""

    def render(items: list[dict[str, Any]]) -> None:
        t = Table("WHEN", "ACTOR", "PERSON", "ACTION", "TARGET", "REASON", "DETAIL")
        for a in items:
            t.add_row(
                ts(a["at"]),
                a["actor"],
                str(a.get("person") or a["detail"].get("person") or "-"),
                a["action"],
                a["target"],
                a["reason"],
                json.dumps(a["detail"]),
            )
        out.print(t)

    def do() -> Any:
        params = {"target": target, "actor": actor, "action": action, "limit": limit}
        window = {"since": point_in_time(since), "until": point_in_time(until)}
        return client_for(home, control)[1].get("/v1/audit", **params, **window)

    run(as_json, do, render)


@app.command()
def events(
    group: Annotated[str | None, typer.Argument(help="only this group")] = None,
    limit: int = 50,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    control: ControlOpt = None,
) -> None:
    """What the controller did and why (newest first)."""

    def render(items: list[dict[str, Any]]) -> None:
        t = Table("WHEN", "GROUP", "INSTANCE", "KIND", "MESSAGE")
        for e in items:
            t.add_row(ts(e["at"]), e["group"], e["instance"] or "-", e["kind"], e["message"])
        out.print(t)

    run(
        as_json,
        lambda: client_for(home, control)[1].get("/v1/events", group=group, limit=limit),
        render,
    )


@app.command()
def quota(
    window: Annotated[float, typer.Option(help="under-use window, seconds")] = 3600.0,
    below: Annotated[float, typer.Option(help="under-used: average below this x guarantee")] = 0.5,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    control: ControlOpt = None,
) -> None:
    """Pools, guarantees, use, loans and spend rate; and groups that under-use their quota."""

    def render(q: dict[str, Any]) -> None:
        t = Table("POOL", "PURPOSE", "UNITS", "GUARANTEED", "IN USE", "PRICE/H")
        for p in q["pools"]:
            t.add_row(
                p["name"],
                p["purpose"],
                str(p["count"]),
                str(p["guaranteed"]),
                str(p["in_use"]),
                f"{p['price_per_hour']:g}",
            )
        out.print(t)
        t = Table("GROUP", "POOL", "GUAR.", "LIMIT", "HELD", "OWN", "BORROWED", "SPEND/H", "NOTE")
        for g in q["groups"]:
            qs = g["quota"]
            t.add_row(
                g["name"],
                g["pool"],
                str(qs["guaranteed"]),
                "-" if qs["limit"] is None else str(qs["limit"]),
                str(g["held_units"]),
                str(g["own_units"] if g["own_units"] is not None else "-"),
                str(g["borrowed_units"] if g["borrowed_units"] is not None else "-"),
                f"{g['spend_per_hour']:g}",
                (f"advisory: would grant {g['advice']['advised']}. " if g.get("advice") else "")
                + (g["refused"] or ""),
            )
        out.print(t)
        t = Table("LOAN", "LENDER", "BORROWER", "UNITS", "SINCE", "ENDED", "RECLAIM LATENCY")
        for loan in q["loans"]:
            latency = loan["reclaim_latency_s"]
            t.add_row(
                str(loan["id"]),
                loan["lender"] or "(pool)",
                loan["borrower"],
                str(loan["units"]),
                ts(loan["started_at"]),
                ts(loan["ended_at"]) if loan["ended_at"] else "open",
                "-" if latency is None else f"{latency:.1f}s",
            )
        out.print(t)
        out.print(f"spend: {q['spend_per_hour']:g}/h now, {q['spent_this_month']:g} this month")
        for u in q["underused"]:
            out.print(f"under-used: {u['group']}: {u['reason']}")

    run(
        as_json,
        lambda: client_for(home, control)[1].get("/v1/quota", window_s=window, below=below),
        render,
    )


@token_app.command("create")
def token_create(
    name: Annotated[str, typer.Argument(help="who holds it; the audit log's actor")],
    role: Annotated[str, typer.Option(help="viewer | operator | admin | gateway")] = "viewer",
    groups: Annotated[
        str | None, typer.Option(help="comma-separated: act only on these groups")
    ] = None,
    expires: Annotated[str | None, typer.Option(help="lifetime, e.g. 90d, 12h")] = None,
    owner: Annotated[
        str | None,
        typer.Option(
            metavar="EMAIL-OR-NAME",
            help="the person it belongs to; default: yours (the installation's admin "
            "token: a person named like the token). Only the installation's admin token "
            "(or --store) may name another person",
        ),
    ] = None,
    store: Annotated[
        bool,
        typer.Option(
            "--store",
            help="break glass: mint it in the store itself ($SLUICE_DATABASE_URL, else the "
            "state directory's state.db), with no control API and no token, as the "
            "installation would; audited as local:<your user> with --reason. For a lost "
            "admin token, or a token put straight into a Kubernetes secret",
        ),
    ] = False,
    reason: Annotated[
        str | None, typer.Option("--reason", help="why (required with --store); audited")
    ] = None,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    control: ControlOpt = None,
) -> None:
    """Issue a token. It is shown once: Sluice keeps only its sha256. Every token belongs to
    a person, and review needs two persons, not two tokens.

    --store (break glass) mints it in the store, not through the control API:
    whoever opens the store holds the installation, so any role for any person,
    e.g. `--role admin --owner admin` for an installation token like the first
    `admin`. The audit row names local:<user> and --reason."""

    def do() -> Any:
        body = {
            "name": name,
            "role": role,
            "groups": [g.strip() for g in groups.split(",") if g.strip()] if groups else None,
            "expires_in_s": duration_s(expires) if expires else None,
            **({"owner": owner} if owner is not None else {}),
        }
        if not store:
            return post(home, control, "/v1/tokens", body)
        return mint_in_store(body)

    def mint_in_store(body: dict[str, Any]) -> Any:
        # Imported here: only the break-glass path pays for the store and the API's models.
        import asyncio
        import getpass
        import os

        from pydantic import ValidationError

        from sluice.cli.common import state_store
        from sluice.config import Settings
        from sluice.control.tokens import TokenAdmin
        from sluice.control.tokens_api import TokenRequest
        from sluice.core import NotFound, SpecError, SpecIssue, SystemClock
        from sluice.spec import load_spec_text

        here = "sluice token create"
        if control is not None:
            raise SpecError([SpecIssue("--store", "mints in the store: drop --control", here)])
        if not (reason or "").strip():
            why = "with --store, say why (it goes to the audit log): --reason TEXT"
            raise SpecError([SpecIssue("--reason", why, here)])
        try:
            request = TokenRequest.model_validate(body)
        except ValidationError as exc:
            issues = [
                SpecIssue(".".join(str(p) for p in e["loc"]) or "token", e["msg"], here)
                for e in exc.errors()
            ]
            raise SpecError(issues) from None
        settings = Settings.from_env(home)
        db = settings.home / "state.db"
        if settings.database_url is None and not db.is_file():
            raise NotFound(
                f"no state database at {db}: point --home / $SLUICE_HOME at the state "
                "directory, or $SLUICE_DATABASE_URL at the store",
                home=str(settings.home),
            )
        try:
            user = getpass.getuser()
        except (KeyError, OSError):  # a container's user with no name
            user = f"uid-{os.getuid()}"
        with state_store(settings) as opened:
            if request.groups:
                live = opened.latest_revision()
                known = (
                    set()
                    if live is None
                    else {g.name for g in load_spec_text(live.yaml_text, "live").spec.groups}
                )
                unknown = sorted(set(request.groups) - known)
                if unknown:
                    raise NotFound(
                        f"no group named {', '.join(unknown)} in the live revision "
                        f"(groups: {', '.join(sorted(known)) or 'none'})",
                        groups=unknown,
                    )
            admin = TokenAdmin(opened, SystemClock())
            token, record = asyncio.run(
                admin.create(
                    request.name,
                    request.role,
                    request.groups,
                    request.expires_in_s,
                    by=f"local:{user}",
                    person=request.owner or request.name,
                    reason=f"break glass, minted in the store (--store): {reason}",
                )
            )
        return {**record.to_json(), "token": token}

    def render(r: dict[str, Any]) -> None:
        scope = f" on {', '.join(r['groups'])}" if r["groups"] else ""
        who = f"token {r['name']} (person {r['person']})"
        out.print(f"{who}: {r['role']}{scope}; shown once, keep it secret:")
        print(r["token"])

    run(as_json, do, render)


@token_app.command("list")
def token_list(as_json: JsonOpt = False, home: HomeOpt = None, control: ControlOpt = None) -> None:
    """Every token ever issued (never the token itself)."""

    def render(items: list[dict[str, Any]]) -> None:
        t = Table("NAME", "PERSON", "ROLE", "GROUPS", "CREATED", "BY", "EXPIRES", "REVOKED")
        for x in items:
            t.add_row(
                x["name"],
                x["person"],
                x["role"],
                ", ".join(x["groups"]) if x["groups"] else "*",
                ts(x["created_at"]),
                x["created_by"],
                ts(x["expires_at"]) if x["expires_at"] else "never",
                ts(x["revoked_at"]) if x["revoked_at"] else "-",
            )
        out.print(t)

    run(as_json, lambda: client_for(home, control)[1].get("/v1/tokens"), render)


@token_app.command("revoke")
def token_revoke(
    name: str, as_json: JsonOpt = False, home: HomeOpt = None, control: ControlOpt = None
) -> None:
    """Revoke a token: its next call is refused (401)."""
    run(
        as_json,
        lambda: post(home, control, f"/v1/tokens/{name}/revoke", {}),
        lambda r: out.print(f"token {r['name']} revoked"),
    )


@app.command()
def status(as_json: JsonOpt = False, home: HomeOpt = None, control: ControlOpt = None) -> None:
    """Is the platform healthy? ok, or degraded and why (store refusing writes, failing
    controller ticks), with the controller's tick counters."""

    def render(r: dict[str, Any]) -> None:
        c = r["controller"]
        head = "[green]ok[/green]" if r["degraded"] is None else "[red]degraded[/red]: "
        out.print(head + (r["degraded"] or ""), highlight=False)
        out.print(
            f"revision {r['revision']}; {c['ticks']} ticks, {c['tick_failures']} failed"
            + (f", last error: {c['last_tick_error']}" if c["last_tick_error"] else ""),
            highlight=False,
        )

    run(as_json, lambda: client_for(home, control)[1].get("/v1/status"), render)


@app.command()
def gc(as_json: JsonOpt = False, home: HomeOpt = None, control: ControlOpt = None) -> None:
    """Apply the spec's `retention` now: rotate big logs, drop old ones, expire old rows."""

    def render(r: dict[str, Any]) -> None:
        out.print(f"rotated: {', '.join(r['rotated']) or 'nothing'}")
        out.print(f"removed logs of long-gone instances: {len(r['removed'])}")
        p = r["pruned"]
        out.print(
            f"expired rows: {p['events']} events, {p['decisions']} decisions, "
            f"{p['loans']} loans, {p['audit']} audit entries"
        )

    run(as_json, lambda: post(home, control, "/v1/gc", {}), render)


app.command("simulate")(simulate)
app.command("compare")(compare)
app.command("estimate")(estimate)
app.command("explain")(explain)
app.command("history")(history)
app.command("loadtest")(loadtest)
app.command("drill")(drill)
app.command("capacity")(capacity)
for _review_command in (propose, proposals, approve, reject):
    app.command()(_review_command)


def main() -> None:
    app()
