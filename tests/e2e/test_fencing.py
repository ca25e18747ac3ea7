"""Fencing on every write (issue 31): a leader paused (SIGSTOP) past its lease while a
standby takes over, then resumed (SIGCONT) with operator calls already waiting at its
control API, writes no row and publishes no routing: its scale, failover, apply and token
calls are refused (503 `fenced`, or never answered as it steps down), no row of its epoch
appears or changes in the store after the takeover, its gateway sync hands out nothing
new, and the new leader's fleet and spec are untouched.

Real `sluice up` processes with their own state directories on one shared database (a
SQLite file, or a PostgreSQL database on the test server: tests/databases.py)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from tests.e2e.conftest import Sluice, kill_workers_of, leads, shared_secrets_key

pytestmark = pytest.mark.serial  # it measures time or rates: run alone (Makefile)

KEY = "sk-search-5d0c81e2a4b9f376"
SPEC = f"""
gateway: {{host: 127.0.0.1, port: 0}}
control: {{leader_election: {{lease_duration_s: 3, renew_deadline_s: 2, retry_period_s: 0.5}}}}
pools:
  - {{name: local, count: 6, memory_gb: 16}}
groups:
  - name: chat
    owner: ops@example.com
    business: core
    alert_channel: "#ops"
    models:
      m-chat: {{runtime: sim, sim: {{startup_s: 0.2, memory_gb: 1}}}}
    resources: {{pool: local, accelerators: 1, memory_gb: 1}}
    replicas: 2
    backup: spare
  - name: spare
    owner: ops@example.com
    business: core
    alert_channel: "#ops"
    models:
      m-chat: {{runtime: sim, sim: {{startup_s: 0.2, memory_gb: 1}}}}
    resources: {{pool: local, accelerators: 1, memory_gb: 1}}
    replicas: 1
tenants:
  - {{name: search, api_keys: [{KEY}]}}
