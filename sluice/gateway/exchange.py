"""One request from parsed to last byte sent: route it, proxy it (retrying once), log it (R4).

An `Exchange` is also the `ResponseSink` of the upstream connection serving it, so response
bytes flow from the upstream parser to the client transport without queues or tasks.
"""

from __future__ import annotations

import asyncio
import json.scanner
from typing import TYPE_CHECKING

from sluice.core.errors import NotFound, SluiceError, Unauthorized, Unavailable, UpstreamError
from sluice.gateway.errors import BadRequest, MethodNotAllowed, UpstreamTimeout
from sluice.gateway.responses import (
    CHUNK_END,
    close_header,
    json_body,
    json_response,
    status_line,
)
from sluice.gateway.upstream import UpstreamConnection
from sluice.policy.balance import pick_least_outstanding
from sluice.policy.routing import Endpoint, TenantAccess

if TYPE_CHECKING:
    from sluice.gateway.client import ClientProtocol
    from sluice.gateway.state import GatewayState

__all__ = ["Exchange", "parse_json"]

_CHUNKED = b"transfer-encoding: chunked\r\n"
# The C scanner when available. typeshed wants a `make_scanner` as context; a decoder is one.
_scan_json = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]


def parse_json(data: bytes) -> object:
    """`json.loads` for a request body, minus its pure-Python wrapper (a third of the cost)."""
    text = data.decode().strip(" \t\n\r")  # UnicodeDecodeError is a ValueError too
    try:
        value, end = _scan_json(text, 0)
    except StopIteration:
        raise ValueError("no JSON value") from None
    if end != len(text):
        raise ValueError(f"extra data at character {end}")
    return value


