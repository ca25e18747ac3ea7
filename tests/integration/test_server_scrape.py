"""The controller's scraper against real server processes (the OpenAI stub with vLLM's
metric names): a good server's numbers reach `load` and the status, and one answering
garbage, a body without end, nothing at all, or refusing connections is a counted failure
that leaves the others' numbers alone."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from sluice.control.scraper import ScrapeTarget, ServerScraper, scrape_targets
from sluice.core import InstanceState, InstanceStatus
from sluice.spec import load_spec_text

STUB = str(Path(__file__).parents[1] / "e2e" / "openai_stub.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def stubs(*modes: tuple[str, ...]) -> Iterator[list[str]]:
    """One stub per flag set; yields their base URLs once each listens."""
    procs, urls = [], []
    try:
        for flags in modes:
            port = free_port()
            cmd = [sys.executable, STUB, "--host", "127.0.0.1", "--port", str(port)]
            procs.append(
                subprocess.Popen(
                    [*cmd, "--model", "m", *flags],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            urls.append(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 20
        for url in urls:
            while True:
                try:
                    httpx.get(url + "/health", timeout=1).raise_for_status()
                    break
                except httpx.HTTPError:
                    assert time.monotonic() < deadline, f"{url} never listened"
                    time.sleep(0.05)
        yield urls
    finally:
        for p in procs:
            p.kill()
            p.wait(10)


def test_good_numbers_are_kept_and_every_bad_answer_is_a_counted_failure() -> None:
    modes = [("--waiting", "5"), ("--metrics", "garbage"), ("--metrics", "huge")]
    with stubs(*modes, ("--metrics", "hang")) as (good, garbage, huge, hang):
        refused = f"http://127.0.0.1:{free_port()}"
        targets = [
            ScrapeTarget("g", "good", good + "/metrics"),
            ScrapeTarget("g", "garbage", garbage + "/metrics"),
            ScrapeTarget("g", "huge", huge + "/metrics"),
            ScrapeTarget("g", "hang", hang + "/metrics"),
            ScrapeTarget("g", "refused", refused + "/metrics"),
            ScrapeTarget("g", "not-found", good + "/no-metrics-here"),
            ScrapeTarget("other", "other-good", good + "/metrics"),
        ]

        async def run() -> None:
            scraper = ServerScraper(time.time, timeout_s=1.0, max_bytes=1 * 2**20)
            try:
                scraper.watch([])  # nothing to read yet: no task
                await scraper.poll(targets)
                scraper.watch(targets)  # the polling task picks them up from here
                await asyncio.sleep(0)
                now = time.time()
                load = scraper.load("g", now)
                assert load is not None
                assert (load.instances, load.waiting, load.running) == (1, 5.0, 0.0)
                assert scraper.load("g", now + 60) is None  # stale: missing, never zero
                status = scraper.status()["instances"]
                assert status["good"]["waiting"] == 5.0 and status["good"]["failures"] == 0
                assert "vllm:num_requests_waiting" in status["good"]["metrics"]
                errors = {iid: s["error"] for iid, s in status.items() if s["failures"]}
                assert set(errors) == {"garbage", "huge", "hang", "refused", "not-found"}
                assert "no known server metric" in errors["garbage"]
                assert "over 1048576 bytes" in errors["huge"]
                assert errors["hang"].startswith("TimeoutError")
                assert errors["refused"].startswith("ConnectError")
                assert "answered 404" in errors["not-found"]
                text = scraper.prometheus_text().decode()
                assert 'sluice_server_waiting{group="g",instance="good"} 5' in text
                assert 'sluice_server_scrape_failures_total{group="g",instance="hang"} 1' in text
                garbage_rows = [ln for ln in text.splitlines() if 'instance="garbage"' in ln]
                assert [ln.split("{")[0] for ln in garbage_rows] == [
                    "sluice_server_scrape_failures_total"  # no numbers it never said
                ]
            finally:
                await scraper.aclose()

        asyncio.run(run())


def test_a_latency_window_counts_what_the_servers_served_after_it_began() -> None:
    with stubs(("--delay", "0.03"), ("--delay", "0.3")) as (fast, slow):
        targets = [
            ScrapeTarget("g", i, u + "/metrics") for i, u in (("fast", fast), ("slow", slow))
        ]
        body = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}

        async def run() -> None:
            scraper = ServerScraper(time.time, poll_s=0.1)
            try:
                async with httpx.AsyncClient(timeout=10) as c:
                    for url in (fast, slow):  # before the window: never counted in it
                        await c.post(url + "/v1/chat/completions", json=body)
                    scraper.watch(targets)
                    await scraper.poll(targets)
                    scraper.reset(["g"], time.time())
                    for url in (fast, fast, fast, slow):
                        r = await c.post(url + "/v1/chat/completions", json=body)
                        r.raise_for_status()
                    await scraper.poll(targets)
                win = scraper.window("g")
                assert win is not None and win.ttft is not None
                assert win.ttft.total == 4  # three fast and one slow, the earlier two not
                summary = win.to_json()
                assert summary["requests"] == 4
                assert 0.01 <= summary["ttft_p50_s"] <= 0.05  # the fast server's bucket
                assert 0.25 <= summary["ttft_p99_s"] <= 0.5  # the slow one's
                assert scraper.window("not-scraped") is None
            finally:
                await scraper.aclose()

        asyncio.run(run())


def test_targets_are_the_ready_instances_of_servers_that_declare_metrics() -> None:
    spec = load_spec_text(
        """
