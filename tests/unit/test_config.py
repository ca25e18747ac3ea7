"""Settings from the environment: $SLUICE_DATABASE_URL picks the state database (empty or
unset: the SQLite file in the state directory), and no repr shows its password or a token."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.config import Settings
from sluice.store import redacted


def test_the_database_url_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    url = "postgresql+psycopg://sluice:s3cret@db.example:5432/fleet"
    monkeypatch.setenv("SLUICE_DATABASE_URL", url)
    monkeypatch.setenv("SLUICE_TOKEN", "slc_secret_token")
    settings = Settings.from_env(str(tmp_path))
    assert settings.database_url == url
    assert "s3cret" not in repr(settings) and "slc_secret_token" not in repr(settings)
    assert redacted(url) == "postgresql+psycopg://sluice:***@db.example:5432/fleet"
    monkeypatch.setenv("SLUICE_DATABASE_URL", "")
    assert Settings.from_env(str(tmp_path)).database_url is None
    monkeypatch.delenv("SLUICE_DATABASE_URL")
    assert Settings.from_env(str(tmp_path)).database_url is None
