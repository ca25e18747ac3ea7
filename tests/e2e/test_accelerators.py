"""Accelerator metrics through a real `sluice up` (issue 37), on a fake NVML: the seam
(`SLUICE_NVML_MODULE`) loads tests/e2e/fake_nvml.py in place of pynvml, which answers
from a JSON file this test writes once it knows the instances' pids.

Two command instances share one device (a fractional pool); each one's memory (its
process's, as NVML lists it) and the device's utilization show on the control API's
/metrics and in `sluice get instances --json`; the one far above its estimate
(resources.memory_gb) raises the memory-over-estimate alert naming group and owner; and
where NVML lists no process ids (a container), the memory reads "unknown", not zero."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import Sluice, running
from tests.faults.conftest import Api, wait_until

HERE = Path(__file__).parent
GIB = 1024**3
ARGV = [sys.executable, str(HERE / "openai_stub.py"), "--host", "{host}", "--port", "{port}",
        "--model", "{model}"]  # fmt: skip

SPEC = f"""
gateway: {{host: 127.0.0.1, port: 0}}
pools:
  - {{name: gpu, accelerator: fake-gpu, count: 2, memory_gb: 16, devices: [0],
     units_per_device: 2}}
groups:
  - name: chat
    owner: ml-team@example.com
    business: search
    alert_channel: "#ml"
    models:
      m-chat:
        runtime: command
        command: {{argv: {json.dumps(ARGV)}, stop_grace_s: 1}}
    resources: {{pool: gpu, accelerators: 1, fractional: true, memory_gb: 1}}
    max_concurrency: 4
    replicas: 2
    warmup: {{requests: 1}}
    health: {{interval_s: 0.5, failure_threshold: 2, timeout_s: 1, startup_timeout_s: 20}}
tenants:
  - {{name: search, api_keys: [sk-search-b095adcc724f4f8a]}}
routes:
  - {{tag: r-chat, match: {{models: [m-chat]}}, to: chat}}
observability:
  alerts:
    window_s: 2
    rules:
      - {{name: memory-over-estimate, series: instances_over_estimate, threshold: 0.5,
         for_s: 1}}
"""


def metrics(s: Sluice) -> dict[str, list[tuple[dict[str, str], float]]]:
    r = httpx.get(
        s.control_url + "/metrics", headers=s.control_headers(), trust_env=False, timeout=10
    )
    r.raise_for_status()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for f in text_string_to_metric_families(r.text):
        for sample in f.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def test_two_instances_on_one_device_memory_utilization_and_the_over_estimate_alert(
    tmp_path: Path,
) -> None:
    state = tmp_path / "nvml.json"
    env = {"SLUICE_NVML_MODULE": str(HERE / "fake_nvml.py"), "FAKE_NVML_STATE": str(state)}

    def two_ready(s: Sluice) -> bool:
        return len(s.ready("chat")) == 2

    with running(tmp_path, SPEC, "2 ready", two_ready, environ=env) as s, Api(s) as api:
        a, b = sorted(s.ready("chat"), key=lambda i: i["id"])
        assert a["devices"] == b["devices"] == "0"  # both on the one device
        processes = [{"pid": a["pid"], "used": GIB // 2}, {"pid": b["pid"], "used": 3 * GIB}]
        device = {"uuid": "GPU-e2e", "memory_total": 16 * GIB, "memory_used": 4 * GIB,
                  "utilization": 40, "processes": processes}  # fmt: skip
        state.write_text(json.dumps({"devices": [device]}))

        def measured() -> bool:
            return all(
                (i.get("accelerator") or {}).get("memory") == "measured"
                for i in s.instances("chat")
            )

        wait_until("both instances measured", measured, timeout=20)
        got = {i["id"]: i["accelerator"] for i in s.instances("chat")}
        assert got[a["id"]]["memory_used_bytes"] == GIB // 2
        assert got[b["id"]]["memory_used_bytes"] == 3 * GIB
        for acc in got.values():
            assert acc["utilization"] == 40.0 and acc["devices"] == ["0"]
            assert acc["estimate_bytes"] == GIB and acc["estimate_source"] == "declared"
        assert not got[a["id"]]["over_estimate"] and got[b["id"]]["over_estimate"]
        assert got[b["id"]]["measured_over_estimate"] == 3.0
        table = s.show("get", "instances")
        assert "3.0 / 1.0 GiB !" in table and "0.5 / 1.0 GiB" in table and "40%" in table

        m = metrics(s)
        mem = {lb["instance"]: v for lb, v in m["sluice_instance_accelerator_memory_bytes"]}
        assert mem == {a["id"]: GIB // 2, b["id"]: 3 * GIB}
        util = {lb["instance"]: v for lb, v in m["sluice_instance_accelerator_utilization_percent"]}
        assert util == {a["id"]: 40.0, b["id"]: 40.0}
        assert m["sluice_device_utilization_percent"] == [
            ({"device": "0", "uuid": "GPU-e2e"}, 40.0)
        ]
        assert m["sluice_group_accelerator_memory_bytes"] == [({"group": "chat"}, 3.5 * GIB)]
        assert m["sluice_group_accelerator_over_estimate_instances"] == [({"group": "chat"}, 1.0)]

        def fired() -> bool:
            return any(
                f["rule"] == "memory-over-estimate" and f["phase"] == "firing"
                for f in api.get("/v1/alerts", group="chat")["firing"]
            )

        wait_until("the memory-over-estimate alert fires", fired, timeout=30)
        report = s.cli("alerts", "--group", "chat")
        [alert] = [f for f in report["firing"] if f["rule"] == "memory-over-estimate"]
        assert alert["group"] == "chat" and alert["owner"] == "ml-team@example.com"
        assert alert["series"] == "instances_over_estimate"

        # a container hides the pids: NVML lists none, and memory is unknown, not zero
        state.write_text(json.dumps({"devices": [{**device, "processes": []}]}))

        def unknown() -> bool:
            return all(
                (i.get("accelerator") or {}).get("memory") == "unknown" for i in s.instances("chat")
            )

        wait_until("memory unknown once pids are hidden", unknown, timeout=20)
        acc = s.instances("chat")[0]["accelerator"]
        assert acc["memory_used_bytes"] is None and "hidden" in acc["note"]
        assert "unknown / 1.0 GiB" in s.show("get", "instances")
        unknown_now = metrics(s)["sluice_group_accelerator_memory_unknown_instances"]
        assert unknown_now == [({"group": "chat"}, 2.0)]
