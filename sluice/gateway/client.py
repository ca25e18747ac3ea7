"""One `asyncio.Protocol` per client connection: parse requests, run them in order.

A plain Protocol with `httptools` (no web framework) because the data plane must keep up
with nginx on one core; the per-request work is one parse, one `Exchange`, and coalesced
writes. Requests on a connection are answered strictly in order; pipelined ones wait.

Everything a client sends before it is authenticated is bounded (`gateway.limits`):

- memory: httptools gathers a header line in full before handing it over, so the bytes of a
  request in progress are counted read by read, and a read that would take its head past
  `max_header_bytes` is fed only up to that point; a head still unfinished there is refused
  (431) and nothing more is read. Header lines are counted (431), the URL measured (414),
  the body too (413); what is sent after the head (body, chunk framing, trailers, which
  httptools gathers like headers) may not exceed `max_body_bytes + max_header_bytes` (413).
- time: `check_deadlines()`, called about once a second by the gateway for every
  connection, refuses a head not complete within `header_timeout_s` of its first byte (of
  the connection's opening, for the first request) or a body not complete within
  `body_timeout_s` of its head (408, then close), and closes a connection idle (nothing
  received since its last answer) for `keepalive_timeout_s`. Reading the clock is left to
  that sweep and to one clock read per read from the socket, nothing per byte.
- a client that stops reading: while its answer waits in a full send buffer (writing
  paused, so the instance's connection is not read either and its own timeout does not
  run), the sweep watches the buffer; if it has not shrunk for `write_stall_s`, the
  connection is aborted, the request's instance connection closed (not pooled: the worker
  sees the disconnect and stops generating) and its slot freed, counted as `write_stall`.
- connections: one over `max_connections`, or over `max_connections_per_ip` from its
  address, is answered 503 and closed before anything is read from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import sys
import termios
import time
from collections import deque
from collections.abc import Callable
from typing import Final, cast

import httptools

from sluice.core.errors import SluiceError
from sluice.gateway.errors import BadRequest, WriteStalled
from sluice.gateway.exchange import Exchange
from sluice.gateway.responses import CONTINUE_100, HOP_BY_HOP
from sluice.gateway.state import GatewayState

__all__ = ["LINGER_S", "ClientProtocol"]

log = logging.getLogger("sluice.gateway")

LINGER_S: Final = 2.0
"""How long to keep draining a client's upload after refusing it (see `_linger`)."""

# Header kinds and reading states are Final literals: the compiled gateway inlines them
# (a plain module name is a dict lookup at each use there).
_HOP: Final = 0
_CONNECTION: Final = 1
_AUTH: Final = 2
_REQUEST_ID: Final = 3
_LENGTH: Final = 4
_EXPECT: Final = 5
_PRIORITY: Final = 6
_REQUEST_HEADERS: Final = {
    **dict.fromkeys(HOP_BY_HOP, _HOP),
    b"connection": _CONNECTION,
    b"host": _HOP,
    b"authorization": _AUTH,
    b"x-request-id": _REQUEST_ID,
    b"content-length": _LENGTH,
    b"expect": _EXPECT,
    b"x-sluice-priority": _PRIORITY,
}
"""Request headers that need more than forwarding, by lower-cased name."""
_FORWARD: Final = -1
_IDLE: Final = 0
_HEAD: Final = 1
_BODY: Final = 2
"""What a connection is reading: nothing (between requests), a head, a body."""
_header_kinds: Final[dict[bytes, int]] = {}
"""The kind of a request header by its name exactly as sent (clients repeat a few spellings),
so most headers cost one dict hit."""


def _header_kind(name: bytes) -> int:
    lname = name.lower()
    kind = _REQUEST_HEADERS.get(lname)
    if kind is None:
        kind = _HOP if lname.startswith(b"proxy-") else _FORWARD
    if len(_header_kinds) >= 1024:  # bounded: names are the clients' choice
        _header_kinds.clear()
    _header_kinds[name] = kind
    return kind


