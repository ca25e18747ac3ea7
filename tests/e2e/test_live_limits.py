"""End to end: `gateway.limits` changed by `sluice apply` reach the running gateway.

The limits travel with the routing snapshot the controller publishes on every new revision,
so lowering them takes effect at once, on a keep-alive connection opened before the apply
too, and raising them back lets the same requests through again, without a restart.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.e2e.conftest import Sluice, running

SPEC = """
gateway:
  host: 127.0.0.1
  port: 0
{limits}
pools:
  - {{name: local, count: 2, memory_gb: 8}}
groups:
  - name: chat
    owner: ops@example.com
    business: search
    alert_channel: "#ops"
    models:
      m-chat:
        runtime: sim
        sim: {{startup_s: 0.2, service_time: {{kind: fixed, seconds: 0.01}}}}
    resources: {{pool: local, memory_gb: 1}}
    max_concurrency: 8
    replicas: 1
    slow_start_s: 0
tenants:
  - {{name: search, api_keys: [sk-search-b095adcc724f4f8a]}}
routes:
  - {{tag: chat-main, match: {{models: [m-chat]}}, to: chat}}
"""
LOW = "  limits: {max_headers: 16, max_header_bytes: 1024}"
BODY = {"model": "m-chat", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}
MANY = {f"x-extra-{i}": "v" for i in range(20)}
"""20 header lines more than a plain request: within the default 100, over 16."""
LONG = {"x-long": "v" * 2048}
"""One 2 KiB header: within the default 64 KiB head, over 1 KiB."""


def apply(s: Sluice, limits: str, reason: str) -> None:
    path = s.home / f"{reason}.yaml"
    path.write_text(SPEC.format(limits=limits))
    s.cli("apply", "-f", str(path), "--reason", reason)


def send(client: httpx.Client, headers: dict[str, str]) -> httpx.Response:
    return client.post(
        "/v1/chat/completions",
        json=BODY,
        headers={"Authorization": "Bearer sk-search-b095adcc724f4f8a", **headers},
    )


def test_applied_limits_take_effect_on_the_running_gateway(tmp_path: Path) -> None:
    with (
        running(
            tmp_path, SPEC.format(limits=""), "1 ready", lambda s: len(s.ready("chat")) == 1
        ) as s,
        httpx.Client(base_url=s.endpoint, trust_env=False, timeout=20) as client,
    ):
        assert send(client, MANY).status_code == 200
        assert send(client, LONG).status_code == 200  # the connection stays open

        apply(s, LOW, "lower")
        count = send(client, MANY)
        assert count.status_code == 431, count.text
        assert count.json()["error"]["limit"] == "gateway.limits.max_headers"
        assert count.json()["error"]["limit_value"] == 16
        size = send(client, LONG)
        assert size.status_code == 431, size.text
        assert size.json()["error"]["limit"] == "gateway.limits.max_header_bytes"
        assert send(client, {}).status_code == 200  # a plain request is within both

        apply(s, "", "raise")
        assert send(client, MANY).status_code == 200
        assert send(client, LONG).status_code == 200
