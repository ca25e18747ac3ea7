"""The gateway's limits (`gateway.limits`) and client disconnects, over real sockets on
127.0.0.1: each limit answers its status with the usual JSON error naming the limit, slow or
greedy clients are cut off without costing memory or other clients' time, and a client that
leaves frees its slot on the gateway and on the instance (a real worker process)."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
import pytest

from sluice.gateway import Gateway
from sluice.gateway.errors import JsonTooDeep
from sluice.gateway.exchange import deeper_than, parse_json
from sluice.policy.routing import RouteRule
from sluice.spec.models import GatewayLimits, GatewaySpec

from .gateway_fakes import (
    AUTH,
    CHAT,
    FakeUpstream,
    chat,
    free_port,
    g1,
    log_lines,
    metric_values,
)
from .gateway_fakes import running as running_gateway
from .gateway_fakes import snapshot as make_routing

KEY = b"authorization: Bearer sk-test-f3abf2a6cc4f0098\r\n"


# -- raw HTTP helpers -------------------------------------------------------------------------


def request(
    body: bytes = json.dumps(CHAT).encode(),
    *,
    path: bytes = b"/v1/chat/completions",
    headers: bytes = b"",
    close: bool = False,
) -> bytes:
    return b"POST %s HTTP/1.1\r\nhost: gw\r\n%s%s%scontent-length: %d\r\n\r\n%s" % (
        path,
        KEY,
        headers,
        b"connection: close\r\n" if close else b"",
        len(body),
        body,
    )


class Response:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def error(self) -> dict[str, Any]:
        assert self.headers["content-type"] == "application/json", self.headers
        err: dict[str, Any] = json.loads(self.body)["error"]
        return err


async def read_response(reader: asyncio.StreamReader) -> Response:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = dict(line.split(": ", 1) for line in lines[1:] if line)
    headers = {k.lower(): v for k, v in headers.items()}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return Response(status, headers, body)


@asynccontextmanager
async def connection(
    port: int, local: str | None = None
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, local_addr=(local, 0) if local else None
    )
    try:
        yield reader, writer
    finally:
        writer.close()
        with suppress(ConnectionError):
            await writer.wait_closed()


async def exchange(port: int, data: bytes, timeout: float = 5.0) -> Response:
    """Send `data` on a fresh connection and read one response."""
    async with connection(port) as (reader, writer):
        writer.write(data)
        async with asyncio.timeout(timeout):
            return await read_response(reader)


async def closed_by_peer(reader: asyncio.StreamReader, timeout: float) -> bytes:
    """Everything the gateway still sends until it closes the connection."""
    async with asyncio.timeout(timeout):
        try:
            return await reader.read(-1)
        except ConnectionResetError:
            return b""


def refused(gw: Gateway, reason: str) -> float:
    return metric_values(gw.metrics_text()[0].decode())(
        "sluice_gateway_refused_total", reason=reason
    )


def running(*ups: FakeUpstream, **limits: Any) -> Any:
    """The harness of the gateway tests, with `gateway.limits` fields as keywords."""
    return running_gateway(*ups, limits=GatewayLimits(**limits))


def vm_rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS in /proc/self/status")


# -- the spec -----------------------------------------------------------------------------------


def test_limits_have_defaults_and_are_validated() -> None:
    limits = GatewaySpec().limits
    assert limits.max_header_bytes == 64 * 1024 and limits.max_headers == 100
    assert limits.max_request_line_bytes == 8 * 1024 and limits.max_body_bytes == 8 * 1024**2
    assert limits.header_timeout_s == 10.0 and limits.body_timeout_s == 60.0
    assert limits.keepalive_timeout_s == 75.0
    assert limits.max_connections == 10_000 and limits.max_connections_per_ip == 256
    assert limits.max_json_depth == 64 and limits.write_stall_s == 30.0
    spec = GatewaySpec.model_validate({"limits": {"max_headers": 50, "header_timeout_s": 2}})
    assert spec.limits.max_headers == 50 and spec.limits.header_timeout_s == 2.0
    with pytest.raises(ValueError, match="max_header_bytes"):
        GatewaySpec.model_validate({"limits": {"max_header_bytes": 10}})
    with pytest.raises(ValueError, match="max_header_byte"):
        GatewaySpec.model_validate({"limits": {"max_header_byte": 4096}})


def test_json_depth_is_measured_without_recursion() -> None:
    assert not deeper_than({"a": [1, {"b": []}]}, 4) and deeper_than({"a": [1, {"b": []}]}, 3)
    assert not deeper_than("scalar", 1) and not deeper_than([], 1) and deeper_than([[]], 1)
    for depth, deep in ((64, False), (65, True), (1023, True), (1500, True), (100_000, True)):
        body = b"[" * depth + b"]" * depth
        if deep:
            with pytest.raises(JsonTooDeep):
                parse_json(body, 64)
        else:
            assert parse_json(body, 64) == parse_json(body, 1000)
    # brackets inside strings do not count; what orjson refuses still reaches the stdlib
    assert parse_json(b'{"x": "' + b"[" * 500 + b'"}', 64) == {"x": "[" * 500}
    with pytest.raises(JsonTooDeep):
        parse_json(b"[NaN, " + b"[" * 1500 + b"]" * 1500 + b"]", 64)
    assert parse_json(b"[NaN]", 64) != [0]  # (NaN: orjson refuses it, the stdlib takes it)


# -- the head ---------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_too_large_head_is_431_naming_the_limit() -> None:
    async with running(FakeUpstream("i1"), max_header_bytes=4096) as (gw, _client, log):
        pad = b"x-pad: %s\r\n"
        base = len(request(headers=pad % b"")) - len(json.dumps(CHAT))  # the head alone
        fits = request(headers=pad % (b"a" * (4096 - base)))
        over = request(headers=pad % (b"a" * (4097 - base)))
        assert (await exchange(gw.port, fits)).status == 200  # exactly at the limit
        resp = await exchange(gw.port, over)
        assert resp.status == 431
        err = resp.error()
        assert err["code"] == "request_header_too_large"
        assert "max_header_bytes" in err["message"] and "4096" in err["message"]
        assert err["limit"] == "gateway.limits.max_header_bytes" and err["limit_value"] == 4096
        assert "x-request-id" in resp.headers and resp.headers.get("connection") == "close"
        # the same head in three reads is measured the same way
        for data, status in ((fits, 200), (over, 431)):
            async with connection(gw.port) as (reader, writer):
                for piece in (data[:1000], data[1000:3000], data[3000:]):
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0.05)
                async with asyncio.timeout(5):
                    assert (await read_response(reader)).status == status
        assert refused(gw, "header_bytes") == 2
        assert [line["status"] for line in log_lines(log)] == [200, 431, 200, 431]


@pytest.mark.asyncio
async def test_pipelined_requests_are_not_charged_for_each_others_bytes() -> None:
    async with running(FakeUpstream("i1"), max_header_bytes=4096) as (gw, _client, _log):
        big_body = json.dumps({**CHAT, "pad": "b" * 3000}).encode()
        second = request(headers=b"x-pad: %s\r\n" % (b"h" * 3500), close=True)
        async with connection(gw.port) as (reader, writer):
            writer.write(request(big_body) + second)  # one write: mostly one read
            async with asyncio.timeout(5):
                assert (await read_response(reader)).status == 200
                assert (await read_response(reader)).status == 200
        assert refused(gw, "header_bytes") == 0


@pytest.mark.asyncio
async def test_too_many_headers_is_431_and_a_long_url_414() -> None:
    async with running(FakeUpstream("i1")) as (gw, _client, _log):
        # host, authorization, content-length and 97 more: 100 lines
        lines = b"".join(b"x-h%d: v\r\n" % i for i in range(97))
        assert (await exchange(gw.port, request(headers=lines))).status == 200
        resp = await exchange(gw.port, request(headers=lines + b"x-one-more: v\r\n"))
        assert resp.status == 431
        assert "max_headers" in resp.error()["message"] and "100" in resp.error()["message"]
        resp = await exchange(gw.port, request(headers=b"a: b\r\n" * 5000))
        assert resp.status == 431 and resp.error()["code"] == "request_header_too_large"

        long_path = b"/v1/chat/completions?" + b"q" * 8200
        resp = await exchange(gw.port, request(path=long_path))
        assert resp.status == 414 and resp.error()["code"] == "request_uri_too_long"
        assert (
            "max_request_line_bytes" in resp.error()["message"]
            and "8192" in resp.error()["message"]
        )
        huge_path = b"/v1/chat/completions?" + b"q" * 200_000  # past the head's limit too
        assert (await exchange(gw.port, request(path=huge_path))).status == 414
        assert refused(gw, "header_count") == 2 and refused(gw, "request_line") == 2


@pytest.mark.asyncio
async def test_too_large_body_is_413_naming_the_limit() -> None:
    async with running(FakeUpstream("i1"), max_body_bytes=2048) as (gw, _client, _log):
        big = json.dumps({**CHAT, "pad": "p" * 3000}).encode()
        resp = await exchange(gw.port, request(big))
        assert resp.status == 413 and resp.error()["code"] == "request_too_large"
        assert "max_body_bytes" in resp.error()["message"] and "2048" in resp.error()["message"]
        chunked = (
            b"POST /v1/completions HTTP/1.1\r\nhost: gw\r\n%stransfer-encoding: chunked\r\n\r\n"
        )
        async with connection(gw.port) as (reader, writer):
            writer.write(chunked % KEY + b"400\r\n" + b"p" * 1024 + b"\r\n")
            writer.write(b"400\r\n" + b"p" * 1024 + b"\r\n" + b"400\r\n" + b"p" * 1024 + b"\r\n")
            async with asyncio.timeout(5):
                assert (await read_response(reader)).status == 413
        # what follows a head is bounded as sent too: a chunked body's trailer is gathered
        # like a header, so a huge one is cut at max_body_bytes + max_header_bytes
        async with connection(gw.port) as (reader, writer):
            writer.write(chunked % KEY + b"2\r\n{}\r\n0\r\nx-trailer: ")
            answer = asyncio.ensure_future(read_response(reader))
            with suppress(ConnectionError):
                for _ in range(200):  # up to 13 MB
                    writer.write(b"t" * 65536)
                    await writer.drain()
                    if answer.done():
                        break
            async with asyncio.timeout(5):
                resp = await answer
            assert resp.status == 413 and "max_body_bytes" in resp.error()["message"]
        assert refused(gw, "body_bytes") == 3


@pytest.mark.asyncio
async def test_a_64_mb_header_is_cut_at_the_limit_without_buffering_it() -> None:
    async with running(FakeUpstream("i1")) as (gw, client, _log):
        assert (await chat(client)).status_code == 200  # warm up
        before = vm_rss_kib()
        peak = before
        chunk = b"a" * 65536
        results: list[tuple[int, int]] = []

        async def greedy() -> None:
            nonlocal peak
            sent = 0
            async with connection(gw.port) as (reader, writer):
                writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\nx-big: ")
                answer = asyncio.ensure_future(read_response(reader))
                try:
                    async with asyncio.timeout(20):
                        while sent < 64 * 1024 * 1024 and not answer.done():
                            writer.write(chunk)
                            await writer.drain()
                            sent += len(chunk)
                            peak = max(peak, vm_rss_kib())
                        resp = await answer
                except ConnectionError:  # the gateway closed after answering
                    resp = await asyncio.wait_for(answer, 5)
                results.append((resp.status, sent))

        await asyncio.gather(*(greedy() for _ in range(4)))
        growth_mb = (max(peak, vm_rss_kib()) - before) / 1024
        sent_mb = [round(sent / 2**20, 1) for _, sent in results]
        print(
            f"\n4 clients sending a 64 MB header: RSS grew {growth_mb:.1f} MB; MB sent: {sent_mb}"
        )
        assert [status for status, _ in results] == [431] * 4
        assert growth_mb < 8
        assert refused(gw, "header_bytes") == 4
        assert (await chat(client)).status_code == 200


# -- time -------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_slowloris_is_cut_by_the_head_deadline_while_others_are_served() -> None:
    async with running(FakeUpstream("i1"), header_timeout_s=2.0) as (gw, client, log):

        async def slowloris() -> tuple[float, bytes]:
            async with connection(gw.port) as (reader, writer):
                return await drip(reader, writer, request(), 1.0)  # a byte a second

        slow = asyncio.ensure_future(slowloris())
        await asyncio.sleep(0.5)
        start = time.perf_counter()
        resp = await chat(client)
        served_in = time.perf_counter() - start
        assert resp.status_code == 200 and not slow.done()
        after, data = await slow
        print(
            f"\nslowloris cut after {after:.2f} s; "
            f"meanwhile a request took {served_in * 1000:.1f} ms"
        )
        assert 1.9 < after < 5.0 and served_in < 1.0
        assert data.startswith(b"HTTP/1.1 408 ")
        err = json.loads(data.partition(b"\r\n\r\n")[2])["error"]
        assert err["code"] == "request_timeout" and "header_timeout_s is 2.0" in err["message"]
        assert refused(gw, "header_timeout") == 1
        assert [line["status"] for line in log_lines(log)] == [200, 408]


async def drip(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes, every: float
) -> tuple[float, bytes]:
    """Send `data` a byte at a time, `every` seconds apart, until the gateway closes the
    connection; returns how long that took and what it sent back."""
    start = time.perf_counter()
    reading = asyncio.ensure_future(closed_by_peer(reader, 30))
    for byte in data:
        with suppress(ConnectionError):
            writer.write(bytes([byte]))
        await asyncio.wait([reading], timeout=every)
        if reading.done():
            break
    answer = await reading
    return time.perf_counter() - start, answer


@pytest.mark.asyncio
async def test_silent_and_idle_connections_are_closed() -> None:
    limits = {"header_timeout_s": 0.5, "keepalive_timeout_s": 1.5}
    async with running(FakeUpstream("i1", latency=0.8), **limits) as (gw, _client, _log):
        async with connection(gw.port) as (reader, _writer):  # sends nothing at all
            start = time.perf_counter()
            assert await closed_by_peer(reader, 5) == b""  # closed, no answer
            assert 0.45 < time.perf_counter() - start < 3.0
        async with connection(gw.port) as (reader, writer):
            writer.write(request())  # answered after 0.8 s: longer than the head deadline
            async with asyncio.timeout(5):
                assert (await read_response(reader)).status == 200
            await asyncio.sleep(0.8)  # idle for longer than the head deadline: still open
            writer.write(request())
            async with asyncio.timeout(5):
                assert (await read_response(reader)).status == 200
            start = time.perf_counter()
            assert await closed_by_peer(reader, 5) == b""  # idle past keepalive_timeout_s
            assert 1.4 < time.perf_counter() - start < 4.0
        async with connection(gw.port) as (reader, writer):
            writer.write(request())
            async with asyncio.timeout(5):
                assert (await read_response(reader)).status == 200
            # a byte every 0.3 s no longer keeps a connection open: the head is due in 0.5 s
            took, answer = await drip(reader, writer, request(), 0.3)
            assert answer.startswith(b"HTTP/1.1 408 ") and took < 3.0
        assert refused(gw, "header_timeout") == 2


@pytest.mark.asyncio
async def test_slow_body_is_408() -> None:
    async with running(FakeUpstream("i1"), body_timeout_s=0.5) as (gw, _client, _log):
        async with connection(gw.port) as (reader, writer):
            writer.write(request()[:-10])  # the head, and all but 10 bytes of the body
            start = time.perf_counter()
            data = await closed_by_peer(reader, 5)
            assert 0.45 < time.perf_counter() - start < 3.0
        assert data.startswith(b"HTTP/1.1 408 ")
        err = json.loads(data.partition(b"\r\n\r\n")[2])["error"]
        assert "body_timeout_s" in err["message"] and "0.5" in err["message"]
        assert refused(gw, "body_timeout") == 1


# -- clients that stop reading ----------------------------------------------------------------


async def small_window_socket(port: int) -> socket.socket:
    """A connected non-blocking socket with a small receive buffer (4 KiB asked, no
    autotuning), so that a client not reading backs the answer up into the gateway soon."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return sock


