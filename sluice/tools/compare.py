"""`sluice compare`: send one fixed suite of requests to two targets (old and new version) and
report how their answers differ, item by item and in aggregate (requirement C5).

The engine is an async shell (`sluice.comparing`: httpx, bounded concurrency per target)
around the pure `sluice.policy.compare`, which holds the suite's format, the scoring and the
report's versioned shape ("sluice.compare/1"); the controller's compare run at a rollout's start
sends the same requests through the same shell (`sluice.comparing`), so both reports read
alike.
A target is `group:NAME` (through the gateway, header `x-sluice-group`, operator tenants
only) or a base URL `http://host:port` (one instance, no gateway).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from sluice.comparing import run_suite
from sluice.core.errors import SpecError, SpecIssue, Unavailable
from sluice.policy.compare import (
    SCHEMA,
    Answer,
    CompareOptions,
    Suite,
    SuiteItem,
    Target,
    parse_suite,
    read_answer,
    score_item,
    summarise,
)

__all__ = [
    "SCHEMA",
    "Answer",
    "CompareOptions",
    "SuiteItem",
    "Target",
    "compare",
    "load_suite",
    "parse_target",
    "read_answer",
    "score_item",
    "summarise",
]


# --- the suite and the targets -------------------------------------------------------------


def load_suite(path: Path) -> list[SuiteItem]:
    """Parse a JSONL suite; every bad line becomes a SpecIssue naming file and line (exit 2)."""
    return list(_read_suite(path).items)


def _read_suite(path: Path) -> Suite:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SpecError(
            [SpecIssue("--suite", f"cannot read the suite: {exc}", str(path))]
        ) from None
    return parse_suite(data, str(path))


def parse_target(text: str, option: str, endpoint: str | None) -> Target:
    """`group:NAME` (needs the gateway `endpoint`) or `http(s)://host:port` (an instance)."""
    if text.startswith("group:"):
        group = text.removeprefix("group:").strip()
        if not group:
            raise SpecError([SpecIssue(option, "group:NAME needs a group name", "<command line>")])
        if endpoint is None:
            raise Unavailable(
                f"{option} {text}: no gateway endpoint; pass --endpoint URL or start sluice "
                "(`sluice up -f SPEC`) so control.json names it"
            )
        return Target(text, endpoint.rstrip("/"), group)
    if text.startswith(("http://", "https://")):
        return Target(text, text.rstrip("/").removesuffix("/v1"))
    message = f"{text!r}: expected group:NAME or a base URL such as http://127.0.0.1:8001"
    raise SpecError([SpecIssue(option, message, "<command line>")])


async def compare(
    suite_path: Path,
    a: Target,
    b: Target,
    options: CompareOptions,
    transport: httpx.AsyncBaseTransport | None = None,
) -> dict[str, Any]:
    """Send the suite to both targets (concurrently, `options.concurrency` each) and score.

    Raises SpecError for a bad suite (exit 2) and Unavailable when a target answered no
    request at all (exit 6): a wrong URL should not read as "everything differs"."""
    return await run_suite(_read_suite(suite_path), a, b, options, transport)
