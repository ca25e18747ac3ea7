"""The control API (operators, CLI, console): the app that every route of it sits in.

`build_control_api` composes it: authentication and the guard before any route, the error
handlers, `/healthz`, then each resource's routes from its own room: `status_api` (status,
quota, data plane, metrics), `groups_api` (groups, instances, scale, failover, route rules,
explain, history), `rollouts_api`, `revisions_api` (apply, proposals), `records_api`
(audit, events, gc) and `tokens_api` (tokens, whoami); `api_deps` holds what they share.

Not on the request path, so FastAPI is fine here. Errors are the platform's error tree
rendered as `{"error": {...}}` with the error's HTTP status. A store that cannot be reached
or written (PostgreSQL away, SQLite locked, read-only or full) is a 503 `store_unavailable`
naming the store (never its password) with a `Retry-After`, not a 500: the gateways keep
serving their last routes meanwhile.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from sluice.control.api_deps import Limit, Me, RowId, authenticated
from sluice.control.auth import (
    CSRF_HEADER,
    SESSION_COOKIE,
    Authenticator,
    Principal,
    Role,
    csrf_matches,
)
from sluice.control.console import is_console_path, mount_console
from sluice.control.controller import Controller
from sluice.control.groups_api import group_routes
from sluice.control.guard import ControlGuard
from sluice.control.records_api import record_routes
from sluice.control.refusals import RefusalAudit
from sluice.control.review import ReviewBoard
from sluice.control.revisions_api import revision_routes
from sluice.control.rollouts_api import rollout_routes
from sluice.control.status_api import status_routes
from sluice.control.supervisor import InstanceSupervisor
from sluice.control.tokens import TokenAdmin
from sluice.control.tokens_api import TokenRequest, token_routes
from sluice.core import Forbidden, InstanceStatus, SluiceError
from sluice.spec import PlatformSpec
from sluice.store import Store, store_unavailable

__all__ = ["Limit", "Me", "RowId", "TokenRequest", "build_control_api"]
"""`Me`, `Limit`, `RowId` (from `api_deps`) and `TokenRequest` (from `tokens_api`) stay
importable from here, where `capacity_api`, `alerts_api`, `handover` and the CLI take them."""


def build_control_api(
    controller: Controller,
    supervisor: InstanceSupervisor,
    store: Store,
    tokens: TokenAdmin,
    allowed_hosts: Collection[str],
    data_plane: Callable[[], dict[str, Any]] | None = None,
    review: ReviewBoard | None = None,
    metrics: Callable[[], tuple[bytes, str]] | None = None,
    housekeeping: Callable[[], Awaitable[dict[str, Any]]] | None = None,
    more_routes: Callable[[APIRouter], None] | None = None,
) -> FastAPI:
    """Every route but `/healthz` needs a token (`tokens`); a request whose `Host` is not
    one of `allowed_hosts` (DNS rebinding) is refused before routing. `data_plane`, if
    given, reports the gateway's live state; `review`, the proposal workflow (R5);
    `metrics`, the gateway's Prometheus text (served here, behind a viewer token);
    `housekeeping`, one retention pass (`sluice gc`); `more_routes` adds routes behind
    the same authentication (the alerts': `sluice.control.alerts_api`)."""
    app = FastAPI(
        title="Sluice control API", version="1", docs_url=None, redoc_url=None, openapi_url=None
    )
    authenticator = Authenticator(store, tokens.clock)
    api = APIRouter(dependencies=[Depends(authenticated)])

    async def caller(request: Request) -> Principal:
        principal = await _caller(request, authenticator)
        _gateway_only_syncs(principal, request.url.path)
        return principal

    refusals = RefusalAudit(lambda *row: controller.audit(*row), tokens.clock)
    app.add_middleware(
        ControlGuard,
        hosts=allowed_hosts,
        caller=caller,
        exempt=lambda path: path == "/healthz" or is_console_path(path),  # the console logs in
        routes=lambda: api.routes,  # every guarded route is on `api`
        on_refused=refusals.record,
    )

    @app.exception_handler(SluiceError)
    async def _sluice_error(request: Request, exc: SluiceError) -> JSONResponse:
        """A 403 inside a route (another team's group, another gateway's id) goes on record
        too, unless the route audited it already (`detail.audited`, an approval refused)."""
        principal = getattr(request.state, "principal", None)
        if exc.http_status == 403 and principal is not None and not exc.detail.get("audited"):
            what = f"{request.method} {request.url.path}"
            await refusals.record(principal, what, 403, exc.message)
        return _error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        codes = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed"}
        code = codes.get(exc.status_code, "http_error")
        body = {"error": {"code": code, "message": str(exc.detail)}}
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    async def _store_error(_: Request, exc: Exception) -> JSONResponse:
        """The store cannot be reached or written: 503 naming it, and (a write refused) the
        controller's status turns degraded until a write goes through again. Any other
        database error is a bug: raised on, a 500 with its traceback in the log."""
        outage = store_unavailable(exc, store.location)
        if outage is None:
            raise exc
        controller.store_refused(exc)
        return _error_response(outage)

    for kind in (DBAPIError, PoolTimeout, sqlite3.OperationalError):
        app.add_exception_handler(kind, _store_error)

    @app.exception_handler(RequestValidationError)
    async def _bad_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        issues = [
            {"field": ".".join(str(p) for p in e["loc"]), "message": e["msg"]} for e in exc.errors()
        ]
        text = "; ".join(f"{i['field']}: {i['message']}" for i in issues)
        body = {"error": {"code": "invalid_request", "message": text, "issues": issues}}
        return JSONResponse(body, status_code=422)

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        """Unauthenticated: ok or degraded, nothing more (why is in `/v1/status`)."""
        return {
            "status": "degraded" if controller.degraded else "ok",
            "revision": controller.revision,
        }

    # Each room gets only what its routes use, looked up when a request comes.
    def statuses() -> list[InstanceStatus]:
        return supervisor.statuses()

    def now() -> float:
        return tokens.clock.now()

    def spec() -> PlatformSpec:
        return controller.spec

    status_routes(api, controller, statuses, data_plane, metrics)
    group_routes(api, controller, statuses, store, data_plane, now)
    rollout_routes(api, controller, store)
    revision_routes(api, controller, store, review)
    record_routes(api, controller, store, review, housekeeping)
    token_routes(api, tokens, spec)

    @api.get("/v1/openapi.json")
    async def openapi() -> dict[str, Any]:
        """This API's OpenAPI schema (for clients and contract tests), behind a token."""
        return app.openapi()

    if more_routes is not None:
        more_routes(api)
    app.include_router(api)
    mount_console(app, authenticator, tokens.clock)
    return app


def _error_response(exc: SluiceError) -> JSONResponse:
    """`exc` as its JSON body and status, with its `Retry-After` if it has one."""
    headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s is not None else None
    return JSONResponse(exc.to_json(), status_code=exc.http_status, headers=headers)


async def _caller(request: Request, authenticator: Authenticator) -> Principal:
    """A bearer token, or else the console's session cookie; a change made with the cookie
    must carry the session's CSRF token in `X-CSRF-Token` (a form on another site cannot
    set a header, nor read the token)."""
    authorization = request.headers.get("authorization")
    session = request.cookies.get(SESSION_COOKIE)
    if authorization is not None or session is None:
        return await authenticator.authenticate(authorization)
    principal = await authenticator.from_session(session)
    if request.method not in ("GET", "HEAD") and not csrf_matches(
        session, request.headers.get(CSRF_HEADER)
    ):
        raise Forbidden(f"a change made with the console's session needs its {CSRF_HEADER}")
    return principal


def _gateway_only_syncs(me: Principal, path: str) -> None:
    """A gateway token may sync its gateway (`sluice.control.gateways`) and learn its own
    name (`GET /v1/whoami`: `sluice gateway` names itself after its token), and read
    nothing else: refused here, before any route, since most reads need only a valid token."""
    if me.role is Role.GATEWAY and not (path.startswith("/v1/gateways/") or path == "/v1/whoami"):
        raise Forbidden(
            f"token {me.name!r} is a gateway token: it may only sync a gateway "
            "(POST /v1/gateways/ID/sync) and ask its own name (GET /v1/whoami)",
            needs=Role.VIEWER.value,
            role=me.role.value,
        )
