"""Gateways are who they say (issue 31): a gateway token names its gateway, a live id is held
by its token, what a gateway sends of groups and instances outside the routing is dropped
and counted, and the controller keeps a bounded number of gateways and forgets silent ones
(sluice.policy.gateways, sluice.control.gateways); `sluice gateway` learns its name from
the control API and refuses an id that is not its token's at start (sluice.cli.gateway_run,
sluice.gateway.remote)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient

import sluice.control.gateways as control_gateways
import sluice.gateway.remote as remote
from sluice.cli.gateway_run import choose_gateway_id
from sluice.control.api import _gateway_only_syncs
from sluice.control.auth import Principal, Role
from sluice.control.gateways import MAX_GATEWAYS, GatewayFleet, gateway_routes
from sluice.core import Forbidden, ManualClock, SluiceError, SpecError, Unauthorized, Unavailable
from sluice.policy import build_routing_snapshot
from sluice.policy.autoscale.base import TrafficSample
from sluice.policy.gateways import GATEWAY_TTL_S, GatewayBook, gateway_id_fits
from sluice.policy.routing import Endpoint, RoutingSnapshot
from sluice.policy.snapshot_wire import sample_to_json
from sluice.spec import load_spec_text

EXAMPLES = Path(__file__).parents[2] / "examples"
ANSWER = {"at": 1.0, "status": 200, "latency_s": 0.1, "ttft_s": None, "output_bytes": 5}


def sample(arrivals: int, in_flight: int = 0) -> TrafficSample:
    return TrafficSample(
        at=0.0,
        in_flight=in_flight,
        queued=0,
        arrivals=arrivals,
        completions=arrivals,
        latency_bounds=(0.1, 1.0),
        latency_counts=(arrivals, 0, 0),
    )


def snapshot(version: int, *instances: str) -> RoutingSnapshot:
    """The quickstart's routing (groups chat, embed, demo) with `instances` ready in chat."""
    spec = load_spec_text((EXAMPLES / "quickstart.yaml").read_text(), "quickstart.yaml").spec
    ready = {"chat": [Endpoint(i, "127.0.0.1", 9000 + k, 4) for k, i in enumerate(instances)]}
    return build_routing_snapshot(spec, ready, version)


def fleet_of(*instances: str) -> tuple[GatewayFleet, ManualClock]:
    clock = ManualClock(100.0)
    fleet = GatewayFleet(clock)
    fleet.publish(snapshot(1, *instances))
    return fleet, clock


@pytest.mark.parametrize(
    ("gateway_id", "fits"),
    [
        ("gw-1", True),
        ("gw-1-w0", True),
        ("gw-1-host-8080-w3", True),
        ("gw-1-sluice-gateway-7d9f-abcde", True),
        ("gw-2", False),
        ("gw-10", False),  # a name is not a prefix of another's
        ("gw-1x", False),
        ("gw-1-", False),
        ("gw", False),
        ("x-gw-1", False),
        ("local", False),
    ],
)
def test_a_gateway_token_names_its_gateway(gateway_id: str, fits: bool) -> None:
    assert gateway_id_fits("gw-1", gateway_id) is fits


def test_a_sync_of_an_id_not_the_tokens_is_refused_and_changes_nothing() -> None:
    fleet, _ = fleet_of("i-1")
    fleet.sample_groups(["chat"])
    fleet.sync("gw-1-w0", "b", {"chat": sample(3)}, {"version": 1}, 1, token="gw-1")
    before = (fleet.book.live(), fleet.traffic(), fleet.status(), fleet.samples("i-1", 0, 99))
    for token, gateway in (("forger", "gw-1-w0"), ("forger", "gw-9"), ("gw-1", "gw-2-w0")):
        with pytest.raises(Forbidden, match=f"token '{token}' may sync only gateway") as err:
            fleet.sync(
                gateway, "x", {"chat": sample(999)}, {}, None, None, {"i-1": [ANSWER]}, token=token
            )
        assert err.value.detail["allowed"] == [token, f"{token}-<suffix>"]
    with pytest.raises(SpecError, match="controller's own gateway"):
        fleet.sync("local", "x", {}, {}, None, token="local")
    after = (fleet.book.live(), fleet.traffic(), fleet.status(), fleet.samples("i-1", 0, 99))
    assert after == before and fleet.book.share_of("gw-1-w0").count == 1


