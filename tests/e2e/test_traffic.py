"""End to end through `sluice up`: weighted splits, the failover escape hatch, tenant
boundaries and route tags, on fast `sim` groups."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import Sluice, running

SIM = "{startup_s: 0.2, service_time: {kind: fixed, seconds: 0.01}, memory_gb: 1}"
GROUP = """
  - name: {name}
    owner: ops@example.com
    business: {business}
    alert_channel: "#ops"
    models:
      {model}: {{runtime: sim, version: v1, sim: {sim}}}
    resources: {{pool: local, accelerators: 1, memory_gb: 1}}
    max_concurrency: 16
    replicas: 1
    slow_start_s: 0
    warmup: {{requests: 1}}
"""
SPEC = (
    """
gateway: {host: 127.0.0.1, port: 0}
pools:
  - {name: local, count: 8, memory_gb: 16}
groups:
"""
    + GROUP.format(name="chat", business="search", model="m-chat", sim=SIM)
    + GROUP.format(name="chat-canary", business="search", model="m-chat", sim=SIM)
    + GROUP.format(name="chat-backup", business="search", model="m-chat", sim=SIM)
    + GROUP.format(name="risk", business="risk", model="m-risk", sim=SIM)
    + """
tenants:
  - {name: search, api_keys: [sk-search-b095adcc724f4f8a], groups: [chat, chat-canary, chat-backup]}
  - {name: risk, api_keys: [sk-risk-86e971a281319d90], groups: [risk]}
routes:
  - tag: chat-split
    match: {models: [m-chat]}
    to: [{group: chat, weight: 90}, {group: chat-canary, weight: 10}]
  - tag: risk-main
    match: {models: [m-risk]}
    to: risk
"""
)


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sluice]:
    home = tmp_path_factory.mktemp("traffic")
    with running(
        home,
        SPEC,
        "all four groups ready",
        lambda s: (
            {i["group"] for i in s.instances() if i["state"] == "ready"}
            == {"chat", "chat-canary", "chat-backup", "risk"}
        ),
        timeout=120,
    ) as s:
        yield s


def call(client: httpx.Client, key: str, model: str) -> httpx.Response:
    return client.post(
        "/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]},
    )


def test_90_10_split_lands_within_3_percent(platform: Sluice) -> None:
    with httpx.Client(base_url=platform.endpoint, trust_env=False, timeout=30) as client:

        def one(_: int) -> tuple[int, str]:
            r = call(client, "sk-search-b095adcc724f4f8a", "m-chat")
            return r.status_code, r.headers.get("x-sluice-group", "")

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(one, range(2000)))
    assert Counter(status for status, _ in results) == {200: 2000}
    groups = Counter(group for _, group in results)
    assert abs(groups["chat-canary"] / 2000 - 0.10) <= 0.03
    assert groups["chat"] + groups["chat-canary"] == 2000


def test_failover_moves_all_traffic_within_a_second_and_back(platform: Sluice) -> None:
    seen: list[tuple[float, int, str]] = []
    stop = threading.Event()

    def stream() -> None:
        with httpx.Client(base_url=platform.endpoint, trust_env=False, timeout=30) as client:
            deadline = time.monotonic() + 120
            while not stop.is_set() and time.monotonic() < deadline:
                r = call(client, "sk-search-b095adcc724f4f8a", "m-chat")
                seen.append((time.monotonic(), r.status_code, r.headers["x-sluice-group"]))

    threads = [threading.Thread(target=stream) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)
        out = platform.cli("route", "failover", "chat", "--to", "chat-backup", "--reason", "e2e")
        switched = time.monotonic()
        assert out == {"group": "chat", "to": "chat-backup"}
        time.sleep(1.5)
        # chat-canary keeps its 10%: the failover is of group `chat`, not of the route
        after = [g for t, _, g in seen if t > switched + 1.0]
        assert after and "chat" not in after and "chat-backup" in after
        routes = platform.cli("get", "routes")
        assert routes["failovers"] == {"chat": "chat-backup"}
        assert [r["tag"] for r in routes["rules"]] == [
            "chat-split",
            "risk-main",
            "default:m-chat",
            "default:m-risk",
        ]

        platform.cli("route", "restore", "chat", "--reason", "e2e over")
        restored = time.monotonic()
        time.sleep(1.5)
        back = [g for t, _, g in seen if t > restored + 1.0]
        assert back and "chat-backup" not in back and "chat" in back
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert {status for _, status, _ in seen} == {200}
    audit = platform.cli("audit", "--target", "group/chat")
    assert [a["action"] for a in audit[:2]] == ["restore", "failover"]


def test_tenant_boundaries_hold(platform: Sluice) -> None:
    with httpx.Client(base_url=platform.endpoint, trust_env=False, timeout=30) as client:
        r = call(client, "sk-risk-86e971a281319d90", "m-chat")
        assert r.status_code == 403
        assert "chat" not in json.dumps(r.json()).replace("m-chat", "")
        assert "x-sluice-instance" not in r.headers
        assert call(client, "sk-search-b095adcc724f4f8a", "m-risk").status_code == 403
        assert call(client, "sk-risk-86e971a281319d90", "m-risk").status_code == 200


def test_dataplane_state_is_visible_from_the_control_api(platform: Sluice) -> None:
    state = platform.cli("get", "dataplane")
    chat = state["groups"]["chat"]
    assert chat["slots"] == 16 and chat["instances"] == 1 and chat["ejected"] == []
    assert set(chat["queued"]) == {"high", "normal", "low"}


def test_every_access_log_line_carries_its_rule_tag(platform: Sluice) -> None:
    started = int(time.time() * 1000) / 1000  # the log keeps milliseconds
    with httpx.Client(base_url=platform.endpoint, trust_env=False, timeout=30) as client:
        statuses = Counter(
            call(
                client,
                "sk-search-b095adcc724f4f8a" if model == "m-chat" else "sk-risk-86e971a281319d90",
                model,
            ).status_code
            for model in ("m-chat", "m-risk")
            for _ in range(50)
        )
    assert statuses == {200: 100}
    time.sleep(0.3)  # the gateway flushes the access log every 0.1 s
    lines = [json.loads(x) for x in Path(platform.home / "access.log").read_text().splitlines()]
    served = [x for x in lines if x["status"] == 200 and x["ts"] >= started]
    assert len(served) == 100
    assert Counter(x["route"] for x in served) == {"chat-split": 50, "risk-main": 50}
    assert all(x["group"] and x["instance"] for x in served)


def test_an_apply_that_would_strand_a_failover_is_refused(platform: Sluice) -> None:
    platform.cli("route", "failover", "chat", "--to", "chat-backup", "--reason", "e2e")
    try:
        narrowed = platform.home / "narrowed.yaml"
        narrowed.write_text(
            SPEC.replace("groups: [chat, chat-canary, chat-backup]", "groups: [chat, chat-canary]")
        )
        before = platform.cli("get", "routes")
        out = platform.cli("apply", "-f", str(narrowed), "--reason", "e2e", check=False)
        assert out["error"]["code"] == "conflict", out
        assert "would strand failover chat -> chat-backup" in out["error"]["message"]
        assert "tenant(s) search may use 'chat' but not 'chat-backup'" in out["error"]["message"]
        assert platform.cli("get", "routes") == before  # nothing applied
    finally:
        platform.cli("route", "restore", "chat", "--reason", "e2e over")
