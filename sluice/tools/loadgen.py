"""An open-loop load generator for OpenAI-compatible endpoints (the Sluice gateway or one
server), the engine under `sluice loadtest` and `sluice drill`.

The caller gives the schedule (send offsets and request bodies); every arrival is sent at
its time whether or not earlier ones were answered. One scheduler task sleeps until each
arrival (monotonic `loop.time()`) and spawns that request's task, so a 100k-arrival schedule
holds only the requests in flight, never 100k sleeping tasks. The run is bounded: a count, a
duration (no sends start after it; in-flight ones get up to the request timeout, then are
cancelled), a hard cap on requests in flight, and a per-request timeout. An arrival that
finds the cap reached is not sent late: it is recorded as unsent, and the report says the
generator fell behind (`sluice.tools.loadstats`), so coordinated omission is visible rather
than hidden as latency. Every failure of a request is an Outcome with an error text; nothing
raises out of a request task.

`run_closed` is the closed loop beside it: a fixed number of callers, each sending again
as its answer ends (a server measured at a given batch size, `sluice loadtest --fit`),
within the same bounds.

Streaming bodies (`"stream": true`) are read as SSE: time to first content chunk, the gaps
between content chunks, total latency. Non-streaming answers give total latency and
`usage.completion_tokens`. Both keep `usage.prompt_tokens` when the server reports it.

Why httpx: it is already a dependency, async and streams responses, so the generator runs
inside the CLI's asyncio loop next to everything else. Locust would bring gevent and its
own runner and process model; it is not embeddable in an asyncio CLI.

It sends only to loopback or to hosts the operator names (`check_target`): a mistyped
endpoint must not become a load test of someone else's server. Callers check first.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import json
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from sluice.core.errors import SpecError, SpecIssue
from sluice.core.urls import is_loopback_host, redact_url
from sluice.tools.loadbodies import load_bodies, synthesized_body
from sluice.tools.loadstats import BEHIND_LAG_S, LoadRun, Outcome

__all__ = [
    "BEHIND_LAG_S",
    "Arrival",
    "LoadLimits",
    "LoadRun",
    "LoadTarget",
    "Outcome",
    "check_target",
    "load_bodies",
    "run_closed",
    "run_load",
    "synthesized_body",
]

COMMAND_LINE = "<command line>"
MAX_ITL = 64  # inter-token gaps kept per request: enough for quantiles, bounded memory
LIVE_WINDOW = 2000  # latencies the progress display's quantiles are taken over
REFRESH_S = 0.25  # progress refresh period: at most 4 a second
CANCEL_GRACE_S = 0.5  # past the request timeout, so a request's own timeout ends it first


@dataclass(frozen=True, slots=True)
class LoadTarget:
    """Where requests go: a gateway or server base URL (a trailing /v1 is stripped), an
    API key (Authorization: Bearer), a group to pin (x-sluice-group, operator tenants)."""

    base_url: str
    api_key: str | None = None
    group: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Arrival:
    """One scheduled request: its offset from the start, its path and body."""

    at_s: float
    path: str  # "/v1/chat/completions", "/v1/completions" or "/v1/embeddings"
    body: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class LoadLimits:
    """Bounds of a run; a bad value is a SpecError (exit 2), as the CLI's options."""

    max_requests: int = 100_000
    max_duration_s: float = 3600.0
    max_in_flight: int = 256
    timeout_s: float = 60.0

    def __post_init__(self) -> None:
        issues = [
            SpecIssue(name, "must be positive", COMMAND_LINE)
            for name, value in (
                ("max_requests", self.max_requests),
                ("max_duration_s", self.max_duration_s),
                ("max_in_flight", self.max_in_flight),
                ("timeout_s", self.timeout_s),
            )
            if not value > 0
        ]
        if issues:
            raise SpecError(issues)


