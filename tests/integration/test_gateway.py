"""The gateway in front of tiny real upstream servers on 127.0.0.1, driven by real clients."""

from __future__ import annotations

import asyncio
import io
import json
import random
import re
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import httpx
import openai
import pytest

from sluice.gateway import Gateway
from sluice.policy.routing import (
    Endpoint,
    RouteRule,
    RouteTable,
    RoutingSnapshot,
    TenantAccess,
    api_key_digest,
)

AUTH = {"Authorization": "Bearer sk-test"}
CHAT = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}


# -- fake upstream instances -----------------------------------------------------------------


class FakeUpstream:
    """A minimal HTTP/1.1 keep-alive server whose behaviour is chosen by `mode`.

    json: OpenAI-shaped chat completion (SSE when the body asks for `stream`);
    sse: always streams `events` chunks `delay` apart; abrupt: closes without answering;
    once: answers the first request on a connection, drops the connection on the next
    (a stale pooled connection); die_mid_stream: head and one chunk, then closes;
    eof: a body without length, ended by closing (HTTP/1.0 style); hang: never answers.
    """

    def __init__(self, name: str, mode: str = "json", *, events: int = 5, delay: float = 0.0):
        self.name = name
        self.mode = mode
        self.events = events
        self.delay = delay
        self.requests: list[tuple[str, str, dict[str, str], dict[str, Any]]] = []
        self.open_connections = 0
        self.accepted = 0
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

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        self.open_connections += 1
        self.accepted += 1
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
                    await self._json(writer, body, headers)
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
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"x-upstream: %s\r\nx-sluice-group: spoofed\r\nkeep-alive: timeout=5\r\n"
            b"content-length: %d\r\n\r\n%s" % (self.name.encode(), len(payload), payload)
        )
        await writer.drain()

    async def _stream(self, writer: asyncio.StreamWriter, body: dict[str, Any]) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
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
        self._write_chunk(writer, b"data: [DONE]\n\n")
        writer.write(b"0\r\n\r\n")
        await writer.drain()

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
    endpoints = tuple(Endpoint(iid, "127.0.0.1", port, 8) for iid, port in instances)
    return RoutingSnapshot(
        version=version,
        routes=RouteTable(
            [
                RouteRule("r-secret", "g-secret", models=frozenset({"m2"})),
                RouteRule("r1", group, models=frozenset({"m1"})),
            ]
        ),
        tenants_by_key={api_key_digest("sk-test"): tenant or TenantAccess("t1")},
        endpoints={group: endpoints} if endpoints else {},
        group_models={group: frozenset({"m1"}), "g-secret": frozenset({"m2"})},
        all_models=frozenset({"m1", "m2"}),
    )


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def running(
    *upstreams: FakeUpstream, snapshot: RoutingSnapshot | None = None, **kwargs: Any
) -> AsyncIterator[tuple[Gateway, httpx.AsyncClient, io.StringIO]]:
    """Upstreams, a gateway over them (one instance per upstream) and a client; all torn down."""
    for up in upstreams:
        await up.start()
    log = io.StringIO()
    gw = Gateway(host="127.0.0.1", port=0, rng=random.Random(7), access_log=log, **kwargs)
    gw.update(snapshot or make_snapshot(1, [(up.name, up.port) for up in upstreams]))
    await gw.start()
    client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{gw.port}", timeout=10.0)
    try:
        yield gw, client, log
    finally:
        await client.aclose()
        await gw.stop(timeout=2.0)
        for up in upstreams:
            await up.stop()


def log_lines(log: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.getvalue().splitlines()]


# -- happy path -------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_proxies_with_sluice_headers_and_one_log_line() -> None:
    up = FakeUpstream("i1")
    async with running(up) as (gw, client, log):
        resp = await client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
        assert resp.status_code == 200
        assert resp.json()["instance"] == "i1"
        assert resp.headers["x-sluice-group"] == "g1"  # the upstream's spoofed one is dropped
        assert resp.headers["x-sluice-instance"] == "i1"
        assert resp.headers["x-sluice-route"] == "r1"
        assert resp.headers["x-upstream"] == "i1"
        assert "keep-alive" not in resp.headers
        request_id = resp.headers["x-request-id"]
        seen = resp.json()["seen_headers"]
        assert seen["x-request-id"] == request_id
        assert "authorization" not in seen  # tenant keys never reach instances
        assert seen["host"] == f"127.0.0.1:{up.port}"
        assert "connection" not in seen
        assert gw.outstanding() == {}
        [line] = log_lines(log)
    assert line["request_id"] == request_id
    assert line["method"] == "POST"
    assert line["path"] == "/v1/chat/completions"
    assert line["status"] == 200
    assert (line["tenant"], line["model"], line["route"]) == ("t1", "m1", "r1")
    assert (line["group"], line["instance"]) == ("g1", "i1")
    assert line["retried"] is False
    assert line["error"] is None
    assert line["bytes_out"] == len(resp.content)
    assert isinstance(line["latency_ms"], float)
    assert abs(line["ts"] - time.time()) < 60


