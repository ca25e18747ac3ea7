"""The one shape of a name in a spec: a pool, group, tenant, template, rollout or drill."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

__all__ = ["NAME_PATTERN", "Name"]

NAME_PATTERN = r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$"
Name = Annotated[str, Field(pattern=NAME_PATTERN)]
"""Lowercase letters, digits, '.', '_' and '-'; starts and ends alphanumeric; <= 63 chars."""
