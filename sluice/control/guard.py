"""Limits before work: who may call a control-API route and how large its body may be,
checked before a byte of the body is read (issue 31).

FastAPI reads and parses a body before any dependency or handler runs, so a role check in
the handler comes too late: a viewer's 150 MB POST to a scale route used to be read whole,
parsed and answered 422, and grew the process (which also runs the gateway in `sluice up`)
by 460 MB. Here, in order, before routing:

1. the `Host` is one this API serves (DNS rebinding): 421;
2. the caller is authenticated (bearer token or console session): 401 (503 with a
   `Retry-After` when the store that holds the tokens cannot be reached: no traceback);
3. the route's guard (`guarded`) admits the caller's role, and a token scoped to groups
   names the route's `{group}`: 403;
4. the body fits the route's cap: a `Content-Length` over it is refused unread, a chunked
   body as soon as it passes the cap, and a body still arriving after `BODY_READ_S` is
   refused too: 413 or 408.

Every route should say what it needs with `@guarded(...)`; one that does not is readable by
any viewer if it is a GET and needs an admin otherwise (a new mutating route is closed until
its author opens it), and its body is capped at `SMALL_BODY`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
from starlette.requests import Request
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sluice.control.auth import Principal, Role
from sluice.core import SluiceError

__all__ = [
    "BODY_READ_S",
    "SMALL_BODY",
    "SPEC_BODY",
    "ControlGuard",
    "Guard",
    "guard_of",
    "guarded",
]

SMALL_BODY = 64 << 10
"""A control action's body (scale, failover, token, review): a reason and a few fields."""
SPEC_BODY = 4 << 20
"""A spec upload's body: `MAX_SPEC_BYTES` of YAML (`sluice.control.spec_work`), JSON-escaped."""
BODY_READ_S = 30.0
"""A body must have arrived whole this long after its request began (a slow-loris upload
holds a connection, not the controller)."""

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class Guard:
    """What a route needs: a role (and, with a `{group}` in its path, scope over that
    group) and a body of at most `body_cap` bytes."""

    role: Role
    body_cap: int = SMALL_BODY


def guarded(role: Role, body_cap: int = SMALL_BODY) -> Callable[[F], F]:
    """Mark a route's endpoint with what it needs (put it under the `@api.post(...)`)."""

    def mark(endpoint: F) -> F:
        endpoint.__sluice_guard__ = Guard(role, body_cap)  # type: ignore[attr-defined]
        return endpoint

    return mark


def guard_of(route: BaseRoute) -> Guard:
    """The route's own guard, or the default: GET for any viewer, anything else admin."""
    found = getattr(getattr(route, "endpoint", None), "__sluice_guard__", None)
    if isinstance(found, Guard):
        return found
    methods = getattr(route, "methods", None) or {"GET"}
    return Guard(Role.VIEWER if set(methods) <= {"GET", "HEAD"} else Role.ADMIN)


class ControlGuard:
    """The ASGI middleware in front of the control API (see the module's docstring).
    `caller` authenticates a request (raising a SluiceError); `exempt(path)` names the
    paths that authenticate themselves (health, the console's login pages); `routes`
    returns the app's routes (read per request, so routes added later are guarded)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        hosts: Collection[str],
        caller: Callable[[Request], Awaitable[Principal]],
        exempt: Callable[[str], bool],
        routes: Callable[[], Sequence[BaseRoute]],
        on_refused: Callable[[Principal, str, int, str], Awaitable[None]] | None = None,
    ) -> None:
        self._app = app
        self._hosts = frozenset(h.lower() for h in hosts)
        self._caller = caller
        self._exempt = exempt
        self._routes = routes
        self._on_refused = on_refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        request = Request(scope)
        host = _host_name(request.headers.get("host", ""))
        if host not in self._hosts:
            message = (
                f"this control API does not serve host {host!r}; it serves "
                f"{', '.join(sorted(self._hosts))} (control.allowed_hosts)"
            )
            await _refuse(send, 421, "bad_host", message)
            return
        if self._exempt(scope["path"]):
            await self._app(scope, receive, send)
            return
        try:
            principal = await self._caller(request)
        except SluiceError as exc:  # no one's: answered, not audited
            await _send_json(send, exc.http_status, exc.to_json(), exc.retry_after_s)
            return
        guard, group = self._guard(scope)
        what = f"{scope['method']} {scope['path']}"
        try:
            principal.require(guard.role, what, groups=(group,) if group else ())
        except SluiceError as exc:
            await self._refused(principal, what, exc.http_status, exc.message)
            await _send_json(send, exc.http_status, exc.to_json())
            return
        scope.setdefault("state", {})["principal"] = principal
        try:
            body = await _bounded_body(request, receive, guard.body_cap)
        except _BodyRefused as refused:
            await self._refused(principal, what, refused.status, refused.message)
            await _refuse(send, refused.status, refused.code, refused.message)
            return
        await self._app(scope, _replay(body, receive), send)

    async def _refused(self, who: Principal, what: str, status: int, why: str) -> None:
        if self._on_refused is not None:
            await self._on_refused(who, what, status, why)

    def _guard(self, scope: Scope) -> tuple[Guard, str | None]:
        """The guard of the route this request will reach, and the `{group}` it names."""
        for route in self._routes():
            match, child = route.matches(scope)
            if match is Match.FULL:
                group = child.get("path_params", {}).get("group")
                return guard_of(route), group if isinstance(group, str) else None
        return Guard(Role.VIEWER), None  # no such route: the router answers 404 / 405


class _BodyRefused(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


async def _bounded_body(request: Request, receive: Receive, cap: int) -> bytes:
    """The whole body, at most `cap` bytes, within `BODY_READ_S`."""
    too_large = _BodyRefused(
        413, "too_large", f"the body of {request.method} {request.url.path} is at most {cap} bytes"
    )
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > cap):
        raise too_large
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(BODY_READ_S):
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    break  # the client went away: the app sees an empty body, then the close
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > cap:
                    raise too_large
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
    except TimeoutError:
        raise _BodyRefused(
            408, "timeout", f"the body did not arrive within {BODY_READ_S:g} s"
        ) from None
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives the app the body already read, then the real stream's end."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _refuse(send: Send, status: int, code: str, message: str) -> None:
    await _send_json(send, status, {"error": {"code": code, "message": message}})


async def _send_json(
    send: Send, status: int, payload: Any, retry_after_s: int | None = None
) -> None:
    body = orjson.dumps(payload)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),  # an unread body may still be on its way
    ]
    if retry_after_s is not None:
        headers.append((b"retry-after", str(retry_after_s).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _host_name(host: str) -> str:
    """`Host` without its port: `127.0.0.1:8081` -> `127.0.0.1`, `[::1]:80` -> `::1`."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host