async def read_until_closed(sock: socket.socket, timeout: float) -> int:
    """Bytes read until the gateway closes the connection (EOF or reset)."""
    loop = asyncio.get_running_loop()
    total = 0
    async with asyncio.timeout(timeout):
        try:
            while data := await loop.sock_recv(sock, 1 << 16):
                total += len(data)
        except ConnectionResetError:
            pass
    return total


@pytest.mark.asyncio
async def test_a_client_that_stops_reading_a_stream_is_cut_off_and_its_instance_freed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A slow reader is left alone; one that reads nothing for `write_stall_s` is cut off,
    and the instance's connection is closed (not pooled), so it stops generating."""
    up = FakeUpstream("i1", mode="sse", events=1_000_000)  # far more than any buffer holds
    async with running(up, write_stall_s=0.5) as (gw, client, log):
        loop = asyncio.get_running_loop()
        sock = await small_window_socket(gw.port)
        try:
            await loop.sock_sendall(sock, request(json.dumps({**CHAT, "stream": True}).encode()))
            # 4 KiB every 0.1 s for 2 s: slow, but reading, so never cut
            for _ in range(20):
                await asyncio.sleep(0.1)
                assert await loop.sock_recv(sock, 4096)
            start = time.perf_counter()  # ...then it reads nothing more
            assert refused(gw, "write_stall") == 0
            assert gw.outstanding() == {"i1": 1} and up.open_connections == 1
            async with asyncio.timeout(10):
                while gw.outstanding() or up.open_connections:
                    await asyncio.sleep(0.01)
            cut_after = time.perf_counter() - start
            await read_until_closed(sock, 5)  # what was in flight, then the reset
        finally:
            sock.close()
        print(f"\na client that stopped reading was cut off {cut_after:.2f} s later")
        assert 0.5 <= cut_after < 3.0
        assert refused(gw, "write_stall") == 1
        assert gw.status()["groups"]["g1"]["in_use"] == 0
        [warning] = [r for r in caplog.records if r.name == "sluice.gateway"]
        assert "write_stall_s is 0.5" in warning.getMessage()
        [line] = log_lines(log)
        assert line["status"] == 200 and line["error"] == "write_stall"
        up.mode = "json"
        resp = await chat(client)  # on a fresh connection: the stalled one was not pooled
        assert resp.status_code == 200 and up.accepted == 2