class Exchange:
    """State of one request; `start()` runs it, and it reports back via `client.exchange_done`."""

    __slots__ = (
        "_out",
        "auth",
        "body",
        "bytes_out",
        "chunked",
        "client",
        "conn",
        "endpoint",
        "error",
        "error_code",
        "finished",
        "group",
        "head_sent",
        "headers",
        "http11",
        "instance",
        "keep_alive",
        "method",
        "model",
        "request_id",
        "retried",
        "reused",
        "route",
        "slot",
        "state",
        "status",
        "t0",
        "tenant",
        "url",
    )

    def __init__(
        self,
        client: ClientProtocol,
        state: GatewayState,
        method: bytes,
        url: bytes,
        headers: list[bytes],
        request_id: bytes,
        body: bytes = b"",
        *,
        auth: bytes | None = None,
        keep_alive: bool,
        http11: bool = True,
        t0: float,
        error: SluiceError | None = None,
    ) -> None:
        self.client = client
        self.state = state
        self.method = method
        self.url = url
        self.headers = headers  # forwardable request header pieces, x-request-id included
        self.request_id = request_id
        self.auth = auth  # the raw Authorization header value
        self.body = body
        self.keep_alive = keep_alive
        self.http11 = http11
        self.t0 = t0
        self.error = error  # set when the request was refused while parsing (413, 400)
        self.tenant: str | None = None
        self.model: str | None = None
        self.route: str | None = None
        self.group: str | None = None
        self.instance: str | None = None
        self.endpoint: Endpoint | None = None
        self.slot: str | None = None  # instance whose outstanding count this request holds
        self.conn: UpstreamConnection | None = None
        self.reused = False
        self.retried = False
        self.status = 0
        self.error_code: str | None = None
        self.bytes_out = 0
        self.chunked = False
        self.head_sent = False
        self.finished = False
        self._out: list[bytes] = []

    # -- dispatch ---------------------------------------------------------------------------

    def start(self) -> None:
        try:
            if self.error is not None:
                raise self.error
            path = self.url.partition(b"?")[0]
            if path.startswith(b"/v1/") and path != b"/v1/models":
                self._require(b"POST")
                self._proxy()
            elif path == b"/healthz":
                self._require(b"GET")
                self._respond(200, {"status": "ok", "version": self.state.snapshot.version})
            elif path == b"/v1/models":
                self._require(b"GET")
                self._list_models()
            else:
                raise NotFound(f"no such path: {path.decode('latin-1')}")
        except SluiceError as err:
            self._fail(err)
        except Exception as exc:  # a bug: report it, and answer 500 rather than hang
            asyncio.get_running_loop().call_exception_handler(
                {"message": "gateway request failed", "exception": exc}
            )
            if self.conn is not None:
                self.conn.abandon()
                self.conn = None
            self._release_slot()
            if not self.finished:
                self._fail(SluiceError("internal error"))

    def _require(self, method: bytes) -> None:
        if self.method != method:
            raise MethodNotAllowed(f"use {method.decode()} for this path")

    def _tenant(self) -> TenantAccess:
        if self.auth is None:
            raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")
        tenant = self.state.tenant_for(self.auth)
        if tenant is None:
            raise Unauthorized("unknown API key")
        self.tenant = tenant.name
        return tenant

    def _list_models(self) -> None:
        models = self.state.snapshot.models_for(self._tenant())
        data = [{"id": m, "object": "model", "owned_by": "sluice"} for m in models]
        self._respond(200, {"object": "list", "data": data})

    def _proxy(self) -> None:
        state = self.state
        tenant = self._tenant()
        try:
            payload = parse_json(self.body)
        except ValueError as exc:  # bad UTF-8 included
            raise BadRequest(f"request body is not JSON: {exc}") from None
        model = payload.get("model") if isinstance(payload, dict) else None
        if not isinstance(model, str) or not model:
            raise BadRequest("request body needs a string field 'model'")
        self.model = model
        route = state.resolve(tenant, model)
        self.route = route.tag
        self.group = route.group
        endpoints = state.snapshot.endpoints.get(route.group, ())
        if not endpoints:
            raise Unavailable("no ready instance serves this model right now", model=model)
        if len(endpoints) == 1:
            self._attempt(endpoints[0], reuse=True)
        else:
            endpoint = pick_least_outstanding(endpoints, state.outstanding, state.rng)
            assert endpoint is not None
            self._attempt(endpoint, reuse=True)

    # -- upstream attempts ------------------------------------------------------------------

    def _attempt(self, endpoint: Endpoint, *, reuse: bool) -> None:
        state = self.state
        self.endpoint = endpoint
        self.instance = endpoint.instance_id
        state.take_slot(endpoint.instance_id)
        self.slot = endpoint.instance_id
        host = state.pool.host(endpoint.host, endpoint.port)
        conn = state.pool.take_idle(host) if reuse else None
        if conn is None:
            self.reused = False
            state.pool.connect(host, self._connected)
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
            self._retry()
        else:
            self._send(conn)

    def _send(self, conn: UpstreamConnection) -> None:
        self.conn = conn
        body = self.body
        wire = [self.method, b" ", self.url, b" HTTP/1.1\r\n", conn.host.host_header]
        wire += self.headers
        wire += (b"content-length: %d\r\n\r\n" % len(body), body)
        if not conn.request(b"".join(wire), self):  # closed since it was opened: like a refusal
            self.conn = None
            self._release_slot()
            self._retry()
        elif self.client.write_paused:
            conn.pause_reading()

    def _release_slot(self) -> None:
        if self.slot is not None:
            self.state.drop_slot(self.slot)
            self.slot = None

    # -- ResponseSink -----------------------------------------------------------------------

    def upstream_head(self, status: int, headers: list[bytes], has_length: bool) -> None:
        self.status = status
        keep_alive = self.keep_alive and not self.client.closing
        if has_length or status in (204, 304):
            self.chunked = False
        elif self.http11:
            self.chunked = True  # re-chunk so each piece reaches the client as it arrives
        else:
            keep_alive = False  # HTTP/1.0 client: the end of the body is the end of the connection
        self.keep_alive = keep_alive
        out = self._out
        out.append(status_line(status))
        out.extend(headers)
        out.append(self._sluice_headers())
        if self.chunked:
            out.append(_CHUNKED)
        out.append(close_header(keep_alive))
        out.append(b"\r\n")
        self.head_sent = True

    def upstream_body(self, data: bytes) -> None:
        self.bytes_out += len(data)
        if self.chunked:
            self._out.extend((b"%x\r\n" % len(data), data, b"\r\n"))
        else:
            self._out.append(data)

    def upstream_flush(self) -> None:
        if self._out:
            self.client.writelines(self._out)
            self._out.clear()

    def upstream_done(self) -> None:
        self.conn = None
        self._release_slot()
        if self.finished:
            return
        if self.chunked:
            self._out.append(CHUNK_END)
        self.upstream_flush()
        self._finish()

    def upstream_failed(self, exc: BaseException, received: bool) -> None:
        self.conn = None
        self._release_slot()
        if self.finished:
            return
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
        """The instance got nothing or answered nothing: try again where it is safe to."""
        endpoint = self.endpoint
        assert endpoint is not None and self.group is not None
        if self.reused:  # a stale pooled connection: the same instance, on a fresh one
            self._attempt(endpoint, reuse=False)
        elif not self.retried:
            self.retried = True
            state = self.state
            candidates = state.snapshot.endpoints.get(self.group) or (endpoint,)
            other = pick_least_outstanding(
                candidates, state.outstanding, state.rng, exclude=endpoint.instance_id
            )
            assert other is not None
            self._attempt(other, reuse=True)
        else:
            self._fail(UpstreamError("no instance could take the request"))

    # -- client side ------------------------------------------------------------------------

    def pause_upstream(self) -> None:
        if self.conn is not None:
            self.conn.pause_reading()

    def resume_upstream(self) -> None:
        if self.conn is not None:
            self.conn.resume_reading()

    def client_gone(self) -> None:
        """The client disconnected: stop the upstream side and log what happened."""
        if self.finished:
            return
        if self.conn is not None:
            self.conn.abandon()
            self.conn = None
        self._release_slot()
        if not self.head_sent:
            self.status = 499  # nginx's "client closed request"
        self.error_code = "client_disconnected"
        self.finished = True
        self._log()

    # -- ending -----------------------------------------------------------------------------

    def _respond(self, status: int, payload: object) -> None:
        self._send_json(status, json_body(payload))

    def _fail(self, err: SluiceError) -> None:
        self.error_code = err.code
        self._send_json(err.http_status, json_body(err.to_json()))

    def _send_json(self, status: int, body: bytes) -> None:
        self.status = status
        self.keep_alive = self.keep_alive and not self.client.closing
        self.bytes_out = len(body)
        self.client.write(json_response(status, body, self._sluice_headers(), self.keep_alive))
        self._finish()

    def _sluice_headers(self) -> bytes:
        return b"".join(
            (
                b"x-request-id: ",
                self.request_id,
                b"\r\n",
                self.state.route_headers(self.route, self.group, self.instance),
            )
        )

    def _finish(self) -> None:
        self.finished = True
        self._log()
        self.client.exchange_done(self)

    def _log(self) -> None:
        if self.state.access_log is not None:
            self.state.access_log.record(self)
