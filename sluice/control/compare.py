"""The controller's compare run (C5 at a rollout's start): the rollout's suite straight to one
baseline and one canary instance, scored by the pure `sluice.policy.compare` as `sluice
compare` scores it, so the report archived with the rollout (C6) has the tool's shape. The
tool (`sluice.tools.compare`) is an outside client; this is the control plane's own shell."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from sluice.policy.compare import (
    PATHS,
    Answer,
    CompareOptions,
    SuiteItem,
    Target,
    answer_version,
    parse_suite,
    read_answer,
    report,
    request_headers,
)

__all__ = ["run_compare"]


async def run_compare(
    suite_path: Path,
    a: Target,
    b: Target,
    options: CompareOptions,
    transport: httpx.AsyncBaseTransport | None = None,
) -> dict[str, Any]:
    """Send the suite to both targets (`options.concurrency` requests in flight each) and
    return the "sluice.compare/1" report. Raises SpecError for a bad suite and Unavailable
    when a side answered nothing (`sluice.policy.compare.report`)."""
    data = await asyncio.to_thread(suite_path.read_bytes)
    suite = parse_suite(data, str(suite_path), "compare.suite")
    started_at = time.time()
    started = time.perf_counter()
    async with httpx.AsyncClient(
        timeout=options.timeout_s, trust_env=False, transport=transport
    ) as client:
        answers = await asyncio.gather(
            *(_ask_all(client, target, suite.items, options) for target in (a, b))
        )
    duration = time.perf_counter() - started
    return report(suite, a, b, (answers[0], answers[1]), started_at, duration, options.worst)


async def _ask_all(
    client: httpx.AsyncClient, target: Target, items: Sequence[SuiteItem], options: CompareOptions
) -> list[Answer]:
    headers = request_headers(target, options.api_key)
    gate = asyncio.Semaphore(options.concurrency)
    return list(await asyncio.gather(*(_ask(client, gate, target, i, headers) for i in items)))


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
