"""An `external` group through a real `sluice up`: two OpenAI-compatible servers the test
starts itself (`openai_stub.py`), one of which wants a key Sluice reads from an environment
variable. Both serve; one is killed and the gateway routes around it; it comes back on the
same port and serves again. The key reaches that server and no file Sluice writes."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.e2e.conftest import running
from tests.faults.conftest import Api, Load, free_port, in_flight, lines, report, wait_until

STUB = str(Path(__file__).with_name("openai_stub.py"))
KEY = "k-e2e-fleet-7f3c9a"
KEY_ENV = "SLUICE_E2E_FLEET_KEY"


def stub(port: int, name: str, *flags: str) -> subprocess.Popen[bytes]:
    argv = [sys.executable, STUB, "--host", "127.0.0.1", "--port", str(port)]
    return subprocess.Popen(
        [*argv, "--model", "m-ext", "--name", name, *flags],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def spec(port_a: int, port_b: int) -> str:
    return f"""
gateway: {{host: 127.0.0.1, port: 0}}
pools:
  - {{name: fleet, accelerator: remote-h100, count: 2, memory_gb: 80}}
groups:
  - name: ext
    owner: ops@example.com
    business: search
    alert_channel: "#ops"
    models:
      m-ext:
        runtime: external
        external:
          endpoints:
            - {{url: "http://127.0.0.1:{port_a}"}}
            - {{url: "http://127.0.0.1:{port_b}", api_key_env: {KEY_ENV}}}
          health_path: /health
    resources: {{pool: fleet, accelerators: 1, memory_gb: 40}}
    max_concurrency: 16
    slow_start_s: 0
    warmup: {{requests: 1}}
    health: {{interval_s: 0.5, failure_threshold: 2, timeout_s: 1, startup_timeout_s: 10}}
    drain_timeout_s: 10
tenants:
  - {{name: search, api_keys: [sk-search-b095adcc724f4f8a]}}
routes:
  - {{tag: ext, match: {{models: [m-ext]}}, to: ext}}
"""


def served_by(outcomes: list, since: float = 0.0, until: float = float("inf")) -> Counter[str]:
    return Counter(o.instance for o in outcomes if o.ok and since <= o.sent < until)


def test_an_external_group_routes_around_a_dead_endpoint_and_takes_it_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)  # `sluice up` inherits it; the spec names only the variable
    port_a, port_b = free_port(), free_port()
    a, b = stub(port_a, "a"), stub(port_b, "b", "--require-key", KEY)
    try:
        with (
            running(
                tmp_path, spec(port_a, port_b), "2 ready", lambda s: len(s.ready("ext")) == 2
            ) as s,
            Api(s) as api,
        ):
            by_port = {int(i["url"].rsplit(":", 1)[1]): i["id"] for i in api.ready("ext")}
            inst_a, inst_b = by_port[port_a], by_port[port_b]
            load = Load(s.endpoint, model="m-ext", rate=20.0).start(max_s=60)
            try:
                time.sleep(2.0)
                a.kill()
                a.wait()
                killed = time.monotonic()
                wait_until(
                    "a out of routing",
                    lambda: (
                        {i["id"]: i["state"] for i in api.instances("ext")}.get(inst_a)
                        == "starting"
                    ),
                    timeout=15,
                )
                tried_at_out = api.get("/v1/dataplane")["served"].get(inst_a, 0)
                time.sleep(2.0)
                tried_later = api.get("/v1/dataplane")["served"].get(inst_a, 0)
                a = stub(port_a, "a")
                back_at = wait_until("a back", lambda: len(api.ready("ext")) == 2, timeout=20)
                time.sleep(2.0)
            finally:
                outcomes = load.stop()
            failed = [o for o in outcomes if not o.ok]
            report("external-endpoint-down", len(outcomes), len(failed), 0, back_at - killed)
            before = served_by(outcomes, until=killed)
            assert before[inst_a] and before[inst_b]  # both served; b got its key
            assert tried_later == tried_at_out  # out of routing: the gateway sent it nothing
            assert served_by(outcomes, since=back_at + 0.5)[inst_a]  # taken back
            assert len(failed) <= in_flight(outcomes, killed), "\n".join(lines(outcomes))
            kinds = [e["kind"] for e in api.events("ext") if e["instance"] == inst_a]
            assert "unhealthy" in kinds and "recovered" in kinds and "failed" not in kinds
            assert {i["id"] for i in api.instances("ext")} == {inst_a, inst_b}  # never replaced
            s.stop()  # the access log and the store are flushed and closed
        files = [p for p in s.home.rglob("*") if p.is_file()]
        assert any(p.name.endswith(".db") or "sqlite" in p.name for p in files), files
        leaked = [p for p in files if KEY.encode() in p.read_bytes()]
        assert not leaked, f"the endpoint key is written in {leaked}"
        assert KEY not in "".join(s.output)
    finally:
        for proc in (a, b):
            proc.kill()
            proc.wait()
