"""The controller survives its own errors and a store that refuses writes; slow instances
never stall its tick; a drain outlasts a failed /stats read (issue 13, "Hardening").

The store faults are real SQLite errors: the store the controller holds is switched to a
read-only connection to the same file (`mode=ro`), so every write raises the driver's own
"attempt to write a readonly database", and reads keep working, as with a read-only mount.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from sluice.cli import serving as process_parts
from sluice.control import Controller, EventLog, InstanceSupervisor, TokenAdmin, build_control_api
from sluice.control import ticks as ticks_module
from sluice.control.auth import Role
from sluice.core import Conflict, InstanceState, InstanceStatus, SystemClock
from sluice.policy import Endpoint, RoutingSnapshot
from sluice.runtime import LocalRuntime
from sluice.spec import GroupSpec, Sealer, load_spec_text
from sluice.store import Store

GROUP = """
  - name: {name}
    owner: o@example.com
    business: search
    alert_channel: "#ops"
    models:
      {model}: {{runtime: sim}}
    resources: {{pool: local, memory_gb: 1}}
    replicas: {replicas}
"""
SPEC = """
pools:
  - {{name: local, count: 8, memory_gb: 16}}
groups:
{groups}
tenants:
  - {{name: t, api_keys: [sk-t-12ccad2ae47ed66b]}}
routes:
  - {{tag: main, match: {{models: [m]}}, to: chat}}
{rollouts}
"""
ROLLOUT = """
rollouts:
  - name: r1
    baseline: chat
    canary: chat-v2
    steps: [50, 100]
    hold_s: 600
    analysis: {min_samples: 100000}
