"""Not ready means not ready (issue 33), through real sockets: a gateway without routes
answers every request 503 with `Retry-After` (never 401, whatever the key), `/readyz` 503
with why, `/healthz` 200; once its first routes are in it serves, `/readyz` says 200, and
only then is an unknown key a 401."""

from __future__ import annotations

import io
import random
import time

import httpx
import pytest

from sluice.gateway import Gateway

from .gateway_fakes import AUTH, CHAT, FakeUpstream, log_lines, make_snapshot, metric_values

URL = "http://127.0.0.1:9"
WHY = f"no routes yet: never synced with the controller at {URL}"


@pytest.mark.asyncio
@pytest.mark.parametrize("headers", [AUTH, {}, {"Authorization": "Bearer sk-nobody"}])
async def test_an_unready_gateway_answers_503_with_retry_after_never_401(
    headers: dict[str, str],
) -> None:
    gateway = Gateway(rng=random.Random(0), controls=[URL])
    await gateway.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gateway.port}") as client:
            chat = await client.post("/v1/chat/completions", json=CHAT, headers=headers)
            models = await client.get("/v1/models", headers=headers)
            ready = await client.get("/readyz")
            health = await client.get("/healthz")
    finally:
        await gateway.stop()
    for resp in (chat, models):
        assert resp.status_code == 503, resp.text
        assert resp.headers["retry-after"] == "1"
        assert resp.headers["content-type"] == "application/json"
        assert "x-request-id" in resp.headers
        assert resp.json() == {"error": {"code": "not_ready", "message": WHY}}
    assert ready.status_code == 503 and ready.headers["retry-after"] == "1"
    assert ready.json() == {"ready": False, "stale": False, "reason": WHY, "version": 0}
    assert health.status_code == 200  # liveness: the process runs
    assert health.json() == {
        "status": "ok",
        "version": 0,
        "ready": False,
        "stale": False,
        "reason": WHY,
    }


@pytest.mark.asyncio
async def test_it_serves_from_its_first_routes_and_says_why_it_waited() -> None:
    up = FakeUpstream("i1")
    await up.start()
    log = io.StringIO()
    gateway = Gateway(rng=random.Random(0), controls=[URL], access_log=log)
    await gateway.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gateway.port}") as client:
            # the sync says why no controller answered: /readyz and the 503 say it too
            gateway.readiness.failed(f"{URL}: ConnectError")
            refused = await client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
            assert refused.status_code == 503
            assert refused.json()["error"]["message"] == f"{WHY} ({URL}: ConnectError)"
            assert (await client.get("/readyz")).json()["reason"] == f"{WHY} ({URL}: ConnectError)"
            value = metric_values(gateway.metrics_text()[0].decode())
            assert value("sluice_gateway_ready") == value("sluice_gateway_synced") == 0.0
            # the first sync: routes in, a controller answered
            gateway.update(make_snapshot(1, [("i1", up.port)]))
            gateway.readiness.synced(time.monotonic())
            served = await client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
            assert served.status_code == 200 and served.json()["instance"] == "i1"
            ready = await client.get("/readyz")
            assert ready.status_code == 200 and "retry-after" not in ready.headers
            doc = ready.json()
            assert doc["ready"] is True and doc["stale"] is False and doc["version"] == 1
            assert 0.0 <= doc["last_sync_age_s"] < 3.0 and "reason" not in doc
            health = (await client.get("/healthz")).json()
            assert health["ready"] is True and health["stale"] is False
            # now it knows the keys: an unknown one is refused as such
            unknown = {"Authorization": "Bearer sk-nobody"}
            assert (await client.post("/v1/chat/completions", json=CHAT, headers=unknown)).json()[
                "error"
            ]["code"] == "unauthorized"
            value = metric_values(gateway.metrics_text()[0].decode())
            assert value("sluice_gateway_ready") == value("sluice_gateway_synced") == 1.0
            assert 0.0 <= value("sluice_gateway_last_sync_age_seconds") < 3.0
    finally:
        await gateway.stop()
        await up.stop()
    statuses = [(line["path"], line["status"], line["error"]) for line in log_lines(log)]
    assert statuses[:3] == [
        ("/v1/chat/completions", 503, "not_ready"),
        ("/readyz", 503, None),
        ("/v1/chat/completions", 200, None),
    ]