def test_a_live_id_is_held_by_its_token_until_it_falls_silent() -> None:
    fleet, clock = fleet_of()
    fleet.sync("gw-1-w0", "b", {}, {}, None, token="gw-1")
    # the token `gw` may name `gw-1-w0` by the rule, but that id is live under `gw-1`
    with pytest.raises(Forbidden, match="'gw-1-w0' is live under token 'gw-1'"):
        fleet.sync("gw-1-w0", "x", {}, {}, None, token="gw")
    clock.advance(GATEWAY_TTL_S + 1)
    fleet.sync("gw-1-w0", "x", {}, {}, None, token="gw")  # forgotten: the id is free
    with pytest.raises(Forbidden, match="live under token 'gw'"):
        fleet.sync("gw-1-w0", "b", {}, {}, None, token="gw-1")


def test_counters_and_answers_outside_the_routing_are_dropped_counted_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fleet, clock = fleet_of("i-1")
    fleet.sample_groups(["chat"])
    caplog.set_level(logging.WARNING, "sluice.gateways")
    sent = {"chat": sample(0), "nope": sample(0)}
    answers = {"i-1": [ANSWER], "i-9": [ANSWER, ANSWER]}
    fleet.sync("gw-1", "b", sent, {}, 1, None, answers, token="gw-1")
    clock.advance(1)
    sent = {"chat": sample(4), "nope": sample(10**9)}
    fleet.sync("gw-1", "b", sent, {}, 1, None, answers, token="gw-1")
    traffic = fleet.traffic()
    assert set(traffic) == {"chat"} and traffic["chat"].arrivals == 4
    assert "nope" not in fleet.book.gateways["gw-1"].counters  # not kept, not even raw
    assert [r["latency_s"] for r in fleet.samples("i-1", 0, 99)[0]] == [0.1, 0.1]
    assert fleet.samples("i-9", 0, 99) == ([], 0)
    assert fleet.status()["dropped"] == {"gw-1": {"counters": 2, "answers": 4}}
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "'gw-1'" in lines[0] and "nope" in lines[0], lines
    clock.advance(60)
    fleet.sync("gw-1", "b", sent, {}, 1, None, answers, token="gw-1")
    assert len(caplog.records) == 2 and "6 dropped in all" in caplog.records[1].getMessage()


def test_a_gateway_a_snapshot_behind_keeps_its_counts_and_answers() -> None:
    fleet, _ = fleet_of("i-1")
    fleet.sample_groups(["chat"])
    fleet.publish(snapshot(2, "i-2"))  # i-1 left rotation; a gateway on v1 still answered it
    fleet.sync("gw-1", "b", {"chat": sample(1)}, {}, 1, None, {"i-1": [ANSWER]}, token="gw-1")
    assert fleet.samples("i-1", 0, 99)[0] and fleet.status()["dropped"] == {}
    fleet.publish(snapshot(3, "i-2", "i-3"))  # two versions on: i-1 is no longer known
    fleet.sync("gw-1", "b", {"chat": sample(1)}, {}, 3, None, {"i-1": [ANSWER]}, token="gw-1")
    assert fleet.status()["dropped"] == {"gw-1": {"counters": 0, "answers": 1}}


def test_before_the_first_routing_nothing_is_kept_and_a_group_kept_later_brings_no_burst() -> None:
    fleet = GatewayFleet(ManualClock(0.0))
    # a controller that just took over meets a gateway that counted for an hour
    fleet.sync("gw-1", "b", {"chat": sample(50_000)}, {}, None, token="gw-1")
    assert fleet.traffic() == {} and fleet.status()["dropped"] == {}
    fleet.publish(snapshot(1))
    fleet.sync("gw-1", "b", {"chat": sample(50_003)}, {}, None, token="gw-1")
    fleet.sync("gw-1", "b", {"chat": sample(50_010)}, {}, None, token="gw-1")
    assert fleet.traffic()["chat"].arrivals == 7  # counted from when it was first kept
    book = GatewayBook()
    book.push("gw-a", "b", {}, 0.0)
    book.push("gw-a", "b", {"chat": sample(900)}, 1.0)
    book.push("gw-a", "b", {"chat": sample(905)}, 2.0)
    assert book.traffic(2.0)["chat"].arrivals == 5


