"""The store going away is an outage you can read (issue 33): which database errors are an
outage (`sluice.store.outage`), the one line they become, the log filter that keeps their
tracebacks out, the access log on a full disk, and a state directory that cannot be written."""

from __future__ import annotations

import asyncio
import errno
import io
import json
import logging
import os
import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client.core import CollectorRegistry
from prometheus_client.exposition import generate_latest
from sqlalchemy import exc as sa_exc

import sluice.gateway.accesslog as accesslog_module
from sluice.cli import common as cli_common
from sluice.cli.serving import StoreOutageFilter
from sluice.cli.statedir import hold_state_dir
from sluice.core import StoreUnavailable, Unavailable
from sluice.gateway.accesslog import REPEAT_LOG_S, AccessLog
from sluice.policy.route_choice import ExchangeRecord
from sluice.store import outage_reason, redacted, store_unavailable

PASSWORD = "pw-c0ffee-5ecret"
PG_URL = f"postgresql+psycopg://sluice:{PASSWORD}@db.internal:5432/fleet"
REFUSED = (
    'connection failed: connection to server at "10.0.0.7", port 5432 failed: Connection '
    "refused\n\tIs the server running on that host and accepting TCP/IP connections?"
)


def pg_gone() -> sa_exc.OperationalError:
    """What SQLAlchemy raises when PostgreSQL does not answer."""
    return sa_exc.OperationalError("SELECT 1", {}, psycopg.OperationalError(REFUSED))


def sqlite_error(text: str) -> sa_exc.OperationalError:
    return sa_exc.OperationalError("INSERT ...", {}, sqlite3.OperationalError(text))


# -- which errors are an outage, and the line they become ----------------------------------


def test_postgresql_away_is_a_503_naming_the_store_without_its_password() -> None:
    found = store_unavailable(pg_gone(), redacted(PG_URL))
    assert isinstance(found, StoreUnavailable) and isinstance(found, Unavailable)
    assert (found.http_status, found.exit_code, found.code) == (503, 7, "store_unavailable")
    assert found.retry_after_s == 5
    body = json.dumps(found.to_json())
    assert PASSWORD not in body
    assert found.message == (
        "the state store (postgresql+psycopg://sluice:***@db.internal:5432/fleet) does not "
        'answer: connection failed: connection to server at "10.0.0.7", port 5432 failed: '
        "Connection refused; the data plane keeps serving; retry shortly"
    )
    assert "\n" not in found.message  # one line: the driver's hint is left out
    assert found.to_json()["error"]["store"] == redacted(PG_URL)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("database is locked", "is busy (locked)"),
        ("attempt to write a readonly database", "does not take writes (read-only)"),
        ("database or disk is full", "does not take writes (disk full)"),
        ("disk I/O error", "does not answer"),
        ("unable to open database file", "does not answer"),
    ],
)
def test_sqlite_outages_say_what_is_wrong(text: str, problem: str) -> None:
    for exc in (sqlite_error(text), sqlite3.OperationalError(text)):
        found = store_unavailable(exc, "sqlite:////var/lib/sluice/state.db")
        assert found is not None
        assert found.detail["problem"] == problem and found.detail["reason"] == text


def test_other_ways_the_store_is_away_are_outages_too() -> None:
    pool = sa_exc.TimeoutError("QueuePool limit of size 5 overflow 10 reached, timeout 30.00")
    closed = sa_exc.InterfaceError("SELECT 1", {}, psycopg.InterfaceError("the connection is lost"))
    read_only = sa_exc.InternalError(
        "INSERT", {}, psycopg.errors.ReadOnlySqlTransaction("cannot execute INSERT")
    )
    for exc in (pool, closed, read_only, psycopg.OperationalError("server closed the connection")):
        assert outage_reason(exc) is not None, exc
    wrapped = RuntimeError("the tick failed")
    wrapped.__cause__ = pg_gone()  # raised `from` an outage: still one
    assert outage_reason(wrapped) is not None
    assert outage_reason(StoreUnavailable("x", reason="gone")) == "gone"


