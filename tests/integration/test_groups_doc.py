"""`sluice groups doc` (G4) through the real CLI on a state directory whose fleet is not
running: the directory comes from the store's latest revision, instance records, last hour
of history and last day's alert events; a webhook's token never shows, and the page escapes
what the spec's authors wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from sluice.core import InstanceState
from sluice.policy.autoscale.base import TrafficSample
from sluice.policy.history import MINUTE_S, Rollup, bucket_start
from sluice.store import InstanceRecord, RollupRow, Store

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "T0K3N-SECRET"

SPEC = f"""
pools:
  - {{name: gpu, accelerator: h100-80g, count: 8, memory_gb: 80, price_per_hour: 2.0}}
groups:
  - name: chat
    owner: chat-team@example.com
    business: "assistant <script>alert(1)</script> & co"
    alert_channel: "https://user:pw@hooks.example.com:8443/services/{TOKEN}?key={TOKEN}"
    models:
      m1: {{runtime: sim, version: v3}}
      m2: {{runtime: sim, version: v4}}
    resources: {{pool: gpu, accelerators: 2, memory_gb: 60}}
    quota: {{guaranteed: 4, limit: 6, borrow_limit: 2, reserved: true}}
  - name: search
    owner: search-team
    business: web search
    alert_channel: "#search-oncall"
    models: {{s: {{runtime: sim}}}}
    resources: {{pool: gpu, accelerators: 1, memory_gb: 10}}
"""


def sluice(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SLUICE_HOME": str(home), "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "sluice", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=ROOT,
    )


def minute(start: float, requests: int, errors: int) -> dict[str, Any]:
    """One stored minute of `chat`: `requests` answered, latencies all in (0.1, 0.2]."""
    older = TrafficSample(0.0, 0, 0, 0, 0, (0.1, 0.2), (0, 0, 0))
    newer = TrafficSample(
        60.0, 1, 0, requests, requests, (0.1, 0.2), (0, requests, 0), server_errors=errors
    )
    return Rollup.between(older, newer, {"held_units": 4.0}, start + 60, 60.0).to_json()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A store left by a fleet that stopped: a revision, instances, history, alerts."""
    now = time.time()
    store = Store.for_home(tmp_path)
    try:
        store.add_revision(yaml_text=SPEC, author="admin", reason="", diff="", now=now - 7200)
        for i, state in enumerate(("ready", "ready", "failed")):
            store.upsert_instance(
                InstanceRecord(f"chat-{i}", "chat", "t", InstanceState(state).value, None,
                               None, None, now - 600, now - 60)
            )  # fmt: skip
        store.upsert_instance(
            InstanceRecord("search-0", "search", "t", "ready", None, None, None, now, now)
        )
        last = bucket_start(now, MINUTE_S) - MINUTE_S
        rows = [
            RollupRow("chat", MINUTE_S, last - k * MINUTE_S, minute(last - k * MINUTE_S, 600, 6))
            for k in range(30)
        ]
        rows.append(RollupRow("chat", MINUTE_S, last - 3 * 3600, minute(0, 10**6, 10**6)))
        store.write_rollups(rows)  # the last row is three hours old: not in "last hour"
        for at, kind in (
            (now - 3600, "alert_firing"),
            (now - 1800, "alert_resolved"),
            (now - 900, "alert_firing"),
            (now - 3 * 86_400, "alert_firing"),
        ):
            store.append_event(group="chat", instance=None, kind=kind, message="x", detail={},
                               now=at)  # fmt: skip
    finally:
        store.close()
    return tmp_path


def test_groups_doc_json_from_the_store(home: Path) -> None:
    done = sluice(home, "groups", "doc", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert TOKEN not in done.stdout and "pw" not in done.stdout
    assert doc["revision"] == 1
    chat, search = doc["groups"]
    assert chat["alert_channel"] == "https://hooks.example.com:8443/…"
    assert search["alert_channel"] == "#search-oncall"
    assert chat["owner"] == "chat-team@example.com"
    assert chat["models"] == {
        "m1": {"runtime": "sim", "version": "v3"},
        "m2": {"runtime": "sim", "version": "v4"},
    }
    assert chat["resources"] == {
        "pool": "gpu",
        "accelerator": "h100-80g",
        "accelerators": 2,
        "memory_gb": 60.0,
    }
    assert chat["quota"] == {"guaranteed": 4, "limit": 6, "borrow_limit": 2, "reserved": True}
    assert chat["instances"] == {"failed": 1, "ready": 2}
    h = chat["health_last_hour"]
    assert h["requests_per_s"] == pytest.approx(10.0, rel=0.05)
    assert h["error_rate"] == pytest.approx(0.01)
    assert 100 <= h["p95_ms"] <= 200
    assert chat["alerts_24h"] == {"firing": 2, "resolved": 1}
    assert search["instances"] == {"ready": 1}
    assert search["health_last_hour"] == {"observed_s": 0.0}


def test_groups_doc_html_is_one_escaped_table(home: Path, tmp_path: Path) -> None:
    out_dir = tmp_path / "doc"
    done = sluice(home, "groups", "doc", "--html", str(out_dir))
    assert done.returncode == 0, done.stderr
    assert "chat" in done.stdout and TOKEN not in done.stdout
    page = (out_dir / "index.html").read_text()
    assert page.count("<table>") == 1
    assert "<script>" not in page
    assert "assistant &lt;script&gt;alert(1)&lt;/script&gt; &amp; co" in page
    assert TOKEN not in page and TOKEN not in (out_dir / "groups.json").read_text()
    assert "hooks.example.com:8443/…" in page and "m2 (sim v4)" in page


def test_groups_doc_without_a_state_database(tmp_path: Path) -> None:
    missing = sluice(tmp_path / "none", "groups", "doc", "--json")
    assert missing.returncode == 4
    assert "no state database" in json.loads(missing.stdout)["error"]["message"]
    assert not (tmp_path / "none").exists()
