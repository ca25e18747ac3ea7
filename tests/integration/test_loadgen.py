"""The load generator against real servers on 127.0.0.1 (the OpenAI stub, a subprocess):
open-loop sends on schedule, streaming timings, the in-flight cap as unsent arrivals, the
count and duration bounds, the request timeout, and failures as outcomes, never raised."""

from __future__ import annotations

import asyncio
import io
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from rich.console import Console

from sluice.tools.loadgen import Arrival, LoadLimits, LoadTarget, run_load, synthesized_body

STUB = str(Path(__file__).parents[1] / "e2e" / "openai_stub.py")
KEY = "k-load"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_stub(*flags: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, STUB, "--host", "127.0.0.1", "--port", str(port), "--model", "m", *flags],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            httpx.get(url + "/health", timeout=1, headers={"authorization": f"Bearer {KEY}"})
            return proc, url
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait(10)
                raise AssertionError(f"stub on {url} never listened") from None
            time.sleep(0.05)


@pytest.fixture(scope="module")
def fast() -> Iterator[str]:
    """0.05 s to the first token, 0.01 s between tokens; wants the bearer key KEY."""
    proc, url = start_stub("--delay", "0.05", "--token-delay", "0.01", "--require-key", KEY)
    try:
        yield url
    finally:
        proc.kill()
        proc.wait(10)


@pytest.fixture(scope="module")
def slow() -> Iterator[str]:
    proc, url = start_stub("--delay", "0.5")
    try:
        yield url
    finally:
        proc.kill()
        proc.wait(10)


def chat(at_s: float, stream: bool = False, model: str = "m") -> Arrival:
    return Arrival(at_s, *synthesized_body(model, 8, 5, stream=stream))


@pytest.mark.asyncio
async def test_an_open_loop_schedule_is_sent_on_time_and_answered(fast: str) -> None:
    arrivals = [chat(i / 20) for i in range(40)]  # 20 rps for 2 s
    run = await run_load(LoadTarget(fast + "/v1", api_key=KEY), arrivals)
    s = run.summary()
    assert (s["requests"], s["sent"], s["ok"], s["unsent"], s["errors"]) == (40, 40, 40, 0, 0)
    assert s["status"] == {"200": 40}
    assert 0.045 <= s["latency_ms"]["p50"] / 1000 <= 0.25  # the stub's 0.05 s, plus overhead
    assert s["offered_rps"] == pytest.approx(40 / 1.95)
    assert s["output_tokens"] == 40 * 5
    assert s["behind"] is False and s["lag_ms"]["p99"] < 50
    assert s["ttft_ms"]["p50"] is None  # no streaming
    assert [o.at_s for o in run.outcomes] == [a.at_s for a in arrivals]
    assert 1.95 <= run.duration_s < 3.0
    assert abs(run.started_at - time.time()) < 10
    assert sum(r["ok"] for r in run.timeline()) == 40


@pytest.mark.asyncio
async def test_sends_never_wait_for_answers(slow: str) -> None:
    """Ten arrivals 50 ms apart against a 0.5 s server: all go out on schedule, the last
    one long before the first answer (an open loop)."""
    run = await run_load(LoadTarget(slow), [chat(i * 0.05) for i in range(10)])
    sent = [o.sent_s for o in run.outcomes if o.sent_s is not None]
    first_done = min(o.done_s for o in run.outcomes if o.done_s is not None)
    assert len(sent) == 10 and max(sent) < first_done
    s = run.summary()
    # nothing was held back (a loaded machine may still lag the schedule: `behind` says so)
    assert s["ok"] == 10 and s["unsent"] == 0
    assert s["mean_in_flight"] > 4  # ten half-second requests over about a second


@pytest.mark.asyncio
async def test_streaming_gives_ttft_and_inter_token_times(fast: str) -> None:
    arrivals = [chat(i * 0.05, stream=True) for i in range(8)]
    run = await run_load(LoadTarget(fast, api_key=KEY), arrivals)
    assert all(o.ok for o in run.outcomes), [o.error for o in run.outcomes]
    for o in run.outcomes:
        assert o.ttft_s is not None and 0.045 <= o.ttft_s < 0.5
        assert len(o.itl_s) == 4  # five content chunks, four gaps
        assert o.output_tokens == 5  # from the usage chunk
        assert o.done_s is not None and o.sent_s is not None
        assert o.done_s - o.sent_s >= o.ttft_s + sum(o.itl_s) - 1e-6
    s = run.summary()
    assert 0.045 <= s["ttft_ms"]["p50"] / 1000 < 0.5
    assert 0.008 <= s["itl_ms"]["p50"] / 1000 < 0.1


@pytest.mark.asyncio
async def test_the_in_flight_cap_leaves_arrivals_unsent_and_says_behind(slow: str) -> None:
    arrivals = [chat(i * 0.02) for i in range(10)]  # ten in 0.2 s, each answered in 0.5 s
    run = await run_load(LoadTarget(slow), arrivals, LoadLimits(max_in_flight=2))
    unsent = [o for o in run.outcomes if o.sent_s is None]
    assert len(unsent) == 8
    assert all(o.error == "unsent: in-flight cap" and o.status is None for o in unsent)
    s = run.summary()
    assert (s["sent"], s["unsent"], s["ok"]) == (2, 8, 2)
    assert s["behind"] is True and "unsent" in s["behind_reason"]


