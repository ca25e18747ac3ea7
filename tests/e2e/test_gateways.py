"""End to end: gateways apart from the controller (`sluice gateway`, issue 21).

Real processes on 127.0.0.1: `sluice up` (controller + its own gateway) and `sluice gateway
--workers 2` (two processes on one port, SO_REUSEPORT). The remote gateway serves from the
routes it syncs, its counters drive the autoscaler, the slots of every instance are split
between the gateways, it keeps serving while the controller is paused, and its token may
do nothing else. A gateway token names its gateway: another gateway token can neither sync
the real gateway's id nor make one up, and what it sends of unknown groups and instances
under its own id is dropped and counted. Then two `sluice controller` (no gateway of their
own) on one database: the leader is killed under load through the remote gateways, the
standby takes over, and no request, instance or audit row is lost, none started twice.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import (
    OpenLoop,
    Sluice,
    free_port,
    free_ports,
    kill_workers_of,
    remote_gateway,
    running,
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
    autoscaling: {{min: {min}, max: 4, interval_s: 1}}
tenants:
  - {{name: search, api_keys: [sk-search-b095adcc724f4f8a]}}
"""


def dataplane(s: Sluice) -> dict:
    doc: dict = s.cli("get", "dataplane")
    return doc


def slots(doc: dict, group: str) -> int | None:
    """The group's slots in a data-plane view, or None while the group is not in it yet
    (a gateway reports a group only after its first sync of the routes)."""
    slots: int | None = doc.get("groups", {}).get(group, {}).get("slots")
    return slots


def test_a_gateway_apart_serves_the_controllers_routes_and_drives_its_autoscaler(
    tmp_path: Path,
) -> None:
    spec = SPEC.format(control_port=0, min=1)
    with running(tmp_path, spec, "chat ready", lambda s: len(s.ready("chat")) == 1) as s:
        token = s.token("gw-1", "gateway")
        metrics = free_ports(2)
        with remote_gateway([s.control_url], token, 2, tmp_path, metrics) as gw:
            # named after its token (no --id): gw-1-HOST-PORT, worker i adds -wI
            named = f"gw-1-{socket.gethostname()}-{gw.port}"

            # three gateways share the instance's 4 slots: the local one and two workers
            def shared() -> bool:  # each gateway's status arrives with its next sync
                live = dataplane(s)
                return set(live["gateways"]) == {"local", f"{named}-w0", f"{named}-w1"} and (
                    slots(live, "chat") == 4
                )

            s.wait_for("three gateways holding the 4 slots between them", shared, timeout=10)
            # the token may sync, and read nothing
            r = httpx.get(
                s.control_url + "/v1/groups", headers={"Authorization": f"Bearer {token}"}
            )
            assert r.status_code == 403 and "viewer" in r.text
            auth = {"Authorization": f"Bearer {token}"}
            for gw_id, body, why in (
                ("local", {"boot": "b"}, "controller's own gateway"),
                (
                    "gw-1-x",
                    {"boot": "b", "status": {"groups": {"chat": "x"}}},
                    "not a data-plane status",
                ),
                ("gw-1-x", {"boot": "b", "counters": {"chat": {"at": "soon"}}}, "counters.chat"),
            ):
                r = httpx.post(f"{s.control_url}/v1/gateways/{gw_id}/sync", json=body, headers=auth)
                assert r.status_code == 422 and why in r.text, r.text
            # load through the remote gateway only: its counters reach the autoscaler
            load = OpenLoop(gw.endpoint)
            load.run(rate=30, seconds=12)
            results = load.results()
            assert all(code == 200 for code, _ in results), [c for c, _ in results if c != 200]
            chat = next(g for g in s.cli("get", "groups") if g["name"] == "chat")
            assert chat["desired"] >= 2, chat  # 30 rps x 0.2 s = 6 in flight > 4 slots
            s.wait_for("the new instances routed", lambda: len(s.ready("chat")) >= 2)
            served = dataplane(s)["served"]
            assert sum(served.values()) >= len(results)
            # each worker's own /metrics, on its own port: together they counted every answer
            counted = 0.0
            for port in (metrics, metrics + 1):
                text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
                for line in text.splitlines():
                    if line.startswith("sluice_gateway_requests_total{") and 'group="chat"' in line:
                        counted += float(line.rsplit(" ", 1)[1])
            assert counted >= len(results), counted
            assert httpx.get(f"http://127.0.0.1:{metrics}/").status_code == 404
            # the controller paused: the remote gateway serves on from its last routes
            assert s.proc is not None
            os.kill(s.proc.pid, signal.SIGSTOP)
            try:
                paused = OpenLoop(gw.endpoint)
                paused.run(rate=10, seconds=4)
                codes = [c for c, _ in paused.results()]
            finally:
                os.kill(s.proc.pid, signal.SIGCONT)
            assert codes and all(c == 200 for c in codes), codes
            assert any("no controller answers" in line for line in gw.output), gw.output


