"""One request from parsed to last byte sent: route it, admit it, proxy it (retrying once),
mirror it, log it (R4, R6).

The decision is `sluice.policy.route_choice`'s (`GatewayState.choose`): this module does what
it says (asks admission for a slot, picks the instance, relays bytes) and reports how it went
as one `ExchangeRecord`, which the metrics and the access log read.

An `Exchange` is also the `ResponseSink` of the upstream connection serving it, so response
bytes flow from the upstream parser to the client transport without queues or tasks. It is
also its own admission ticket (a `groups.Waiter`): a queued request is parked in its group's
`GroupAdmission` and resumed (or refused) by the gateway state, with no task or future per
request.

Every exchange that takes a group slot gives it back exactly once, in `_end_admission`, called
by every ending (`_finish`, `client_gone`, an internal error).
"""

from __future__ import annotations

import asyncio
import json.scanner
import math
import time
from typing import TYPE_CHECKING, Any, Final, Protocol

import orjson

from sluice.core.errors import NotFound, SluiceError, Unauthorized, Unavailable, UpstreamError
from sluice.gateway.errors import (
    BadRequest,
    JsonTooDeep,
    MethodNotAllowed,
    Overloaded,
    RateLimited,
    UpstreamTimeout,
)
from sluice.gateway.mirror import MirrorRequest
from sluice.gateway.responses import CHUNK_END, STATUS_LINES, json_body, json_response, status_line
from sluice.gateway.upstream import UpstreamConnection
from sluice.policy.admission import Offer, answer_cost, request_cost
from sluice.policy.answers import UsageStripper, ask_for_usage, read_answer, usage_in_tail
from sluice.policy.route_choice import ExchangeRecord, RouteChoice
from sluice.policy.routing import Endpoint, TenantAccess

if TYPE_CHECKING:
    from sluice.gateway.groups import GroupRuntime
    from sluice.gateway.samples import SampleRing
    from sluice.gateway.state import GatewayState

__all__ = ["Client", "Exchange", "deeper_than", "parse_json"]

_CHUNKED: Final = b"transfer-encoding: chunked\r\n"
ANSWER_HEAD: Final = 256 * 1024
"""Answer bytes copied whole for canary analysis (text, and a JSON answer's usage)..."""
ANSWER_TAIL: Final = 16 * 1024
"""...and the last ones kept past that (a long stream's usage and finish reason)."""
_new_record = tuple.__new__
# The C scanner when available. typeshed wants a `make_scanner` as context; a decoder is one.
_scan_json = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]


def parse_json(data: bytes, max_depth: int = 64) -> object:
    """The JSON value of a request body (the gateway reads only its top-level `model`).

    orjson is 2.5x faster than the stdlib's C scanner; what it refuses goes to the stdlib,
    whose verdict (and error message) stands. Raises `JsonTooDeep` (a `SluiceError`, not a
    `ValueError`) for arrays and objects nested more than `max_depth` deep: the body goes on
    to an instance, whose parser should not have to recurse that far. Checking costs two
    byte counts: no value nests deeper than it has brackets.
    """
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if str(exc).startswith("depth limit"):  # orjson stops at 1024 levels
            raise JsonTooDeep("") from None
        value = _stdlib_json(data)
    if data.count(b"[") + data.count(b"{") > max_depth and deeper_than(value, max_depth):
        raise JsonTooDeep("")
    return value


def _stdlib_json(data: bytes) -> object:
    text = data.decode().strip(" \t\n\r")  # UnicodeDecodeError is a ValueError too
    try:
        value, end = _scan_json(text, 0)
    except StopIteration:
        raise ValueError("no JSON value") from None
    except RecursionError:  # nested as deep as the interpreter's recursion limit
        raise JsonTooDeep("") from None
    if end != len(text):
        raise ValueError(f"extra data at character {end}")
    return value


def deeper_than(value: object, limit: int) -> bool:
    """Whether arrays and objects nest more than `limit` levels deep in `value` (a top-level
    array or object is level 1). Level by level, without recursion; stops past `limit`."""
    level: list[dict[Any, Any] | list[Any]] = [value] if isinstance(value, dict | list) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        below: list[dict[Any, Any] | list[Any]] = []
        for item in level:
            children = item.values() if isinstance(item, dict) else item
            below += [c for c in children if isinstance(c, dict | list)]
        level = below
    return False