@pytest.mark.asyncio
async def test_client_request_id_is_kept_and_connections_are_reused() -> None:
    up = FakeUpstream("i1")
    async with running(up) as (_, client, _log):
        for _ in range(5):
            resp = await client.post(
                "/v1/embeddings", json={"model": "m1"}, headers={**AUTH, "x-request-id": "abc"}
            )
            assert resp.headers["x-request-id"] == "abc"
        assert up.requests[-1][2]["x-request-id"] == "abc"
        assert up.accepted == 1


@pytest.mark.asyncio
async def test_healthz_and_models() -> None:
    tenant = TenantAccess("t1", models=frozenset({"m1"}))
    up = FakeUpstream("i1")
    async with running(up, snapshot=make_snapshot(3, [], tenant=tenant)) as (gw, client, log):
        gw.update(make_snapshot(4, [("i1", 1)], tenant=tenant))
        health = await client.get("/healthz")
        assert health.status_code == 200
        assert health.json() == {"status": "ok", "version": 4}
        assert gw.snapshot_version == 4
        models = await client.get("/v1/models", headers=AUTH)
        assert models.json() == {
            "object": "list",
            "data": [{"id": "m1", "object": "model", "owned_by": "sluice"}],
        }
        assert (await client.get("/v1/models")).status_code == 401
        assert len(log_lines(log)) == 3


# -- errors -----------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_errors_are_json_with_known_headers() -> None:
    tenant = TenantAccess("t1", models=frozenset({"m1"}))
    async with running(snapshot=make_snapshot(1, [], tenant=tenant), max_body_bytes=1000) as (
        _,
        client,
        log,
    ):

        async def call(body: Any, headers: dict[str, str] = AUTH, raw: bytes | None = None):
            content = raw if raw is not None else json.dumps(body).encode()
            return await client.post("/v1/chat/completions", content=content, headers=headers)

        cases = [
            (await call(CHAT, {}), 401, "unauthorized"),
            (await call(CHAT, {"Authorization": "Bearer nope"}), 401, "unauthorized"),
            (await call(None, raw=b"{not json"), 400, "invalid_request"),
            (await call({"messages": []}), 400, "invalid_request"),
            (await call({"model": "nope"}), 404, "not_found"),
            (await call({"model": "m2"}), 403, "forbidden"),
            (await call(CHAT), 503, "unavailable"),
            (await call(None, raw=b'{"model":"m1","x":"' + b"a" * 2000 + b'"}'), 413, None),
            (await client.get("/nowhere"), 404, "not_found"),
            (await client.get("/v1/chat/completions", headers=AUTH), 405, None),
        ]
        for resp, status, code in cases:
            assert resp.status_code == status, resp.text
            assert resp.headers["content-type"] == "application/json"
            assert "x-request-id" in resp.headers
            error = resp.json()["error"]
            assert set(error) >= {"code", "message"}
            if code is not None:
                assert error["code"] == code
        forbidden = cases[5][0]
        assert "g-secret" not in forbidden.text and "x-sluice-group" not in forbidden.headers
        unavailable = cases[6][0]
        assert unavailable.headers["retry-after"] == "1"
        assert unavailable.headers["x-sluice-group"] == "g1"
        assert unavailable.headers["x-sluice-route"] == "r1"
        assert "x-sluice-instance" not in unavailable.headers
        lines = log_lines(log)
        assert [line["status"] for line in lines] == [status for _, status, _ in cases]
        assert lines[0]["error"] == "unauthorized" and lines[0]["tenant"] is None


@pytest.mark.asyncio
async def test_oversized_upload_gets_413_not_a_reset() -> None:
    async with running() as (_, client, log):
        body = b'{"model":"m1","pad":"' + b"x" * (9 * 1024 * 1024) + b'"}'
        resp = await client.post("/v1/chat/completions", content=body, headers=AUTH)
        assert resp.status_code == 413
        assert resp.json()["error"]["code"] == "request_too_large"
        assert log_lines(log)[0]["status"] == 413


