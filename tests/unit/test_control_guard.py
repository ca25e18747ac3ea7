"""The control API's guard (sluice.control.guard): role, scope and body size are checked
before a body is read, and every mutating route says what it needs."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient
from starlette.routing import BaseRoute

import sluice.control.api as control_api
from sluice.control.alerts_api import alert_routes
from sluice.control.auth import Principal, Role
from sluice.control.capacity_api import capacity_routes
from sluice.control.gateways import GatewayFleet, gateway_routes
from sluice.control.guard import SMALL_BODY, Guard, guard_of
from sluice.core import ManualClock


def _more_routes(api: Any) -> None:
    """The routes `sluice up` adds beside the API's own."""
    alert_routes(api, None, lambda: None)  # type: ignore[arg-type]
    capacity_routes(api, None, None, lambda: 0.0)  # type: ignore[arg-type]
    gateway_routes(api, GatewayFleet(ManualClock(0.0)))


@pytest.fixture
def app_as(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A control API whose caller is whoever the test says (no store behind it)."""
    caller: dict[str, Principal] = {}

    async def fake_caller(request: Any, authenticator: Any) -> Principal:
        return caller["me"]

    monkeypatch.setattr(control_api, "_caller", fake_caller)
    app = control_api.build_control_api(
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        SimpleNamespace(clock=None),  # type: ignore[arg-type]
        allowed_hosts=["testserver"],
        more_routes=_more_routes,
    )

    def client(me: Principal) -> TestClient:
        caller["me"] = me
        return TestClient(app, raise_server_exceptions=False)

    yield client


def api_routes(app: Any) -> list[BaseRoute]:
    inner = [getattr(r, "original_router", None) for r in app.router.routes]
    return [route for router in inner if router is not None for route in router.routes]


def test_every_mutating_route_names_what_it_needs() -> None:
    app = control_api.build_control_api(
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        SimpleNamespace(clock=None),  # type: ignore[arg-type]
        allowed_hosts=["testserver"],
        more_routes=_more_routes,
    )
    routes = api_routes(app)
    assert len(routes) > 30
    unmarked = [
        f"{sorted(r.methods)} {r.path}"  # type: ignore[attr-defined]
        for r in routes
        if set(r.methods) - {"GET", "HEAD"}  # type: ignore[attr-defined]
        and getattr(r.endpoint, "__sluice_guard__", None) is None  # type: ignore[attr-defined]
    ]
    assert unmarked == []
    # and a route nobody marked: GET for any viewer, anything else closed to all but admins
    bare = SimpleNamespace(endpoint=lambda: None, methods={"POST"})
    assert guard_of(bare) == Guard(Role.ADMIN)  # type: ignore[arg-type]
    assert guard_of(SimpleNamespace(endpoint=lambda: None, methods={"GET"})) == Guard(Role.VIEWER)  # type: ignore[arg-type]


def test_a_viewers_large_post_is_refused_by_role_before_it_is_read(app_as: Any) -> None:
    client = app_as(Principal("vera", Role.VIEWER))
    read = 0

    def body() -> Iterator[bytes]:
        nonlocal read
        for _ in range(64):
            read += 1 << 20
            yield b"x" * (1 << 20)

    r = client.post("/v1/groups/chat/scale", content=body())
    assert r.status_code == 403 and "needs the operator role" in r.json()["error"]["message"]


def test_a_scoped_token_is_refused_on_another_groups_path(app_as: Any) -> None:
    client = app_as(Principal("ops", Role.OPERATOR, frozenset({"chat"})))
    r = client.post("/v1/groups/search/scale", json={"replicas": 1, "reason": "x"})
    assert r.status_code == 403 and "search" in r.json()["error"]["message"]
    r = client.get("/v1/groups/search/explain")
    assert r.status_code == 403


def test_bodies_over_the_routes_cap_are_413_declared_or_streamed(app_as: Any) -> None:
    client = app_as(Principal("ops", Role.OPERATOR))
    big = b"{" + b" " * SMALL_BODY + b"}"
    r = client.post("/v1/groups/chat/scale", content=big)
    assert r.status_code == 413 and f"at most {SMALL_BODY} bytes" in r.json()["error"]["message"]

    def chunked() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield b"{"
        for _ in range(SMALL_BODY // 1024 + 1):
            yield b" " * 1024
        yield b"}"

    r = client.post("/v1/groups/chat/scale", content=chunked())
    assert r.status_code == 413
    r = client.post("/v1/groups/chat/scale", content=b"1", headers={"content-length": "-1"})
    assert r.status_code in (400, 413)


def test_a_gateway_token_reaches_only_its_routes(app_as: Any) -> None:
    client = app_as(Principal("gw", Role.GATEWAY))
    assert client.get("/v1/groups").status_code == 403
    assert client.post("/v1/proposals", json={"yaml": "", "reason": "x"}).status_code == 403


def test_an_unknown_host_is_421_before_anything_else(app_as: Any) -> None:
    client = app_as(Principal("vera", Role.VIEWER))
    r = client.get("/v1/groups", headers={"host": "evil.example"})
    assert r.status_code == 421 and r.json()["error"]["code"] == "bad_host"