class Client(Protocol):
    """The client connection an exchange answers on (`client.ClientProtocol`)."""

    closing: bool
    write_paused: bool

    def write(self, data: bytes) -> None: ...
    def abort(self) -> None: ...
    def exchange_done(self, exchange: Exchange) -> None: ...


class Exchange:
    """State of one request; `start()` runs it, and it reports back via `client.exchange_done`.

    `__slots__`: the hot path reads and writes about fifty fields per request, and slot
    access is cheaper than the instance dict (a dict-based version cost 0.8 us more per
    request, measured, even though its `__init__` set only what the parser hands over).
    """

    __slots__ = (
        "_out",
        "answer",
        "answer_size",
        "answer_tail",
        "auth",
        "body",
        "bytes_out",
        "chunked",
        "client",
        "conn",
        "endpoint",
        "error",
        "error_code",
        "events",
        "finished",
        "group",
        "grp",
        "head_sent",
        "headers",
        "http11",
        "instance",
        "keep_alive",
        "last_piece",
        "method",
        "mirror",
        "model",
        "payload",
        "priority",
        "priority_header",
        "queue_ms",
        "queued_at",
        "request_id",
        "retried",
        "reused",
        "route",
        "slot",
        "state",
        "status",
        "stripper",
        "t0",
        "t_body",
        "tenant",
        "url",
        "via",
        "waiting",
    )

    def __init__(
        self,
        client: Client,
        state: GatewayState,
        method: bytes,
        url: bytes,
        headers: list[bytes],
        request_id: bytes,
        body: bytes,
        auth: bytes | None,
        priority_header: bytes | None,
        keep_alive: bool,
        http11: bool,
        t0: float,
        error: SluiceError | None = None,
    ) -> None:
        self.client = client
        self.state = state
        self.method = method
        self.url = url
        self.headers = headers  # forwardable request header pieces, x-request-id included
        self.request_id = request_id
        self.body = body
        self.auth = auth  # the raw Authorization header value
        self.priority_header = priority_header  # the raw x-sluice-priority value
        self.keep_alive = keep_alive
        self.http11 = http11
        self.t0 = t0
        self.error = error  # set when the request was refused while parsing (413, 400)
        self._out: list[bytes] = []
        # What routing and admission learn (all in the access log).
        self.tenant: str | None = None
        self.model: str | None = None
        self.payload: object = None
        """The parsed body of a proxied request (its prompt, for prefix-aware choice)."""
        self.priority: str | None = None
        self.route: str | None = None  # the tag of the rule `route_choice.choose` chose
        self.group: str | None = None  # the group that serves it (after failover, fallback)
        self.via: str | None = None  # how it got there when not straight: failover, fallback
        self.mirror: str | None = None  # the group a copy went to
        self.grp: GroupRuntime | None = None  # whose slot it holds, or whose queue it is in
        self.waiting = False  # in `grp`'s queue
        self.queued_at = 0.0
        self.queue_ms = 0.0
        # The upstream side.
        self.instance: str | None = None
        self.endpoint: Endpoint | None = None
        self.slot: str | None = None  # instance whose outstanding count this request holds
        self.conn: UpstreamConnection | None = None
        self.reused = False
        self.retried = False
        # The answer.
        self.status = 0
        self.error_code: str | None = None
        self.bytes_out = 0
        self.answer: list[bytes] | None = None
        """A copy of the answer's first `ANSWER_HEAD` bytes, kept while its group is under
        canary analysis (`_sample` reads tokens, finish reason and text from it)."""
        self.answer_size = 0
        self.answer_tail = b""
        """the answer's last `ANSWER_TAIL` bytes once it outgrew the head"""
        self.last_piece = b""
        """where an answer's `usage` is: its last body piece; a stream's last one naming it"""
        self.stripper: UsageStripper | None = None
        """takes out the usage chunk the gateway asked for on the caller's behalf"""
        self.events = 0
        """`data:` lines of a streamed answer: its tokens where it gives no usage"""
        self.t_body = 0.0  # -1.0: streamed to a group, first body byte not yet seen
        self.chunked = False
        self.head_sent = False
        self.finished = False

    # -- dispatch ---------------------------------------------------------------------------

    def start(self) -> None:
        try:
            if self.error is not None:
                raise self.error
            path = self.url.partition(b"?")[0]
            if path.startswith(b"/v1/") and path != b"/v1/models":
                if self.method != b"POST":
                    raise MethodNotAllowed("use POST for this path")
                self._proxy()
            elif path == b"/healthz":  # liveness: 200 while the process runs
                self._require(b"GET")
                health = self.state.readiness.report(time.monotonic())
                self._respond(
                    200, {"status": "ok", "version": self.state.snapshot.version, **health}
                )
            elif path == b"/readyz":  # readiness: 503 until the first routes are in
                self._require(b"GET")
                ready = self.state.readiness.report(time.monotonic())
                ready["version"] = self.state.snapshot.version
                self._respond(200 if ready["ready"] else 503, ready)
            elif path == b"/v1/models":
                self._require(b"GET")
                self._list_models()
            else:
                raise NotFound(f"no such path: {path.decode('latin-1')}")
        except SluiceError as err:
            self._fail(err)
        except Exception as exc:
            self._crash(exc)

    def _crash(self, exc: Exception) -> None:
        """A bug: report it, and answer 500 rather than hang."""
        asyncio.get_running_loop().call_exception_handler(
            {"message": "gateway request failed", "exception": exc}
        )
        if self.conn is not None:
            self.conn.abandon()
            self.conn = None
        self._release_slot()
        self._end_admission()
        if not self.finished:
            self._fail(SluiceError("internal error"))

    def _require(self, method: bytes) -> None:
        if self.method != method:
            raise MethodNotAllowed(f"use {method.decode()} for this path")

    def _tenant(self) -> TenantAccess:
        """The request's tenant, or 401. An unready gateway (no routes yet) knows no key
        and answers 503 instead (`NotReady`): checked only on the way to a 401, so a known
        key pays nothing for it."""
        if self.auth is None:
            self._unready()
            raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")
        tenant = self.state.tenant_for(self.auth)
        if tenant is None:
            self._unready()
            raise Unauthorized("unknown API key")
        self.tenant = tenant.name
        return tenant

    def _unready(self) -> None:
        readiness = self.state.readiness
        if not readiness.routed:
            raise readiness.error(time.monotonic())

    def _list_models(self) -> None:
        models = self.state.snapshot.models_for(self._tenant())
        data = [{"id": m, "object": "model", "owned_by": "sluice"} for m in models]
        self._respond(200, {"object": "list", "data": data})

    def _proxy(self) -> None:
        state = self.state
        tenant = self._tenant()
        if tenant.rate_limit is not None:
            wait = state.rate_wait(tenant.name)
            if wait > 0.0:
                raise RateLimited(
                    "this API key is over its rate limit; retry later", math.ceil(wait)
                )
        try:
            payload = parse_json(self.body, state.limits.max_json_depth)
        except ValueError as exc:  # bad UTF-8 included
            raise BadRequest(f"request body is not JSON: {exc}") from None
        except JsonTooDeep:
            state.metrics.refused["json_depth"] += 1
            raise state.limits.error("json_depth") from None
        model = payload.get("model") if isinstance(payload, dict) else None
        if not isinstance(payload, dict) or not isinstance(model, str) or not model:
            raise BadRequest("request body needs a string field 'model'")
        self.model = model
        self.payload = payload
        raw = self.priority_header
        if raw is not None and tenant.priority_header:
            asked: str | None = raw.decode("latin-1").strip().lower()
            self.priority = tenant.priority_for(asked)
        else:  # (set before routing, so that a refused request's log line has it too)
            asked = None
            self.priority = tenant.priority
        choice = state.choose(tenant, model, asked, self.headers)
        self.route = choice.tag
        group = self.group = choice.group
        self.via = choice.via
        g = state.groups.get(group)
        if g is not None:
            g.metrics.arrivals += 1
            if g.unejects_at:
                state.uneject(g)
            if g.traffic.ask_stream_usage and payload.get("stream") is True:
                self._ask_for_usage()
        if g is not None and g.candidates and g.admission.try_acquire():
            self.grp = g
            self._dispatch(g)
            if g.standby_at is not None and g.over_level() > 0:
                state.take_standby_in(g)
        else:
            self._admit_slow(choice, g)
        if choice.mirror is not None:
            self._mirror(choice.mirror)

    def _ask_for_usage(self) -> None:
        """A completion streamed to a caller who did not ask for its usage: ask the server
        for it anyway, so its tokens are counted, not estimated from chunks, and take it
        out of what the caller gets (`policy.answers.UsageStripper`)."""
        if self.url.partition(b"?")[0].endswith(b"completions"):
            asked = ask_for_usage(self.body, self.payload)
            if asked is not None:
                self.body = asked
                self.stripper = UsageStripper()

    def _admit_slow(self, choice: RouteChoice, g: GroupRuntime | None) -> None:
        """The group has no free slot or no instance: a fallback with headroom (in the
        choice's order), else its queue."""
        state = self.state
        group = self.group
        serving = g is not None and bool(g.candidates)
        why = "overloaded" if serving else "no ready instance"
        now = time.monotonic()
        for name in choice.fallbacks:
            fg = state.groups.get(name)
            if fg is None:
                continue
            if fg.unejects_at:
                state.uneject(fg)
            if fg.candidates and fg.admission.try_acquire():
                step = f"fallback {group}->{name}: {why}"
                self.via = step if self.via is None else f"{self.via}; {step}"
                self.group = name
                self.grp = fg
                self._dispatch(fg)
                return
        if g is None or not (serving or g.holds(now)):  # (it holds just after an outage)
            if g is not None:
                g.metrics.shed["no_instance"] += 1
            raise Unavailable("no ready instance serves this model right now", model=self.model)
        offer, evicted = g.admission.offer_nowait(self, choice.priority, now, *self._share())
        if offer is Offer.SHED:
            g.metrics.shed["overloaded"] += 1
            raise Overloaded("this model's instances and queue are full; retry later")
        self.grp = g
        if offer is Offer.ADMITTED:
            self._dispatch(g)
            return
        self.waiting = True
        self.queued_at = now
        state.watch_queue(g)
        if evicted is not None:  # last: answering it may run its client's next request
            evicted.refused_in_queue(
                Overloaded("pushed out of the queue by higher-priority requests; retry later"),
                "evicted",
                now,
            )

    def _dispatch(self, g: GroupRuntime) -> None:
        state = self.state
        payload = self.payload if len(self.body) >= g.prefix_min_bytes else None
        endpoint = g.pick(self.headers, state.outstanding, state.rng, payload)
        if endpoint is None:  # the group lost its instances while this one waited
            if self._requeue(g):
                return
            raise Unavailable("no ready instance serves this model right now", model=self.model)
        self._attempt(endpoint, reuse=True)

    def _mirror(self, group: str) -> None:
        """Shadow a copy to the mirror group if it has a free slot; never waits for it."""
        state = self.state
        mg = state.groups.get(group)
        if mg is None or not mg.candidates or not mg.admission.try_acquire():
            return
        endpoint = mg.pick(self.headers, state.outstanding, state.rng)
        assert endpoint is not None  # candidates is not empty
        self.mirror = group
        mg.metrics.mirrored += 1
        MirrorRequest(state, mg, endpoint, self.method, self.url, self.headers, self.body).start()

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
        if self.stripper is not None and (has_length or not 200 <= status < 300):
            self.stripper = None  # no stream came: nothing to take out
        if g is not None and g.samples is not None:
            self.answer, self.answer_size, self.answer_tail = [], 0, b""
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
        usage = False
        if self.t_body:  # streamed to a group: count its events, note where its usage is
            self.events += data.count(b"data:")
            usage = b'"usage"' in data
            if usage:
                self.last_piece = data
            if self.t_body < 0.0:
                self.t_body = time.perf_counter()
        else:
            self.last_piece = data
        if self.answer is not None:
            self._keep(data)
        stripper = self.stripper
        if stripper is not None and (usage or stripper.held or not data.endswith(b"\n\n")):
            data = stripper.feed(data)  # (else whole events, no usage: nothing to take out)
            if not data:
                return
        self.bytes_out += len(data)
        if self.chunked:
            self._out.extend((b"%x\r\n" % len(data), data, b"\r\n"))
        else:
            self._out.append(data)

    def _keep(self, data: bytes) -> None:
        """Copy answer bytes for canary analysis: the head whole, then a sliding tail."""
        assert self.answer is not None
        if self.answer_size < ANSWER_HEAD:
            self.answer.append(data)
            self.answer_size += len(data)
        else:
            self.answer_tail = (self.answer_tail + data)[-ANSWER_TAIL:]

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
        if self.stripper is not None and (held := self.stripper.flush()):
            self.bytes_out += len(held)
            out.extend((b"%x\r\n" % len(held), held, b"\r\n") if self.chunked else (held,))
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

    # -- the queue (called by GatewayState) -------------------------------------------------

    def leave_queue(self, now: float) -> float:
        """Out of the queue with a slot (or refused); returns the seconds it waited."""
        self.waiting = False
        waited = now - self.queued_at
        self.queue_ms = waited * 1000.0
        return waited

    def resume(self) -> None:
        """It got a slot while queued: proxy it now (unless its client left meanwhile)."""
        if self.finished or self.grp is None:
            return
        try:
            self._dispatch(self.grp)
        except SluiceError as err:
            self._fail(err)
        except Exception as exc:
            self._crash(exc)

    def _requeue(self, g: GroupRuntime) -> bool:
        """Every instance of the group refused a connection (or the group has none left):
        give the slot back and wait in the queue, where the request stood when it first
        asked (its `max_wait_s` counts from then), until an instance is back. False if the
        group does not hold requests now (`GroupRuntime.holds`): then it fails as before."""
        now = time.monotonic()
        if g.candidates or not g.holds(now):
            return False
        assert self.priority is not None
        since = self.queued_at or now  # (0.0: it never waited)
        self.queued_at = since
        self.waiting = True
        self.state.watch_queue(g)
        woken = g.admission.requeue(self, self.priority, since, *self._share())
        if woken:
            self.state.wake(g, woken, now)
        return True

    def refused_in_queue(self, err: SluiceError, reason: str, now: float) -> None:
        """Admission dropped it from the queue (expired, evicted, group removed): answer `err`."""
        g, self.grp = self.grp, None
        waited = self.leave_queue(now)
        if g is not None:
            g.metrics.shed[reason] += 1
            if reason == "queue_timeout":
                g.metrics.queue_wait.observe(waited)
        if self.finished:
            return
        try:
            self._fail(err)
        except Exception as exc:
            self._crash(exc)

    def _end_admission(self) -> None:
        """Give the group slot back (or leave the queue); exactly once, whatever the ending."""
        g = self.grp
        if g is None:
            return
        self.grp = None
        if self.waiting:
            self.waiting = False
            g.admission.cancel(self)
        else:
            woken = g.admission.release()
            if woken:
                self.state.wake(g, woken, time.monotonic())

    # -- client side ------------------------------------------------------------------------

    def client_gone(self, code: str = "client_disconnected") -> None:
        """The client disconnected (or is being cut off: `code` says why, for the access log):
        stop the upstream side, free its slot, log what happened."""
        if self.finished:
            return
        if self.conn is not None:
            self.conn.abandon()
            self.conn = None
        self._release_slot()
        self._end_admission()
        if not self.head_sent:
            self.status = 499  # nginx's "client closed request"
        self.error_code = code
        self.finished = True
        self._log(time.perf_counter())

    # -- ending -----------------------------------------------------------------------------

    def _respond(self, status: int, payload: object) -> None:
        self._send_json(status, json_body(payload))

    def _fail(self, err: SluiceError) -> None:
        self.error_code = err.code
        # None (the tree's default: no header): a 503 or 429 still says 1 s
        retry_after = err.retry_after_s or 1
        self._send_json(err.http_status, json_body(err.to_json()), retry_after)

    def _send_json(self, status: int, body: bytes, retry_after_s: int = 1) -> None:
        self.status = status
        self.keep_alive = self.keep_alive and not self.client.closing
        self.bytes_out = len(body)
        self.client.write(
            json_response(status, body, self._sluice_headers(), self.keep_alive, retry_after_s)
        )
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
        now = time.perf_counter()  # read once: latency ejection, samples and the log agree
        g = self.grp
        if g is not None:
            if self.t_body > 0.0:  # a streamed answer's first body byte came
                g.metrics.ttfb.observe(self.t_body - self.t0)
            if self.head_sent and self.error_code is None and not self.retried:
                # answered in full, by one instance: its latency feeds latency ejection
                latency = now - self.t0 - 0.001 * self.queue_ms
                woken = g.answered(self.instance or "", self.status, latency)
                if woken:
                    self.state.wake(g, woken, time.monotonic())
            if g.samples is not None and self.instance is not None:
                self._sample(g.samples, now)
            if (
                200 <= self.status < 300
                and self.error_code is None
                and (self.last_piece or self.events)
            ):
                self._count_tokens(g, now)
        self._end_admission()
        record = self.record(now)  # `self._log(now)`, inlined: every request
        state = self.state
        state.metrics.record(record)
        if state.access_log is not None:
            state.access_log.record(record)
        self.client.exchange_done(self)

    def _count_tokens(self, g: GroupRuntime, now: float) -> None:
        """The answer's tokens, by tenant: its `usage` (the end of its last body piece), else
        a stream's `data:` events but its `[DONE]`; its time per output token if streamed.
        A request that waited in the queue was charged an estimate there: the real cost
        corrects the tenant's fair-share counter (`admission.charge`)."""
        usage = usage_in_tail(self.last_piece)
        if usage is not None:
            prompt, completion = usage
        elif self.t_body > 0.0 and self.events:
            prompt, completion = 0, self.events - 1
        else:
            return
        tokens = g.metrics.tokens  # `g.metrics.count_tokens(...)`, inlined: every answer
        counts = tokens.get(self.tenant or "")
        if counts is None:
            counts = tokens[self.tenant or ""] = [0, 0]
        counts[0] += prompt
        counts[1] += completion
        if usage is not None:  # the autoscaler's mean lengths count these answers
            g.metrics.usage_answers += 1
            g.metrics.usage_completion += completion
        if self.t_body > 0.0 and completion > 1:
            g.metrics.tpot.observe((now - self.t_body) / (completion - 1))
        if self.queue_ms and usage is not None:
            tenant, estimate, weight = self._share()
            real = answer_cost(prompt, completion)
            g.admission.charge(tenant, real - estimate, self.priority or "normal", weight)

    def _share(self) -> tuple[str, float, float]:
        """Who this request is in its group's fair-share queue: its tenant, the cost it is
        estimated at there (`request_cost`) and its tenant's weight."""
        access = self.state.tenant_for(self.auth or b"")  # (memoised: the key `_tenant` read)
        weight = access.weight if access is not None else 1.0
        return self.tenant or "", request_cost(len(self.body), self.payload), weight

    def _sample(self, ring: SampleRing, now: float) -> None:
        """Record this answer for its group's canary analysis (only groups under one). An
        answer cut off after its head counts as status 0, a failed connection's. Tokens,
        finish reason and the start of the text come from the answer's copy
        (`policy.answers`); time per output token from a stream's tokens after the first."""
        start = self.t0 + 0.001 * self.queue_ms
        ttfb = self.t_body - start if self.t_body > 0.0 else None
        status = 0 if self.head_sent and self.error_code is not None else self.status
        assert self.instance is not None
        facts = None
        if self.answer is not None and 200 <= status < 300:
            facts = read_answer(b"".join(self.answer), self.answer_tail)
        tokens = facts.completion_tokens if facts is not None else None
        tpot = None
        if tokens is not None and tokens > 1 and ttfb is not None:
            tpot = max(0.0, (now - self.t_body) / (tokens - 1))
        ring.record(self.instance, status, now - start, ttfb, self.bytes_out, facts, tpot)

    def _log(self, now: float) -> None:
        """Report how it went, as one record, to the metrics and the access log."""
        record = self.record(now)
        state = self.state
        state.metrics.record(record)
        if state.access_log is not None:
            state.access_log.record(record)

    def record(self, now: float) -> ExchangeRecord:
        """What was asked, chosen and done, for an exchange that ended at `now`
        (`perf_counter`). `answer`: what the instance gave it, 0 when it gave no answer
        (see `_answer`); 0 too when no instance was tried."""
        code = self.error_code
        status = self.status
        latency = now - self.t0
        queue_ms = self.queue_ms
        # `tuple.__new__` straight: the namedtuple's own `__new__` is a Python call that
        # costs twice as much, once per request. The fields in `ExchangeRecord`'s order.
        return _new_record(
            ExchangeRecord,
            (
                self.method,
                self.url,
                status,
                self.tenant,
                self.model,
                self.priority,
                self.route,
                self.group,
                self.instance,
                self.via,
                self.mirror,
                self.retried,
                code,
                self.request_id,
                self.t0,
                queue_ms,
                latency,
                latency - 0.001 * queue_ms,
                self.bytes_out,
                0 if self.instance is None else status if code is None else self._answer(code),
            ),
        )

    def _answer(self, code: str) -> int:
        """The status the instance tried last gave a request that ended in error `code`: 0
        (no answer) if its answer was cut off after the head or its connection failed or
        broke (the gateway's 502), else the status the client got (the gateway's 504 on a
        timeout, 499 for a client that left first)."""
        if self.head_sent or code == UpstreamError.code:
            return 0
        return self.status