def test_the_controller_keeps_a_bounded_number_of_gateways_and_forgets_silent_ones() -> None:
    fleet, clock = fleet_of("i-1")
    for k in range(MAX_GATEWAYS):
        fleet.sync(f"gw-{k}", "b", {"nope": sample(1)}, {"version": 1}, 1, token=f"gw-{k}")
    with pytest.raises(Unavailable, match=f"at most {MAX_GATEWAYS} live gateways"):
        fleet.sync("gw-new", "b", {}, {}, 1, token="gw-new")
    assert "gw-new" not in fleet.book.gateways
    fleet.sync("gw-0", "b", {}, {"version": 1}, 1, token="gw-0")  # a live one syncs on
    assert fleet.book.share_of("gw-0").count == MAX_GATEWAYS
    assert len(fleet.status()["dropped"]) == MAX_GATEWAYS
    clock.advance(GATEWAY_TTL_S + 1)
    fleet.sync("gw-new", "b", {}, {"version": 1}, 1, token="gw-new")  # the others fell silent
    assert fleet.book.live() == ["gw-new"]
    status = fleet.status()
    assert status["gateways"] == {"gw-new": 1} and status["dropped"] == {}
    # gone means removed, not only left out
    assert set(fleet._statuses) == set(fleet._owners) == {"gw-new"} and fleet._dropped == {}


def _app(fleet: GatewayFleet) -> TestClient:
    """The sync route behind a stand-in for the control API's authentication: the bearer
    is `role:name`."""
    app = FastAPI()
    api = APIRouter()
    gateway_routes(api, fleet)

    @app.middleware("http")
    async def caller(request: Request, call_next: Any) -> Any:
        role, name = request.headers["authorization"].removeprefix("Bearer ").split(":")
        request.state.principal = Principal(name, Role(role))
        return await call_next(request)

    @app.exception_handler(SluiceError)
    async def error(_: Request, exc: SluiceError) -> JSONResponse:
        return JSONResponse(exc.to_json(), status_code=exc.http_status)

    app.include_router(api)
    return TestClient(app)


def test_the_sync_route_binds_the_id_to_the_token_before_reading_the_body() -> None:
    fleet, _ = fleet_of("i-1")
    client = _app(fleet)
    body = {"boot": "b", "counters": {"chat": sample_to_json(sample(2))}}
    r = client.post(
        "/v1/gateways/gw-1-w0/sync", json=body, headers={"authorization": "Bearer gateway:forger"}
    )
    assert r.status_code == 403, r.text
    message = r.json()["error"]["message"]
    assert "token 'forger' may sync only gateway 'forger' or 'forger-<suffix>'" in message
    # refused before the body is read: a body that would not even parse gets the same 403
    r = client.post(
        "/v1/gateways/gw-9/sync", content=b"{", headers={"authorization": "Bearer gateway:forger"}
    )
    assert r.status_code == 403 and fleet.book.live() == []
    for who in ("gateway:gw-1", "admin:gw-1"):  # an admin token syncs under the same rule
        r = client.post(
            "/v1/gateways/gw-1-w0/sync", json=body, headers={"authorization": f"Bearer {who}"}
        )
        assert r.status_code == 200, r.text
    r = client.post(
        "/v1/gateways/admin-1/sync", json=body, headers={"authorization": "Bearer admin:root"}
    )
    assert r.status_code == 403
    r = client.post(
        "/v1/gateways/gw-1/sync", json=body, headers={"authorization": "Bearer viewer:gw-1"}
    )
    assert r.status_code == 403 and "needs a gateway token" in r.text