def test_a_bug_is_no_outage() -> None:
    for exc in (
        sa_exc.IntegrityError("INSERT", {}, sqlite3.IntegrityError("UNIQUE constraint failed")),
        sa_exc.ProgrammingError("SELEC", {}, sqlite3.ProgrammingError("syntax error")),
        RuntimeError("boom"),
        OSError(errno.ENOSPC, "No space left on device"),  # not the store's: the caller's
    ):
        assert outage_reason(exc) is None and store_unavailable(exc, "x") is None


# -- the CLI's one line ----------------------------------------------------------------------


def test_the_cli_prints_an_outage_on_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    found = store_unavailable(pg_gone(), redacted(PG_URL))
    assert found is not None
    cli_common.print_error(found)
    cli_common.print_error(Unavailable("a driver's\n\ttwo lines [bold]and markup[/bold]"))
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: the state store (postgresql")
    assert lines[1] == "error: a driver's two lines [bold]and markup[/bold]"


def test_a_command_reading_the_store_gets_the_outage_not_a_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import typer

    def reads_the_store() -> None:
        raise pg_gone()

    with pytest.raises(typer.Exit) as ended:
        cli_common.run(False, reads_the_store, print)
    assert ended.value.exit_code == 7
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: the state store does not answer: connection failed")

    def a_bug() -> None:
        raise KeyError("not an outage")

    with pytest.raises(KeyError):  # a bug still shows its traceback
        cli_common.run(False, a_bug, print)


# -- the log filter: no traceback for an outage, repeats once a minute -----------------------


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


def test_the_filter_drops_an_outages_traceback_and_spaces_its_repeats() -> None:
    now = [0.0]
    handler = Collect()
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    handler.addFilter(StoreOutageFilter(lambda: now[0]))
    logger = logging.getLogger("test.store_outage.loop")
    logger.propagate = False
    logger.addHandler(handler)
    try:
        for _ in range(30):  # a loop failing every second
            try:
                raise pg_gone()
            except Exception:
                logger.exception("reading failed; next one in %gs", 1.0)
            now[0] += 1.0
        try:
            raise RuntimeError("a bug")
        except Exception:
            logger.exception("reading failed; next one in %gs", 1.0)
        now[0] = 61.0
        try:
            raise pg_gone()
        except Exception:
            logger.exception("reading failed; next one in %gs", 1.0)
    finally:
        logger.removeHandler(handler)
    first, bug, again = handler.lines
    assert first.startswith("test.store_outage.loop: reading failed; next one in 1s [the state")
    assert "Connection refused" in first and "Traceback" not in first
    assert "RuntimeError: a bug" in bug and "Traceback" in bug  # a bug keeps its traceback
    assert "Traceback" not in again and "29 like it left out" in again


# -- the access log on a full disk -----------------------------------------------------------


def exchange(n: int) -> ExchangeRecord:
    return ExchangeRecord(
        method=b"POST",
        url=b"/v1/chat/completions",
        status=200,
        tenant="search",
        model="m",
        priority="normal",
        route="r",
        group="chat",
        instance="chat-1",
        via=None,
        mirror=None,
        retried=False,
        error_code=None,
        request_id=b"rid-%d" % n,
        t0=0.001 * n,
        queue_ms=0.0,
        latency_s=0.01,
        served_s=0.01,
        bytes_out=10,
        answer=200,
    )


class FullDisk(io.StringIO):
    """A text stream whose writes fail with ENOSPC while `full`."""

    def __init__(self) -> None:
        super().__init__()
        self.full = True

    def write(self, s: str) -> int:
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(s)


@pytest.mark.asyncio
async def test_a_full_disk_costs_lines_counted_and_one_log_line_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="sluice.gateway.accesslog")
    now = [0.0]
    stream = FullDisk()
    log = AccessLog(stream, monotonic=lambda: now[0])
    for n in range(200):  # 200 requests in 20 s on a full disk: no exception reaches them
        log.record(exchange(n))
        log.flush()
        now[0] += 0.1
    assert log.dropped == 200 and log.write_errors == 200
    said = [r for r in caplog.records if r.name == "sluice.gateway.accesslog"]
    assert len(said) == 1 and said[0].levelno == logging.ERROR and not said[0].exc_info
    assert "cannot be written (No space left on device)" in said[0].getMessage()
    now[0] = REPEAT_LOG_S + 1.0
    log.record(exchange(200))
    assert "201 line(s) lost in 61 s" in caplog.records[-1].getMessage()
    stream.full = False  # space freed
    log.record(exchange(201))
    log.flush()
    assert "written again" in caplog.records[-1].getMessage()
    assert [json.loads(line)["request_id"] for line in stream.getvalue().splitlines()] == [
        "rid-201"
    ]
    registry = CollectorRegistry()
    log.register(registry)
    text = generate_latest(registry).decode()
    assert "sluice_gateway_access_log_dropped_lines_total 201.0" in text
    assert "sluice_gateway_access_log_write_errors_total 201.0" in text