def test_a_gateway_token_cannot_sync_another_gateway_nor_feed_what_is_not_routed(
    tmp_path: Path,
) -> None:
    spec = SPEC.format(control_port=0, min=1)
    with running(tmp_path, spec, "chat ready", lambda s: len(s.ready("chat")) == 1) as s:
        real, forger = s.token("gw-1", "gateway"), s.token("forger", "gateway")
        # an --id that is not the token's stops `sluice gateway` at start, saying why
        cmd = [sys.executable, "-m", "sluice", "gateway", "--control", s.control_url]
        r = subprocess.run(
            [*cmd, "--port", "0", "--id", "gw-1-edge"],
            env={**os.environ, "SLUICE_GATEWAY_TOKEN": forger, "SLUICE_HOME": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode != 0 and "token 'forger' may sync only 'forger' or" in r.stderr, r
        with remote_gateway([s.control_url], real, 1, tmp_path) as gw:
            real_id = f"gw-1-{socket.gethostname()}-{gw.port}"
            s.wait_for(
                "the real gateway holding its share",
                lambda: (
                    set(dataplane(s)["gateways"]) == {"local", real_id}
                    and slots(dataplane(s), "chat") == 4
                ),
            )
            [instance] = [i["id"] for i in s.ready("chat")]
            before = dataplane(s)
            auth = {"Authorization": f"Bearer {forger}"}
            busy = {  # 500 in flight and a million arrivals: the autoscaler would go to max
                "at": 0,
                "in_flight": 500,
                "queued": 500,
                "arrivals": 10**6,
                "completions": 0,
                "latency_bounds": [0.1],
                "latency_counts": [0, 0],
            }
            answer = {"at": 1.0, "status": 500, "latency_s": 9.0, "output_bytes": 0}
            forged = {
                "boot": "f",
                "counters": {"chat": busy},
                "samples": {instance: [answer] * 50},
            }
            url = s.control_url + "/v1/gateways/{}/sync"
            for gw_id in (real_id, "gw-9"):  # the real gateway's id, a made-up one
                r = httpx.post(url.format(gw_id), json=forged, headers=auth)
                assert r.status_code == 403, r.text
                message = r.json()["error"]["message"]
                assert "token 'forger' may sync only gateway 'forger' or" in message
            # each forged sync is on record, with the token that tried it
            tried = {row["target"] for row in s.cli("audit", "--actor", "forger")}
            assert {f"POST /v1/gateways/{i}/sync" for i in (real_id, "gw-9")} <= tried, tried
            time.sleep(3)  # three autoscaler ticks and three syncs of the real gateway
            after = dataplane(s)
            assert set(after["gateways"]) == {"local", real_id} and after["dropped"] == {}
            assert slots(after, "chat") == 4 and after["served"] == before["served"]
            chat = next(g for g in s.cli("get", "groups") if g["name"] == "chat")
            assert chat["desired"] == 1, chat
            # under its own id: accepted, but a group and an instance that are not routed
            # are dropped and counted, never kept
            ghost = {
                "boot": "f",
                "counters": {"ghost": busy},
                "samples": {"ghost-1": [answer, answer]},
            }
            r = httpx.post(url.format("forger-1"), json=ghost, headers=auth)
            assert r.status_code == 200, r.text
            seen = dataplane(s)
            assert seen["dropped"] == {"forger-1": {"counters": 1, "answers": 2}}, seen
            assert "ghost" not in seen["groups"]
            s.wait_for(
                "the drop in the controller's log",
                lambda: any("'forger-1'" in line and "dropped" in line for line in s.output),
                timeout=10,
            )


@pytest.fixture
def two_controllers(tmp_path: Path) -> Iterator[tuple[Sluice, Sluice, int]]:
    """Two `sluice controller` on one SQLite database and one control port: the standby
    binds it once it leads, so gateways need one URL (as behind a Service)."""
    control_port = free_port()
    spec = tmp_path / "platform.yaml"
    spec.write_text(SPEC.format(control_port=control_port, min=2))
    environ = {
        "SLUICE_DATABASE_URL": f"sqlite:///{tmp_path / 'state.db'}",
        **shared_secrets_key(tmp_path),
    }
    a = Sluice(tmp_path / "a", spec, environ=environ, command="controller")
    b = Sluice(tmp_path / "b", spec, environ=environ, command="controller")
    try:
        a.start()
        assert any("no gateway in this process" in line for line in a.output), a.output
        a.wait_for("a leads with 2 ready", lambda: len(a.ready("chat")) == 2)
        b.start(wait_endpoint=False)
        b.wait_for("b waits", lambda: any("standby:" in line for line in b.output), timeout=30)
        yield a, b, control_port
    finally:
        for s in (a, b):
            s.kill()
            kill_workers_of(s.home)


def test_the_leader_killed_under_load_loses_no_request_through_the_gateways(
    two_controllers: tuple[Sluice, Sluice, int], tmp_path: Path
) -> None:
    a, b, control_port = two_controllers
    token = a.token("gw-1", "gateway")
    before = {i["id"] for i in a.ready("chat")}
    control = f"http://127.0.0.1:{control_port}"
    with remote_gateway([control], token, 2, tmp_path, gateway_id="gw-1") as gw:
        # the two gateway processes are the whole data plane: they hold all 4 slots
        a.wait_for(
            "the two gateways holding each instance's slots",
            lambda: (
                set(dataplane(a)["gateways"]) == {"gw-1-w0", "gw-1-w1"}
                and slots(dataplane(a), "chat") == 8
            ),
            timeout=15,
        )
        load = OpenLoop(gw.endpoint)
        sender = threading.Thread(target=load.run, kwargs={"rate": 15, "seconds": 15})
        sender.start()
        time.sleep(4)
        audited = a.cli("audit", "--limit", "200")
        assert a.proc is not None
        a.proc.kill()  # kill -9: no goodbye, its lease runs out
        sender.join()
        results = load.results()
        b.wait_for("b leads", lambda: any(x.startswith("leader:") for x in b.output), timeout=30)
        token_file = b.home / "admin.token"
        token_file.write_text((a.home / "admin.token").read_text())
        token_file.chmod(0o600)
        # the gateways find the new leader on the same URL and sync with it
        b.wait_for(
            "the gateways sync with b",
            lambda: {"gw-1-w0", "gw-1-w1"} <= set(dataplane(b)["gateways"]),
        )
    codes = [c for c, _ in results]
    assert len(codes) == 225 and all(c == 200 for c in codes), [c for c in codes if c != 200]
    # b adopted the same instances: none started twice, none lost
    assert {i["id"] for i in b.ready("chat")} == before
    launches = [e for e in b.cli("events", "chat", "--limit", "200") if e["kind"] == "launch"]
    assert len(launches) == 2, launches
    audit_after = b.cli("audit", "--limit", "200")
    actions = [e["action"] for e in audit_after]
    assert actions.count("lead") == 2 and "token-create" in actions
    assert {e["id"] for e in audited} <= {e["id"] for e in audit_after}  # no audit row lost
