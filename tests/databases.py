"""The databases a store test runs on: a SQLite file in the test's directory, and a fresh
PostgreSQL database on the server `$SLUICE_TEST_DATABASE_URL` names (`.ci/run` starts one on
127.0.0.1), made for one test and dropped after it, so tests pass alone, in any order and
side by side under pytest-xdist.

Without that variable the PostgreSQL cases skip, except under CI, where they fail: there a
missing server must not pass unnoticed (the rule tests/e2e/test_prometheus.py follows).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from sluice.store import Store
from sluice.store.store import database_url

__all__ = ["BACKENDS", "SERVER_ENV", "Database", "database_for", "postgres_database"]

SERVER_ENV = "SLUICE_TEST_DATABASE_URL"
BACKENDS = ("sqlite", "postgresql")


@dataclass(frozen=True, slots=True)
class Database:
    """One empty database: `url` (password included) opens it as often as a test likes."""

    backend: str
    url: str

    def open(self) -> Store:
        return Store.open(self.url)

    def raw(self) -> bytes:
        """Everything the database holds, as bytes to search (e.g. for a secret that must
        not be stored): the SQLite files (WAL included), or every PostgreSQL row as text."""
        if self.backend == "sqlite":
            path = Path(self.url.removeprefix("sqlite:///"))
            return b"".join(p.read_bytes() for p in sorted(path.parent.glob(f"{path.name}*")))
        engine = create_engine(self.url, poolclass=NullPool)
        try:
            with engine.connect() as conn:
                tables = conn.execute(
                    text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
                ).scalars()
                rows = [
                    row
                    for table in list(tables)
                    for row in conn.execute(text(f'SELECT t::text FROM "{table}" t')).scalars()
                ]
        finally:
            engine.dispose()
        return "\n".join(rows).encode()

    def __repr__(self) -> str:
        return f"Database({self.backend})"


def postgres_server() -> URL:
    """The test server's URL (any database on it; its role may CREATE DATABASE)."""
    raw = os.environ.get(SERVER_ENV)
    if not raw:
        why = (
            f"no PostgreSQL server for the store tests: set ${SERVER_ENV} to "
            "postgresql+psycopg://USER:PASSWORD@127.0.0.1:PORT/postgres, a role that may "
            "CREATE DATABASE (.ci/run starts one with the Debian postgresql package)"
        )
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return database_url(raw)


@contextlib.contextmanager
def postgres_database() -> Iterator[str]:
    """The URL of a new, empty database on the test server; dropped afterwards, with any
    connection a test left open."""
    server = postgres_server()
    name = f"sluice_test_{secrets.token_hex(8)}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        try:
            yield server.set(database=name).render_as_string(hide_password=False)
        finally:
            _drop(admin, name)
    finally:
        admin.dispose()


def _drop(admin: Engine, name: str) -> None:
    """DROP ... WITH (FORCE) ends the test's own sessions, but not an autovacuum worker
    (that needs superuser): one that came by meanwhile is waited out (`.ci/postgres` runs
    the server with autovacuum off; a server of one's own may not)."""
    for attempt in range(50):
        try:
            with admin.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            return
        except DBAPIError as exc:
            if "pg_signal_backend" not in str(exc) or attempt == 49:
                raise
            time.sleep(0.2)


@contextlib.contextmanager
def database_for(backend: str, directory: Path) -> Iterator[Database]:
    """An empty database of `backend`; the SQLite one is a file in `directory`."""
    if backend == "sqlite":
        directory.mkdir(parents=True, exist_ok=True)
        yield Database("sqlite", f"sqlite:///{directory / 'state.db'}")
    elif backend == "postgresql":
        with postgres_database() as url:
            yield Database("postgresql", url)
    else:
        raise ValueError(f"backend {backend!r}: one of {', '.join(BACKENDS)}")
