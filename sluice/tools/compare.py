"""`sluice compare`: send one fixed suite of requests to two targets (old and new version) and
report how their answers differ, item by item and in aggregate (requirement C5).

The engine is an async shell (httpx, bounded concurrency per target) around the pure
`sluice.policy.compare`, which holds the suite's format, the scoring and the report's
versioned shape ("sluice.compare/1"); the controller's compare run at a rollout's start
(`sluice.control.compare`) is the other shell around it, so both reports read alike.
A target is `group:NAME` (through the gateway, header `x-sluice-group`, operator tenants
only) or a base URL `http://host:port` (one instance, no gateway).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from sluice.core.errors import SpecError, SpecIssue, Unavailable
from sluice.policy.compare import (
    PATHS,
    SCHEMA,
    Answer,
    CompareOptions,
    Suite,
    SuiteItem,
    Target,
    answer_version,
    parse_suite,
    read_answer,
    report,
    request_headers,
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


# --- the I/O shell -------------------------------------------------------------------------


async def _ask(
    client: httpx.AsyncClient,
    gate: asyncio.Semaphore,
    target: Target,
    item: SuiteItem,
    headers: dict[str, str],
) -> Answer:
    async with gate:
        started = time.perf_counter()
        try:
            response = await client.post(
                target.url + PATHS[item.kind], json=item.body, headers=headers
            )
        except httpx.HTTPError as exc:
            seconds = time.perf_counter() - started
            return Answer(None, seconds, error=f"{type(exc).__name__}: {exc}".rstrip(": "))
        seconds = time.perf_counter() - started
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text
    version = answer_version(item, response.headers.get("x-sluice-model-version"), body)
    return read_answer(item.kind, response.status_code, body, seconds, version)


async def _ask_all(
    client: httpx.AsyncClient, target: Target, items: Sequence[SuiteItem], options: CompareOptions
) -> list[Answer]:
    headers = request_headers(target, options.api_key)
    gate = asyncio.Semaphore(options.concurrency)
    return list(await asyncio.gather(*(_ask(client, gate, target, i, headers) for i in items)))


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
    suite = _read_suite(suite_path)
    started_at = time.time()
    started = time.perf_counter()
    async with httpx.AsyncClient(
        timeout=options.timeout_s, trust_env=False, transport=transport
    ) as client:
        answers = await asyncio.gather(
            _ask_all(client, a, suite.items, options), _ask_all(client, b, suite.items, options)
        )
    duration = time.perf_counter() - started
    return report(suite, a, b, answers, started_at, duration, options.worst)