def test_a_sync_from_a_gateway_without_token_counts_is_read_as_zero_tokens() -> None:
    fleet, clock = fleet_of("i-1")
    client = _app(fleet)
    auth = {"authorization": "Bearer gateway:gw-1"}
    older = sample_to_json(sample(2))
    for key in ("prompt_tokens", "completion_tokens"):  # a gateway from before they were kept
        del older[key]
    r = client.post(
        "/v1/gateways/gw-1/sync", json={"boot": "b", "counters": {"chat": older}}, headers=auth
    )
    assert r.status_code == 200, r.text
    clock.advance(1.0)
    newer = {**sample_to_json(sample(5)), "prompt_tokens": 300, "completion_tokens": 40}
    r = client.post(
        "/v1/gateways/gw-1/sync", json={"boot": "b", "counters": {"chat": newer}}, headers=auth
    )
    assert r.status_code == 200, r.text
    chat = fleet.traffic()["chat"]
    assert (chat.arrivals, chat.prompt_tokens, chat.completion_tokens) == (3, 300, 40)


def test_a_gateway_token_may_ask_its_name_and_read_nothing_else() -> None:
    me = Principal("gw-1", Role.GATEWAY)
    _gateway_only_syncs(me, "/v1/whoami")
    _gateway_only_syncs(me, "/v1/gateways/gw-1/sync")
    for path in ("/v1/groups", "/v1/whoami/x", "/v1/whoamix", "/v1/dataplane"):
        with pytest.raises(Forbidden, match="GET /v1/whoami"):
            _gateway_only_syncs(me, path)


def test_sluice_gateway_names_itself_after_its_token_and_refuses_another_id() -> None:
    me = remote.Identity("gw-1", "gateway")
    assert choose_gateway_id(me, None, "host-a", 8080, 4) == "gw-1-host-a-8080"
    assert choose_gateway_id(me, "gw-1-edge", "host-a", 8080, 4) == "gw-1-edge"
    assert choose_gateway_id(remote.Identity("root", "admin"), "root", "h", 1, 1) == "root"
    with pytest.raises(SpecError, match="token 'gw-1' may sync only 'gw-1' or 'gw-1-<suffix>'"):
        choose_gateway_id(me, "gw", "host-a", 8080, 1)
    with pytest.raises(SpecError, match="not a gateway id"):
        choose_gateway_id(me, "gw-1-" + "x" * 95, "host-a", 8080, 2)
    with pytest.raises(Forbidden, match="is a viewer token"):
        choose_gateway_id(remote.Identity("alice", "viewer"), None, "host-a", 8080, 1)


def test_whoami_waits_for_a_controller_and_stops_at_a_refused_token() -> None:
    answers: list[httpx.Response | Exception] = []

    def controller(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/whoami"
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    transport = httpx.MockTransport(controller)
    waited: list[str] = []

    def whoami(controls: list[str], **kw: Any) -> remote.Identity:
        return asyncio.run(remote.whoami(controls, "tok", retry_s=0, transport=transport, **kw))

    answers[:] = [
        httpx.ConnectError("refused"),
        httpx.Response(503, text="starting"),
        httpx.Response(200, json={"name": "gw-1", "role": "gateway", "groups": None}),
    ]
    me = whoami(["http://a", "http://b"], waiting=waited.append)
    assert me == remote.Identity("gw-1", "gateway") and not answers
    # the round no controller answered was told (the gateway's readiness says it)
    assert waited == ["http://a: ConnectError; http://b: HTTP 503 starting"]
    answers[:] = [httpx.Response(401, json={"error": {"message": "unknown token"}})]
    with pytest.raises(Unauthorized, match=r"refused this gateway's token.*unknown token"):
        whoami(["http://a"])
    answers[:] = [httpx.ConnectError("refused")]
    with pytest.raises(Unavailable, match="no control API answered"):
        whoami(["http://a"], wait_s=0)


def test_the_bound_is_the_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(control_gateways, "MAX_GATEWAYS", 2)
    fleet, _ = fleet_of()
    fleet.sync("a", "b", {}, {}, None, token="a")
    fleet.sync("b", "b", {}, {}, None, token="b")
    with pytest.raises(Unavailable, match="at most 2 live gateways"):
        fleet.sync("c", "b", {}, {}, None, token="c")
