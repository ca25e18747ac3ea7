"""Settings read once at start-up (environment and flags), then passed down; never at import."""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Settings"]


@dataclass(frozen=True, slots=True)
class Settings:
    home: Path
    """State directory: state.db, instance logs, control.json (where the API listens)."""
    actor: str
    """Who the audit log names for changes made from this process."""
    control_url: str | None = None

    @classmethod
    def from_env(cls, home: str | None = None, control_url: str | None = None) -> Settings:
        root = home or os.environ.get("SLUICE_HOME") or str(Path.home() / ".sluice")
        actor = os.environ.get("SLUICE_USER") or getpass.getuser()
        url = control_url or os.environ.get("SLUICE_CONTROL_URL")
        return cls(home=Path(root).expanduser().resolve(), actor=actor, control_url=url)

    @property
    def control_file(self) -> Path:
        return self.home / "control.json"

    @property
    def access_log(self) -> Path:
        return self.home / "access.log"