@pytest.mark.asyncio
async def test_upstream_timeout_is_504() -> None:
    up = FakeUpstream("i1", mode="hang")
    async with running(up, upstream_timeout_s=0.3) as (gw, client, log):
        start = time.perf_counter()
        resp = await client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
        assert resp.status_code == 504
        assert 0.25 < time.perf_counter() - start < 3.0
        assert resp.headers["x-sluice-instance"] == "i1"
        assert gw.outstanding() == {}
        assert log_lines(log)[0]["error"] == "upstream_timeout"


@pytest.mark.asyncio
async def test_every_instance_failing_is_502() -> None:
    up = FakeUpstream("i1", mode="abrupt")
    async with running(up) as (gw, client, log):
        resp = await client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
        assert resp.status_code == 502
        assert resp.json()["error"]["code"] == "upstream_error"
        assert gw.outstanding() == {}
        assert log_lines(log)[0]["retried"] is True


# -- streaming --------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_streaming_arrives_incrementally() -> None:
    up = FakeUpstream("i1", mode="sse", events=5, delay=0.2)
    async with running(up) as (gw, client, log):
        arrivals: list[float] = []
        start = time.perf_counter()
        body = b""
        async with client.stream(
            "POST", "/v1/chat/completions", json={**CHAT, "stream": True}, headers=AUTH
        ) as resp:
            assert resp.headers["x-sluice-instance"] == "i1"
            assert resp.headers["transfer-encoding"] == "chunked"
            async for chunk in resp.aiter_raw():
                arrivals.append(time.perf_counter() - start)
                body += chunk
                if len(arrivals) == 1:
                    assert gw.outstanding() == {"i1": 1}
        assert body.count(b"data: ") == 6 and body.endswith(b"data: [DONE]\n\n")
        assert arrivals[0] < 0.5  # the first event is not held back...
        assert arrivals[-1] - arrivals[0] > 0.6  # ...until the last one
        assert gw.outstanding() == {}
        assert log_lines(log)[0]["bytes_out"] == len(body)


@pytest.mark.asyncio
async def test_body_ended_by_upstream_close_is_rechunked() -> None:
    async with running(FakeUpstream("i1", mode="eof")) as (_, client, log):
        resp = await client.post("/v1/completions", json=CHAT, headers=AUTH)
        assert resp.status_code == 200
        assert resp.headers["transfer-encoding"] == "chunked"
        assert resp.text == "until the end"
        assert log_lines(log)[0]["error"] is None


@pytest.mark.asyncio
async def test_client_leaving_mid_stream_frees_the_instance() -> None:
    up = FakeUpstream("i1", mode="sse", events=50, delay=0.05)
    async with running(up) as (gw, client, log):
        async with client.stream("POST", "/v1/completions", json=CHAT, headers=AUTH) as resp:
            async for _ in resp.aiter_raw():
                break  # leaving the block closes the connection mid-response
        async with asyncio.timeout(3):
            while gw.outstanding() or not log.getvalue() or up.open_connections:
                await asyncio.sleep(0.01)
        [line] = log_lines(log)
        assert line["status"] == 200 and line["error"] == "client_disconnected"


@pytest.mark.asyncio
async def test_upstream_dying_mid_stream_breaks_the_response_without_hanging() -> None:
    up = FakeUpstream("i1", mode="die_mid_stream")
    async with running(up) as (gw, client, log):
        start = time.perf_counter()
        with pytest.raises(httpx.RemoteProtocolError):
            async with asyncio.timeout(5):
                async with client.stream(
                    "POST", "/v1/chat/completions", json=CHAT, headers=AUTH
                ) as r:
                    assert r.status_code == 200
                    async for _ in r.aiter_raw():
                        pass
        assert time.perf_counter() - start < 2.0
        assert gw.outstanding() == {}
        [line] = log_lines(log)
        assert line["status"] == 200 and line["error"] == "upstream_error"


# -- resilience -------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_dead_instance_is_retried_on_another() -> None:
    up = FakeUpstream("i2")
    await up.start()
    snapshot = make_snapshot(1, [("i1", free_port()), ("i2", up.port)])
    async with running(snapshot=snapshot) as (gw, client, log):
        for _ in range(6):
            resp = await client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
            assert resp.status_code == 200
            assert resp.headers["x-sluice-instance"] == "i2"
        lines = log_lines(log)
        assert any(line["retried"] for line in lines)
        assert all(line["instance"] == "i2" and line["status"] == 200 for line in lines)
        assert gw.outstanding() == {}
    await up.stop()


@pytest.mark.asyncio
async def test_stale_pooled_connection_never_loses_the_request() -> None:
    up = FakeUpstream("i1", mode="once")
    async with running(up) as (_, client, log):
        for _ in range(3):
            resp = await client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
            assert resp.status_code == 200
        assert [line["retried"] for line in log_lines(log)] == [False] * 3
        assert len(up.requests) == 5  # two of them hit a connection the upstream had dropped