"""

SEALER = Sealer(bytes(range(64)))
"""a fixed secrets key: a test's controllers on one store read each other's revisions"""


def spec_text(rollout: bool = False, chat: int = 2) -> str:
    groups = GROUP.format(name="chat", model="m", replicas=chat)
    if rollout:
        groups += GROUP.format(name="chat-v2", model="m", replicas=2)
    return SPEC.format(groups=groups, rollouts=ROLLOUT if rollout else "")


class SwitchableStore:
    """The real store, or (`read_only()`) a read-only connection to the same file."""

    def __init__(self, home: Path) -> None:
        self.rw = Store.for_home(home)
        self.ro = Store.open(f"sqlite:///file:{home / 'state.db'}?mode=ro&uri=true")
        self.current = self.rw

    def read_only(self, on: bool = True) -> None:
        self.current = self.ro if on else self.rw

    def __getattr__(self, name: str) -> Any:
        return getattr(self.current, name)

    def close(self) -> None:
        self.rw.close()
        self.ro.close()


class FakeSupervisor:
    """Instances that are just statuses; `crash` fails one the way the real supervisor
    does (an event first, which a read-only store refuses)."""

    def __init__(self, events: EventLog) -> None:
        self.changed = asyncio.Event()
        self.events = events
        self.instances: dict[str, InstanceStatus] = {}
        self.launched: list[str] = []
        self.drained: list[str] = []
        self.fail_statuses = 0

    def add(self, group: GroupSpec, iid: str, url: str = "http://127.0.0.1:9") -> None:
        now = time.time()
        self.instances[iid] = InstanceStatus(
            iid, group.name, group.template(), InstanceState.READY, now, url=url, ready_at=now
        )

    async def crash(self, iid: str) -> None:
        inst = self.instances.pop(iid)
        await self.events.emit(inst.group, iid, "failed", "process exited with code -9")
        self.changed.set()

    def statuses(self) -> list[InstanceStatus]:
        if self.fail_statuses:
            self.fail_statuses -= 1
            raise RuntimeError("boom: a bug in the tick")
        return list(self.instances.values())

    def ready_endpoints(self) -> dict[str, list[Endpoint]]:
        out: dict[str, list[Endpoint]] = {}
        for s in self.instances.values():
            if s.state is InstanceState.READY and s.url:
                port = int(s.url.rsplit(":", 1)[1])
                out.setdefault(s.group, []).append(Endpoint(s.id, "127.0.0.1", port, 8))
        return out

    def launch(self, spec: GroupSpec, template: str, reason: str, pool: object = None) -> str:
        self.launched.append(spec.name)
        self.add(spec, f"{spec.name}-new{len(self.launched)}")
        self.changed.set()
        return f"{spec.name}-new{len(self.launched)}"

    def drain(self, instance_id: str, reason: str) -> None:
        self.drained.append(instance_id)

    def remove(self, instance_id: str, reason: str) -> None:
        self.instances.pop(instance_id, None)


@contextlib.asynccontextmanager
async def platform(tmp_path: Path, text: str) -> AsyncIterator[tuple[Controller, Any, Any, list]]:
    store = SwitchableStore(tmp_path)
    clock = SystemClock()
    events = EventLog(store, clock)  # type: ignore[arg-type]
    sup = FakeSupervisor(events)
    published: list[RoutingSnapshot] = []
    ctl = Controller(store, sup, events, clock, publish=published.append, sealer=SEALER)  # type: ignore[arg-type]
    await ctl.apply(load_spec_text(text, "test.yaml"), "tester", "test")
    for g in ctl.spec.groups:
        for k in range(g.replicas):
            sup.add(g, f"{g.name}-{k}")
    try:
        yield ctl, sup, store, published
    finally:
        await ctl.close()
        store.close()


async def until(what: str, pred: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


@pytest.fixture
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ticks_module, "RETRY_MIN_S", 0.05)
    monkeypatch.setattr(ticks_module, "RETRY_MAX_S", 0.4)


@pytest.mark.asyncio
@pytest.mark.usefixtures("fast_retries")
async def test_a_read_only_store_holds_the_last_good_state_and_recovers(tmp_path: Path) -> None:
    async with platform(tmp_path, spec_text()) as (ctl, sup, store, published):
        tokens = TokenAdmin(store, SystemClock())
        token, _ = await tokens.create("ops", Role.ADMIN, None, None, by="test")
        api = build_control_api(ctl, sup, store, tokens, allowed_hosts=["test"])
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://test")
        auth = {"Authorization": f"Bearer {token}"}
        loop = asyncio.create_task(ctl.run())
        try:
            await until("a first routing table", lambda: len(published) == 1)
            assert (await http.get("/healthz")).json()["status"] == "ok"

            store.read_only()
            await sup.crash("chat-0")  # wants a replacement; the store refuses the event
            await until("degraded", lambda: ctl.status()["controller"]["tick_failures"] >= 3)
            status = (await http.get("/v1/status", headers=auth)).json()
            assert status["status"] == "degraded"
            assert status["degraded"] == "store read-only: attempt to write a readonly database"
            assert "readonly" in status["controller"]["last_tick_error"]
            assert status["store"]["problem"] == "store read-only"
            assert (await http.get("/healthz")).json()["status"] == "degraded"
            assert (await http.get("/v1/status")).status_code == 401  # the why needs a token
            r = await http.post(
                "/v1/groups/chat/scale", json={"replicas": 3, "reason": "x"}, headers=auth
            )
            assert r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable"
            await asyncio.sleep(0.5)
            assert sup.launched == [] and len(published) == 1  # last good state, untouched

            store.read_only(False)
            await until("ok again", lambda: ctl.status()["status"] == "ok")
            await until("the replacement", lambda: sup.launched == ["chat"])
            await until("a new table", lambda: len(published) >= 2)
            kinds = {e.kind: e for e in store.list_events(limit=50)}
            assert "failed" in kinds  # kept in memory, stored once the store took writes
            assert "takes writes again" in kinds["store"].message
            assert kinds["failed"].at < kinds["store"].at
            assert not loop.done()
        finally:
            loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop
            await http.aclose()


@pytest.mark.asyncio
@pytest.mark.usefixtures("fast_retries")
async def test_a_failing_tick_is_logged_counted_and_retried_with_backoff(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="sluice.controller")
    async with platform(tmp_path, spec_text()) as (ctl, sup, _store, _published):
        sup.fail_statuses = 4
        loop = asyncio.create_task(ctl.run())
        try:
            await until("ticks again", lambda: ctl.status()["controller"]["ticks"] >= 1)
            status = ctl.status()
            assert status["status"] == "ok"
            assert status["controller"]["tick_failures"] == 4
            assert (
                status["controller"]["last_tick_error"] == "RuntimeError: boom: a bug in the tick"
            )
            failures = [r for r in caplog.records if "tick failed" in r.getMessage()]
            assert len(failures) == 4
            assert failures[0].exc_info is not None  # the traceback, once
            assert "RuntimeError: boom" in caplog.text and "Traceback" in caplog.text
            gaps = [b.created - a.created for a, b in itertools.pairwise(failures)]
            assert gaps[0] >= 0.05 and gaps[1] >= 0.1 and gaps[2] >= 0.2  # 0.05 doubling
            sup.fail_statuses = 1
            sup.changed.set()
            await until("a failure again", lambda: ctl.status()["controller"]["tick_failures"] == 5)
            assert ctl.status()["controller"]["retry_in_s"] == 0.05  # reset by the success
        finally:
            loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop


class FakeWorker:
    """Answers /sluice/samples (rows arriving all the time) and /stats like a worker does,
    or (`hang`) accepts connections and never answers."""

    def __init__(self, hang: bool = False) -> None:
        self.hang = hang
        self.rows: list[dict[str, Any]] = []
        self.reads = 0
        self.connections = 0
        """connections open now"""
        self.port = 0
        self._server: asyncio.Server | None = None
        self._feeder: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> FakeWorker:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        self._feeder = asyncio.create_task(self._feed())
        return self

    async def stop(self) -> None:
        assert self._server is not None and self._feeder is not None
        self._feeder.cancel()
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 1)

    async def _feed(self) -> None:
        while True:
            for _ in range(5):
                seq = len(self.rows) + 1
                self.rows.append(
                    {"seq": seq, "at": time.time(), "status": 200, "latency_s": 0.01, "text": "ok."}
                )
            await asyncio.sleep(0.05)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while line := await reader.readline():
                while (await reader.readline()) not in (b"\r\n", b""):
                    pass
                if self.hang:
                    await asyncio.sleep(3600)
                self.reads += 1
                target = urlsplit(line.split()[1].decode())
                if target.path == "/stats":
                    body: dict[str, Any] = {
                        "inflight": 0,
                        "cpu_s_total": 0.001 * len(self.rows),
                        "requests_total": len(self.rows),
                    }
                else:
                    after = int(parse_qs(target.query).get("after", ["0"])[0])
                    page = self.rows[after : after + 2000]
                    body = {"next": page[-1]["seq"] if page else after, "samples": page}
                data = json.dumps(body).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    + f"content-length: {len(data)}\r\n\r\n".encode()
                    + data
                )
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.connections -= 1
            writer.close()


@pytest.mark.asyncio
async def test_a_hung_instance_never_stalls_the_tick_nor_the_others_samples(
    tmp_path: Path,
) -> None:
    good_base, good_canary, hung = FakeWorker(), FakeWorker(), FakeWorker(hang=True)
    for w in (good_base, good_canary, hung):
        await w.start()
    try:
        async with platform(tmp_path, spec_text(rollout=True, chat=1)) as (ctl, sup, _s, _p):
            sup.instances.clear()
            chat, canary = ctl.spec.group("chat"), ctl.spec.group("chat-v2")
            assert chat is not None and canary is not None
            sup.add(chat, "chat-0", good_base.url)
            sup.add(canary, "chat-v2-0", good_canary.url)
            sup.add(canary, "chat-v2-hung", hung.url)
            await ctl.rollout("r1", "start", "tester", "test")
            durations, counts = [], []
            t0 = time.monotonic()
            while time.monotonic() - t0 < 5.0:
                started = time.monotonic()
                await ctl.tick()
                durations.append(time.monotonic() - started)
                live = ctl.rollout_live("r1")
                assert live is not None
                analysis = live["steps"][-1]["analysis"]
                if analysis is not None:
                    counts.append((analysis["baseline_samples"], analysis["canary_samples"]))
                await asyncio.sleep(0.1)
            sampling = ctl.status()["samples"]
        print(
            f"ticks: {len(durations)}, slowest {max(durations) * 1000:.1f} ms, "
            f"samples seen: {counts[-1]}, poll rounds {sampling['rounds']}, "
            f"last round {sampling['last_round_s']} s"
        )
        assert max(durations) < 0.25, durations  # the hung instance costs the tick nothing
        assert "chat-v2-hung" in sampling["failing"]
        assert "TimeoutError" in sampling["failing"]["chat-v2-hung"]["error"]
        # the others' samples kept coming all along: both sides grew over the run
        assert counts[0][0] < counts[-1][0] and counts[0][1] < counts[-1][1], counts
        assert counts[-1][1] > 100 and good_canary.reads >= 4
        assert sampling["last_round_s"] < 2.0  # one round costs at most the timeout
    finally:
        for w in (good_base, good_canary, hung):
            await w.stop()


@pytest.mark.asyncio
async def test_the_poller_drops_its_connections_when_nothing_is_watched() -> None:
    """A rollout that ends must not leave the poller's keep-alive connections open: those to
    instances stopped meanwhile would sit in CLOSE_WAIT for as long as no rollout runs."""
    from sluice.control.samples import SampleCollector

    worker = await FakeWorker().start()
    collector = SampleCollector(poll_s=0.05)
    try:
        collector.watch([("g", "i-1", worker.url)])
        async with asyncio.timeout(10):
            while worker.reads < 4:
                await asyncio.sleep(0.02)
        assert worker.connections >= 1
        collector.watch([])
        async with asyncio.timeout(10):
            while worker.connections:
                await asyncio.sleep(0.02)
        # and it polls again on the next watch, with a fresh pool
        reads = worker.reads
        collector.watch([("g", "i-1", worker.url)])
        async with asyncio.timeout(10):
            while worker.reads < reads + 2:
                await asyncio.sleep(0.02)
    finally:
        await collector.aclose()
        await worker.stop()


def test_a_window_keeps_a_bounded_uniform_sample() -> None:
    from sluice.control.samples import GroupSamples, window_rows
    from sluice.policy.analysis import RequestSample

    win = GroupSamples(capacity=window_rows(100))
    assert win.capacity == 5000 and window_rows(10_000) == 20_000
    for k in range(50_000):
        win.add(RequestSample(200, float(k)))
    assert len(win.samples) == 5000 and win.seen == 50_000
    mean = sum(s.latency_s for s in win.samples) / len(win.samples)
    assert 22_000 < mean < 28_000  # the whole step, not just its end (which is ~47,500)


class DropStats(httpx.AsyncBaseTransport):
    """A network that loses `/stats` reads: the first `drop` of them (all: -1)."""

    def __init__(self, drop: int) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.drop = drop
        self.dropped = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/stats" and (self.drop < 0 or self.dropped < self.drop):
            self.dropped += 1
            raise httpx.ReadError("connection reset by peer", request=request)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


DRAIN_GROUP = """
pools:
  - {{name: local, count: 8, memory_gb: 16}}
