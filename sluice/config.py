"""Settings read once at start-up (environment and flags), then passed down; never at import."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Settings"]


@dataclass(frozen=True, slots=True)
class Settings:
    home: Path
    """State directory: state.db (unless `database_url`), instance logs, control.json (where
    the API listens)."""
    control_url: str | None = None
    token: str | None = None
    """The CLI's API token: --token, else $SLUICE_TOKEN, else `home/admin.token` if this
    user can read it (the machine that runs `sluice up`, like a kubeconfig)."""
    database_url: str | None = None
    """$SLUICE_DATABASE_URL: the state database (e.g. postgresql+psycopg://USER:PASSWORD@HOST/DB)
    when it is not the SQLite file `home/state.db`. It may hold a password: never print it
    (`sluice.store.redacted` hides it)."""

    @classmethod
    def from_env(
        cls, home: str | None = None, control_url: str | None = None, token: str | None = None
    ) -> Settings:
        root = home or os.environ.get("SLUICE_HOME") or str(Path.home() / ".sluice")
        path = Path(root).expanduser().resolve()
        url = control_url or os.environ.get("SLUICE_CONTROL_URL")
        return cls(
            home=path,
            control_url=url,
            token=token or os.environ.get("SLUICE_TOKEN"),
            database_url=os.environ.get("SLUICE_DATABASE_URL") or None,
        )

    def __repr__(self) -> str:
        # The token and the database URL's password stay out of logs and tracebacks.
        return f"Settings(home={str(self.home)!r}, control_url={self.control_url!r})"

    @property
    def control_file(self) -> Path:
        return self.home / "control.json"

    @property
    def access_log(self) -> Path:
        return self.home / "access.log"

    @property
    def admin_token_file(self) -> Path:
        return self.home / "admin.token"

    def api_token(self) -> str | None:
        if self.token:
            return self.token.strip()
        try:
            return self.admin_token_file.read_text().strip() or None
        except OSError:
            return None
