"""End to end (issue 33): PostgreSQL stopped for 20 s under load is an outage you can read.

Real processes on 127.0.0.1: a private PostgreSQL (`.ci/postgres`, in its own directory on a
free port, since the test stops it), `sluice controller` on it, and `sluice gateway` syncing
from the controller, under a bounded 10 req/s load. While the server is stopped: the data
plane loses no request (the gateway serves its last routes), the control API answers 503
with a JSON body naming the store, `sluice status` and `sluice scale` print one line and exit
7, and the controller's log holds no traceback per failure. Once the server is back: the
control API answers 200 again and `sluice scale` works (the controller recovered alone).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, make_url
from sqlalchemy.pool import NullPool

from sluice.store import redacted
from tests.e2e.conftest import (
    OpenLoop,
    Sluice,
    free_port,
    kill_workers_of,
    remote_gateway,
    shared_secrets_key,
)

pytestmark = pytest.mark.serial  # it measures an outage's length: run alone (Makefile)

CI_POSTGRES = Path(__file__).parents[2] / ".ci" / "postgres"
OUTAGE_S = 20.0
RATE = 10.0  # requests per second through the gateway

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
      m-chat:
        runtime: sim
        sim: {startup_s: 0.2, service_time: {kind: fixed, seconds: 0.02}, memory_gb: 1}
    resources: {pool: local, accelerators: 1, memory_gb: 1}
    max_concurrency: 8
    replicas: 1
tenants:
  - {name: search, api_keys: [sk-search-b095adcc724f4f8a]}
"""


@dataclass
class PrivatePostgres:
    """A PostgreSQL server of this test alone: `url` names a database made for it."""

    directory: Path
    port: int
    url: str

    def stop(self) -> None:
        subprocess.run(["bash", str(CI_POSTGRES), "stop", str(self.directory)], check=True)

    def start_again(self) -> None:
        """Start the stopped server on its data with the options `.ci/postgres start` gave
        it (that script only makes new clusters)."""
        (bin_dir,) = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version)[-1:]
        options = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.directory} "
            "-c max_connections=300 -c fsync=off"
        )
        cmd = [f"{bin_dir}/pg_ctl", "-D", f"{self.directory}/data"]
        cmd += ["-l", f"{self.directory}/server.log", "-w", "start", "-o", options]
        if os.geteuid() == 0:  # the cluster belongs to `postgres` (see .ci/postgres)
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def _version(path: str) -> tuple[int, ...]:
    return tuple(int(p) for p in Path(path).parent.name.split(".") if p.isdigit())


def _skip(why: str) -> None:
    """Skip here; fail under CI, where a PostgreSQL that cannot start must not pass unseen
    (the rule of tests/databases.py)."""
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    if not glob.glob("/usr/lib/postgresql/*/bin/postgres"):
        _skip("no PostgreSQL server binaries (/usr/lib/postgresql/*/bin)")
    # under /tmp, not pytest's tmp_path: the server's user must be able to reach it
    directory = Path(tempfile.mkdtemp(prefix="sluice-pg-outage-", dir="/tmp"))
    port = free_port()
    started = subprocess.run(
        ["bash", str(CI_POSTGRES), "start", str(directory), str(port)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if started.returncode != 0:
        shutil.rmtree(directory, ignore_errors=True)
        _skip(f".ci/postgres cannot run here: {started.stderr.strip()[-300:]}")
    server = started.stdout.strip()
    admin = create_engine(server, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql('CREATE DATABASE "sluice"')
        url = server.rsplit("/", 1)[0] + "/sluice"
        yield PrivatePostgres(directory, port, url)
    finally:
        admin.dispose()
        with contextlib.suppress(subprocess.CalledProcessError):
            subprocess.run(
                ["bash", str(CI_POSTGRES), "stop", str(directory)],
                check=True,
                capture_output=True,
                timeout=60,
            )
        shutil.rmtree(directory, ignore_errors=True)


def sluice_cli(s: Sluice, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluice", *args],
        capture_output=True,
        text=True,
        env={**s.env(), "COLUMNS": "80"},  # narrow: a wrapped line would show
        timeout=60,
    )


def one_line(r: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in r.stderr, r.stderr
    (line,) = r.stderr.strip().splitlines()
    return line


def test_postgresql_stopped_under_load_is_an_outage_you_can_read(
    tmp_path: Path, private_postgres: PrivatePostgres
) -> None:
    pg = private_postgres
    environ = {"SLUICE_DATABASE_URL": pg.url, **shared_secrets_key(tmp_path)}
    home = tmp_path / "controller"
    spec = tmp_path / "platform.yaml"
    spec.write_text(SPEC)
    s = Sluice(home, spec, environ=environ, command="controller")
    s.start()
    try:
        s.wait_for("chat ready", lambda: len(s.ready("chat")) == 1, timeout=60)
        token = s.token("gw-1", "gateway")
        admin = s.control_headers()
        with remote_gateway([s.control_url], token, 1, tmp_path) as gw:
            load = OpenLoop(gw.endpoint, model="m-chat")
            total_s = 5.0 + OUTAGE_S + 10.0
            sending = threading.Thread(target=load.run, args=(RATE, total_s), daemon=True)
            sending.start()
            time.sleep(5.0)

            pg.stop()
            stopped_at = time.monotonic()
            log_before = len(s.output)
            time.sleep(3.0)  # every part of the controller has met the outage by now
            r = httpx.get(s.control_url + "/v1/status", headers=admin, trust_env=False)
            assert r.status_code == 503, r.text
            assert r.headers["retry-after"] == "5"
            error = r.json()["error"]
            assert error["code"] == "store_unavailable"
            assert error["store"] == redacted(pg.url)  # named, its password hidden
            assert str(make_url(pg.url).password) not in r.text
            assert error["message"].startswith(f"the state store ({redacted(pg.url)}) ")

            status = sluice_cli(s, "status")
            assert status.returncode == 7
            assert one_line(status).startswith("error: the state store (postgresql")
            scale = sluice_cli(s, "scale", "chat", "2", "--reason", "during the outage")
            assert scale.returncode == 7 and "data plane keeps serving" in one_line(scale)

            time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - stopped_at)))
            during = s.output[log_before:]
            pg.start_again()

            def answers() -> bool:
                got = httpx.get(s.control_url + "/v1/status", headers=admin, trust_env=False)
                return got.status_code == 200

            s.wait_for("the control API answers again", answers, timeout=60)
            scale = sluice_cli(s, "scale", "chat", "2", "--reason", "after the outage")
            assert scale.returncode == 0, scale.stderr
            s.wait_for("a second instance", lambda: len(s.ready("chat")) == 2, timeout=90)
            sending.join(total_s + 30)
            results = load.results()
        failed = [code for code, _ in results if code != 200]
        assert len(results) == int(RATE * total_s) and failed == [], failed
        # no traceback per failure: the outage said on a few lines, not one per second
        assert sum("Traceback" in line for line in during) <= 2, "".join(during)
    finally:
        s.kill()
        kill_workers_of(home)
