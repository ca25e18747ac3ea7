"""Two control planes on one database: one leads, the other waits as a standby and takes
over; a leader that was paused past its lease comes back deposed and exits without touching
the instances (fenced). Real `sluice up` processes with their own state directories, one
shared database (`$SLUICE_DATABASE_URL`: a SQLite file both open, or a PostgreSQL
database on the test server, see tests/databases.py)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Sluice, kill_workers_of, leads, shared_secrets_key

pytestmark = pytest.mark.serial  # it measures time or rates: run alone (Makefile)

SPEC = """
gateway: {host: 127.0.0.1, port: 0}
control: {leader_election: {lease_duration_s: 3, renew_deadline_s: 2, retry_period_s: 0.5}}
pools:
  - {name: local, count: 4, memory_gb: 8}
groups:
  - name: chat
    owner: ops@example.com
    business: core
    alert_channel: "#ops"
    models:
      m-chat: {runtime: sim, sim: {startup_s: 0.2, memory_gb: 1}}
    resources: {pool: local, accelerators: 1, memory_gb: 1}
    replicas: 2
tenants:
  - {name: search, api_keys: [sk-search-b095adcc724f4f8a]}
"""


def waits_as_standby(s: Sluice) -> bool:
    return any("standby:" in line for line in s.output)


@pytest.fixture
def pair(tmp_path: Path, shared_database: str) -> Iterator[tuple[Sluice, Sluice]]:
    environ = {"SLUICE_DATABASE_URL": shared_database, **shared_secrets_key(tmp_path)}
    spec = tmp_path / "platform.yaml"
    spec.write_text(SPEC)
    a = Sluice(tmp_path / "a", spec, environ=environ)
    b = Sluice(tmp_path / "b", spec, environ=environ)
    try:
        a.start()
        a.wait_for("a leads with 2 ready", lambda: leads(a) and len(a.ready("chat")) == 2)
        b.start(wait_endpoint=False)
        b.wait_for("b waits as a standby", lambda: waits_as_standby(b), timeout=30)
        # one database, one set of tokens: b's CLI uses the admin token a bootstrapped
        token = b.home / "admin.token"
        token.write_text((a.home / "admin.token").read_text())
        token.chmod(0o600)
        yield a, b
    finally:
        for s in (a, b):
            s.kill()
            kill_workers_of(s.home)


def lead_audit(s: Sluice) -> list[dict[str, Any]]:
    return [e for e in s.cli("audit", "--action", "lead", "--limit", "20")]


def test_the_standby_takes_over_when_the_leader_dies(pair: tuple[Sluice, Sluice]) -> None:
    a, b = pair
    assert not leads(b) and b.proc is not None and b.proc.poll() is None
    before = {i["id"] for i in a.instances("chat") if i["state"] == "ready"}
    assert a.proc is not None
    killed = time.monotonic()
    os.kill(a.proc.pid, signal.SIGKILL)  # a crash: no release of the lease
    b.wait_for("b leads", lambda: leads(b) and bool(b.endpoint), timeout=30)
    took_s = time.monotonic() - killed
    b.wait_for("b serves chat", lambda: len(b.ready("chat")) == 2, timeout=60)
    r = b.client("sk-search-b095adcc724f4f8a").chat.completions.create(
        model="m-chat", messages=[{"role": "user", "content": "hi"}]
    )
    assert r.choices[0].message.content
    epochs = sorted(e["detail"]["epoch"] for e in lead_audit(b))
    assert epochs[-2:] == [epochs[-2], epochs[-2] + 1], epochs  # a new epoch for b
    # a crashed holder on this host: no need to wait out its lease (3 s); the rest is b
    # starting its gateway and control API
    assert took_s < 3 + 0.5 + 10, took_s
    # b adopted a's instances (still running, recorded in the shared store): none twice
    assert {i["id"] for i in b.instances("chat") if i["state"] == "ready"} == before
    launches = [e for e in b.cli("events", "chat", "--limit", "200") if e["kind"] == "launch"]
    assert len(launches) == 2, launches


def test_a_paused_leader_comes_back_deposed_and_touches_nothing(
    pair: tuple[Sluice, Sluice],
) -> None:
    a, b = pair
    assert a.proc is not None
    os.kill(a.proc.pid, signal.SIGSTOP)  # a stalled leader: its lease lapses
    try:
        b.wait_for("b leads", lambda: leads(b) and bool(b.endpoint), timeout=30)
        b.wait_for("b serves chat", lambda: len(b.ready("chat")) >= 2, timeout=60)
    finally:
        os.kill(a.proc.pid, signal.SIGCONT)
    served = {i["id"] for i in b.instances("chat") if i["state"] == "ready"}
    a.proc.wait(timeout=30)  # it finds its lease taken and exits
    assert any("lost the controller lease" in line for line in a.output), a.output[-10:]
    assert any("deposed" in line for line in a.output), a.output[-10:]
    time.sleep(1.0)
    still = {i["id"] for i in b.instances("chat") if i["state"] == "ready"}
    assert served <= still  # the deposed leader stopped none of them