# -- connections ------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_connections_over_the_caps_get_503_unread() -> None:
    caps = {"max_connections": 4, "max_connections_per_ip": 2}
    async with running(FakeUpstream("i1"), **caps) as (gw, _client, _log):
        async with connection(gw.port) as (r1, w1), connection(gw.port):
            async with connection(gw.port) as (reader, _writer):  # a third from 127.0.0.1
                data = await closed_by_peer(reader, 5)
            assert data.startswith(b"HTTP/1.1 503 ") and b"retry-after: 1\r\n" in data
            err = json.loads(data.partition(b"\r\n\r\n")[2])["error"]
            assert err["code"] == "too_many_connections"
            assert "gateway.limits.max_connections_per_ip is 2" in err["message"]
            # other addresses have counts of their own, up to the total of 4
            async with connection(gw.port, "127.0.0.2"), connection(gw.port, "127.0.0.3"):
                async with connection(gw.port, "127.0.0.4") as (reader, _writer):
                    data = await closed_by_peer(reader, 5)
                assert data.startswith(b"HTTP/1.1 503 ")
                err = json.loads(data.partition(b"\r\n\r\n")[2])["error"]
                assert "gateway.limits.max_connections is 4" in err["message"]
            w1.write(request())  # the connections let in are served as usual
            async with asyncio.timeout(5):
                assert (await read_response(r1)).status == 200
        async with asyncio.timeout(5):  # all closed: there is room again
            while (await exchange(gw.port, request())).status == 503:
                await asyncio.sleep(0.01)
        assert refused(gw, "connections_per_ip") == 1 and refused(gw, "connections") == 1


