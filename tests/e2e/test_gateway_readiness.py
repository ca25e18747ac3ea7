"""End to end: not ready means not ready (issue 33).

Real processes on 127.0.0.1: a `sluice gateway` started while no controller answers
listens, unready: a request with a valid tenant key gets 503 with `Retry-After` (never
401) and `/readyz` 503 with why, while `/healthz` says 200. Once `sluice controller` is
started and the gateway syncs, the same request is served and `/readyz` says 200. With
the controller paused, it serves on from its last routes and says they are stale.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx

from tests.e2e.conftest import RemoteGateway, Sluice, free_port, kill_workers_of

SPEC = """
gateway: {{host: 127.0.0.1, port: 0}}
control: {{host: 127.0.0.1, port: {control_port}}}
pools:
  - {{name: local, count: 2, memory_gb: 8}}
groups:
  - name: chat
    owner: ops@example.com
    business: core
    alert_channel: "#ops"
    models:
      m-chat:
        runtime: sim
        sim: {{startup_s: 0.2, service_time: {{kind: fixed, seconds: 0.01}}, memory_gb: 1}}
    resources: {{pool: local, accelerators: 1, memory_gb: 1}}
    max_concurrency: 4
    slow_start_s: 0
    replicas: 1
tenants:
  - {{name: search, api_keys: [{key}]}}
"""
KEY = "sk-search-0d5c8e21f9a34b7c"
CHAT = {"model": "m-chat", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}


def gauges(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith(("sluice_gateway_ready ", "sluice_gateway_synced ")) or (
            line.startswith("sluice_gateway_last_sync_age_seconds ")
        ):
            name, value = line.split(" ", 1)
            out[name] = float(value)
    return out


def test_a_gateway_before_its_controller_is_unready_503_then_serves_once_synced(
    tmp_path: Path,
) -> None:
    control_port = free_port()
    control = f"http://127.0.0.1:{control_port}"
    spec = tmp_path / "platform.yaml"
    spec.write_text(SPEC.format(control_port=control_port, key=KEY))
    (tmp_path / "control").mkdir()
    s = Sluice(tmp_path / "control", spec, command="controller")
    gw: RemoteGateway | None = None
    try:
        # a gateway token, then no controller at all
        s.start()
        token = s.token("gw-1", "gateway")
        s.stop()
        kill_workers_of(s.home)
        metrics_port = free_port()
        gw = RemoteGateway([control], token, 1, tmp_path, metrics_port, gateway_id="gw-1")
        c = httpx.Client(base_url=gw.endpoint, trust_env=False, timeout=10)
        auth = {"Authorization": f"Bearer {KEY}"}
        deadline = time.monotonic() + 30
        while True:  # it listens at once, though no controller answers
            try:
                health = c.get("/healthz")
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "".join(gw.output)
                time.sleep(0.2)
        assert health.status_code == 200 and health.json()["ready"] is False
        for _ in range(3):  # over a few seconds: still unready, never 401
            r = c.post("/v1/chat/completions", json=CHAT, headers=auth)
            assert r.status_code == 503, r.text
            assert 1 <= int(r.headers["retry-after"]) <= 5
            error = r.json()["error"]
            assert error["code"] == "not_ready", error
            assert f"never synced with the controller at {control}" in error["message"]
            ready = c.get("/readyz")
            assert ready.status_code == 503 and "retry-after" in ready.headers
            doc = ready.json()
            assert doc["ready"] is False and control in doc["reason"], doc
            time.sleep(1)
        metrics = f"http://127.0.0.1:{metrics_port}/metrics"
        unready = gauges(httpx.get(metrics, trust_env=False).text)
        assert unready == {"sluice_gateway_ready": 0.0, "sluice_gateway_synced": 0.0}
        # the controller comes: the gateway learns its name, syncs, and serves
        s.start()
        gw.wait_routing(1, timeout=60)
        codes: list[int] = []
        deadline = time.monotonic() + 60
        while True:  # (the instance may still be starting: 503 no ready instance)
            r = c.post("/v1/chat/completions", json=CHAT, headers=auth)
            codes.append(r.status_code)
            if r.status_code == 200:
                break
            assert time.monotonic() < deadline, (codes, r.text)
            time.sleep(0.3)
        assert 401 not in codes and set(codes) <= {200, 503}, codes
        ready = c.get("/readyz")
        assert ready.status_code == 200, ready.text
        doc = ready.json()
        assert doc["ready"] is True and doc["stale"] is False and doc["last_sync_age_s"] < 3
        synced = gauges(httpx.get(metrics, trust_env=False).text)
        assert synced["sluice_gateway_ready"] == synced["sluice_gateway_synced"] == 1.0
        assert synced["sluice_gateway_last_sync_age_seconds"] < 3
        # the controller paused: the gateway serves on from its last routes, and says so
        assert s.proc is not None
        os.kill(s.proc.pid, signal.SIGSTOP)
        try:
            time.sleep(5)
            r = c.post("/v1/chat/completions", json=CHAT, headers=auth)
            ready, health = c.get("/readyz"), c.get("/healthz")
            stale = gauges(httpx.get(metrics, trust_env=False).text)
        finally:
            os.kill(s.proc.pid, signal.SIGCONT)
        assert r.status_code == 200, r.text
        assert ready.status_code == 200
        for doc in (ready.json(), health.json()):
            assert doc["ready"] is True and doc["stale"] is True, doc
            assert doc["last_sync_age_s"] > 3 and "serving the last good routes" in doc["reason"]
        assert stale["sluice_gateway_ready"] == 1.0 and stale["sluice_gateway_synced"] == 0.0
        assert stale["sluice_gateway_last_sync_age_seconds"] > 3
        c.close()
    finally:
        if gw is not None:
            gw.stop()
        s.kill()
        kill_workers_of(s.home)
