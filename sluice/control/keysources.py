"""Tenant keys a spec names by source (`api_keys_env`, `api_keys_file`), read on the
controller's machine: the I/O edge of the pure `spec.secrets.resolve_key_sources`."""

from __future__ import annotations

import os
from pathlib import Path

from sluice.spec import LoadedSpec, PlatformSpec
from sluice.spec.secrets import resolve_key_sources

__all__ = ["spec_with_key_sources"]


def spec_with_key_sources(loaded: LoadedSpec) -> PlatformSpec:
    """Tenant keys named by `api_keys_env` / `api_keys_file`, read here on the controller's
    machine (the spec names the source, never holds the keys) and kept as digests."""
    return resolve_key_sources(
        loaded.spec,
        os.environ,
        lambda path: Path(path).read_text(encoding="utf-8"),
        text=loaded.text,
        source=loaded.source,
    )
