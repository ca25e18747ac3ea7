"""The web console: the operator's pages, served by the control API's own process and port.

Log in with a token; the console then holds an HttpOnly, SameSite=Strict session cookie
(`sluice.control.auth`). Every page is server-rendered HTML that works without JavaScript;
with it, `live.js` re-fetches the page every second and swaps in its `data-live` parts, so a
change made anywhere (CLI, API, another console) shows within two seconds. Every change is a
plain HTML form carrying the session's CSRF token, and goes through the control API in
process (`client.ApiClient`), as the logged-in person.
"""

from __future__ import annotations

import asyncio
import hmac
import secrets
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from sluice.control.auth import (
    SESSION_COOKIE,
    Authenticator,
    Principal,
    Role,
    csrf_matches,
    csrf_token,
)
from sluice.control.console import pages
from sluice.control.console.client import ApiClient, ApiRefused
from sluice.control.console.pages import NO_VALUE
from sluice.core import Clock, SluiceError, Unauthorized
from sluice.core.urls import redact_channel

__all__ = ["is_console_path", "mount_console"]

_HERE = Path(__file__).parent
_MAX_FORM_BYTES = 16 * 1024
"""Every console form is a few short fields; anything larger is refused unread."""
_FORM_READ_S = 10.0
_FLASH = "sluice_flash"
_LOGIN_CSRF = "sluice_login"
_SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}


def is_console_path(path: str) -> bool:
    """The console's pages authenticate by session themselves (a login form, not a 401)."""
    return path in ("/", "/ui") or path.startswith("/ui/")


class _NeedLogin(Exception):
    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


@dataclass(frozen=True, slots=True)
class _Visit:
    """One request of a logged-in person: who, their cookie, and how to ask the API."""

    me: Principal
    session: str
    host: str
    api: ApiClient

    async def get(self, path: str, **params: Any) -> Any:
        return await self.api.get(self.host, self.session, path, **params)

    async def post(self, path: str, body: dict[str, Any]) -> Any:
        return await self.api.post(self.host, self.session, path, body)

    def may_operate(self, *groups: str) -> bool:
        return self.me.role.rank >= Role.OPERATOR.rank and (
            self.me.groups is None or set(groups) <= self.me.groups
        )

    @property
    def is_admin(self) -> bool:
        return self.me.role is Role.ADMIN


