"""The store going away is an outage you can read (issue 33), part by part: the control API
answers 503 naming the store (a token check included), the CLI prints one line and exits
with its documented code whatever the control API answers or if it does not answer, a part
of `sluice up` stopped by the outage is retried until the store answers, and a state
directory on a read-only mount stops `sluice up` with one line."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import psycopg
import pytest
from sqlalchemy import exc as sa_exc
from typer.testing import CliRunner

import sluice.cli.client as client_module
from sluice.cli import serving
from sluice.control.api import build_control_api
from sluice.control.auth import Role
from sluice.control.tokens import TokenAdmin
from sluice.core import SystemClock
from sluice.store import Store, redacted

PASSWORD = "pw-c0ffee-5ecret"
PG_URL = f"postgresql+psycopg://sluice:{PASSWORD}@127.0.0.1:5432/fleet"
QUICKSTART = Path(__file__).parents[2] / "examples" / "quickstart.yaml"


def pg_gone() -> sa_exc.OperationalError:
    refused = (
        'connection failed: connection to server at "127.0.0.1", port 5432 failed: '
        "Connection refused\n\tIs the server running on that host and accepting TCP/IP "
        "connections?"
    )
    return sa_exc.OperationalError("SELECT ...", {}, psycopg.OperationalError(refused))


class NamedStore(Store):
    """A SQLite store that calls itself what a PostgreSQL one would (its URL, password
    hidden), so the answers can be checked for the name and against the password."""

    @property
    def location(self) -> str:
        return redacted(PG_URL)


@pytest.fixture
def control_api(tmp_path: Path) -> Iterator[tuple[httpx.AsyncClient, NamedStore, dict, list]]:
    """The control API on a real store, an admin token's headers, and the store errors the
    controller was told about."""
    store = NamedStore.open(f"sqlite:///{tmp_path / 'state.db'}")
    tokens = TokenAdmin(store, SystemClock())
    token, _ = asyncio.run(tokens.create("ops", Role.ADMIN, None, None, by="test"))
    told: list[BaseException] = []

    async def audit(*row: Any) -> None:
        pass

    controller = SimpleNamespace(store_refused=told.append, audit=audit, degraded=False)
    api = build_control_api(controller, None, store, tokens, allowed_hosts=["test"])  # type: ignore[arg-type]
    http = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=api, raise_app_exceptions=False),
        base_url="http://test",
    )
    try:
        yield http, store, {"Authorization": f"Bearer {token}"}, told
    finally:
        asyncio.run(http.aclose())
        store.close()


def assert_store_unavailable(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 503, r.text
    assert r.headers["retry-after"] == "5"
    assert PASSWORD not in r.text
    error: dict[str, Any] = r.json()["error"]
    assert error["code"] == "store_unavailable"
    assert error["store"] == "postgresql+psycopg://sluice:***@127.0.0.1:5432/fleet"
    assert error["message"].startswith(f"the state store ({error['store']}) does not answer: ")
    assert error["message"].endswith("; the data plane keeps serving; retry shortly")
    return error


def test_a_token_check_without_the_store_is_a_503_naming_it(
    control_api: tuple[httpx.AsyncClient, NamedStore, dict, list],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    http, store, auth, _ = control_api

    def gone(*args: Any, **kwargs: Any) -> Any:
        raise pg_gone()

    async def calls() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        ok = await http.get("/v1/revisions", headers=auth)
        monkeypatch.setattr(store, "token_by_digest", gone)
        away = await http.get("/v1/revisions", headers=auth)
        bad = await http.get("/v1/revisions", headers={"Authorization": "Bearer nope"})
        return ok, away, bad

    ok, away, bad = asyncio.run(calls())
    assert ok.status_code == 200
    error = assert_store_unavailable(away)  # not 401: the token may be good, not 500
    assert "Connection refused" in error["reason"]
    assert bad.status_code == 401  # a malformed token needs no store to be refused


def test_a_route_whose_store_call_fails_answers_503_and_a_bug_500(
    control_api: tuple[httpx.AsyncClient, NamedStore, dict, list],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    http, store, auth, told = control_api
    errors: list[BaseException] = [
        pg_gone(),
        sa_exc.IntegrityError("INSERT", {}, sqlite3.IntegrityError("UNIQUE constraint failed")),
    ]

    def failing(*args: Any, **kwargs: Any) -> Any:
        raise errors.pop(0)

    monkeypatch.setattr(store, "list_revisions", failing)

    async def calls() -> tuple[httpx.Response, httpx.Response]:
        return (
            await http.get("/v1/revisions", headers=auth),
            await http.get("/v1/revisions", headers=auth),
        )

    away, bug = asyncio.run(calls())
    assert_store_unavailable(away)
    assert len(told) == 1  # the controller's status turns degraded
    assert bug.status_code == 500


def test_a_locked_sqlite_store_answers_503(
    control_api: tuple[httpx.AsyncClient, NamedStore, dict, list], tmp_path: Path
) -> None:
    http, _, auth, _ = control_api
    holder = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock past busy_timeout
    try:
        body = {"name": "viewer-1", "role": "viewer"}
        r = asyncio.run(http.post("/v1/tokens", json=body, headers=auth))
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert r.status_code == 503 and r.headers["retry-after"] == "5"
    assert r.json()["error"]["message"].startswith(
        "the state store (postgresql+psycopg://sluice:***@127.0.0.1:5432/fleet) is busy (locked)"
    )


# -- the CLI: one line and a documented exit code, whatever comes back ----------------------


@contextlib.contextmanager
def fake_control_api(status: int, body: bytes, content_type: str) -> Iterator[str]:
    """An HTTP server on 127.0.0.1 answering every request with `status` and `body`."""

    class Answer(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def sluice(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SLUICE_HOME": str(home), "SLUICE_TOKEN": "slc_" + "x" * 43}
    env.pop("SLUICE_CONTROL_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "sluice", *args], capture_output=True, text=True, env=env, timeout=60
    )


def one_line(r: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in r.stderr, r.stderr
    (line,) = r.stderr.strip().splitlines()
    return line


STORE_AWAY = {
    "error": {
        "code": "store_unavailable",
        "message": "the state store (postgresql+psycopg://u:***@db:5432/s) does not answer: "
        "connection refused; the data plane keeps serving; retry shortly",
        "store": "postgresql+psycopg://u:***@db:5432/s",
    }
}


def test_the_cli_on_a_503_of_the_store_prints_one_line_and_exits_7(tmp_path: Path) -> None:
    with fake_control_api(503, json.dumps(STORE_AWAY).encode(), "application/json") as url:
        r = sluice("status", "--control", url, home=tmp_path)
        assert r.returncode == 7
        assert one_line(r) == f"error: {STORE_AWAY['error']['message']}"
        r = sluice("scale", "chat", "2", "--reason", "x", "--control", url, home=tmp_path)
        assert r.returncode == 7 and one_line(r).startswith("error: the state store")
        r = sluice("scale", "chat", "2", "--reason", "x", "--json", "--control", url, home=tmp_path)
        assert r.returncode == 7 and json.loads(r.stdout) == STORE_AWAY


def test_the_cli_on_a_control_api_that_does_not_answer_exits_6(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    r = sluice("status", "--control", url, home=tmp_path)
    assert r.returncode == 6
    line = one_line(r)
    assert line.startswith(f"error: cannot reach the control API at {url}: ")
    assert "Connection refused" in line
    r = sluice("status", "--json", "--control", url, home=tmp_path)
    assert r.returncode == 6 and json.loads(r.stdout)["error"]["code"] == "unavailable"


def test_the_cli_on_a_crash_page_prints_one_line(tmp_path: Path) -> None:
    with fake_control_api(500, b"Internal Server Error", "text/plain") as url:
        r = sluice("status", "--control", url, home=tmp_path)
    assert r.returncode == 1
    assert one_line(r) == (
        f"error: the control API at {url} answered HTTP 500: Internal Server Error"
    )


def test_the_cli_on_a_control_api_that_hangs_exits_6(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sluice.cli.main import app

    monkeypatch.setattr(client_module, "TIMEOUT_S", 0.5)
    with socket.socket() as listening:  # accepts (the backlog), never answers
        listening.bind(("127.0.0.1", 0))
        listening.listen(8)
        url = f"http://127.0.0.1:{listening.getsockname()[1]}"
        r = CliRunner().invoke(
            app, ["status", "--control", url], env={"SLUICE_HOME": str(tmp_path)}
        )
    assert r.exit_code == 6, r.output
    assert f"the control API at {url} did not answer within 0.5 s" in " ".join(r.output.split())


# -- a part of `sluice up` stopped by an outage is retried until the store answers ----------


@pytest.mark.asyncio
async def test_a_part_stopped_by_the_store_is_retried_until_it_answers_on_few_lines(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(serving, "STORE_RETRY_S", (0.01, 0.02))
    monkeypatch.setattr(serving, "BACK_AFTER_S", 0.2)
    monkeypatch.setattr(serving, "RESTARTS", 1)  # an outage is no crash: not counted
    caplog.set_level(logging.INFO, logger="sluice.up")
    stop = asyncio.Event()
    runs: list[int] = []

    async def drills(attempt: int) -> None:
        runs.append(attempt)
        if attempt < 8:
            raise pg_gone()
        await stop.wait()

    task = asyncio.create_task(
        serving.keep_serving("drill schedules", drills, stop, store=redacted(PG_URL))
    )
    for _ in range(200):
        if "runs again" in caplog.text:
            break
        await asyncio.sleep(0.02)
    stop.set()
    await asyncio.wait_for(task, 2)
    assert runs == list(range(9))
    lines = [r for r in caplog.records if r.name == "sluice.up"]
    assert [r.levelname for r in lines] == ["ERROR", "WARNING"]
    first, back = (r.getMessage() for r in lines)
    assert first.startswith(
        "drill schedules stopped: the state store "
        "(postgresql+psycopg://sluice:***@127.0.0.1:5432/fleet) does not answer: connection "
        'failed: connection to server at "127.0.0.1", port 5432 failed: Connection refused; '
        "retrying until it answers"
    )
    assert "runs again" in back and "8 failures" in back
    assert PASSWORD not in caplog.text and not any(r.exc_info for r in lines)


@pytest.mark.asyncio
async def test_an_outage_that_lasts_is_said_again_once_a_minute_with_a_count(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(serving, "STORE_RETRY_S", (0.01, 0.01))
    monkeypatch.setattr(serving, "REPEAT_LOG_S", 0.0)  # "a minute" passes at every failure
    caplog.set_level(logging.INFO, logger="sluice.up")
    stop = asyncio.Event()

    async def observer(attempt: int) -> None:
        if attempt == 3:
            stop.set()
        raise pg_gone()

    await asyncio.wait_for(serving.keep_serving("observer", observer, stop), 2)
    messages = [r.getMessage() for r in caplog.records if r.name == "sluice.up"]
    assert messages[0].startswith("observer stopped: the state store does not answer")
    assert [m.split("(")[1].split(" in")[0] for m in messages[1:]] == [
        "2 failures",
        "3 failures",
    ]


# -- a state directory on a read-only mount -------------------------------------------------


def test_sluice_up_on_a_read_only_state_directory_says_so_on_one_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "sluice.lock").write_text("")  # it was a state directory before it turned read-only
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1): cannot mount a read-only state directory")
    namespaces = ["-m"] if os.geteuid() == 0 else ["-r", "-m"]
    read_only = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" "$1" && '
    probe = subprocess.run(
        [unshare, *namespaces, "sh", "-c", read_only + 'exec touch "$1/x"', "sh", str(home)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if "Read-only file system" not in probe.stderr:
        pytest.skip(f"cannot mount a read-only state directory here: {probe.stderr.strip()}")
    env = {**os.environ, "SLUICE_HOME": str(home)}
    env.pop("SLUICE_DATABASE_URL", None)
    cmd = [sys.executable, "-m", "sluice", "up", "-f", str(QUICKSTART)]
    r = subprocess.run(
        [unshare, *namespaces, "sh", "-c", read_only + 'shift && exec "$@"', "sh", str(home), *cmd],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert r.returncode == 7, r.stderr
    line = one_line(r)
    assert line.startswith(f"error: the state directory {home} cannot be written (Read-only")
    assert "--home / $SLUICE_HOME" in line