def _unsent(transport: asyncio.Transport) -> int:
    """Bytes of answers the client has not taken: the transport's buffer plus the kernel's
    send queue (TIOCOUTQ: sent or not, not acknowledged). The transport's buffer alone moves
    in steps of half the kernel's buffer (the socket turns writable only then), megabytes
    on a fast link, so a client reading slowly but steadily would look stalled."""
    size = transport.get_write_buffer_size()
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError, ValueError):  # closed, or not Linux: the buffer only
            queued = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
            size += int.from_bytes(queued, sys.byteorder, signed=True)
    return size


class ClientProtocol(asyncio.Protocol):
    """Parses requests off one client connection and runs them one at a time."""

    __slots__ = (
        "_auth",
        "_body",
        "_body_at",
        "_body_len",
        "_connection_header",
        "_conns",
        "_consumed",
        "_current",
        "_discard",
        "_draining",
        "_expect",
        "_head_at",
        "_headers",
        "_ip",
        "_left",
        "_limits",
        "_on_lost",
        "_parser",
        "_pipelined",
        "_priority",
        "_queue",
        "_reading",
        "_requests",
        "_rid",
        "_rx_at",
        "_stall_at",
        "_stall_size",
        "_state",
        "_t0",
        "_transport",
        "_url",
        "closing",
        "last_active",
        "write_paused",
    )

    def __init__(
        self, state: GatewayState, conns: set[ClientProtocol], on_lost: Callable[[], None]
    ) -> None:
        self._state = state
        self._limits = state.limits
        self._conns = conns  # the gateway's open connections, for shutdown and idle sweeps
        self._on_lost = on_lost
        self._ip: str | None = None  # counted in `state.clients_by_ip` while set
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._current: Exchange | None = None
        self._queue: deque[Exchange] = deque()
        self._draining = False
        self._pipelined = False  # reading paused until queued requests are answered
        self._discard = False  # a request was refused mid-parse: ignore the rest of the input
        self.closing = False  # answer what is in flight, then close
        self.write_paused = False
        self._stall_at = 0.0  # writing paused, and the send buffer last shrank, at this time
        self._stall_size = 0  # bytes in the send buffer then
        # Deadlines (all `time.perf_counter()` seconds; see `check_deadlines`).
        self.last_active = 0.0  # opened, or last answer sent: idle since then
        self._reading = _HEAD  # a fresh connection owes its first head
        self._head_at = 0.0  # the head being read is due `header_timeout_s` after this
        self._body_at = 0.0  # the body being read is due `body_timeout_s` after this
        self._rx_at = 0.0  # when the latest read arrived
        self._left = self._limits.max_header_bytes  # what the request may still take, as sent
        self._requests = 0  # requests parsed off this connection
        self._reset_request()

    def _reset_request(self) -> None:
        self._url = b""
        self._headers: list[bytes] = []
        self._auth: bytes | None = None
        self._priority: bytes | None = None
        self._rid: bytes | None = None
        self._body: list[bytes] = []
        self._body_len = 0
        self._expect = False
        self._connection_header = False
        self._consumed = 0  # header lines not forwarded (the forwarded ones are in _headers)
        self._t0 = 0.0

    # -- used by Gateway and Exchange -------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self._transport is not None:
            self._transport.write(data)

    def abort(self) -> None:
        """A response broke halfway: close after what was written, so the client sees EOF."""
        self.closing = True
        if self._transport is not None:
            self._transport.close()

    def terminate(self) -> None:
        """Drop the connection now, unsent data included."""
        if self._transport is not None:
            self._transport.abort()

    def shutdown(self) -> None:
        """Finish the request in flight (if any), then close."""
        self.closing = True
        if self._current is None and not self._queue and self._transport is not None:
            self._transport.close()

    def exchange_done(self, exchange: Exchange) -> None:
        self._current = None
        self.last_active = time.perf_counter()
        transport = self._transport
        if transport is None:
            return
        if not exchange.keep_alive or self.closing:
            if self._discard and transport.can_write_eof():
                self._linger(transport)
            else:
                transport.close()
        elif self._queue:
            self._drain()
        elif self._pipelined and not self._discard:
            self._pipelined = False
            transport.resume_reading()

    def check_deadlines(self, now: float) -> None:
        """Enforce the client-side timeouts at `now` (`time.perf_counter()`); the gateway
        calls this for every connection about once a second. While a request is being
        answered, only the upstream's timeout runs, and the write stall (see the module)."""
        if self.write_paused and self._transport is not None and self._stalled(now):
            return
        if self._current is not None or self._discard or self._transport is None:
            return
        reading = self._reading
        limits = self._limits
        if reading == _IDLE:
            if now - self.last_active > limits.keepalive_timeout_s and not self._queue:
                if self._transport.get_write_buffer_size():  # not even reading its answers
                    self._transport.abort()
                else:
                    self.shutdown()
        elif reading == _HEAD:
            if now - self._head_at > limits.header_timeout_s:
                if self._t0 == 0.0:  # not one byte of a request since it opened: just close
                    self._state.metrics.refused["header_timeout"] += 1
                    self._discard = True
                    self._transport.close()
                else:
                    self._refuse("header_timeout")
        elif now - self._body_at > limits.body_timeout_s:
            self._refuse("body_timeout")

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        tr = self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.last_active = self._head_at = time.perf_counter()
        limits = self._limits
        peer = tr.get_extra_info("peername")
        ip = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        by_ip = self._state.clients_by_ip
        if limits.max_connections and len(self._conns) >= limits.max_connections:
            self._refuse_connection("connections")
        elif limits.max_connections_per_ip and by_ip.get(ip, 0) >= limits.max_connections_per_ip:
            self._refuse_connection("connections_per_ip")
        else:
            self._ip = ip
            by_ip[ip] = by_ip.get(ip, 0) + 1
            self._conns.add(self)

    def data_received(self, data: bytes) -> None:
        if self._discard:
            return
        self._rx_at = time.perf_counter()
        if len(data) > self._left:
            self._feed_bounded(data)  # this read could take a request past its allowance
            return
        requests = self._requests
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._upgrade()
        except httptools.HttpParserError as exc:
            self._malformed(exc)
        if self._reading != _IDLE and self._requests == requests and not self._discard:
            # A request still unfinished, and this read held nothing but its bytes: count
            # them (one that began after another request in the same read is not counted
            # until its next read, so it may overshoot by that read; it never undershoots).
            self._left -= len(data)
            if self._reading == _HEAD and (len(self._headers) >> 2) + self._consumed > (
                self._limits.max_headers
            ):
                self._refuse("header_count")

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        current, self._current = self._current, None
        if current is not None:
            current.client_gone()
        while self._queue:
            self._queue.popleft().client_gone()
        ip = self._ip
        if ip is not None:
            self._ip = None
            by_ip = self._state.clients_by_ip
            left = by_ip[ip] - 1
            if left:
                by_ip[ip] = left
            else:
                del by_ip[ip]
            self._conns.discard(self)
            self._on_lost()

    def pause_writing(self) -> None:
        self.write_paused = True
        self._stall_at = time.perf_counter()
        if self._transport is not None:
            self._stall_size = _unsent(self._transport)
        if self._current is not None:
            self._current.pause_upstream()

    def resume_writing(self) -> None:
        self.write_paused = False
        if self._current is not None:
            self._current.resume_upstream()

    def _stalled(self, now: float) -> bool:
        """Writing is paused: cut the client off if what it has not taken yet (see
        `_unsent`) has not shrunk (it read nothing) for `write_stall_s`. Measured here, once
        a sweep, because the transport says nothing between pausing and resuming."""
        transport = self._transport
        assert transport is not None
        size = _unsent(transport)
        if size < self._stall_size:  # it read something since the last look
            self._stall_size = size
            self._stall_at = now
            return False
        limit = self._limits.write_stall_s
        if now - self._stall_at <= limit:
            return False
        self._state.metrics.refused["write_stall"] += 1
        current = self._current
        log.warning(
            "client %s read nothing of its answer for %.1f s (gateway.limits.write_stall_s is "
            "%g): cut off with %d bytes unsent%s",
            self._ip,
            now - self._stall_at,
            limit,
            size,
            f", request {current.request_id.decode('latin-1')} to {current.instance}"
            if current is not None
            else "",
        )
        if current is not None:  # before the abort, so the access log says why
            current.client_gone(WriteStalled.code)
        self._discard = True
        transport.abort()
        return True

    # -- httptools callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        # `_reset_request()`, inlined: this runs for every request.
        self._url = b""
        self._headers = []
        self._auth = None
        self._priority = None
        self._rid = None
        self._body = []
        self._body_len = 0
        self._expect = False
        self._connection_header = False
        self._consumed = 0
        self._t0 = t0 = self._rx_at  # the read that brought its first byte
        if self._reading == _IDLE:  # (the first request's head is due from the opening)
            self._head_at = t0
        self._reading = _HEAD

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        kind = _header_kinds.get(name)
        if kind is None:
            kind = _header_kind(name)
        if kind == _FORWARD:
            self._headers += (name, b": ", value, b"\r\n")
            return
        if kind == _REQUEST_ID:
            self._rid = value
            self._headers += (name, b": ", value, b"\r\n")
            return
        self._consumed += 1  # (the forwarded lines are counted by `_headers`)
        if kind == _AUTH:  # read here, never forwarded: tenants' keys stay out of instances
            self._auth = value
        elif kind == _LENGTH:  # not forwarded: re-computed from the buffered body
            if int(value) > self._limits.max_body_bytes:
                self._body_len = -1  # refused in on_headers_complete, before reading the body
        elif kind == _EXPECT:  # answered here, since the body is buffered here
            self._expect = value.lower() == b"100-continue"
        elif kind == _CONNECTION:
            self._connection_header = True
        elif kind == _PRIORITY:  # the gateway's own: consumed here (admission), not forwarded
            self._priority = value
        # else _HOP: hop-by-hop, or Host (set per instance): not forwarded

    def on_headers_complete(self) -> None:
        if self._discard:
            return
        self._reading = _BODY
        self._body_at = self._rx_at
        limits = self._limits
        self._left = limits.max_request_bytes  # (body, framing, trailers: a backstop)
        if len(self._url) > limits.max_request_line_bytes:
            self._refuse("request_line")
        elif (len(self._headers) >> 2) + self._consumed > limits.max_headers:
            self._refuse("header_count")
        elif self._body_len < 0:
            self._refuse("body_bytes")
        elif self._expect and self._current is None and self._transport is not None:
            self._transport.write(CONTINUE_100)

    def on_body(self, body: bytes) -> None:
        if self._discard:
            return
        self._body_len += len(body)
        if self._body_len > self._limits.max_body_bytes:
            self._refuse("body_bytes")
        else:
            self._body.append(body)

    def on_message_complete(self) -> None:
        if self._discard:
            return
        parser = self._parser
        keep_alive = parser.should_keep_alive()
        # An HTTP/1.0 client (no chunked encoding) either closes or says `Connection:`;
        # asking the parser costs more than the test, so HTTP/1.1 defaults skip it.
        http11 = (keep_alive and not self._connection_header) or parser.get_http_version() == "1.1"
        t0 = self._t0
        chunks = self._body
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        headers = self._headers
        request_id = self._rid
        if not request_id:
            request_id = self._state.next_request_id()
            headers += (b"x-request-id", b": ", request_id, b"\r\n")
        self._t0 = 0.0  # no request in progress
        self._reading = _IDLE
        self._requests += 1
        self._left = self._limits.max_header_bytes
        self._enqueue(
            Exchange(
                self,
                self._state,
                parser.get_method(),
                self._url,
                headers,
                request_id,
                body,
                self._auth,
                self._priority,
                keep_alive,
                http11,
                t0,
            )
        )

    # -- internals --------------------------------------------------------------------------

    def _feed_bounded(self, data: bytes) -> None:
        """A read longer than the request in progress (or the next one) may still take: feed
        only that much, and refuse the request if it is still unfinished there; then the
        rest (body, later requests). What httptools holds stays within the limits."""
        left = self._left
        view = memoryview(data)
        requests = self._requests
        self._feed(view[:left])
        if self._discard:
            return
        reading = self._reading
        if reading == _HEAD and self._requests == requests:
            too_long = len(self._url) > self._limits.max_request_line_bytes
            self._refuse("request_line" if too_long else "header_bytes")
            return
        if reading == _BODY and self._requests == requests and self._left == left:
            self._refuse("body_bytes")  # (its body's allowance was `left` already)
            return
        self._feed(view[left:])

    def _feed(self, data: bytes | memoryview) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._upgrade()
        except httptools.HttpParserError as exc:
            self._malformed(exc)

    def _upgrade(self) -> None:
        if self._t0 == 0.0:  # the request is complete and queued: answer it, then close
            self._discard = True
            self.shutdown()
        else:
            self._reject(BadRequest("protocol upgrades are not supported"))

    def _malformed(self, exc: httptools.HttpParserError) -> None:
        if not self._discard:  # (a callback may have refused the request already)
            self._reject(BadRequest(f"malformed HTTP request: {exc}"))

    def _refuse_connection(self, reason: str) -> None:
        """Over a connection cap: answer 503 and close, without reading a byte."""
        self._discard = True
        self._state.metrics.refused[reason] += 1
        transport = self._transport
        if transport is not None:
            transport.write(self._limits.connection_refusal(reason))
            transport.close()

    def _refuse(self, reason: str) -> None:
        """Refuse the request being read for going over a limit (counted by `reason`)."""
        if self._discard:
            return
        self._state.metrics.refused[reason] += 1
        self._reject(self._limits.error(reason))

    def _enqueue(self, exchange: Exchange) -> None:
        if self._current is None and not self._queue:
            self._current = exchange
            exchange.start()
            return
        self._queue.append(exchange)
        if self._current is None:
            self._drain()
        elif self._transport is not None and not self._pipelined:
            self._pipelined = True
            self._transport.pause_reading()  # read no more until we catch up

    def _drain(self) -> None:
        # A loop, not recursion: many pipelined requests may each finish synchronously.
        if self._draining:
            return
        self._draining = True
        try:
            while self._current is None and self._queue and self._transport is not None:
                self._current = self._queue.popleft()
                self._current.start()
        finally:
            self._draining = False

    def _linger(self, transport: asyncio.Transport) -> None:
        """Close after refusing a request mid-upload, without resetting the connection.

        Closing with unread upload bytes makes the kernel send RST, and the client may lose
        our answer. So: send FIN after the answer, keep reading (and dropping) for a moment.
        """
        transport.write_eof()
        transport.resume_reading()  # data_received drops everything once _discard is set
        asyncio.get_running_loop().call_later(LINGER_S, transport.close)

    def _reject(self, err: SluiceError) -> None:
        """Answer `err` once what is in flight is done, then close; stop reading meanwhile."""
        self._discard = True
        if self._transport is not None:
            self._transport.pause_reading()
        started = self._t0 != 0.0
        self._enqueue(
            Exchange(
                self,
                self._state,
                self._parser.get_method() if started else b"",
                self._url if started else b"",
                [],
                self._state.next_request_id(),
                b"",
                None,
                None,
                False,
                True,
                self._t0 if started else time.perf_counter(),
                err,
            )
        )