def check_target(url: str, allow_hosts: Collection[str], option: str = "--endpoint") -> None:
    """Refuse a URL that is not http(s), or whose host is neither loopback (127.0.0.0/8,
    ::1, localhost) nor one of `allow_hosts`."""

    def refuse(message: str) -> SpecError:
        return SpecError([SpecIssue(option, message, COMMAND_LINE)])

    try:
        parts = urlsplit(url.strip())
        host = (parts.hostname or "").rstrip(".")
        _ = parts.port
    except ValueError:
        raise refuse(f"not a URL: {redact_url(url)}") from None
    if parts.scheme not in ("http", "https"):
        given = f"{parts.scheme}://" if parts.scheme else "a URL without a scheme"
        raise refuse(f"only http:// and https:// URLs can be load tested, not {given}")
    if not host:
        raise refuse("the URL has no host: give http://HOST:PORT")
    allowed = {h.strip().strip("[]").rstrip(".").lower() for h in allow_hosts}
    if is_loopback_host(host) or host in allowed:
        return
    raise refuse(
        f"{host} is not a loopback address: load is sent only to 127.0.0.0/8, ::1 and "
        f"localhost unless the host is named; add --allow-host {host} to allow it"
    )


def _base_url(url: str) -> str:
    base = url.strip().rstrip("/")
    return base.removesuffix("/v1")


def _headers(target: LoadTarget) -> dict[str, str]:
    headers = dict(target.headers)
    if target.api_key:
        headers["authorization"] = f"Bearer {target.api_key}"
    if target.group:
        headers["x-sluice-group"] = target.group
    return headers


@dataclass(slots=True)
class _Answer:
    """What one request task gathers before it becomes an Outcome."""

    status: int | None = None
    ttft_s: float | None = None
    gaps: list[float] = field(default_factory=list)
    output_tokens: int | None = None
    prompt_tokens: int | None = None
    served_by: str | None = None
    error: str | None = None


def _content(chunk: Any) -> bool:
    """Whether an SSE chunk carries output: chat delta content, reasoning or tool calls, or
    a completion's text."""
    if not isinstance(chunk, dict):
        return False
    for choice in chunk.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict) and any(
            delta.get(k) for k in ("content", "reasoning_content", "tool_calls")
        ):
            return True
        if choice.get("text"):
            return True
    return False


def _usage_tokens(payload: Any, key: str = "completion_tokens") -> int | None:
    usage = payload.get("usage") if isinstance(payload, dict) else None
    tokens = usage.get(key) if isinstance(usage, dict) else None
    return tokens if isinstance(tokens, int) else None


def _http_error(status: int, body: bytes) -> str:
    text = " ".join(body.decode("utf-8", "replace").split())
    return f"HTTP {status}: {text[:200]}"


async def _stream(
    client: httpx.AsyncClient,
    url: str,
    body: Mapping[str, Any],
    clock: Callable[[], float],
    sent: float,
    ans: _Answer,
) -> None:
    async with client.stream("POST", url, json=body) as response:
        ans.status = response.status_code
        ans.served_by = response.headers.get("x-sluice-group")
        if not 200 <= response.status_code < 300:
            ans.error = _http_error(response.status_code, await response.aread())
            return
        last: float | None = None
        chunks = 0
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                ans.output_tokens = ans.output_tokens if ans.output_tokens is not None else chunks
                return
            try:
                payload = json.loads(data)
            except json.JSONDecodeError:
                ans.error = f"stream: a chunk is not JSON: {data[:80]}"
                return
            if isinstance(payload, dict) and payload.get("error"):
                ans.error = f"stream error: {json.dumps(payload['error'])[:200]}"
                return
            tokens = _usage_tokens(payload)
            ans.output_tokens = tokens if tokens is not None else ans.output_tokens
            prompt = _usage_tokens(payload, "prompt_tokens")
            ans.prompt_tokens = prompt if prompt is not None else ans.prompt_tokens
            if _content(payload):
                now = clock()
                chunks += 1
                if last is None:
                    ans.ttft_s = now - sent
                else:
                    ans.gaps.append(now - last)
                last = now
        ans.error = "stream: ended before data: [DONE]"


async def _whole(
    client: httpx.AsyncClient, url: str, body: Mapping[str, Any], ans: _Answer
) -> None:
    response = await client.post(url, json=body)
    ans.status = response.status_code
    ans.served_by = response.headers.get("x-sluice-group")
    if not 200 <= response.status_code < 300:
        ans.error = _http_error(response.status_code, response.content)
        return
    try:
        payload = response.json()
        ans.output_tokens = _usage_tokens(payload)
        ans.prompt_tokens = _usage_tokens(payload, "prompt_tokens")
    except ValueError:
        ans.error = "answer is not JSON"


def _sample(gaps: list[float]) -> tuple[float, ...]:
    """At most MAX_ITL gaps, evenly spread over the answer (not only its start)."""
    if len(gaps) <= MAX_ITL:
        return tuple(gaps)
    step = (len(gaps) - 1) / (MAX_ITL - 1)
    return tuple(gaps[round(k * step)] for k in range(MAX_ITL))


