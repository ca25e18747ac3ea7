"""End to end: the controller's store fault does not reach the data plane (issue 13).

Another process takes the state database's write lock and holds it (as a stuck `sqlite3`
shell or a backup tool would): every write `sluice up` tries fails after SQLite's busy
timeout with "database is locked", a real OperationalError, so its ticks fail. (A read-only
file is no test here: the store's connections stay open, and root writes anyway; the
integration tests switch to a read-only connection instead.) Under steady load the gateway
loses no request, the status says degraded and why, and once the lock is gone the
controller recovers by itself: ticks succeed again and a scale command takes effect.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from tests.e2e.conftest import OpenLoop, Sluice, running

SPEC = """
gateway: {host: 127.0.0.1, port: 0}
pools:
  - {name: local, count: 4, memory_gb: 16}
groups:
  - name: chat
    owner: ops@example.com
    business: search
    alert_channel: "#ops"
    models:
      m-chat:
        runtime: sim
        sim: {startup_s: 0.2, service_time: {kind: fixed, seconds: 0.02}, memory_gb: 1}
    resources: {pool: local, accelerators: 1, memory_gb: 1}
    max_concurrency: 16
    replicas: 1
    slow_start_s: 0
tenants:
  - {name: search, api_keys: [sk-search-b095adcc724f4f8a]}
routes:
  - {tag: chat-main, match: {models: [m-chat]}, to: chat}
"""

RATE = 20.0
LOAD_S = 45.0


def status(s: Sluice) -> dict[str, Any]:
    with httpx.Client(base_url=s.control_url, trust_env=False, timeout=10) as c:
        r = c.get("/v1/status", headers=s.control_headers())
        r.raise_for_status()
        return dict(r.json())


def healthz(s: Sluice) -> str:
    with httpx.Client(base_url=s.control_url, trust_env=False, timeout=10) as c:
        return str(c.get("/healthz").json()["status"])


def wait_status(s: Sluice, what: str, pred: Any, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = status(s)
        if pred(st):
            return st
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}; status: {status(s)}")


def test_a_locked_store_degrades_the_controller_not_the_gateway(tmp_path: Path) -> None:
    def ready(s: Sluice) -> bool:
        return len(s.ready("chat")) == 1

    with running(tmp_path, SPEC, "chat ready", ready) as s:
        assert status(s)["status"] == "ok"
        load = OpenLoop(s.endpoint)
        sender = threading.Thread(target=load.run, args=(RATE, LOAD_S), daemon=True)
        sender.start()
        time.sleep(1.0)

        # the fault: another process holds the write lock of state.db
        lock = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")
        locked_at = time.monotonic()
        try:
            # degraded as soon as any write is refused (a lease renewal, a tick's write, an
            # event); then a tick meets the lock too: the next ones probe the store first
            st = wait_status(
                s,
                "degraded, with a tick that met the lock",
                lambda st: st["status"] == "degraded" and st["controller"]["last_tick_error"],
                timeout=30,
            )
            noticed = time.monotonic() - locked_at
            assert st["degraded"] == "store locked: database is locked", st
            assert st["store"]["problem"] == "store locked"
            assert "database is locked" in st["controller"]["last_tick_error"]
            assert healthz(s) == "degraded"
            assert len(s.ready("chat")) == 1  # reads still work; the instance is untouched
            time.sleep(10.0)  # long enough for retries: each waits out the busy timeout
        finally:
            lock.execute("ROLLBACK")
            lock.close()
        released_at = time.monotonic()

        st = wait_status(s, "ok again", lambda st: st["status"] == "ok", timeout=45)
        recovered = time.monotonic() - released_at
        failures = st["controller"]["tick_failures"]
        assert failures >= 2 and st["controller"]["failing_in_a_row"] == 0
        ticks = st["controller"]["ticks"]
        wait_status(s, "ticks again", lambda st: st["controller"]["ticks"] > ticks, timeout=10)
        assert healthz(s) == "ok"
        events = s.cli("events", "--limit", "50")
        assert any("takes writes again" in e["message"] for e in events), events

        s.cli("scale", "chat", "2", "--reason", "e2e: after the store fault")
        s.wait_for("2 ready", lambda: len(s.ready("chat")) == 2, timeout=30)

        sender.join(LOAD_S + 30)
        results = load.results()
        codes = Counter(code for code, _ in results)
        print(
            f"store fault noticed after {noticed:.1f} s, recovered {recovered:.1f} s after "
            f"the lock went; {failures} failed ticks; requests: {dict(codes)}"
        )
        assert len(results) == int(RATE * LOAD_S)
        assert codes == {200: len(results)}, codes  # not one request lost