pools:
  - {name: p, count: 8, memory_gb: 16}
groups:
  - {name: cmd, owner: a@example.com, business: b, alert_channel: "#c",
     resources: {pool: p, memory_gb: 1}, replicas: 1,
     models: {m1: {runtime: command,
                   command: {argv: [srv, --port, "{port}"], metrics_path: /metrics}}}}
  - {name: quiet, owner: a@example.com, business: b, alert_channel: "#c",
     resources: {pool: p, memory_gb: 1}, replicas: 1,
     models: {m2: {runtime: command, command: {argv: [srv, --port, "{port}"]}}}}
  - {name: ext, owner: a@example.com, business: b, alert_channel: "#c",
     resources: {pool: p, memory_gb: 1}, replicas: 1,
     models: {m3: {runtime: external,
                   external: {endpoints: [{url: "http://10.0.0.9:8000"}],
                              metrics_path: /prom}}}}
  - {name: own, owner: a@example.com, business: b, alert_channel: "#c",
     resources: {pool: p, memory_gb: 1}, replicas: 1,
     models: {m4: {runtime: sim}}}
"""
    ).spec

    def inst(iid: str, group: str, state: InstanceState, url: str | None) -> InstanceStatus:
        return InstanceStatus(iid, group, "t", state, 0.0, url=url)

    observed = [
        inst("c1", "cmd", InstanceState.READY, "http://127.0.0.1:5001"),
        inst("c2", "cmd", InstanceState.WARMING, "http://127.0.0.1:5002"),  # not yet
        inst("c3", "cmd", InstanceState.DRAINING, "http://127.0.0.1:5003"),  # no longer
        inst("q1", "quiet", InstanceState.READY, "http://127.0.0.1:5004"),  # no metrics_path
        inst("e1", "ext", InstanceState.READY, "http://10.0.0.9:8000"),
        inst("o1", "own", InstanceState.READY, "http://127.0.0.1:5005"),  # Sluice's worker
        inst("x1", "gone", InstanceState.READY, "http://127.0.0.1:5006"),  # left the spec
    ]
    assert scrape_targets(spec, observed) == [
        ScrapeTarget("cmd", "c1", "http://127.0.0.1:5001/metrics"),
        ScrapeTarget("ext", "e1", "http://10.0.0.9:8000/prom"),
    ]
