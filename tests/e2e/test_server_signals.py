"""A command group's own metrics reach the autoscaler through a real `sluice up` (issue 15).

The server (`openai_stub.py`, vLLM's metric names) says requests wait inside it while the
gateway sends it nothing: the group scales up on that queue alone, `sluice explain` shows
the server's numbers in the decision, and GET /v1/status and the control API's /metrics
show what each instance said.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import httpx

from tests.e2e.conftest import Sluice, running
from tests.faults.conftest import Api, wait_until

STUB = str(Path(__file__).with_name("openai_stub.py"))
ARGV = [sys.executable, STUB, "--host", "{host}", "--port", "{port}", "--model", "{model}"]

SPEC = f"""
gateway: {{host: 127.0.0.1, port: 0}}
pools:
  - {{name: gpu, accelerator: fake-gpu, count: 4, memory_gb: 16}}
groups:
  - name: chat
    owner: ops@example.com
    business: search
    alert_channel: "#ops"
    models:
      m-chat:
        runtime: command
        command:
          argv: [{", ".join(f'"{a}"' for a in ARGV)}]
          metrics_path: /metrics
          stop_grace_s: 1
    resources: {{pool: gpu, accelerators: 1, memory_gb: 1}}
    max_concurrency: 4
    slow_start_s: 0
    warmup: {{requests: 1}}
    health: {{interval_s: 0.5, failure_threshold: 2, timeout_s: 1, startup_timeout_s: 20}}
    drain_timeout_s: 5
    autoscaling: {{min: 1, max: 3}}
tenants:
  - {{name: search, api_keys: [sk-search-b095adcc724f4f8a]}}
routes:
  - {{tag: chat, match: {{models: [m-chat]}}, to: chat}}
"""


def scraped(api: Api, iid: str) -> dict[str, Any] | None:
    got = api.get("/v1/status")["servers"]["instances"].get(iid)
    return got if got and got["scrapes"] > 0 else None


def test_a_queue_inside_the_server_alone_scales_the_group_and_is_explained(
    tmp_path: Path,
) -> None:
    with (
        running(tmp_path, SPEC, "chat ready", lambda s: len(s.ready("chat")) == 1) as s,
        Api(s) as api,
    ):
        (first,) = api.ready("chat")
        wait_until("the first scrape", lambda: scraped(api, first["id"]) is not None, 15)
        seen = scraped(api, first["id"])
        assert seen is not None
        assert (seen["waiting"], seen["running"], seen["failures"]) == (0.0, 0.0, 0)
        assert "vllm:num_requests_waiting" in seen["metrics"]
        assert len(s.instances("chat")) == 1  # idle: nothing to scale for

        # The server now says 12 requests wait in it; the gateway sends it none.
        r = httpx.post(first["url"] + "/stub/waiting", json={"waiting": 12}, timeout=5)
        r.raise_for_status()
        wait_until("a scale-up", lambda: len(s.instances("chat")) >= 2, 30)
        assert api.get("/v1/groups")[0]["desired"] >= 2

        decision = next(
            d for d in s.cli("explain", "chat", "--limit", "50")["decisions"] if d["desired"] > 1
        )
        load, signals = decision["detail"]["load"], decision["detail"]["signals"]
        assert load["server_waiting"] == 12 and load["in_flight"] == 12
        assert decision["detail"]["server"]["waiting"] == 12.0
        assert "12 requests wait inside the servers" in decision["reason"]
        assert signals["server_queue"] == 12.0 and signals["queue"] > 0  # smoothed
        # the server served its one warm-up request and nothing else: no gateway traffic
        log = (s.home / "instances" / f"{first['id']}.log").read_text()
        assert log.count("POST /v1/chat/completions") == 1

        metrics = httpx.get(s.control_url + "/metrics", headers=s.control_headers(), timeout=10)
        assert f'sluice_server_waiting{{group="chat",instance="{first["id"]}"}} 12' in metrics.text
        # its prefix-cache counters (vLLM's names): the warm-up prompt was looked up
        assert (
            f'sluice_server_prefix_cache_hits_total{{group="chat",instance="{first["id"]}"}} 0'
            in (metrics.text)
        )
        assert (
            f'sluice_server_prefix_cache_queries_total{{group="chat",instance="{first["id"]}"}}'
            in (metrics.text)
        )
        assert "# TYPE sluice_gateway_requests" in metrics.text  # beside the gateway's own


def command_group(name: str, delay: float) -> str:
    argv = ", ".join(f'"{a}"' for a in [*ARGV, "--delay", str(delay)])
    return f"""
  - name: {name}
    owner: ops@example.com
    business: search
    alert_channel: "#ops"
    models:
      m-chat:
        runtime: command
        command: {{argv: [{argv}], metrics_path: /metrics, stop_grace_s: 1}}
    resources: {{pool: gpu, accelerators: 1, memory_gb: 1}}
    max_concurrency: 8
    replicas: 1
    slow_start_s: 0
    warmup: {{requests: 1}}
    health: {{interval_s: 0.5, failure_threshold: 2, timeout_s: 1, startup_timeout_s: 20}}
