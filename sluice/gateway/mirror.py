"""Fire-and-forget copies of requests to a mirror group (shadow traffic).

A `MirrorRequest` holds one slot of the mirror group (taken by the caller with
`try_acquire`, so a busy mirror group is simply skipped) and the instance's outstanding
count, sends the copy over the shared upstream pool, reads the answer and drops it. It never
touches the caller's connection, so it cannot delay or change the caller's response; its
outcome (failure, or answer and latency) feeds the mirror group's outlier detection like any
other request.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from sluice.gateway.upstream import UpstreamConnection
from sluice.policy.routing import Endpoint

if TYPE_CHECKING:
    from sluice.gateway.groups import GroupRuntime
    from sluice.gateway.state import GatewayState

__all__ = ["MirrorRequest"]


class MirrorRequest:
    """One shadow copy: a `ResponseSink` that discards what it receives."""

    __slots__ = ("done", "endpoint", "group", "reused", "sent_at", "state", "status", "wire")

    def __init__(
        self,
        state: GatewayState,
        group: GroupRuntime,
        endpoint: Endpoint,
        method: bytes,
        url: bytes,
        headers: list[bytes],
        body: bytes,
    ) -> None:
        self.state = state
        self.group = group
        self.endpoint = endpoint
        self.status = 0
        self.done = False
        self.reused = False
        self.sent_at = 0.0
        host = state.pool.host(endpoint.host, endpoint.port).host_header
        self.wire = b"".join(
            (
                method,
                b" ",
                url,
                b" HTTP/1.1\r\n",
                host,
                *headers,
                b"content-length: %d\r\n\r\n" % len(body),
                body,
            )
        )

    def start(self) -> None:
        """Send it (on a pooled connection if one is idle); the group slot is already held."""
        state = self.state
        self.sent_at = time.perf_counter()
        state.take_slot(self.endpoint.instance_id)
        host = state.pool.host(self.endpoint.host, self.endpoint.port)
        conn = state.pool.take_idle(host)
        if conn is not None and conn.request(self.wire, self, self.group.timeout_s):
            self.reused = True
        else:
            state.pool.connect(host, self._connected)

    def _connected(self, conn: UpstreamConnection | None, exc: BaseException | None) -> None:
        if conn is None:
            self._end(f"connect: {exc!r}")
        elif not conn.request(self.wire, self, self.group.timeout_s):
            self._end("connection closed before the request was sent")

    # -- ResponseSink -----------------------------------------------------------------------

    def upstream_head(self, status: int, headers: list[bytes], has_length: bool) -> None:
        self.status = status

    def upstream_body(self, data: bytes) -> None:
        pass

    def upstream_flush(self) -> None:
        pass

    def upstream_done(self) -> None:
        self._end(f"HTTP {self.status}" if self.status >= 500 else None)

    def upstream_failed(self, exc: BaseException, received: bool) -> None:
        if self.reused and not received:  # a stale pooled connection: one fresh try
            self.reused = False
            host = self.state.pool.host(self.endpoint.host, self.endpoint.port)
            self.state.pool.connect(host, self._connected)
            return
        self._end(repr(exc))

    def _end(self, failure: str | None) -> None:
        """Give back the instance count and the group slot, exactly once."""
        if self.done:
            return
        self.done = True
        state = self.state
        iid = self.endpoint.instance_id
        state.drop_slot(iid)
        group = self.group
        now = time.monotonic()
        woken = group.admission.release()
        if failure is None:
            group.outlier.record_success(iid)
            woken += group.answered(iid, self.status, time.perf_counter() - self.sent_at)
        else:
            woken += group.failure(iid, failure, now)
        if woken:
            state.wake(group, woken, now)
