"""Fake upstream instances and the harness the gateway integration tests run on.

Everything listens on 127.0.0.1 with real sockets; `running()` tears it all down.
"""

from __future__ import annotations

import asyncio
import io
import json
import random
import socket
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager, suppress
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from sluice.gateway import Gateway
from sluice.policy.routing import (
    Endpoint,
    GroupTraffic,
    RouteRule,
    RouteTable,
    RoutingSnapshot,
    TenantAccess,
    api_key_digest,
)

AUTH = {"Authorization": "Bearer sk-test-f3abf2a6cc4f0098"}
CHAT = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}
INTERNALS = ("server", "via", "x-powered-by", "x-sluice-worker")
"""Headers every fake answer carries that name internals; the gateway must relay none."""


# -- fake upstream instances -----------------------------------------------------------------


class FakeUpstream:
    """A minimal HTTP/1.1 keep-alive server whose behaviour is chosen by `mode`.

    json: OpenAI-shaped chat completion (SSE when the body asks for `stream`);
    sse: always streams `events` chunks `delay` apart (then a usage chunk, 2 prompt tokens,
    if the body asks `stream_options.include_usage`); abrupt: closes without answering;
    once: answers the first request on a connection, drops the connection on the next
    (a stale pooled connection); die_mid_stream: head and one chunk, then closes;
    eof: a body without length, ended by closing (HTTP/1.0 style); hang: never answers.
    json answers wait `latency` seconds and carry `status`. Every answer names its software
    and address as a uvicorn behind a proxy might (`INTERNALS`), and carries a `date`.
    """

    def __init__(
        self,
        name: str,
        mode: str = "json",
        *,
        events: int = 5,
        delay: float = 0.0,
        latency: float = 0.0,
        status: int = 200,
    ):
        self.name = name
        self.mode = mode
        self.events = events
        self.delay = delay
        self.latency = latency
        self.status = status
        self.active = 0  # requests being answered now
        self.peak = 0
        self.requests: list[tuple[str, str, dict[str, str], dict[str, Any]]] = []
        self.open_connections = 0
        self.accepted = 0
        self.carried: list[int] = []  # requests read on each connection, in accept order
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._stopping = asyncio.Event()

    async def start(self) -> FakeUpstream:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        self._stopping.set()
        for writer in self._writers:
            writer.close()
        await asyncio.gather(*self._tasks)
        await self._server.wait_closed()

    async def _answer_after_latency(self) -> None:
        """Wait `latency` seconds, or less when the upstream stops: a long latency holds a
        request for as long as a test needs without holding up its teardown."""
        with suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), self.latency)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        self.open_connections += 1
        self.accepted += 1
        mine = len(self.carried)
        self.carried.append(0)
        try:
            served = 0
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ")
                headers = dict(line.split(": ", 1) for line in lines[1:] if line)
                headers = {k.lower(): v for k, v in headers.items()}
                raw = await reader.readexactly(int(headers.get("content-length", "0")))
                body = json.loads(raw) if raw else {}
                self.requests.append((method, path, headers, body))
                self.carried[mine] += 1
                if self.mode == "abrupt" or (self.mode == "once" and served):
                    break
                if self.mode == "hang":
                    await self._stopping.wait()
                    break
                if self.mode == "eof":
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil ")
                    await writer.drain()
                    writer.write(b"the end")
                    break
                if self.mode in ("sse", "die_mid_stream") or body.get("stream"):
                    await self._stream(writer, body)
                    if self.mode == "die_mid_stream":
                        break
                else:
                    self.active += 1
                    self.peak = max(self.peak, self.active)
                    try:
                        await self._answer_after_latency()
                        await self._json(writer, body, headers)
                    finally:
                        self.active -= 1
                served += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.open_connections -= 1
            writer.close()
            with suppress(ConnectionError):
                await writer.wait_closed()
            self._writers.discard(writer)
            self._tasks.discard(task)

    async def _json(
        self, writer: asyncio.StreamWriter, body: dict[str, Any], headers: dict[str, str]
    ) -> None:
        payload = json.dumps(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 0,
                "model": body.get("model", ""),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": f"hello from {self.name}"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4},
                "instance": self.name,
                "seen_headers": headers,
            }
        ).encode()
        writer.write(
            b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\n%s"
            b"x-custom: %s\r\nx-sluice-group: spoofed\r\nkeep-alive: timeout=5\r\n"
            b"content-length: %d\r\n\r\n%s"
            % (self.status, self._internals(b"server"), self.name.encode(), len(payload), payload)
        )
        await writer.drain()

    async def _stream(self, writer: asyncio.StreamWriter, body: dict[str, Any]) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n%s"
            b"transfer-encoding: chunked\r\n\r\n" % self._internals(b"Server")
        )
        for i in range(self.events):
            chunk = {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": body.get("model", ""),
                "choices": [{"index": 0, "delta": {"content": f"tok{i} "}, "finish_reason": None}],
            }
            self._write_chunk(writer, b"data: %s\n\n" % json.dumps(chunk).encode())
            await writer.drain()
            if self.mode == "die_mid_stream":
                return
            await asyncio.sleep(self.delay)
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": 2, "completion_tokens": self.events}
            doc = {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "choices": [],
                "usage": usage,
            }
            self._write_chunk(writer, b"data: %s\n\n" % json.dumps(doc).encode())
        self._write_chunk(writer, b"data: [DONE]\n\n")
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    def _internals(self, server: bytes) -> bytes:
        """`INTERNALS` and a `date`, as header lines; `server` is how the first name is spelled
        (instances vary in case)."""
        return b"".join(
            (
                b"%s: uvicorn\r\n" % server,
                b"date: Mon, 01 Jan 2024 00:00:00 GMT\r\n",
                b"Via: 1.1 10.0.0.7:%d\r\n" % self.port,
                b"X-Powered-By: starlette\r\n",
                b"x-sluice-worker: 10.0.0.7:%d\r\n" % self.port,
            )
        )

    @staticmethod
    def _write_chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(b"%x\r\n%s\r\n" % (len(data), data))


