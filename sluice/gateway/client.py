"""One `asyncio.Protocol` per client connection: parse requests, run them in order.

A plain Protocol with `httptools` (no web framework) because the data plane must keep up
with nginx on one core; the per-request work is one parse, one `Exchange`, and coalesced
writes. Requests on a connection are answered strictly in order; pipelined ones wait.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import cast

import httptools

from sluice.core.errors import SluiceError
from sluice.gateway.errors import BadRequest, PayloadTooLarge
from sluice.gateway.exchange import Exchange
from sluice.gateway.responses import CONTINUE_100, HOP_BY_HOP
from sluice.gateway.state import GatewayState

__all__ = ["LINGER_S", "ClientProtocol"]

LINGER_S = 2.0
"""How long to keep draining a client's upload after refusing it (see `_linger`)."""

_HOP, _CONNECTION, _AUTH, _REQUEST_ID, _LENGTH, _EXPECT, _PRIORITY = range(7)
_REQUEST_HEADERS = {
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
_FORWARD = -1
_header_kinds: dict[bytes, int] = {}
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


class ClientProtocol(asyncio.Protocol):
    """Parses requests off one client connection and runs them one at a time."""

    __slots__ = (
        "_auth",
        "_body",
        "_body_len",
        "_connection_header",
        "_conns",
        "_current",
        "_discard",
        "_draining",
        "_expect",
        "_headers",
        "_on_lost",
        "_parser",
        "_pipelined",
        "_priority",
        "_queue",
        "_rid",
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
        self._conns = conns  # the gateway's open connections, for shutdown and idle sweeps
        self._on_lost = on_lost
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._current: Exchange | None = None
        self._queue: deque[Exchange] = deque()
        self._draining = False
        self._pipelined = False  # reading paused until queued requests are answered
        self._discard = False  # a request was refused mid-parse: ignore the rest of the input
        self.closing = False  # answer what is in flight, then close
        self.write_paused = False
        self.last_active = 0.0
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
        self.last_active = time.monotonic()
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

    def idle_for(self, now: float) -> float:
        return 0.0 if self._current is not None else now - self.last_active

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.last_active = time.monotonic()
        self._conns.add(self)

    def data_received(self, data: bytes) -> None:
        if self._discard:
            return
        self.last_active = time.monotonic()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._t0 == 0.0:  # the request is complete and queued: answer it, then close
                self._discard = True
                self.shutdown()
            else:
                self._reject(BadRequest("protocol upgrades are not supported"))
        except httptools.HttpParserError as exc:
            self._reject(BadRequest(f"malformed HTTP request: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        current, self._current = self._current, None
        if current is not None:
            current.client_gone()
        while self._queue:
            self._queue.popleft().client_gone()
        self._conns.discard(self)
        self._on_lost()

    def pause_writing(self) -> None:
        self.write_paused = True
        if self._current is not None:
            self._current.pause_upstream()

    def resume_writing(self) -> None:
        self.write_paused = False
        if self._current is not None:
            self._current.resume_upstream()

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
        self._t0 = time.perf_counter()

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        kind = _header_kinds.get(name)
        if kind is None:
            kind = _header_kind(name)
        if kind == _FORWARD:
            self._headers += (name, b": ", value, b"\r\n")
        elif kind == _AUTH:  # read here, never forwarded: tenants' keys stay out of instances
            self._auth = value
        elif kind == _REQUEST_ID:
            self._rid = value
            self._headers += (name, b": ", value, b"\r\n")
        elif kind == _LENGTH:  # not forwarded: re-computed from the buffered body
            if int(value) > self._state.max_body:
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
        if self._body_len < 0:
            self._reject(PayloadTooLarge(f"request body over {self._state.max_body} bytes"))
        elif self._expect and self._current is None and self._transport is not None:
            self._transport.write(CONTINUE_100)

    def on_body(self, body: bytes) -> None:
        if self._discard:
            return
        self._body_len += len(body)
        if self._body_len > self._state.max_body:
            self._reject(PayloadTooLarge(f"request body over {self._state.max_body} bytes"))
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
