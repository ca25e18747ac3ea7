"""End to end: `autoscaling.mode: advisory` under `sluice up` (issue 16).

A load one instance cannot keep up with makes the advisory autoscaler advise more
instances, every decision journaled and shown by `sluice explain` as advised vs actual,
while the group's count stays at its `replicas` (1) the whole time; applying the same spec
with `mode: active` then lets the autoscaler, which kept learning, scale the group.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.conftest import OpenLoop, Sluice, running

SPEC = """
gateway: {{host: 127.0.0.1, port: 0}}
pools:
  - {{name: local, count: 6, memory_gb: 16}}
groups:
  - name: chat
    owner: ops@example.com
    business: search
    alert_channel: "#ops"
    models:
      m-chat:
        runtime: sim
        sim: {{startup_s: 0.3, service_time: {{kind: fixed, seconds: 0.2}}, memory_gb: 1}}
    resources: {{pool: local, accelerators: 1, memory_gb: 1}}
    max_concurrency: 2
    replicas: 1
    slow_start_s: 0
    queue: {{max_length: 2000, max_wait_s: 60}}
    autoscaling: {{mode: {mode}, min: 1, max: 4}}
tenants:
  - {{name: search, api_keys: [sk-search-b095adcc724f4f8a]}}
"""


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sluice]:
    home = tmp_path_factory.mktemp("advisory")
    text = SPEC.format(mode="advisory")
    with running(home, text, "chat 1 ready", lambda s: len(s.ready("chat")) == 1) as s:
        yield s


def test_advice_is_journaled_while_the_count_stays_then_active_scales(platform: Sluice) -> None:
    counts: list[int] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            counts.append(len(platform.instances("chat")))
            time.sleep(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    load = OpenLoop(platform.endpoint)
    load.run(20, 8)  # 2 slots x 5/s per instance: 10 req/s fit, 20 queue up
    explained: dict[str, Any] = platform.cli("explain", "chat", "--limit", "200")
    shown = platform.show("explain", "chat")
    done.set()
    watcher.join(10)
    results = load.results()

    assert Counter(status for status, _ in results) == Counter({200: len(results)})
    assert counts and set(counts) == {1}, counts  # the count never followed the advice
    assert explained["mode"] == "advisory" and explained["desired"] == 1
    assert explained["advised"]["desired"] > 1, explained["advised"]
    assert explained["advised"]["actual"] == 1
    advice = [d for d in explained["decisions"] if d["mode"] == "advisory"]
    assert advice and all(d["current"] == 1 and d["launched"] == [] for d in advice)
    grew = [d for d in advice if d["desired"] > 1]
    assert grew and all(d["detail"]["signals"] for d in grew), advice
    assert "advised" in shown and "vs actual 1" in shown, shown
    kinds = [e["kind"] for e in platform.cli("events", "chat", "--limit", "500")]
    assert "advice" in kinds and "autoscale" not in kinds

    platform.spec.write_text(SPEC.format(mode="active"))
    platform.cli("apply", "-f", str(platform.spec), "--reason", "let it drive")
    load = OpenLoop(platform.endpoint)
    load.run(20, 8)
    platform.wait_for("chat scaled up", lambda: len(platform.ready("chat")) > 1, timeout=30)
    load.results()
    moves = [e["message"] for e in platform.cli("events", "chat") if e["kind"] == "autoscale"]
    assert any(m.startswith("1 -> ") for m in moves), moves
