"""Not ready means not ready (issue 33): a gateway is unready until its first routes are in
and says why, then ready for good, and stale (with the age of its last sync) while no
controller answers its syncs (`sluice.gateway.readiness`, reported by `ControlSync`, shown
by the readiness gauges of `Gateway.metrics_text()`)."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from sluice.gateway import Gateway
from sluice.gateway.errors import NotReady
from sluice.gateway.readiness import STALE_AFTER_S, Readiness
from sluice.gateway.remote import ControlSync
from sluice.policy import RoutingSnapshot, build_routing_snapshot
from sluice.policy.snapshot_wire import snapshot_to_json
from sluice.spec import load_spec_text

SPEC = """
pools: [{name: local, count: 2, memory_gb: 8}]
groups:
  - name: chat
    owner: ops@example.com
    business: core
    alert_channel: "#ops"
    models: {m: {runtime: sim}}
    resources: {pool: local, accelerators: 1, memory_gb: 1}
    replicas: 1
"""
URL = "http://control:7070"


def _snapshot(version: int = 1) -> RoutingSnapshot:
    spec = load_spec_text(SPEC, "test.yaml").spec
    return dataclasses.replace(build_routing_snapshot(spec, {}, version), epoch=1)


def _gauges(gateway: Gateway) -> dict[str, float]:
    text = gateway.metrics_text()[0].decode()
    return {
        s.name: s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name
        in ("sluice_gateway_ready", "sluice_gateway_synced", "sluice_gateway_last_sync_age_seconds")
    }


def test_a_synced_gateway_is_unready_until_routes_then_stale_while_no_controller_answers() -> None:
    r = Readiness([URL])
    assert r.report(0.0) == {
        "ready": False,
        "stale": False,
        "reason": f"no routes yet: never synced with the controller at {URL}",
    }
    r.failed(f"{URL}: ConnectError")
    assert r.reason(1.0) == (
        f"no routes yet: never synced with the controller at {URL} ({URL}: ConnectError)"
    )
    err = r.error(1.0)
    assert isinstance(err, NotReady)
    assert (err.http_status, err.code, err.retry_after_s) == (503, "not_ready", 1)
    assert err.to_json()["error"]["message"] == r.reason(1.0)
    r.synced(2.0)  # a controller answered, with no routes yet
    assert r.report(2.5) == {
        "ready": False,
        "stale": False,
        "last_sync_age_s": 0.5,
        "reason": f"no routes yet: the controller at {URL} has published none yet",
    }
    r.routed = True  # (what `GatewayState.set_snapshot` does)
    r.synced(3.0)
    assert r.report(3.0 + STALE_AFTER_S) == {"ready": True, "stale": False, "last_sync_age_s": 3.0}
    r.failed(f"{URL}: ReadTimeout")  # one sync lost: not stale yet, the age says it
    assert not r.stale(4.0) and r.reason(4.0) is None
    late = 3.0 + STALE_AFTER_S + 9.0
    assert r.report(late) == {
        "ready": True,  # it serves its last good routes
        "stale": True,
        "last_sync_age_s": STALE_AFTER_S + 9.0,
        "reason": f"serving the last good routes: no sync with the controller at {URL} for "
        f"12 s ({URL}: ReadTimeout)",
    }
    r.synced(late)
    assert r.report(late) == {"ready": True, "stale": False, "last_sync_age_s": 0.0}


def test_a_gateway_fed_in_process_is_ready_with_its_first_routes_and_never_stale() -> None:
    r = Readiness()
    assert r.report(0.0) == {
        "ready": False,
        "stale": False,
        "reason": "no routes yet: the controller has published none yet",
    }
    r.routed = True
    assert r.report(1e6) == {"ready": True, "stale": False}
    several = Readiness(["http://a", "http://b"])
    assert several.reason(0.0) == "no routes yet: never synced with the controllers at " + (
        "http://a, http://b"
    )


def test_the_gateway_is_ready_from_its_first_snapshot_and_its_gauges_say_so() -> None:
    gateway = Gateway(rng=random.Random(0))  # `sluice up`'s: no sync
    assert not gateway.ready
    assert _gauges(gateway) == {"sluice_gateway_ready": 0.0, "sluice_gateway_synced": 0.0}
    gateway.update(_snapshot())
    assert gateway.ready
    assert _gauges(gateway) == {"sluice_gateway_ready": 1.0, "sluice_gateway_synced": 1.0}


def test_control_sync_reports_each_sync_to_the_readiness() -> None:
    gateway = Gateway(rng=random.Random(0), controls=[URL])
    up = {"ok": False, "routes": False}

    def controller(request: httpx.Request) -> httpx.Response:
        if not up["ok"]:
            raise httpx.ConnectError("refused")
        answer: dict[str, Any] = {"share": {"index": 0, "count": 1}, "epoch": 1}
        answer["snapshot"] = snapshot_to_json(_snapshot()) if up["routes"] else None
        return httpx.Response(200, json=answer)

    sync = ControlSync(gateway, [URL], "tok", "gw-1")

    async def once() -> bool:
        async with httpx.AsyncClient(transport=httpx.MockTransport(controller)) as client:
            return await sync.sync_once(client)

    assert not asyncio.run(once())
    now = time.monotonic()
    assert gateway.readiness.report(now) == {
        "ready": False,
        "stale": False,
        "reason": f"no routes yet: never synced with the controller at {URL} ({URL}: ConnectError)",
    }
    up["ok"] = True  # it answers, with no routes yet: still unready
    assert asyncio.run(once()) and not gateway.ready
    assert "has published none yet" in gateway.readiness.report(time.monotonic())["reason"]
    up["routes"] = True
    assert asyncio.run(once()) and gateway.ready
    gauges = _gauges(gateway)
    assert gauges["sluice_gateway_ready"] == gauges["sluice_gateway_synced"] == 1.0
    assert 0.0 <= gauges["sluice_gateway_last_sync_age_seconds"] < STALE_AFTER_S
    up["ok"] = False  # the controller goes away: the routes stay, and go stale
    assert not asyncio.run(once())
    later = time.monotonic() + STALE_AFTER_S + 1.0
    report = gateway.readiness.report(later)
    assert report["ready"] and report["stale"] and report["last_sync_age_s"] > STALE_AFTER_S
    assert report["reason"].endswith(f"({URL}: ConnectError)")
    assert gateway.snapshot_version == 1