# -- the body ---------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_deeply_nested_json_is_400_not_500() -> None:
    async with running(FakeUpstream("i1")) as (gw, client, log):

        def nested(depth: int) -> bytes:  # the top-level object is level 1
            return b'{"model":"m1","x":' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"

        ok = await client.post("/v1/chat/completions", content=nested(64), headers=AUTH)
        assert ok.status_code == 200
        for depth in (65, 1500, 100_000):
            resp = await client.post("/v1/chat/completions", content=nested(depth), headers=AUTH)
            assert resp.status_code == 400, resp.text
            err = resp.json()["error"]
            assert err["code"] == "json_too_deep" and "max_json_depth" in err["message"]
            assert "64" in err["message"] and "Traceback" not in resp.text
        assert refused(gw, "json_depth") == 3
        assert [line["status"] for line in log_lines(log)] == [200, 400, 400, 400]


# -- clients that leave -----------------------------------------------------------------------


@pytest.mark.asyncio
async def test_clients_leaving_free_their_slots_and_upstream_connections_at_once() -> None:
    # No request may finish on its own before the clients leave, however loaded the machine:
    # a finished one would hand its connection back to the pool (CI once saw that at 1.5 s).
    up = FakeUpstream("i1", latency=30)
    async with running_gateway(up, snapshot=g1(up, max_concurrency=4)) as (gw, client, log):
        async with asyncio.timeout(5):
            conns = [await asyncio.open_connection("127.0.0.1", gw.port) for _ in range(10)]
            for _, writer in conns:
                writer.write(request())
            while gw.status()["groups"]["g1"]["queued"]["normal"] < 6:
                await asyncio.sleep(0.01)
        assert gw.status()["groups"]["g1"]["in_use"] == 4 and gw.outstanding() == {"i1": 4}
        start = time.perf_counter()
        for _, writer in conns:
            writer.close()
        for _, writer in conns:
            with suppress(ConnectionError):
                await writer.wait_closed()
        async with asyncio.timeout(2):
            while gw.outstanding() or gw.status()["groups"]["g1"]["in_use"]:
                await asyncio.sleep(0.005)
        freed = time.perf_counter() - start
        assert gw.status()["groups"]["g1"]["queued"]["normal"] == 0
        up.latency = 0.0
        resp = await chat(client)
        # no connection that carried an abandoned request went back to the pool: each one
        # the upstream accepted carried one request at most (a connection still opening when
        # its client left carried none, and is as good as a fresh one)
        assert resp.status_code == 200 and max(up.carried) == 1, up.carried
        print(f"\n10 clients left (4 in flight, 6 queued): slots free after {freed * 1000:.1f} ms")
        assert freed < 1.0
        lines = log_lines(log)
        assert [line["status"] for line in lines] == [499] * 10 + [200]
        assert {line["error"] for line in lines[:10]} == {"client_disconnected"}