class _Live:
    """Counts and a bounded window of recent latencies for the progress display."""

    def __init__(self) -> None:
        self.ok = self.errors = self.unsent = self.in_flight = 0
        self.recent: deque[float] = deque(maxlen=LIVE_WINDOW)

    @property
    def finished(self) -> int:
        return self.ok + self.errors + self.unsent

    def add(self, o: Outcome) -> None:
        if o.sent_s is None:
            self.unsent += 1
        elif o.ok and o.done_s is not None:
            self.ok += 1
            self.recent.append(o.done_s - o.sent_s)
        else:
            self.errors += 1

    def text(self) -> str:
        lat = sorted(self.recent)
        q = (
            f"p50 {lat[len(lat) // 2] * 1000:.0f} ms · "
            f"p99 {lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000:.0f} ms"
            if lat
            else "p50 - · p99 -"
        )
        errors = f"[red]errors {self.errors}[/]" if self.errors else "errors 0"
        return f"{q} · ok {self.ok} · {errors} · unsent {self.unsent} · in flight {self.in_flight}"


class _Run:
    """One run's shared state: the client, the clock, the outcome slots."""

    def __init__(self, client: httpx.AsyncClient, base: str, limits: LoadLimits) -> None:
        self.client = client
        self.base = base
        self.limits = limits
        self.loop = asyncio.get_running_loop()
        self.t0 = self.loop.time()
        self.started_at = time.time()  # wall time of offset 0
        self.live = _Live()
        self.outcomes: list[Outcome | None] = []

    def now(self) -> float:
        return self.loop.time() - self.t0

    def record(self, index: int, o: Outcome) -> None:
        self.outcomes[index] = o
        self.live.add(o)

    async def request(self, index: int, arrival: Arrival) -> None:
        """Send one arrival; every way it can end becomes its Outcome."""
        sent = self.now()
        ans = _Answer()
        self.live.in_flight += 1
        try:
            async with asyncio.timeout(self.limits.timeout_s):
                url = self.base + arrival.path
                if arrival.body.get("stream"):
                    await _stream(self.client, url, arrival.body, self.now, sent, ans)
                else:
                    await _whole(self.client, url, arrival.body, ans)
        except (TimeoutError, httpx.TimeoutException):
            ans.error = "timeout"
        except httpx.ConnectError as exc:
            ans.error = f"connect: {exc}"[:200]
        except asyncio.CancelledError:
            ans.error = "cancelled: the run ended before the answer"
            self._finish(index, arrival, sent, ans)
            raise
        except Exception as exc:  # every failure is an outcome, never a crash of the run
            ans.error = f"{type(exc).__name__}: {exc}"[:200]
        self._finish(index, arrival, sent, ans)

    def _finish(self, index: int, arrival: Arrival, sent: float, ans: _Answer) -> None:
        self.live.in_flight -= 1
        outcome = Outcome(
            at_s=arrival.at_s,
            sent_s=sent,
            done_s=self.now(),
            status=ans.status,
            ttft_s=ans.ttft_s,
            itl_s=_sample(ans.gaps),
            output_tokens=ans.output_tokens,
            error=ans.error,
            served_by=ans.served_by,
            prompt_tokens=ans.prompt_tokens,
        )
        self.record(index, outcome)

    async def schedule(self, arrivals: Sequence[Arrival], tasks: set[asyncio.Task[None]]) -> None:
        """Send each arrival at its time; one that finds the in-flight cap reached (or the
        max duration already past, when the generator fell that far behind) is unsent."""
        for index, arrival in enumerate(arrivals):
            delay = arrival.at_s - self.now()
            # Always yield: a burst of due arrivals must let earlier requests go out too.
            await asyncio.sleep(max(0.0, delay))
            reason = None
            if len(tasks) >= self.limits.max_in_flight:
                reason = "unsent: in-flight cap"
            elif self.now() >= self.limits.max_duration_s:
                reason = "unsent: max duration passed before its turn"
            if reason is not None:
                self.record(index, Outcome(arrival.at_s, None, None, None, None, (), None, reason))
                continue
            task = asyncio.create_task(self.request(index, arrival))
            tasks.add(task)
            task.add_done_callback(tasks.discard)


