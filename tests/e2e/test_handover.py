"""End to end: the control plane hands over without a blip (issue 33).

Real processes on 127.0.0.1: two `sluice controller` on one PostgreSQL database sharing one
control port (as behind a Service), two `sluice gateway` processes syncing with it, and a
bounded open-loop load through the gateways. A SIGTERM hands over: the leader releases the
lease and leaves every instance running, the standby adopts them. A rolling restart of both
controllers changes nothing a caller sees: no failed request, no instance started again, no
revision written. A standby started with an older `-f FILE` runs the live revision when it
takes over, never the file. `sluice down` stops the fleet, audited.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import pytest

from sluice.store import Store
from tests.databases import database_for
from tests.e2e.conftest import (
    OpenLoop,
    Sluice,
    free_port,
    kill_workers_of,
    leads,
    remote_gateway,
    shared_secrets_key,
)

SPEC = """
gateway: {{host: 127.0.0.1, port: 0}}
control: {{port: {control_port},
          leader_election: {{lease_duration_s: 3, renew_deadline_s: 2, retry_period_s: 0.5}}}}
pools:
  - {{name: local, count: 8, memory_gb: 8}}
groups:
  - name: chat
    owner: ops@example.com
    business: core
    alert_channel: "#ops"
    models:
      m-chat:
        runtime: sim
        sim: {{startup_s: 0.3, service_time: {{kind: fixed, seconds: 0.2}}, memory_gb: 1}}
    resources: {{pool: local, accelerators: 1, memory_gb: 1}}
    max_concurrency: 4
    slow_start_s: 0
    replicas: 2
tenants:
  - {{name: search, api_keys: [sk-search-b095adcc724f4f8a]}}
{more_tenants}"""

NEW_TENANT = "  - {name: late, api_keys: [sk-late-tenant-5a9c07e2d1f3b864]}\n"


@contextlib.contextmanager
def leader_and_standby(
    tmp_path: Path, url: str, a_args: Sequence[str] = (), b_args: Sequence[str] = ()
) -> Iterator[tuple[Sluice, Sluice, int]]:
    """Two `sluice controller` on the database at `url` and one control port, each with
    -f of the spec: `a` leads with 2 ready instances, `b` waits as its standby (with the
    admin token, for the CLI once it leads). Both killed, and their workers, at the end."""
    control_port = free_port()
    spec = tmp_path / "platform.yaml"
    spec.write_text(SPEC.format(control_port=control_port, more_tenants=""))
    environ = {"SLUICE_DATABASE_URL": url, **shared_secrets_key(tmp_path)}
    a = Sluice(tmp_path / "a", spec, environ=environ, command="controller")
    b = Sluice(tmp_path / "b", spec, environ=environ, command="controller")
    a.extra_args, b.extra_args = list(a_args), list(b_args)
    try:
        a.start()
        a.wait_for("a leads with 2 ready", lambda: len(a.ready("chat")) == 2)
        b.start(wait_endpoint=False)
        wait_standby(b)
        token = b.home / "admin.token"
        token.write_text((a.home / "admin.token").read_text())
        token.chmod(0o600)
        yield a, b, control_port
    finally:
        for s in (a, b):
            if s.proc is not None and s.proc.poll() is None:
                s.proc.send_signal(signal.SIGCONT)  # a test may have paused it
            s.kill()
            kill_workers_of(s.home)


def wait_standby(s: Sluice) -> None:
    s.wait_for("it waits", lambda: any("standby:" in line for line in s.output), timeout=30)


def revision_numbers(s: Sluice) -> list[int]:
    """The spec's revisions, newest first (GET /v1/revisions)."""
    r = httpx.get(
        f"{s.control_url}/v1/revisions", headers=s.control_headers(), timeout=10, trust_env=False
    )
    r.raise_for_status()
    return [int(x["number"]) for x in r.json()]


def wait_leads(s: Sluice, timeout: float = 30) -> None:
    s.wait_for("it leads", lambda: leads(s), timeout=timeout)


@pytest.fixture
def postgres(tmp_path: Path) -> Iterator[str]:
    with database_for("postgresql", tmp_path / "db") as db:
        yield db.url


def test_a_rolling_restart_of_the_controllers_under_load_changes_nothing_a_caller_sees(
    tmp_path: Path, postgres: str
) -> None:
    with leader_and_standby(tmp_path, postgres) as (a, b, control_port):
        token = a.token("gw", "gateway")
        before = {i["id"]: i["pid"] for i in a.ready("chat")}
        revisions = revision_numbers(a)
        control = f"http://127.0.0.1:{control_port}"
        with remote_gateway([control], token, 2, tmp_path / "gw", gateway_id="gw") as gw:
            load = OpenLoop(gw.endpoint)
            sender = threading.Thread(target=load.run, kwargs={"rate": 20, "seconds": 40})
            sender.start()
            time.sleep(3)
            # 1. SIGTERM the leader: it hands over at once, its instances keep running
            assert a.hand_over() == 0
            assert any("handed over, 2 instance(s) left running" in x for x in a.output), a.output
            wait_leads(b, timeout=15)
            # 2. the old leader comes back as a standby, then the new leader is stopped
            a.start(wait_endpoint=False)
            wait_standby(a)
            b.wait_for("b serves", lambda: len(b.ready("chat")) == 2, timeout=30)
            assert b.hand_over() == 0
            wait_leads(a, timeout=15)
            # 3. and back as a standby: both restarted, one after the other
            sender.join()
            results = load.results()
        codes = [c for c, _ in results]
        assert len(codes) == 800 and all(c == 200 for c in codes), [c for c in codes if c != 200]
        # the same instances, the same processes, throughout: none started again
        a.wait_for("a serves", lambda: len(a.ready("chat")) == 2, timeout=30)
        assert {i["id"]: i["pid"] for i in a.ready("chat")} == before
        launches = [e for e in a.cli("events", "chat", "--limit", "500") if e["kind"] == "launch"]
        assert len(launches) == 2, launches
        assert revision_numbers(a) == revisions  # no revision written by any start
        actions = [e["action"] for e in a.cli("audit", "--limit", "200")]
        assert actions.count("hand-over") == 2 and actions.count("lead") == 3, actions


