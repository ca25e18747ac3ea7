"""Pooled keep-alive HTTP/1.1 connections to instances, driven by callbacks, not tasks.

Opening a TCP connection per request would cost more than the proxying itself, and a task
per request more than the parsing, so each connection is an `asyncio.Protocol` whose
`httptools` parser hands the response straight to a `ResponseSink` (the request being
served), and finished connections wait in a per-address LIFO pool for the next request.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Final, Protocol, cast

import httptools

from sluice.gateway.responses import HOP_BY_HOP, REVEALING
from sluice.policy.routing import Endpoint
from sluice.spec.servers import usable_key

__all__ = ["ConnectCallback", "ResponseSink", "UpstreamConnection", "UpstreamHost", "UpstreamPool"]


class ResponseSink(Protocol):
    """Receives one response. Exactly one of `upstream_done` / `upstream_failed` ends it."""

    def upstream_head(self, status: int, headers: list[bytes], has_length: bool) -> None:
        """Status and forwardable header bytes (name, ": ", value, CRLF): hop-by-hop ones and
        ones naming internals (`server`, `x-powered-by`, any `x-sluice-*`...) removed."""

    def upstream_body(self, data: bytes) -> None: ...

    def upstream_flush(self) -> None:
        """End of one read from the socket: push what arrived to the client now."""

    def upstream_done(self) -> None: ...

    def upstream_failed(self, exc: BaseException, received: bool) -> None:
        """The connection broke or timed out; `received` says whether any response byte came."""


_RESPONSE_HEADERS: Final = HOP_BY_HOP | REVEALING | {b"content-length", b"x-request-id"}
"""Response headers that are not simply forwarded, by lower-cased name."""
# (Final literals: the compiled gateway inlines them; see client.py)
_FORWARD: Final = 0
_DROP: Final = 1
_LENGTH: Final = 2
_TRANSFER_ENCODING: Final = 3
_header_kinds: Final[dict[bytes, int]] = {}
"""What to do with a response header, by its name exactly as sent: instances send the same
few names every time, so one dict hit replaces lower-casing and matching."""


def _header_kind(name: bytes) -> int:
    lname = name.lower()
    if lname == b"content-length":
        kind = _LENGTH
    elif lname == b"transfer-encoding":
        kind = _TRANSFER_ENCODING
    elif lname in _RESPONSE_HEADERS or lname.startswith(b"x-sluice-"):
        kind = _DROP  # hop-by-hop, internals (`server`...), x-request-id and x-sluice-* (the
        # gateway sets its own)
    else:
        kind = _FORWARD
    if len(_header_kinds) >= 1024:  # bounded: names are the instances' choice
        _header_kinds.clear()
    _header_kinds[name] = kind
    return kind


ConnectCallback = Callable[["UpstreamConnection | None", "BaseException | None"], None]


class UpstreamHost:
    """One instance address: its idle connections and its pre-rendered `Host` header (with
    the `Authorization` line of an external endpoint that needs a key: one header block, so
    a request costs nothing more for it)."""

    __slots__ = ("host", "host_header", "idle", "port", "retired")

    def __init__(self, host: str, port: int, auth: bytes = b"") -> None:
        self.host = host
        self.port = port
        self.host_header = b""
        self.authorize(auth)
        self.idle: dict[UpstreamConnection, None] = {}  # insertion-ordered: popitem() is LIFO
        self.retired = False

    def authorize(self, auth: bytes) -> None:
        """`auth`: a whole `authorization: ...\r\n` line, or b"" for none."""
        self.host_header = b"host: %s:%d\r\n%s" % (self.host.encode(), self.port, auth)


class UpstreamConnection(asyncio.Protocol):
    """One keep-alive connection; serves one request at a time for one sink."""

    __slots__ = (
        "_chunked",
        "_complete",
        "_has_length",
        "_head_seen",
        "_headers",
        "_keep_alive",
        "_last_rx",
        "_loop",
        "_parser",
        "_paused",
        "_pool",
        "_received",
        "_sink",
        "_status",
        "_transport",
        "host",
        "timeout_s",
    )

    def __init__(self, pool: UpstreamPool, host: UpstreamHost) -> None:
        self._pool = pool
        self._loop = asyncio.get_running_loop()
        self.host = host
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._sink: ResponseSink | None = None
        self._headers: list[bytes] = []
        self._has_length = False
        self._chunked = False
        self._head_seen = False
        self._complete = False
        self._keep_alive = False
        self._received = False
        self._paused = False
        self._status = 0  # of the response being parsed
        self._last_rx = 0.0  # loop time of the last byte; the pool's sweep enforces the timeout
        self.timeout_s = 300.0  # of the request being served: longest silence, seconds

    # -- driven by the request being served ------------------------------------------------

    @property
    def is_open(self) -> bool:
        return self._transport is not None and not self._transport.is_closing()

    def request(self, wire: bytes, sink: ResponseSink, timeout_s: float) -> bool:
        """Send one request; the response goes to `sink`. False if the connection is gone.

        `timeout_s`: the longest the instance may stay silent (before the head, or between
        body bytes) before the request fails with `TimeoutError`.
        """
        transport = self._transport  # `self.is_open`, inlined
        if transport is None or transport.is_closing():
            return False
        assert self._sink is None
        self._sink = sink
        self.timeout_s = timeout_s
        self._complete = False
        self._head_seen = False
        self._received = False
        self._last_rx = self._loop.time()
        # Timed by the pool's sweep (one timer for all connections, not one per request; it
        # runs every tenth of the shortest timeout in force, 10 ms to 1 s). Inlined: the pool
        # and its connections are one unit, and this runs for every request.
        pool = self._pool
        pool._busy.add(self)
        if pool._sweep is None or timeout_s < pool._sweep_timeout:
            pool._schedule_sweep(timeout_s)
        transport.write(wire)
        return True

    def abandon(self) -> None:
        """The requester went away mid-response: the connection is unusable, drop it."""
        self._sink = None
        self._close()

    def pause_reading(self) -> None:
        """The client reads slower than the instance writes: stop reading (and timing) it."""
        if self._transport is not None and not self._paused:
            self._paused = True
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if self._transport is not None and self._paused:
            self._paused = False
            self._last_rx = self._loop.time()
            self._transport.resume_reading()

    def idle_since(self) -> float | None:
        """Loop time of the last response byte, or None when not waiting on the instance."""
        return None if self._paused or self._sink is None else self._last_rx

    def time_out(self) -> None:
        self._fail(TimeoutError("the instance sent nothing for too long"))

    def abort(self, exc: BaseException) -> None:
        """Fail the request in progress (if any) with `exc` and close."""
        self._fail(exc)

    def close(self) -> None:
        self._close()

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        sink = self._sink
        if sink is None:  # bytes nobody asked for: the connection is out of sync
            self._close()
            return
        self._received = True
        self._last_rx = self._loop.time()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if not self._complete:
                self._fail(exc)
                return
            self._close()  # trailing garbage after a complete response
        if not self._complete:
            sink.upstream_flush()
            return
        self._sink = None
        pool = self._pool
        pool._busy.discard(self)  # `pool.idle(self)`, inlined
        transport = self._transport  # `self.is_open`, inlined
        if self._keep_alive and transport is not None and not transport.is_closing():
            pool.release(self)
        else:
            self._close()
        sink.upstream_done()  # last: it may start the next request on this very connection

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._pool.idle(self)
        self.host.idle.pop(self, None)
        sink = self._sink
        if sink is None:
            return
        self._sink = None
        if exc is None and self._head_seen and not (self._has_length or self._chunked):
            sink.upstream_done()  # a body delimited by EOF (HTTP/1.0 style) ends cleanly here
        else:
            sink.upstream_failed(exc or ConnectionResetError("upstream closed"), self._received)

    # -- httptools callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._complete:
            raise ConnectionError("unsolicited response")  # aborts feed_data
        self._headers = []
        self._has_length = False
        self._chunked = False

    def on_header(self, name: bytes, value: bytes) -> None:
        kind = _header_kinds.get(name)
        if kind is None:
            kind = _header_kind(name)
        if kind == _FORWARD:
            self._headers += (name, b": ", value, b"\r\n")
        elif kind == _LENGTH:
            self._has_length = True
            self._headers += (name, b": ", value, b"\r\n")
        elif kind == _TRANSFER_ENCODING:
            self._chunked = b"chunked" in value.lower()

    def on_headers_complete(self) -> None:
        status = self._status = self._parser.get_status_code()
        if status >= 200 and self._sink is not None:
            self._head_seen = True
            self._sink.upstream_head(status, self._headers, self._has_length and not self._chunked)

    def on_body(self, body: bytes) -> None:
        if self._sink is not None:
            self._sink.upstream_body(body)

    def on_message_complete(self) -> None:
        if self._status >= 200:  # 1xx is an interim response: keep going
            self._complete = True
            self._keep_alive = self._parser.should_keep_alive()  # only valid in this callback

    # -- internals --------------------------------------------------------------------------

    def _fail(self, exc: BaseException) -> None:
        sink = self._sink
        self._sink = None
        self._close()
        if sink is not None:
            sink.upstream_failed(exc, self._received)

    def _close(self) -> None:
        self._pool.idle(self)
        self.host.idle.pop(self, None)
        if self._transport is not None:
            self._transport.close()


def _sweep_interval(timeout_s: float) -> float:
    return min(1.0, max(0.01, timeout_s / 10))


class UpstreamPool:
    """Idle keep-alive connections per instance address, opened on demand."""

    __slots__ = (
        "_auth",
        "_busy",
        "_closed",
        "_connect_timeout",
        "_connecting",
        "_environ",
        "_hosts",
        "_max_idle",
        "_sweep",
        "_sweep_timeout",
    )

    def __init__(
        self,
        *,
        max_idle_per_host: int = 512,
        connect_timeout_s: float = 10.0,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        """`environ`: where the keys of external endpoints are read (default: this
        process's environment)."""
        self._hosts: dict[tuple[str, int], UpstreamHost] = {}
        self._auth: dict[tuple[str, int], bytes] = {}
        self._environ = os.environ if environ is None else environ
        self._busy: set[UpstreamConnection] = set()
        self._sweep: asyncio.TimerHandle | None = None
        self._sweep_timeout = 0.0  # the shortest timeout the pending sweep was timed for
        self._connecting: set[asyncio.Task[UpstreamConnection]] = set()
        self._max_idle = max_idle_per_host
        self._connect_timeout = connect_timeout_s
        self._closed = False

    def host(self, host: str, port: int) -> UpstreamHost:
        key = (host, port)
        entry = self._hosts.get(key)
        if entry is None:
            entry = self._hosts[key] = UpstreamHost(host, port, self._auth.get(key, b""))
        return entry

    def authorize(self, endpoints: Iterable[Endpoint]) -> None:
        """Send each endpoint that names an `api_key_env` that variable's value as its
        bearer key (unset, empty or not a usable key: no header, so the endpoint refuses,
        and the supervisor, which reads the same variable, has said why). Replaces the
        whole map."""
        auth: dict[tuple[str, int], bytes] = {}
        for ep in endpoints:
            key = self._environ.get(ep.api_key_env, "") if ep.api_key_env else ""
            if usable_key(key):  # never a CR/LF into the request head
                auth[(ep.host, ep.port)] = b"authorization: Bearer %s\r\n" % key.encode()
        if auth == self._auth:
            return
        self._auth = auth
        for addr, entry in self._hosts.items():
            entry.authorize(auth.get(addr, b""))

    def take_idle(self, host: UpstreamHost) -> UpstreamConnection | None:
        """The most recently used idle connection (least likely to have timed out), or None.

        A connection leaves `idle` as it closes, so this does not check it again;
        `request()` does, and a caller treats a False there like a refused connection.
        """
        idle = host.idle
        if idle:
            return idle.popitem()[0]
        return None

    def connect(self, host: UpstreamHost, done: ConnectCallback) -> None:
        """Open a fresh connection; `done(conn, None)` or `done(None, exc)` follows."""
        if self._closed:
            done(None, ConnectionAbortedError("gateway is stopping"))
            return
        task = asyncio.get_running_loop().create_task(self._open(host))
        self._connecting.add(task)
        task.add_done_callback(lambda t: self._opened(t, done))

    def release(self, conn: UpstreamConnection) -> None:
        """A connection that finished a response cleanly: keep it unless nobody will want it."""
        host = conn.host
        if self._closed or host.retired or len(host.idle) >= self._max_idle:
            conn.close()
        else:
            if conn._paused:
                conn.resume_reading()
            host.idle[conn] = None

    def _schedule_sweep(self, timeout: float) -> None:
        """Sweep soon enough for `timeout` (unless a sweep is due sooner already)."""
        if self._sweep is not None:
            if timeout >= self._sweep_timeout:
                return
            self._sweep.cancel()
        self._sweep_timeout = timeout
        self._sweep = asyncio.get_running_loop().call_later(
            _sweep_interval(timeout), self._time_out_stalled
        )

    def idle(self, conn: UpstreamConnection) -> None:
        self._busy.discard(conn)

    def _time_out_stalled(self) -> None:
        self._sweep = None
        if not self._busy:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        shortest = float("inf")
        for conn in list(self._busy):
            since = conn.idle_since()
            if since is not None and now - since >= conn.timeout_s:
                conn.time_out()
            else:
                shortest = min(shortest, conn.timeout_s)
        if self._busy:  # (a retry inside `time_out()` may have scheduled one already)
            self._schedule_sweep(shortest)

    def retire(self, live: set[tuple[str, int]]) -> None:
        """Close idle connections to addresses not in `live`; busy ones close when done."""
        for key in [k for k in self._hosts if k not in live]:
            host = self._hosts.pop(key)
            host.retired = True
            for conn in list(host.idle):
                conn.close()

    def close(self) -> None:
        """Close everything: idle connections, ones still busy (their sinks fail), and ones
        being opened."""
        self._closed = True
        self.retire(set())
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for conn in list(self._busy):
            conn.abort(ConnectionAbortedError("gateway is stopping"))
        for task in list(self._connecting):
            task.cancel()

    async def _open(self, host: UpstreamHost) -> UpstreamConnection:
        async with asyncio.timeout(self._connect_timeout):
            _, conn = await asyncio.get_running_loop().create_connection(
                lambda: UpstreamConnection(self, host), host.host, host.port
            )
        return conn

    def _opened(self, task: asyncio.Task[UpstreamConnection], done: ConnectCallback) -> None:
        self._connecting.discard(task)
        if task.cancelled():
            done(None, ConnectionAbortedError("gateway is stopping"))
            return
        exc = task.exception()
        if exc is not None:
            done(None, exc)
        else:
            done(task.result(), None)