def _worker(port: int, log: Path) -> subprocess.Popen[bytes]:
    def sim(seconds: float) -> dict[str, Any]:
        return {
            "runtime": "sim",
            "sim": {
                "startup_s": 0,
                "output_tokens": 50,
                "service_time": {"kind": "fixed", "seconds": seconds},
            },
        }

    config = {
        "instance_id": "w1",
        "group": "g1",
        "host": "127.0.0.1",
        "port": port,
        "max_concurrency": 8,
        "models": {"slow": sim(30.0), "fast": sim(0.02)},
    }
    with log.open("wb") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "sluice.worker", "--config-json", json.dumps(config)],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )


@pytest.mark.asyncio
async def test_slowloris_and_abandoned_requests_leave_a_real_worker_free(tmp_path: Path) -> None:
    """20 slowloris connections and 32 abandoned 30 s generations; then a normal request is
    answered in normal time, because the worker stopped the abandoned ones."""
    port = free_port()
    proc = _worker(port, tmp_path / "worker.log")
    worker = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5)
    try:
        async with asyncio.timeout(20):
            while True:
                assert proc.poll() is None, (tmp_path / "worker.log").read_text()
                with suppress(httpx.TransportError):
                    if (await worker.get("/ready")).status_code == 200:
                        break
                await asyncio.sleep(0.05)
        routing = make_routing(
            1,
            {"g1": [("w1", port)]},
            [RouteRule("r1", (("g1", 1),))],
            models={"g1": {"slow", "fast"}},
            max_concurrency=8,
        )
        async with running_gateway(
            snapshot=routing, limits=GatewayLimits(header_timeout_s=2.0)
        ) as (gw, client, _log):

            async def slowloris() -> bytes:
                async with connection(gw.port) as (reader, writer):
                    return (await drip(reader, writer, request(), 1.0))[1]

            slow = [asyncio.ensure_future(slowloris()) for _ in range(20)]
            body = json.dumps({"model": "slow", "messages": [{"role": "user", "content": "x"}]})
            conns = [await asyncio.open_connection("127.0.0.1", gw.port) for _ in range(32)]
            for _, writer in conns:
                writer.write(request(body.encode()))
            await asyncio.sleep(0.5)
            busy = (await worker.get("/stats")).json()
            assert busy["inflight"] == 8 and gw.status()["groups"]["g1"]["in_use"] == 8
            for _, writer in conns:  # the clients give up
                writer.close()
            for _, writer in conns:
                with suppress(ConnectionError):
                    await writer.wait_closed()
            start = time.perf_counter()
            async with asyncio.timeout(5):
                while (await worker.get("/stats")).json()["inflight"]:
                    await asyncio.sleep(0.02)
            worker_free = time.perf_counter() - start
            assert gw.status()["groups"]["g1"]["in_use"] == 0

            start = time.perf_counter()
            resp = await chat(client, model="fast")
            took = time.perf_counter() - start
            assert resp.status_code == 200, resp.text
            answers = await asyncio.gather(*slow)
            stats = (await worker.get("/stats")).json()
        print(
            f"\nworker in flight back to 0 {worker_free * 1000:.0f} ms after 32 clients left; "
            f"the next request took {took * 1000:.1f} ms; worker stats: {stats}"
        )
        assert took < 5.0 and worker_free < 5.0
        assert stats["disconnected"] >= 8 and stats["errors"] == 0 and stats["inflight"] == 0
        assert all(a.startswith(b"HTTP/1.1 408 ") for a in answers), answers[:2]
    finally:
        await worker.aclose()
        proc.kill()
        proc.wait(timeout=10)
