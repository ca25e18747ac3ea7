"""A command group's own metrics reach the autoscaler through a real `sluice up` (issue 15).

The server (`openai_stub.py`, vLLM's metric names) says requests wait inside it while the
gateway sends it nothing: the group scales up on that queue alone, `sluice explain` shows
the server's numbers in the decision, and GET /v1/status and the control API's /metrics
show what each instance said.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import httpx

from tests.e2e.conftest import running
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
  - {{name: search, api_keys: [sk-search]}}
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
        assert signals["server_queue"] == 12.0 and signals["queue"] > 0  # smoothed
        # the server served its one warm-up request and nothing else: no gateway traffic
        log = (s.home / "instances" / f"{first['id']}.log").read_text()
        assert log.count("POST /v1/chat/completions") == 1

        metrics = httpx.get(s.control_url + "/metrics", headers=s.control_headers(), timeout=10)
        assert f'sluice_server_waiting{{group="chat",instance="{first["id"]}"}} 12' in metrics.text
        assert "# TYPE sluice_gateway_requests" in metrics.text  # beside the gateway's own