"""


ROLLOUT_SPEC = (
    "gateway: {host: 127.0.0.1, port: 0}\n"
    "pools:\n  - {name: gpu, accelerator: fake-gpu, count: 4, memory_gb: 16}\n"
    "groups:" + command_group("chat", 0.02) + command_group("chat-v2", 0.3) + "tenants:\n"
    "  - {name: search, api_keys: [sk-search-b095adcc724f4f8a]}\n"
    "routes:\n  - {tag: chat, match: {models: [m-chat]}, to: chat}\n"
    "rollouts:\n  - {name: v2, baseline: chat, canary: chat-v2, steps: [50, 100], hold_s: 60}\n"
)


def both_ready(s: Sluice) -> bool:
    return {i["group"] for i in s.ready("chat") + s.ready("chat-v2")} == {"chat", "chat-v2"}


def test_a_command_canarys_server_latency_is_shown_beside_its_analysis(tmp_path: Path) -> None:
    with running(tmp_path, ROLLOUT_SPEC, "both groups ready", both_ready) as s, Api(s) as api:
        for iid in (i["id"] for i in s.instances()):
            wait_until("a first scrape", lambda iid=iid: scraped(api, iid) is not None, 15)
        s.cli("rollout", "start", "v2", "--reason", "slower first token")
        hit: dict[str, int] = {}
        with httpx.Client(base_url=s.endpoint, trust_env=False, timeout=30) as c:
            for _ in range(30):  # bounded: 30 requests, one at a time
                r = c.post(
                    "/v1/chat/completions",
                    headers={"Authorization": "Bearer sk-search-b095adcc724f4f8a"},
                    json={"model": "m-chat", "messages": [{"role": "user", "content": "hi"}]},
                )
                assert r.status_code == 200
                group = r.headers["x-sluice-group"]
                hit[group] = hit.get(group, 0) + 1
        assert set(hit) == {"chat", "chat-v2"}, hit  # the 50% step split them

        def latency() -> dict[str, Any] | None:
            got: dict[str, Any] | None = s.cli("rollout", "report", "v2")["state"].get(
                "server_latency"
            )
            sides = got or {}
            done = all((sides.get(k) or {}).get("requests") == hit[g] for k, g in SIDES)
            return got if done else None

        wait_until("the servers' counts in the live state", lambda: latency() is not None, 10)
        got = latency()
        assert got is not None
        base, canary = got["baseline"], got["canary"]
        assert base["ttft_p50_s"] <= 0.05 < 0.25 <= canary["ttft_p50_s"]  # 0.02 s vs 0.3 s
        assert canary["ttft_p99_s"] <= 0.5 and base["tpot_p50_s"] is None  # the stub has none


SIDES = (("baseline", "chat"), ("canary", "chat-v2"))


TTFT_SPEC = SPEC.replace(
    '"--model", "{model}"]', '"--model", "{model}", "--delay", "0.5"]'
).replace(
    "autoscaling: {min: 1, max: 3}",
    "autoscaling: {min: 1, max: 3, targets: {utilization: 0.5, ttft_p95_ms: 150}}",
)


def test_a_slow_first_token_scales_the_group_up_on_the_ttft_signal(tmp_path: Path) -> None:
    """Two callers stream from one instance whose first token takes 0.5 s (target p95 150 ms):
    the instance is busy (2 of its 2 target slots) and the gateway's time to first token is
    over target, so the group grows on `ttft`, and `sluice explain` says so."""
    assert "--delay" in TTFT_SPEC and "ttft_p95_ms" in TTFT_SPEC
    with running(tmp_path, TTFT_SPEC, "chat ready", lambda s: len(s.ready("chat")) == 1) as s:
        stop = threading.Event()

        def caller() -> None:
            headers = {"authorization": "Bearer sk-search-b095adcc724f4f8a"}
            body = {"model": "m-chat", "stream": True, "max_tokens": 4,
                    "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
            with httpx.Client(base_url=s.endpoint, headers=headers, timeout=30) as client:
                while not stop.is_set():
                    with client.stream("POST", "/v1/chat/completions", json=body) as r:
                        r.read()

        callers = [threading.Thread(target=caller, daemon=True) for _ in range(2)]
        for t in callers:
            t.start()
        try:
            wait_until("a scale-up", lambda: len(s.instances("chat")) >= 2, 45)
        finally:
            stop.set()
            for t in callers:
                t.join(timeout=35)
        up = next(
            d for d in s.cli("explain", "chat", "--limit", "100")["decisions"] if d["desired"] > 1
        )
        signals = up["detail"]["signals"]
        assert up["reason"].startswith("ttft p95 "), up["reason"]
        assert signals["ttft_p95_ms"] > 400 and signals["ttft_target_ms"] == 150
        assert up["detail"]["proposals"]["ttft"] == 2
