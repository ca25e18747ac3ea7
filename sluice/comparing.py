"""The HTTP shell of a compare run (C5): a parsed suite sent to two targets with bounded
concurrency, scored by the pure `sluice.policy.compare`. One shell for both callers: `sluice
compare` (`sluice.tools.compare`, an outside client) and the controller's run at a rollout's
start (`sluice.control.rollouts`, archived with it: C6), so their reports read alike. It sits
outside both rooms because neither may import the other."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import httpx

from sluice.policy.compare import (
    PATHS,
    Answer,
    CompareOptions,
    Suite,
    SuiteItem,
    Target,
    answer_version,
    read_answer,
    report,
    request_headers,
)

__all__ = ["run_suite"]


async def run_suite(
    suite: Suite,
    a: Target,
    b: Target,
    options: CompareOptions,
    transport: httpx.AsyncBaseTransport | None = None,
) -> dict[str, Any]:
    """Send `suite` to both targets (`options.concurrency` requests in flight each) and
    return the "sluice.compare/1" report. Raises Unavailable when a side answered nothing
    (`sluice.policy.compare.report`): a wrong URL should not read as "everything differs"."""
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
