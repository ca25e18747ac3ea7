"""The upstream half of an exchange: pick up a connection, send the request, relay the
response as it arrives (the exchange is the connection's `ResponseSink`), retry once where it
is safe, and count an instance's failures for outlier ejection.

A mixin of `Exchange` rather than an object of its own: the hot path stays one object with
slots, no extra allocation or indirection per request.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from sluice.core.errors import SluiceError, UpstreamError
from sluice.gateway.errors import UpstreamTimeout
from sluice.gateway.responses import CHUNK_END, STATUS_LINES, status_line
from sluice.gateway.upstream import UpstreamConnection
from sluice.policy.routing import Endpoint

if TYPE_CHECKING:
    from sluice.gateway.client import ClientProtocol
    from sluice.gateway.groups import GroupRuntime
    from sluice.gateway.state import GatewayState

__all__ = ["UpstreamRelay"]

_CHUNKED = b"transfer-encoding: chunked\r\n"


class UpstreamRelay:
    if not TYPE_CHECKING:  # the fields are `Exchange`'s slots; no instance dict either way
        __slots__ = ()
    else:  # fields and endings of `Exchange`, which this is a part of
        state: GatewayState
        client: ClientProtocol
        grp: GroupRuntime | None
        method: bytes
        url: bytes
        headers: list[bytes]
        body: bytes
        request_id: bytes
        keep_alive: bool
        http11: bool
        route: str | None
        group: str | None
        instance: str | None
        endpoint: Endpoint | None
        slot: str | None
        conn: UpstreamConnection | None
        reused: bool
        retried: bool
        status: int
        error_code: str | None
        bytes_out: int
        t_body: float
        chunked: bool
        head_sent: bool
        finished: bool
        _out: list[bytes]

        def _fail(self, err: SluiceError) -> None: ...
        def _finish(self) -> None: ...

        _requeue: Callable[[GroupRuntime], bool]

    # -- upstream attempts ------------------------------------------------------------------

    def _attempt(self, endpoint: Endpoint, *, reuse: bool) -> None:
        state = self.state
        self.endpoint = endpoint
        iid = self.instance = self.slot = endpoint.instance_id
        outstanding = state.outstanding  # `state.take_slot`, inlined
        outstanding[iid] = outstanding.get(iid, 0) + 1
        served = state.served
        served[iid] = served.get(iid, 0) + 1
        pool = state.pool
        host = pool.host(endpoint.host, endpoint.port)
        idle = host.idle
        conn = idle.popitem()[0] if reuse and idle else None  # `pool.take_idle(host)`, inlined
        if conn is None:
            self.reused = False
            pool.connect(host, self._connected)
        else:
            self.reused = True
            self._send(conn)

    def _connected(self, conn: UpstreamConnection | None, exc: BaseException | None) -> None:
        if self.finished:  # the client left while we were connecting
            if conn is not None:
                self.state.pool.release(conn)
            return
        if conn is None:  # refused, unreachable or timed out: nothing was sent, so retry
            self._release_slot()
            if not isinstance(exc, ConnectionAbortedError):  # (that is the gateway stopping)
                self._unreachable()
            self._instance_failed(f"connect: {exc!r}")
            self._retry()
        else:
            g = self.grp
            if g is not None and self.instance is not None:
                woken = g.reached(self.instance)  # (a dict miss unless it refused before)
                if woken:
                    self.state.wake(g, woken, time.monotonic())
            self._send(conn)

    def _send(self, conn: UpstreamConnection) -> None:
        self.conn = conn
        body = self.body
        # One `%` (a quarter cheaper than a list of pieces and a join, measured).
        wire = b"%s %s HTTP/1.1\r\n%s%scontent-length: %d\r\n\r\n%s" % (
            self.method,
            self.url,
            conn.host.host_header,
            b"".join(self.headers),
            len(body),
            body,
        )
        g = self.grp
        timeout = g.timeout_s if g is not None else self.state.default_traffic.timeout_s
        if not conn.request(wire, self, timeout):  # closed since opened: a refusal
            self.conn = None
            self._release_slot()
            self._retry()
        elif self.client.write_paused:
            conn.pause_reading()

    def _release_slot(self) -> None:
        if self.slot is not None:
            self.state.drop_slot(self.slot)
            self.slot = None

    def _instance_failed(self, reason: str) -> None:
        """Count a failure of the instance tried against it (outlier ejection)."""
        g = self.grp
        if g is not None and self.instance is not None:
            now = time.monotonic()
            woken = g.failure(self.instance, reason, now)
            if woken:
                self.state.wake(g, woken, now)

    def _unreachable(self) -> None:
        """The instance tried refused the connection: out of its group's rotation now."""
        g = self.grp
        if g is not None and self.instance is not None:
            now = time.monotonic()
            woken = g.unreachable(self.instance, now)
            if woken:
                self.state.wake(g, woken, now)

    # -- ResponseSink -----------------------------------------------------------------------

    def upstream_head(self, status: int, headers: list[bytes], has_length: bool) -> None:
        self.status = status
        g = self.grp
        if status >= 500:
            self._instance_failed(f"HTTP {status}")
        elif g is not None and self.instance is not None:
            g.outlier.record_success(self.instance)
        keep_alive = self.keep_alive and not self.client.closing
        chunked = False
        if has_length or status in (204, 304):
            pass
        elif self.http11:
            chunked = True  # re-chunk so each piece reaches the client as it arrives
        else:
            keep_alive = False  # HTTP/1.0 client: the end of the body is the end of the connection
        self.chunked = chunked
        self.keep_alive = keep_alive
        if not has_length and g is not None:
            self.t_body = -1.0  # streamed: note when its first byte arrives (a TTFT proxy)
        out = self._out
        line = STATUS_LINES.get(status)
        out.append(line if line is not None else status_line(status))
        out += headers
        out += (
            b"x-request-id: ",
            self.request_id,
            b"\r\n",
            self.state.route_headers(self.route, self.group, self.instance),
            _CHUNKED if chunked else b"",
            b"\r\n" if keep_alive else b"connection: close\r\n\r\n",
        )
        self.head_sent = True

    def upstream_body(self, data: bytes) -> None:
        self.bytes_out += len(data)
        if self.t_body < 0.0:
            self.t_body = time.perf_counter()
        if self.chunked:
            self._out.extend((b"%x\r\n" % len(data), data, b"\r\n"))
        else:
            self._out.append(data)

    def upstream_flush(self) -> None:
        if self._out:  # one buffer: uvloop writes it with one send(), cheaper than writelines
            self.client.write(b"".join(self._out))
            self._out.clear()

    def upstream_done(self) -> None:
        self.conn = None
        iid = self.slot
        if iid is not None:  # `_release_slot()`, inlined
            self.slot = None
            outstanding = self.state.outstanding
            left = outstanding[iid] - 1
            if left:
                outstanding[iid] = left
            else:
                del outstanding[iid]
        if self.finished:
            return
        out = self._out
        if self.chunked:
            out.append(CHUNK_END)
        if out:  # `upstream_flush()`, inlined
            self.client.write(b"".join(out))
            out.clear()
        self._finish()

    def upstream_failed(self, exc: BaseException, received: bool) -> None:
        self.conn = None
        self._release_slot()
        if self.finished:
            return
        if received or not self.reused:  # a stale pooled connection is not the instance's fault
            self._instance_failed(repr(exc))
        if self.head_sent:  # the client already has part of the answer: cut it off visibly
            self.upstream_flush()
            self.error_code = UpstreamError.code
            self.keep_alive = False
            self.client.abort()
            self._finish()
        elif isinstance(exc, TimeoutError):
            self._fail(UpstreamTimeout("the instance did not answer in time"))
        elif received:
            self._fail(UpstreamError("the instance sent a broken response"))
        else:
            self._retry()

    def _retry(self) -> None:
        """The instance got nothing or answered nothing: try again where it is safe to, or
        wait in the queue if the group has no instance left to try (see `_requeue`)."""
        endpoint = self.endpoint
        g = self.grp
        assert endpoint is not None
        if self.reused:  # a stale pooled connection: the same instance, on a fresh one
            self._attempt(endpoint, reuse=False)
            return
        if g is not None and not g.candidates and self._requeue(g):
            return  # placed again when an instance is back
        if not self.retried and g is not None:
            self.retried = True
            state = self.state
            self._attempt(g.pick_other(endpoint, state.outstanding, state.rng), reuse=True)
        else:
            self._fail(UpstreamError("no instance could take the request"))

    # -- flow control (the client reads slower than the instance writes) --------------------

    def pause_upstream(self) -> None:
        if self.conn is not None:
            self.conn.pause_reading()

    def resume_upstream(self) -> None:
        if self.conn is not None:
            self.conn.resume_reading()