@pytest.mark.asyncio
async def test_removed_instance_idle_connections_are_closed() -> None:
    a, b = FakeUpstream("a"), FakeUpstream("b")
    async with running(a, b) as (gw, client, _log):
        for _ in range(4):
            await client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
        assert a.open_connections == 1
        gw.update(make_snapshot(2, [("b", b.port)]))
        async with asyncio.timeout(2):
            while a.open_connections:
                await asyncio.sleep(0.01)


@pytest.mark.asyncio
async def test_swapping_snapshots_mid_traffic_loses_no_request() -> None:
    ups = [FakeUpstream(name) for name in ("a1", "a2", "b1", "b2")]
    async with running(*ups) as (gw, client, _log):
        sets = [[(u.name, u.port) for u in ups[:2]], [(u.name, u.port) for u in ups[2:]]]
        stop = asyncio.Event()

        async def swap() -> None:
            version = 1
            while not stop.is_set():
                version += 1
                gw.update(make_snapshot(version, sets[version % 2]))
                await asyncio.sleep(0.003)

        sem = asyncio.Semaphore(8)

        async def one() -> str:
            async with sem:
                resp = await client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
                assert resp.status_code == 200, resp.text
                return str(resp.headers["x-sluice-instance"])

        swapper = asyncio.create_task(swap())
        async with asyncio.timeout(30):
            served = await asyncio.gather(*(one() for _ in range(200)))
        stop.set()
        await swapper
        assert len(served) == 200
        assert {"a1", "a2"} & set(served) and {"b1", "b2"} & set(served)
        assert gw.outstanding() == {}


@pytest.mark.asyncio
async def test_stop_lets_a_stream_in_flight_finish() -> None:
    up = FakeUpstream("i1", mode="sse", events=4, delay=0.1)
    await up.start()
    gw = Gateway(rng=random.Random(1))
    gw.update(make_snapshot(1, [("i1", up.port)]))
    await gw.start()
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gw.port}") as client:
        async with client.stream("POST", "/v1/completions", json=CHAT, headers=AUTH) as resp:
            stopping = asyncio.create_task(gw.stop(timeout=5))
            body = b"".join([chunk async for chunk in resp.aiter_raw()])
        await stopping
    assert body.endswith(b"data: [DONE]\n\n")
    await up.stop()


@pytest.mark.asyncio
async def test_pipelined_requests_are_answered_in_order() -> None:
    up = FakeUpstream("i1")
    async with running(up) as (gw, _client, log):
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(
            b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n"
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer sk-test\r\n"
            b'content-length: 14\r\n\r\n{"model":"m1"}'
            b"GET /nowhere HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
        )
        async with asyncio.timeout(5):
            data = await reader.read(-1)
        writer.close()
        await writer.wait_closed()
        assert re.findall(rb"HTTP/1\.1 (\d{3})", data) == [b"200", b"200", b"404"]
        assert [line["path"] for line in log_lines(log)] == [
            "/healthz",
            "/v1/completions",
            "/nowhere",
        ]
        assert up.requests[0][2]["content-length"] == "14"  # a chunked upload, forwarded whole


@pytest.mark.asyncio
async def test_expect_100_continue_is_answered() -> None:
    async with running(FakeUpstream("i1")) as (gw, _client, _log):
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer sk-test\r\n"
            b"expect: 100-continue\r\ncontent-length: 14\r\nconnection: close\r\n\r\n"
        )
        async with asyncio.timeout(5):
            assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
            writer.write(b'{"model":"m1"}')
            data = await reader.read(-1)
        writer.close()
        await writer.wait_closed()
        assert data.startswith(b"HTTP/1.1 200 OK\r\n")


# -- a real OpenAI client ---------------------------------------------------------------------


@pytest.mark.asyncio
async def test_openai_client_through_the_gateway() -> None:
    up = FakeUpstream("i1", delay=0.01)
    async with (
        running(up) as (gw, _client, _log),
        openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{gw.port}/v1", api_key="sk-test", max_retries=0
        ) as oai,
    ):
        completion = await oai.chat.completions.create(model="m1", messages=CHAT["messages"])
        assert completion.choices[0].message.content == "hello from i1"
        stream = await oai.chat.completions.create(
            model="m1", messages=CHAT["messages"], stream=True
        )
        tokens = [chunk.choices[0].delta.content async for chunk in stream]
        assert tokens == [f"tok{i} " for i in range(5)]
        models = await oai.models.list()
        assert [m.id for m in models.data] == ["m1", "m2"]
