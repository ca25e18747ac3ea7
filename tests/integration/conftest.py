"""Fixtures of the integration tests: the store on each backend (see tests/databases.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.store import Store
from tests.databases import BACKENDS, Database, database_for


@pytest.fixture(params=BACKENDS)
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    """An empty database, once on SQLite and once on PostgreSQL."""
    with database_for(request.param, tmp_path / "db") as db:
        yield db


@pytest.fixture
def store(database: Database) -> Iterator[Store]:
    """A migrated store on `database`, closed after the test."""
    with database.open() as s:
        yield s