"""
STAMPED = {
    "audit_log": "at",
    "events": "at",
    "instances": "updated_at",
    "spec_revisions": "created_at",
    "replica_overrides": "set_at",
    "failovers": "set_at",
}
"""The tables whose rows say the epoch of the leader that wrote them, and their time."""


def _rows(url: str, query: str, **params: Any) -> list[tuple[Any, ...]]:
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(query), params)]
    finally:
        engine.dispose()


def _of_epoch(url: str, epoch: int) -> dict[str, set[tuple[Any, ...]]]:
    """Every row the leader of `epoch` wrote, per table, as it stands."""
    return {
        table: set(_rows(url, f"SELECT * FROM {table} WHERE epoch = :e", e=epoch))
        for table in STAMPED
    }


def _call(
    results: dict[str, Any], name: str, url: str, headers: dict[str, str], body: dict[str, Any]
) -> None:
    """POST `body`; the outcome under `name`: (status, JSON) or the transport error."""
    try:
        r = httpx.post(url, json=body, headers=headers, timeout=60)
        try:
            doc = r.json()
        except ValueError:
            doc = r.text
        results[name] = (r.status_code, doc)
    except httpx.HTTPError as exc:
        results[name] = exc


def test_a_resumed_ex_leader_writes_no_row_and_publishes_no_routing(
    tmp_path: Path, shared_database: str
) -> None:
    url = shared_database
    environ = {"SLUICE_DATABASE_URL": url, **shared_secrets_key(tmp_path)}
    spec = tmp_path / "platform.yaml"
    spec.write_text(SPEC)
    a = Sluice(tmp_path / "a", spec, environ=environ)
    b = Sluice(tmp_path / "b", spec, environ=environ)
    try:
        a.start()
        a.wait_for(
            "a leads, all ready",
            lambda: leads(a) and len(a.ready("chat")) == 2 and len(a.ready("spare")) == 1,
        )
        b.start(wait_endpoint=False)
        b.wait_for("b waits", lambda: any("standby:" in line for line in b.output), timeout=30)
        token = b.home / "admin.token"  # one database, one set of tokens
        token.write_text((a.home / "admin.token").read_text())
        token.chmod(0o600)
        control, headers = a.control_url, a.control_headers()
        gateway_headers = {"Authorization": f"Bearer {a.token('gw', role='gateway')}"}
        sync_url = f"{control}/v1/gateways/gw/sync"
        before = httpx.post(sync_url, json={"boot": "e2e"}, headers=gateway_headers, timeout=30)
        assert before.status_code == 200, before.text
        published = before.json()
        ((old_epoch,),) = _rows(url, "SELECT epoch FROM leases WHERE name = 'controller'")
        assert published["epoch"] == old_epoch

        assert a.proc is not None
        os.kill(a.proc.pid, signal.SIGSTOP)  # a stalls past its lease
        try:
            b.wait_for("b leads", lambda: leads(b) and bool(b.endpoint), timeout=30)
            b.wait_for("b serves", lambda: len(b.ready("chat")) == 2, timeout=60)
            ((new_epoch,),) = _rows(url, "SELECT epoch FROM leases WHERE name = 'controller'")
            assert new_epoch > old_epoch
            lead = "SELECT id, at FROM audit_log WHERE action = 'lead' AND epoch = :e"
            ((lead_id, took_at),) = _rows(url, lead, e=new_epoch)
            revisions = _rows(url, "SELECT number FROM spec_revisions")
            old_rows = _of_epoch(url, old_epoch)
            served = {i["id"] for i in b.ready("chat")}
            # operator calls reach the paused leader's API and wait there for it
            results: dict[str, Any] = {}
            why = "sent to the paused ex-leader"
            calls = {
                "scale": ("/v1/groups/chat/scale", {"replicas": 4, "reason": why}),
                "failover": ("/v1/groups/chat/failover", {"to": "spare", "reason": why}),
                "apply": (
                    "/v1/revisions",
                    {"yaml": SPEC.replace("replicas: 1", "replicas: 2"), "reason": why},
                ),
                "token": ("/v1/tokens", {"name": "stale-token", "role": "viewer"}),
            }
            threads = [
                threading.Thread(target=_call, args=(results, n, control + p, headers, body))
                for n, (p, body) in calls.items()
            ]
            threads.append(
                threading.Thread(
                    target=_call,
                    args=(results, "sync", sync_url, gateway_headers, {"boot": "e2e"}),
                )
            )
            for t in threads:
                t.start()
            time.sleep(1.0)  # sent: they wait in the paused process's socket
        finally:
            os.kill(a.proc.pid, signal.SIGCONT)
        for t in threads:
            t.join(90)
        a.proc.wait(timeout=30)  # it finds itself deposed and steps down
        assert any("deposed" in line for line in a.output), a.output[-20:]

        # no call of the ex-leader did anything: refused as fenced, or cut off as it left
        refused = []
        for name, outcome in results.items():
            if isinstance(outcome, Exception):
                continue
            status, doc = outcome
            if name == "sync" and status == 200:  # nothing new published: the same routes
                assert (doc["epoch"], doc["version"]) == (old_epoch, published["version"])
                continue
            if status == 500 and doc == "Internal Server Error":
                continue  # cut off by the stop: its task cancelled (never a 2xx)
            assert status == 503, (name, outcome)
            assert doc["error"]["code"] == "fenced", (name, outcome)
            refused.append(name)
        assert set(results) == {*calls, "sync"}
        # the calls reached its write path (not just a process already gone)
        assert refused, (results, "".join(a.output[-40:]))

        # the store: no row of the old epoch appeared or changed after the takeover
        after = _of_epoch(url, old_epoch)
        for table, rows in after.items():
            assert rows <= old_rows[table], (table, rows - old_rows[table])
            late = f"SELECT * FROM {table} WHERE epoch = :e AND {STAMPED[table]} >= :t"
            assert not _rows(url, late, e=old_epoch, t=took_at), table
        assert not _rows(
            url, "SELECT id FROM audit_log WHERE id > :i AND epoch = :e", i=lead_id, e=old_epoch
        )
        assert not _rows(url, "SELECT * FROM replica_overrides")
        assert not _rows(url, "SELECT * FROM failovers")
        assert not _rows(url, "SELECT * FROM tokens WHERE name = 'stale-token'")
        assert _rows(url, "SELECT number FROM spec_revisions") == revisions
        # the new leader's fleet goes on: its instances, its routing
        time.sleep(1.0)
        assert served <= {i["id"] for i in b.ready("chat")}
        r = b.client(KEY).chat.completions.create(
            model="m-chat", messages=[{"role": "user", "content": "hi"}]
        )
        assert r.choices[0].message.content
    finally:
        for s in (a, b):
            if s.proc is not None and s.proc.poll() is None:
                os.kill(s.proc.pid, signal.SIGCONT)
            s.kill()
            kill_workers_of(s.home)