@pytest.mark.asyncio
async def test_max_requests_and_max_duration_bound_the_run(fast: str) -> None:
    target = LoadTarget(fast, api_key=KEY)
    arrivals = [chat(i * 0.1) for i in range(50)]  # a 5 s schedule
    by_count = await run_load(target, arrivals, LoadLimits(max_requests=5))
    assert [o.at_s for o in by_count.outcomes] == [a.at_s for a in arrivals[:5]]
    assert by_count.summary()["ok"] == 5
    began = time.monotonic()
    by_time = await run_load(target, arrivals, LoadLimits(max_duration_s=0.35))
    assert time.monotonic() - began < 1.5
    assert [o.at_s for o in by_time.outcomes] == [a.at_s for a in arrivals[:4]]
    assert by_time.summary()["ok"] == 4


@pytest.mark.asyncio
async def test_a_request_past_its_timeout_is_an_outcome(slow: str) -> None:
    began = time.monotonic()
    run = await run_load(
        LoadTarget(slow), [chat(0.0), chat(0.01, stream=True)], LoadLimits(timeout_s=0.2)
    )
    assert time.monotonic() - began < 1.0
    assert [(o.status, o.error) for o in run.outcomes] == [(None, "timeout")] * 2
    assert run.summary()["status"] == {"error": 2}


@pytest.mark.asyncio
async def test_refused_connections_and_http_errors_are_outcomes(fast: str) -> None:
    refused = f"http://127.0.0.1:{free_port()}"
    run = await run_load(LoadTarget(refused), [chat(0.0), chat(0.0, stream=True)])
    for o in run.outcomes:
        assert o.status is None and o.error is not None and o.error.startswith("connect:")
    assert run.summary()["errors"] == 2
    no_key = await run_load(LoadTarget(fast), [chat(0.0)])
    assert no_key.outcomes[0].status == 401
    assert (no_key.outcomes[0].error or "").startswith("HTTP 401: ")
    wrong = await run_load(LoadTarget(fast, api_key=KEY), [chat(0.0, stream=True, model="x")])
    assert wrong.outcomes[0].status == 404 and "not served" in (wrong.outcomes[0].error or "")
    assert wrong.summary()["status"] == {"404": 1}


@pytest.mark.asyncio
async def test_progress_goes_to_the_given_console(fast: str) -> None:
    out = io.StringIO()
    console = Console(file=out, width=160, force_terminal=False)
    await run_load(
        LoadTarget(fast, api_key=KEY),
        [chat(i * 0.1) for i in range(5)],
        console=console,
        label="drill",
    )
    text = out.getvalue()
    assert "drill" in text and "ok 5" in text and "p99" in text


@pytest.mark.asyncio
async def test_a_long_schedule_holds_only_the_requests_in_flight() -> None:
    """A 100k-arrival schedule: the tasks alive at any time are the cap plus the scheduler,
    never one per arrival."""
    refused = f"http://127.0.0.1:{free_port()}"
    arrivals = [chat(i * 0.001) for i in range(100_000)]
    peak = 0

    async def watch() -> None:
        nonlocal peak
        while True:
            peak = max(peak, len(asyncio.all_tasks()))
            await asyncio.sleep(0.005)

    watcher = asyncio.create_task(watch())
    try:
        run = await run_load(
            LoadTarget(refused), arrivals, LoadLimits(max_duration_s=0.3, max_in_flight=8)
        )
    finally:
        watcher.cancel()
    assert len(run.outcomes) == 300
    # the cap, the scheduler, the test, the watcher, and a task or two just ending (a busy
    # machine sees them before the loop drops them): bounded, never one per arrival (300)
    assert peak <= 8 + 8


@pytest.mark.asyncio
async def test_cancelling_a_run_cancels_its_requests(slow: str) -> None:
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(run_load(LoadTarget(slow), [chat(0.0), chat(0.05)]), 0.2)
    await asyncio.sleep(0)
    assert asyncio.all_tasks() == {asyncio.current_task()}


@pytest.mark.asyncio
async def test_a_closed_loop_keeps_its_callers_busy_and_stops_on_its_bounds(fast: str) -> None:
    """Three callers, each sending again as its answer ends: never more than three in
    flight and three at the peak, no request starts after the duration, and each body is asked
    for by its send order (its prompt's tokens come back from usage)."""
    from sluice.tools.loadgen import run_closed

    asked: list[int] = []

    def body(k: int) -> tuple[str, dict[str, object]]:
        asked.append(k)
        return synthesized_body("m", 4 + k, 5, stream=True)

    target = LoadTarget(fast, api_key=KEY)
    limits = LoadLimits(max_requests=1000, max_duration_s=1.0, max_in_flight=3, timeout_s=10)
    run = await run_closed(target, body, 3, limits)
    assert asked == list(range(len(run.outcomes))) and len(run.outcomes) >= 6
    assert all(o.ok for o in run.outcomes), [o.error for o in run.outcomes if not o.ok]
    assert all(o.sent_s is not None and o.sent_s < 1.0 for o in run.outcomes)
    assert {o.prompt_tokens for o in run.outcomes} >= {4, 5, 6}
    events = sorted(
        [(o.sent_s, 1) for o in run.outcomes] + [(o.done_s, -1) for o in run.outcomes],
        key=lambda e: (e[0], e[1]),
    )
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    assert peak == 3
    counted = await run_closed(target, body, 2, LoadLimits(max_requests=5, timeout_s=10))
    assert len(counted.outcomes) == 5