groups:
  - name: long
    owner: o@example.com
    business: b
    alert_channel: c
    models:
      m: {{runtime: sim, sim: {{startup_s: 0, service_time: {{kind: fixed, seconds: {seconds}}}}}}}
    resources: {{pool: local, memory_gb: 1}}
    warmup: {{requests: 0}}
    drain_timeout_s: {drain}
"""


async def drain_during_a_request(
    tmp_path: Path, seconds: float, drain_timeout: float, drop: int
) -> tuple[int, float, float, list[Any], DropStats]:
    """Launch one sim instance, send it a `seconds` request, drain it 0.3 s later through a
    network that drops `drop` /stats reads. (status, request end, stop time, events)."""
    group = load_spec_text(DRAIN_GROUP.format(seconds=seconds, drain=drain_timeout)).spec.groups[0]
    net = DropStats(drop)
    with Store.for_home(tmp_path) as store:
        clock = SystemClock()
        events = EventLog(store, clock)
        http = httpx.AsyncClient(transport=net, timeout=10.0)
        sup = InstanceSupervisor(LocalRuntime(tmp_path), store, clock, events, http=http)
        await sup.start()
        try:
            iid = sup.launch(group, group.template(), "test")
            await until(
                "ready",
                lambda: any(s.state is InstanceState.READY for s in sup.statuses()),
                timeout=30,
            )
            (inst,) = sup.statuses()
            assert inst.url is not None
            async with httpx.AsyncClient(trust_env=False, timeout=60) as client:
                request = asyncio.create_task(
                    client.post(
                        f"{inst.url}/v1/chat/completions",
                        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                    )
                )
                await asyncio.sleep(0.3)
                drain_at = time.time()
                sup.drain(iid, "scaled down")
                response = await request
                ended = time.time()
                await until("stopped", lambda: not sup.statuses(), timeout=drain_timeout + 15)
                stopped = time.time()
        finally:
            await sup.shutdown()
        found = [e for e in store.list_events(group="long", limit=50) if e.at >= drain_at]
    return response.status_code, ended - drain_at, stopped - drain_at, found, net


@pytest.mark.asyncio
async def test_a_drain_outlasts_a_lost_stats_read_and_the_long_request_finishes(
    tmp_path: Path,
) -> None:
    """7 s of generation: before, the lost read ended the wait, and SIGKILL came 5 s after
    SIGTERM, cutting the request off at about 5.6 s."""
    status, ended, stopped, found, net = await drain_during_a_request(tmp_path, 7.0, 30, drop=1)
    print(f"request ended {ended:.2f} s after the drain began; stopped at {stopped:.2f} s")
    assert net.dropped == 1
    assert status == 200 and ended > 6.0
    assert stopped >= ended  # stopped only once idle
    assert [e.kind for e in found].count("drain-timeout") == 0
    assert {"drain", "stopped"} <= {e.kind for e in found}


@pytest.mark.asyncio
async def test_a_drain_whose_stats_never_answer_waits_its_whole_drain_timeout(
    tmp_path: Path,
) -> None:
    status, _, stopped, found, net = await drain_during_a_request(tmp_path, 1.0, 3, drop=-1)
    assert status == 200 and net.dropped >= 3
    assert stopped >= 3.0  # no early stop: an unread instance may still be busy
    (timeout,) = [e for e in found if e.kind == "drain-timeout"]
    assert "/stats failed" in timeout.message and "ReadError" in timeout.message


@pytest.mark.asyncio
async def test_a_part_of_sluice_up_that_dies_is_restarted_a_bounded_number_of_times(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(process_parts, "RESTART_DELAY_S", (0.01, 0.02))
    monkeypatch.setattr(process_parts, "RESTARTS", 3)
    runs: list[int] = []

    async def crashing(attempt: int) -> None:
        runs.append(attempt)
        raise RuntimeError("the server fell over")

    stop = asyncio.Event()
    await asyncio.wait_for(
        process_parts.keep_serving("control API", crashing, stop, lambda: True), 5
    )
    assert runs == [0, 1, 2, 3]  # the first run and 3 restarts, then it stays down
    assert "not restarting it again" in caplog.text and "the server fell over" in caplog.text

    async def serving(attempt: int) -> None:
        runs.append(attempt)
        await stop.wait()

    runs.clear()
    task = asyncio.create_task(process_parts.keep_serving("controller", serving, stop))
    await asyncio.sleep(0.05)
    stop.set()  # SIGTERM: it returns, no restart
    await asyncio.wait_for(task, 1)
    assert runs == [0]

    async def never_started(attempt: int) -> None:
        raise SystemExit(1)  # what uvicorn does when it cannot start

    with pytest.raises(Conflict, match="could not start"):
        await process_parts.keep_serving(
            "control API", never_started, asyncio.Event(), lambda: False
        )