def mount_console(app: FastAPI, authenticator: Authenticator, clock: Clock) -> None:
    """Add the console's pages under `/ui` (and `/` -> `/ui/`) to the control API's app."""
    api = ApiClient(app)
    templates = Jinja2Templates(directory=_HERE / "templates")
    env = templates.env
    env.filters.update(
        utc=_utc, ago=lambda t: _ago(t, clock.now()), num=_num, pct=_pct, channel=redact_channel
    )
    shares = pages.RouteShare()
    app.mount("/ui/static", StaticFiles(directory=_HERE / "static"), name="console-static")

    async def visit(request: Request) -> _Visit:
        session = request.cookies.get(SESSION_COOKIE)
        try:
            me = await authenticator.from_session(session)
        except Unauthorized as exc:
            raise _NeedLogin(exc.message) from None
        assert session is not None
        return _Visit(me, session, request.headers.get("host", ""), api)

    def render(
        request: Request, v: _Visit | None, name: str, code: int = 200, **context: Any
    ) -> HTMLResponse:
        flash = request.cookies.get(_FLASH)
        context.update(
            request=request,
            me=v.me if v else None,
            visit=v,
            csrf=csrf_token(v.session) if v else "",
            flash=urllib.parse.unquote(flash) if flash else None,
            now=clock.now(),
        )
        response = templates.TemplateResponse(request, name, context, status_code=code)
        response.headers.update(_SECURITY_HEADERS)
        if flash and "x-sluice-live" not in request.headers:
            response.delete_cookie(_FLASH, path="/ui")
        return response

    async def form(request: Request, v: _Visit) -> Mapping[str, str]:
        """The posted fields, after the CSRF check: refused (403) without the session's
        token or from another origin, before anything is done."""
        fields = await _fields(request)
        origin = request.headers.get("origin")
        if origin is not None and urllib.parse.urlsplit(origin).netloc != v.host:
            raise ApiRefused(403, f"a form posted from {origin} is not this console's")
        if not csrf_matches(v.session, fields.get("csrf")):
            raise ApiRefused(403, "this form has no valid CSRF token: reload the page")
        return fields

    def done(request: Request, path: str, message: str) -> RedirectResponse:
        """After a change: back to the page, which shows `message` once."""
        response = RedirectResponse(path, status_code=303)
        _cookie(request, response, _FLASH, urllib.parse.quote(message), path="/ui", max_age=60)
        return response

    async def change(
        request: Request, path: str, body: Callable[[Mapping[str, str]], dict[str, Any]]
    ) -> Any:
        """A console form's change: checked (session, CSRF, size), then sent to the API
        as the logged-in person; returns the API's answer."""
        v = await visit(request)
        return await v.post(path, body(await form(request, v)))

    @app.exception_handler(_NeedLogin)
    async def _login_first(request: Request, exc: _NeedLogin) -> Response:
        if "x-sluice-live" in request.headers:
            return Response(status_code=401)
        if request.method != "GET":
            return render(request, None, "error.html", 401, status=401, message=exc.why)
        target = urllib.parse.quote(request.url.path + _query(request), safe="")
        return RedirectResponse(f"/ui/login?next={target}", status_code=303)

    @app.exception_handler(ApiRefused)
    async def _refused(request: Request, exc: ApiRefused) -> Response:
        try:
            v: _Visit | None = await visit(request)
        except _NeedLogin:
            v = None
        return render(request, v, "error.html", exc.status, status=exc.status, message=exc.message)

    @app.get("/", include_in_schema=False)
    @app.get("/ui", include_in_schema=False)
    async def _root() -> RedirectResponse:
        return RedirectResponse("/ui/", status_code=307)

    def login_form(request: Request, next: str, code: int = 200, error: str = "") -> Response:
        """The login form, with a fresh nonce in a cookie of its own: a form posted from
        another site cannot know it (login CSRF, which would log a person in as someone
        else)."""
        nonce = secrets.token_hex(32)
        response = render(
            request, None, "login.html", code, next=_local(next), nonce=nonce, error=error
        )
        _cookie(request, response, _LOGIN_CSRF, nonce, path="/ui/login")
        return response

    @app.get("/ui/login", include_in_schema=False)
    async def login_page(request: Request, next: str = "/ui/") -> Response:
        return login_form(request, next)

    @app.post("/ui/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        fields = await _fields(request)
        nonce, expected = fields.get("nonce", ""), request.cookies.get(_LOGIN_CSRF)
        if not expected or not hmac.compare_digest(nonce.encode(), expected.encode()):
            raise ApiRefused(403, "this login form has expired: reload the page")
        try:
            session, _ = await authenticator.log_in(fields.get("token", ""))
        except SluiceError as exc:
            return login_form(request, fields.get("next", ""), 401, exc.message)
        signed_in = RedirectResponse(_local(fields.get("next", "")), status_code=303)
        _cookie(request, signed_in, SESSION_COOKIE, session, path="/")
        signed_in.delete_cookie(_LOGIN_CSRF, path="/ui/login")
        return signed_in

    @app.post("/ui/logout", include_in_schema=False)
    async def logout(request: Request) -> Response:
        v = await visit(request)
        await form(request, v)
        await authenticator.log_out(v.session, v.me)
        response = RedirectResponse("/ui/login", status_code=303)
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response

    @app.get("/ui/", include_in_schema=False)
    async def overview(request: Request) -> HTMLResponse:
        v = await visit(request)
        now = clock.now()
        groups = await v.get("/v1/groups")
        rows = pages.overview_rows(
            groups,
            await v.get("/v1/dataplane"),
            await v.get("/v1/history", since=now - 300),
            await v.get("/v1/quota"),
            await v.get("/v1/alerts"),
        )
        return render(request, v, "overview.html", rows=rows, page="overview")

    @app.get("/ui/groups/{group}", include_in_schema=False)
    async def group_page(
        request: Request, group: str, span: Annotated[str, Query(pattern="^(1h|1d)$")] = "1h"
    ) -> HTMLResponse:
        v = await visit(request)
        name = _segment(group)
        now = clock.now()
        seconds, step = pages.SPANS[span]
        found = [g for g in await v.get("/v1/groups") if g["name"] == group]
        if not found:
            raise ApiRefused(404, f"no group named {group!r}")
        instances = await v.get("/v1/instances", group=group)
        explain = await v.get(f"/v1/groups/{name}/explain", limit=8)
        events = await v.get("/v1/events", group=group, limit=12)
        history = await v.get("/v1/history", group=group, since=now - seconds, step_s=step)
        rows = history["groups"].get(group, [])
        return render(
            request,
            v,
            "group.html",
            page="overview",
            g=found[0],
            instances=instances,
            accel=any(i.get("accelerator") for i in instances),
            explain=explain,
            events=events,
            charts=pages.charts(rows, now - seconds, now),
            span=span,
        )

    @app.post("/ui/groups/{group}/scale", include_in_schema=False)
    async def scale(request: Request, group: str) -> Response:

        def body(fields: Mapping[str, str]) -> dict[str, Any]:
            return {**_reason(fields), "replicas": _int(fields.get("replicas", ""), "replicas")}

        answer = await change(request, f"/v1/groups/{_segment(group)}/scale", body)
        message = f"{group}: {answer['from']} -> {answer['to']} instances"
        return done(request, f"/ui/groups/{_segment(group)}", message)

    @app.post("/ui/groups/{group}/{action}", include_in_schema=False)
    async def failover(request: Request, group: str, action: str) -> Response:
        if action not in ("failover", "restore"):
            raise ApiRefused(404, f"no console action {action!r}")
        answer = await change(request, f"/v1/groups/{_segment(group)}/{action}", _reason)
        if action == "failover":
            message = f"{group}: all traffic now goes to {answer['to']}"
        elif answer["changed"]:
            message = f"{group}: restored (its traffic no longer goes to {answer['from']})"
        else:
            message = f"{group} was not failed over: nothing to restore"
        return done(request, "/ui/routes", message)

    @app.get("/ui/routes", include_in_schema=False)
    async def routes_page(request: Request) -> HTMLResponse:
        v = await visit(request)
        routes = await v.get("/v1/routes")
        groups = await v.get("/v1/groups")
        dataplane = await v.get("/v1/dataplane")
        share = shares.share(dataplane.get("routes", {}), clock.now())
        return render(
            request,
            v,
            "routes.html",
            page="routes",
            rules=[{**r, "match": pages.match_text(r)} for r in routes["rules"]],
            share=share,
            failovers=pages.failover_rows(groups, routes["failovers"]),
            proposals=await v.get("/v1/proposals"),
        )

    @app.post("/ui/proposals/{proposal}/{action}", include_in_schema=False)
    async def review(request: Request, proposal: int, action: str) -> Response:
        if action not in ("approve", "reject"):
            raise ApiRefused(404, f"no console action {action!r}")
        answer = await change(request, f"/v1/proposals/{proposal}/{action}", _reason)
        if answer["state"] == "approved":
            message = f"proposal {proposal} approved: revision {answer['revision']}"
        else:
            message = f"proposal {proposal} {answer['state']}"
        return done(request, "/ui/routes", message)

    @app.get("/ui/quota", include_in_schema=False)
    async def quota_page(request: Request) -> HTMLResponse:
        v = await visit(request)
        return render(request, v, "quota.html", page="quota", q=await v.get("/v1/quota"))

    @app.get("/ui/rollouts", include_in_schema=False)
    async def rollouts_page(request: Request) -> HTMLResponse:
        v = await visit(request)
        runs = await v.get("/v1/rollouts")
        return render(request, v, "rollouts.html", page="rollouts", rollouts=runs)

    @app.get("/ui/rollouts/{name}", include_in_schema=False)
    async def rollout_page(request: Request, name: str) -> HTMLResponse:
        v = await visit(request)
        summary = [r for r in await v.get("/v1/rollouts") if r["name"] == name]
        if not summary:
            raise ApiRefused(404, f"no rollout named {name!r}")
        plan = await v.get(f"/v1/rollouts/{_segment(name)}/plan")
        report = None
        if summary[0]["run"] is not None:
            report = await v.get(f"/v1/rollouts/{_segment(name)}")
        state = (report or {}).get("state") or {}
        spec = (report or {}).get("spec") or {"steps": [s["percent"] for s in plan["steps"]]}
        return render(
            request,
            v,
            "rollout.html",
            page="rollouts",
            r=summary[0],
            plan=plan,
            report=report,
            state=state,
            steps=pages.step_rows(state, spec),
        )

    @app.post("/ui/rollouts/{name}/{action}", include_in_schema=False)
    async def rollout_action(request: Request, name: str, action: str) -> Response:
        path = f"/v1/rollouts/{_segment(name)}/{_segment(action)}"
        answer = await change(request, path, _reason)
        phase = answer.get("phase", "done") if isinstance(answer, dict) else "done"
        message = f"rollout {name}: {action} -> {phase}"
        return done(request, f"/ui/rollouts/{_segment(name)}", message)

    @app.get("/ui/audit", include_in_schema=False)
    async def audit_page(request: Request) -> HTMLResponse:
        v = await visit(request)
        query = {k: request.query_params.get(k, "")[:200] for k in _AUDIT_FIELDS}
        entries = await v.get("/v1/audit", **pages.audit_filters(query, clock.now()))
        return render(request, v, "audit.html", page="audit", entries=entries, query=query)


_AUDIT_FIELDS = ("actor", "target", "action", "since")


async def _fields(request: Request) -> dict[str, str]:
    """An urlencoded form (every console form is one), read with a size and a time limit:
    at most `_MAX_FORM_BYTES` in `_FORM_READ_S`, and 16 fields."""
    body = bytearray()
    try:
        async with asyncio.timeout(_FORM_READ_S):
            async for chunk in request.stream():
                body += chunk
                if len(body) > _MAX_FORM_BYTES:
                    raise ApiRefused(413, f"a console form is at most {_MAX_FORM_BYTES} bytes")
    except TimeoutError:
        raise ApiRefused(408, f"the form did not arrive within {_FORM_READ_S:g} s") from None
    try:
        pairs = urllib.parse.parse_qsl(body.decode(), max_num_fields=16, strict_parsing=False)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ApiRefused(400, f"not a console form: {exc}") from None
    return dict(pairs)


def _cookie(
    request: Request,
    response: Response,
    name: str,
    value: str,
    path: str,
    max_age: int | None = None,
) -> None:
    """Every console cookie: HttpOnly, SameSite=Strict, and Secure when served over TLS."""
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path=path,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def _reason(fields: Mapping[str, str]) -> dict[str, Any]:
    return {"reason": fields.get("reason", "")}


def _segment(text: str) -> str:
    return urllib.parse.quote(text, safe="")


def _local(target: str) -> str:
    """Only a console page: a login form must not send anyone to another site."""
    target = urllib.parse.unquote(target)
    if not target.startswith("/ui/") or target.startswith("//") or "\\" in target:
        return "/ui/"
    return target


def _query(request: Request) -> str:
    return f"?{request.url.query}" if request.url.query else ""


def _int(text: str, field: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ApiRefused(422, f"{field}: {text!r} is not a whole number") from None


def _utc(t: float | None) -> str:
    return NO_VALUE if t is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def _ago(t: float | None, now: float) -> str:
    if t is None:
        return NO_VALUE
    s = max(now - t, 0.0)
    if s < 90:
        return f"{s:.0f} s ago"
    if s < 5400:
        return f"{s / 60:.0f} min ago"
    if s < 129_600:
        return f"{s / 3600:.1f} h ago"
    return f"{s / 86_400:.1f} d ago"


def _num(x: float | None, digits: int = 1, unit: str = "") -> str:
    if x is None:
        return NO_VALUE
    return f"{x:,.{digits}f} {unit}" if unit else f"{x:,.{digits}f}"


def _pct(x: float | None, digits: int = 1) -> str:
    return NO_VALUE if x is None else f"{100 * x:.{digits}f}%"