# -- harness ----------------------------------------------------------------------------------


def make_snapshot(
    version: int,
    instances: list[tuple[str, int]],
    *,
    tenant: TenantAccess | None = None,
    group: str = "g1",
) -> RoutingSnapshot:
    """One group `group` serving m1 (rule r1), and a g-secret serving m2 nobody may reach."""
    return snapshot(
        version,
        {group: instances, "g-secret": []},
        [
            RouteRule("r-secret", (("g-secret", 1),), models=frozenset({"m2"})),
            RouteRule("r1", ((group, 1),), models=frozenset({"m1"})),
        ],
        tenants={"sk-test-f3abf2a6cc4f0098": tenant or TenantAccess("t1")},
        models={group: {"m1"}, "g-secret": {"m2"}},
    )


def snapshot(
    version: int,
    groups: Mapping[str, Iterable[tuple[str, int] | FakeUpstream]],
    rules: Iterable[RouteRule],
    *,
    tenants: Mapping[str, TenantAccess] | None = None,
    models: Mapping[str, Iterable[str]] | None = None,
    traffic: Mapping[str, GroupTraffic] | None = None,
    redirects: Mapping[str, str] | None = None,
    max_concurrency: int = 8,
    standby: Mapping[str, Iterable[tuple[str, int] | FakeUpstream]] | None = None,
) -> RoutingSnapshot:
    """`groups[name]`: its instances, as upstreams or (instance id, port) pairs; every group
    serves m1 unless `models` says; `tenants` by plain API key (default:
    sk-test-f3abf2a6cc4f0098 is t1); the instances are settled (ready long ago)."""
    served = {g: frozenset((models or {}).get(g, {"m1"})) for g in groups}
    keys = tenants if tenants is not None else {"sk-test-f3abf2a6cc4f0098": TenantAccess("t1")}
    return RoutingSnapshot(
        version=version,
        routes=RouteTable(list(rules)),
        tenants_by_key={api_key_digest(k): t for k, t in keys.items()},
        endpoints={
            g: tuple(Endpoint(iid, "127.0.0.1", port, max_concurrency) for iid, port in on(*eps))
            for g, eps in groups.items()
        },
        group_models=served,
        all_models=frozenset(m for ms in served.values() for m in ms),
        redirects=dict(redirects or {}),
        traffic=dict(traffic or {}),
        standby={
            g: tuple(Endpoint(iid, "127.0.0.1", port, max_concurrency) for iid, port in on(*eps))
            for g, eps in (standby or {}).items()
        },
    )


