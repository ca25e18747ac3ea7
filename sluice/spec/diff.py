"""Revision diffs: a unified diff of the YAML an operator applied against the previous one."""

from __future__ import annotations

import difflib

__all__ = ["revision_diff"]


def revision_diff(previous: str | None, current: str, number: int) -> str:
    before = (previous or "").splitlines(keepends=True)
    after = current.splitlines(keepends=True)
    lines = difflib.unified_diff(
        before, after, fromfile=f"revision {number - 1}", tofile=f"revision {number}"
    )
    return "".join(lines)