def test_a_standby_started_with_an_older_file_runs_the_live_revision_when_it_takes_over(
    tmp_path: Path, postgres: str
) -> None:
    with leader_and_standby(tmp_path, postgres) as (a, b, control_port):
        newer = tmp_path / "newer.yaml"
        newer.write_text(SPEC.format(control_port=control_port, more_tenants=NEW_TENANT))
        applied = a.cli("apply", "-f", str(newer), "--reason", "a new tenant")
        live = applied["revision"]
        token = a.token("gw", "gateway")
        control = f"http://127.0.0.1:{control_port}"
        with remote_gateway([control], token, 1, tmp_path / "gw", gateway_id="gw") as gw:

            def late_tenant() -> int:
                r = httpx.post(
                    f"{gw.endpoint}/v1/chat/completions",
                    json={"model": "m-chat", "messages": [{"role": "user", "content": "hi"}]},
                    headers={"Authorization": "Bearer sk-late-tenant-5a9c07e2d1f3b864"},
                    timeout=30,
                    trust_env=False,
                )
                return r.status_code

            a.wait_for("the new tenant is served", lambda: late_tenant() == 200, timeout=20)
            a.kill()  # the leader dies; b takes over with its older -f file in hand
            wait_leads(b, timeout=30)
            said = " ".join(b.output)
            assert f"differs from the live revision {live}" in said, b.output
            assert f"running revision {live}" in said, b.output
            b.wait_for("b serves", lambda: len(b.ready("chat")) == 2, timeout=30)
            assert revision_numbers(b)[0] == live  # nothing reverted
            # the gateway hears from b and keeps the applied tenant
            time.sleep(2)
            assert late_tenant() == 200


def test_a_standby_is_alive_not_ready_and_sluice_down_stops_the_fleet(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    health_a, health_b = free_port(), free_port()
    health = (["--health-port", str(health_a)], ["--health-port", str(health_b)])
    with leader_and_standby(tmp_path, url, *health) as (a, b, _):

        def probe(port: int, path: str) -> tuple[int, dict]:
            r = httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5, trust_env=False)
            return r.status_code, r.json()

        assert probe(health_a, "/readyz") == (200, {"ready": True, "role": "leader"})
        code, body = probe(health_b, "/readyz")
        assert code == 503 and body["role"] == "standby", body
        assert probe(health_b, "/livez") == (200, {"alive": True, "role": "standby"})
        # `sluice down`: b first (a SIGTERM: it only waits, nothing to hand over), then the
        # leader stops every instance, audited with the token's name
        assert b.hand_over() == 0
        pids = [i["pid"] for i in a.ready("chat")]
        done = a.cli("down", "--reason", "end of the test")
        assert done == {"stopping": True, "instances": 2, "stopped": True}, done
        assert a.proc is not None and a.proc.wait(30) == 0
        assert any("all instances stopped" in x for x in a.output), a.output
        assert not [p for p in pids if Path(f"/proc/{p}").exists()]
        store = Store.open(url)
        try:
            (row,) = [r for r in store.list_audit(limit=20) if r.action == "stop"]
        finally:
            store.close()
        assert row.actor == "admin", row
        assert row.reason == "sluice down: end of the test: stopped every instance", row


def test_a_paused_leader_on_the_same_host_leaves_a_leader_and_steps_down_quietly(
    tmp_path: Path,
) -> None:
    """Two controllers on one host share a control port: the leader is paused (SIGSTOP,
    as a long GC pause or a frozen VM would); the standby takes over and leads while the
    port is still held, and binds it once the resumed leader, deposed, has gone: one
    controller answers throughout the end, and the deposed one exits without tracebacks."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    with leader_and_standby(tmp_path, url) as (a, b, control_port):
        assert a.proc is not None
        a.proc.send_signal(signal.SIGSTOP)
        wait_leads(b, timeout=30)
        b.wait_for(
            "b says the port is held",
            lambda: any("is in use" in line for line in b.output),
            timeout=10,
        )
        a.proc.send_signal(signal.SIGCONT)
        assert a.proc.wait(30) == 0
        said = "".join(a.output)
        assert "deposed" in said and "Traceback" not in said, said
        b.wait_for("b answers on the port", lambda: len(b.ready("chat")) == 2, timeout=30)
        assert b.control_url.endswith(f":{control_port}")