@pytest.mark.asyncio
async def test_a_file_cut_mid_line_by_a_full_disk_keeps_whole_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "access.log"
    real_write = os.write
    room = [0]  # bytes the disk still takes

    def write(fd: int, data: Any) -> int:
        if room[0] <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = real_write(fd, bytes(data[: room[0]]))
        room[0] -= n
        return n

    monkeypatch.setattr(accesslog_module.os, "write", write)
    probe = io.StringIO()
    AccessLog(probe).record(exchange(0))
    room[0] = len(probe.getvalue()) * 3 // 2  # a line and a half
    with path.open("a", buffering=1 << 16, encoding="utf-8") as stream:
        log = AccessLog(stream)
        for n in range(5):
            log.record(exchange(n))
        log.flush()  # the first line fits, the second is cut: 4 lost
        assert log.dropped == 4
        for n in range(5, 8):
            log.record(exchange(n))
        log.flush()  # still full: 3 more
        assert log.dropped == 7
        room[0] = 1 << 20  # space freed
        for n in range(8, 10):
            log.record(exchange(n))
        log.flush()
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["request_id"] == "rid-0"
    assert not lines[1].endswith("}")  # the cut line ends on its own line
    assert [json.loads(line)["request_id"] for line in lines[2:]] == ["rid-8", "rid-9"]
    messages = [r.getMessage() for r in caplog.records if r.name == "sluice.gateway.accesslog"]
    assert len(messages) == 2 and "7 line(s) were lost" in messages[1]


@pytest.mark.asyncio
async def test_the_access_log_writes_a_healthy_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "access.log"
    with path.open("a", buffering=1 << 16, encoding="utf-8") as stream:
        log = AccessLog(stream)
        for n in range(3):
            log.record(exchange(n))
        await asyncio.sleep(0.3)  # the timed flush
        assert len(path.read_text().splitlines()) == 3
        log.record(exchange(3))
        log.flush()
    assert len(path.read_text().splitlines()) == 4 and log.dropped == 0


# -- a state directory that cannot be written ------------------------------------------------


def test_a_read_only_state_directory_is_one_line_naming_it_and_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()

    def read_only(self: Path, mode: int) -> None:
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "chmod", read_only)
    with pytest.raises(StoreUnavailable) as raised:
        hold_state_dir(home, home / "control.json")
    message = raised.value.message
    assert message.startswith(f"the state directory {home} cannot be written (Read-only file")
    assert "--home / $SLUICE_HOME" in message and "\n" not in message
    assert raised.value.exit_code == 7


def test_a_full_state_directory_says_to_free_space(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sluice.cli.statedir as statedir

    def full(fd: int, data: Any) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(statedir.os, "write", full)
    with pytest.raises(StoreUnavailable, match=r"No space left on device.*free space"):
        hold_state_dir(tmp_path, tmp_path / "control.json")
    assert [p.name for p in tmp_path.iterdir()] == ["sluice.lock"]  # no probe left behind