async def _refresh(progress: Progress, task_id: TaskID, live: _Live) -> None:
    while True:
        progress.update(task_id, completed=live.finished, stats=live.text())
        progress.refresh()
        await asyncio.sleep(REFRESH_S)


async def run_load(
    target: LoadTarget,
    arrivals: Sequence[Arrival],
    limits: LoadLimits = LoadLimits(),  # frozen: one shared default is safe
    console: Console | None = None,
    label: str = "load",
) -> LoadRun:
    """Send `arrivals` (sorted by `at_s`) open-loop to `target` within `limits`; the caller
    has checked the target (`check_target`). Arrivals past `max_requests` or at or after
    `max_duration_s` are not part of the run. Progress goes to `console` when given."""
    if any(b.at_s < a.at_s for a, b in itertools.pairwise(arrivals)):
        raise ValueError("arrivals must be sorted by at_s")
    count = min(len(arrivals), limits.max_requests)
    count = bisect.bisect_left(arrivals, limits.max_duration_s, hi=count, key=lambda a: a.at_s)
    arrivals = arrivals[:count]
    pool = httpx.Limits(
        max_connections=limits.max_in_flight, max_keepalive_connections=limits.max_in_flight
    )
    async with httpx.AsyncClient(
        trust_env=False, limits=pool, timeout=limits.timeout_s, headers=_headers(target)
    ) as client:
        run = _Run(client, _base_url(target.base_url), limits)
        run.outcomes = [None] * count
        tasks: set[asyncio.Task[None]] = set()
        progress = _progress(console)
        if progress is not None:
            progress.start()
            task_id = progress.add_task(label, total=count, stats="")
            ticker = asyncio.create_task(_refresh(progress, task_id, run.live))
        try:
            await run.schedule(arrivals, tasks)
            if tasks:
                await asyncio.wait(set(tasks), timeout=limits.timeout_s + CANCEL_GRACE_S)
        finally:
            for task in list(tasks):
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if progress is not None:
                ticker.cancel()
                await asyncio.gather(ticker, return_exceptions=True)
                progress.update(task_id, completed=count, stats=run.live.text())
                progress.stop()
    outcomes = [o for o in run.outcomes if o is not None]  # every slot is filled by now
    last = max((max(o.at_s, o.done_s or 0.0) for o in outcomes), default=0.0)
    return LoadRun(outcomes=outcomes, started_at=run.started_at, duration_s=last)


async def run_closed(
    target: LoadTarget,
    body: Callable[[int], tuple[str, Mapping[str, Any]]],
    concurrency: int,
    limits: LoadLimits,
) -> LoadRun:
    """Closed-loop load: `concurrency` callers, each sending its next request as soon as its
    last answer ended, so that `concurrency` requests are in flight all the time (what a
    measure of a server at a given batch size needs; the open loop of `run_load` is for
    rates). Request k (in the order they are sent) is `body(k)`; its outcome's `at_s` is its
    send time. Bounded like `run_load`: no request starts after `max_duration_s` or past
    `max_requests`; each ends within `timeout_s`, and the callers still running at
    `max_duration_s + timeout_s` are cancelled."""
    if concurrency < 1:
        raise SpecError([SpecIssue("concurrency", "must be at least 1", COMMAND_LINE)])
    pool = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(
        trust_env=False, limits=pool, timeout=limits.timeout_s, headers=_headers(target)
    ) as client:
        run = _Run(client, _base_url(target.base_url), limits)

        async def caller() -> None:
            while run.now() < limits.max_duration_s and len(run.outcomes) < limits.max_requests:
                index = len(run.outcomes)
                run.outcomes.append(None)
                path, payload = body(index)
                await run.request(index, Arrival(run.now(), path, payload))

        callers = [asyncio.create_task(caller()) for _ in range(concurrency)]
        try:
            await asyncio.wait(callers, timeout=limits.max_duration_s + limits.timeout_s)
        finally:
            for task in callers:
                task.cancel()
            await asyncio.gather(*callers, return_exceptions=True)
    outcomes = [o for o in run.outcomes if o is not None]
    last = max((o.done_s or o.at_s for o in outcomes), default=0.0)
    return LoadRun(outcomes=outcomes, started_at=run.started_at, duration_s=last)


def _progress(console: Console | None) -> Progress | None:
    if console is None:
        return None
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(bar_width=20),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[stats]}"),
        console=console,
        auto_refresh=False,
        transient=False,
    )