def g1(*ups: FakeUpstream, **kwargs: Any) -> Callable[[], RoutingSnapshot]:
    """For `running(snapshot=...)`: group g1 of `ups` (serving m1), rule r1 to it; other
    `snapshot()` keywords as given."""
    return lambda: snapshot(1, {"g1": on(*ups)}, [RouteRule("r1", (("g1", 1),))], **kwargs)


def on(*ups: FakeUpstream | tuple[str, int]) -> list[tuple[str, int]]:
    """(instance id, port) of each upstream (named as the upstream); pairs pass through."""
    return [(up.name, up.port) if isinstance(up, FakeUpstream) else up for up in ups]


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def running(
    *upstreams: FakeUpstream,
    snapshot: RoutingSnapshot | Callable[[], RoutingSnapshot] | None = None,
    **kwargs: Any,
) -> AsyncIterator[tuple[Gateway, httpx.AsyncClient, io.StringIO]]:
    """Upstreams, a gateway over them and a client; all torn down at the end.

    Without `snapshot`, the upstreams are the instances of g1 (see `make_snapshot`); a
    callable `snapshot` is called once the upstreams listen (so it can use their ports).
    """
    for up in upstreams:
        await up.start()
    log = io.StringIO()
    gw = Gateway(host="127.0.0.1", port=0, rng=random.Random(7), access_log=log, **kwargs)
    if snapshot is None:
        snapshot = make_snapshot(1, [(up.name, up.port) for up in upstreams])
    gw.update(snapshot() if callable(snapshot) else snapshot)
    await gw.start()
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{gw.port}", timeout=10.0, limits=limits)
    try:
        yield gw, client, log
    finally:
        await client.aclose()
        await gw.stop(timeout=2.0)
        for up in upstreams:
            await up.stop()


def log_lines(log: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.getvalue().splitlines()]


async def chat(
    client: httpx.AsyncClient,
    key: str = "sk-test-f3abf2a6cc4f0098",
    model: str = "m1",
    **headers: str,
) -> httpx.Response:
    """One chat completion with API key `key` (extra headers: underscores become dashes)."""
    extra = {k.replace("_", "-"): v for k, v in headers.items()}
    return await client.post(
        "/v1/chat/completions",
        json={**CHAT, "model": model},
        headers={"Authorization": f"Bearer {key}", **extra},
    )


def metric_values(text: str) -> Callable[..., float]:
    """Parse a Prometheus exposition (`Gateway.metrics_text()`); returns
    `value(name, **labels)` for one sample."""
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    return value


def q(max_queue: int = 100, max_wait_s: float = 5.0, **kwargs: Any) -> GroupTraffic:
    """A group's traffic settings: queue limits, and any other `GroupTraffic` field."""
    return GroupTraffic(max_queue=max_queue, max_wait_s=max_wait_s, **kwargs)


async def groups_of(
    client: httpx.AsyncClient, n: int, concurrency: int = 20, header: str = "x-sluice-group"
) -> Counter[str]:
    """Send `n` chat requests, `concurrency` at a time; count the groups that served them
    (or the values of another response `header`)."""
    sem = asyncio.Semaphore(concurrency)

    async def one() -> str:
        async with sem:
            resp = await chat(client)
            assert resp.status_code == 200, resp.text
            return str(resp.headers[header])

    return Counter(await asyncio.gather(*(one() for _ in range(n))))
