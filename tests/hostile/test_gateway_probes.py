"""Raw-socket probes against the gateway of a real `sluice up` (on 127.0.0.1): malformed and
hostile HTTP, one probe per connection. Each gets a 4xx with the platform's JSON error, or a
clean close; never a 5xx, never a hang (every read has a timeout). Where the gateway's
limits name the answer (431 head, 414 URL, 413 body, 400 JSON nesting) the code is checked
too. After all of them an ordinary request is still answered 200.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import pytest

from tests.e2e.conftest import Sluice, running

SPEC = """
gateway:
  host: 127.0.0.1
  port: 0
  limits: {header_timeout_s: 2, body_timeout_s: 2}   # so the 408s come within a read timeout
pools:
  - {name: local, count: 4, memory_gb: 16}
groups:
  - name: chat
    owner: ops@example.com
    business: search
    alert_channel: "#ops"
    models:
      m-chat: {runtime: sim, sim: {startup_s: 0.2, service_time: {kind: fixed, seconds: 0.01}}}
    resources: {pool: local, memory_gb: 2}
    max_concurrency: 16
    replicas: 1
    slow_start_s: 0
    warmup: {requests: 1}
tenants:
  - {name: search, api_keys: [sk-probe-8b6a72e2322f2fb5]}
routes:
  - {tag: chat-main, match: {models: [m-chat]}, to: chat}
"""
KEY = "sk-probe-8b6a72e2322f2fb5"
TIMEOUT_S = 10.0
"""Each read waits at most this long: a probe that gets neither an answer nor a close hangs."""
CHAT = json.dumps(
    {"model": "m-chat", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
).encode()


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def error(self) -> dict[str, object]:
        """The platform's error body: `{"error": {"code": str, "message": str, ...}}`."""
        doc = json.loads(self.body)
        assert isinstance(doc, dict) and isinstance(doc.get("error"), dict), self.body[:300]
        err = doc["error"]
        assert isinstance(err.get("code"), str) and isinstance(err.get("message"), str), err
        return err


@dataclass
class Outcome:
    answers: list[Answer] = field(default_factory=list)
    closed: bool = False  # the gateway closed the connection (EOF, or reset after answering)
    reset: bool = False
    hung: bool = False  # a read timed out with neither answer nor close

    @property
    def first(self) -> Answer:
        assert self.answers, f"no answer: {self}"
        return self.answers[0]


def _read_head(buf: bytearray, sock: socket.socket) -> bytes | None:
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buf += chunk
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    buf[:] = rest
    return head


def _read_exactly(buf: bytearray, sock: socket.socket, n: int) -> bytes:
    while len(buf) < n:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed mid-body")
        buf += chunk
    out = bytes(buf[:n])
    del buf[:n]
    return out


def _read_line(buf: bytearray, sock: socket.socket) -> bytes:
    while b"\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed mid-chunk")
        buf += chunk
    line, _, rest = bytes(buf).partition(b"\r\n")
    buf[:] = rest
    return line


def _read_answer(buf: bytearray, sock: socket.socket) -> Answer | None:
    head = _read_head(buf, sock)
    if head is None:
        return None
    status_line, *lines = head.decode("latin-1").split("\r\n")
    status = int(status_line.split(" ", 2)[1])
    headers: dict[str, str] = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if 100 <= status < 200 and status != 101:
        return _read_answer(buf, sock)  # an interim answer (100 Continue): the final follows
    if status in (101, 204, 304):
        return Answer(status, headers, b"")
    if "content-length" in headers:
        return Answer(status, headers, _read_exactly(buf, sock, int(headers["content-length"])))
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = bytearray()
        while size := int(_read_line(buf, sock).split(b";")[0], 16):
            body += _read_exactly(buf, sock, size + 2)[:-2]
        while _read_line(buf, sock):  # trailers
            pass
        return Answer(status, headers, bytes(body))
    while chunk := sock.recv(65536):  # delimited by the close
        buf += chunk
    body, buf[:] = bytes(buf), b""
    return Answer(status, headers, body)


def probe(address: tuple[str, int], raw: bytes, *, answers: int = 1) -> Outcome:
    """Send `raw` on a fresh connection and read up to `answers` answers (or the close);
    no read waits longer than `TIMEOUT_S`."""
    out = Outcome()
    with socket.create_connection(address, timeout=TIMEOUT_S) as sock:
        # Refused mid-send: what it answered (if anything) is still readable.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(raw)
        buf = bytearray()
        try:
            while len(out.answers) < answers:
                answer = _read_answer(buf, sock)
                if answer is None:
                    out.closed = True
                    break
                out.answers.append(answer)
                if answer.headers.get("connection", "").lower() == "close":
                    out.closed = True
                    break
        except TimeoutError:
            out.hung = not out.answers
        except ConnectionResetError:
            out.reset = out.closed = True
    return out


def request(
    method: str = "POST",
    path: str = "/v1/chat/completions",
    body: bytes | None = CHAT,
    headers: list[tuple[str, str]] | None = None,
    *,
    length: bool = True,
    auth: bool = True,
    extra: bytes = b"",
) -> bytes:
    """An HTTP/1.1 request as bytes (Host, the tenant's key, Content-Length by default)."""
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    if auth:
        lines.append(f"Authorization: Bearer {KEY}")
    if body is not None and length:
        lines.append(f"Content-Length: {len(body)}")
    if body is not None:
        lines.append("Content-Type: application/json")
    lines += [f"{k}: {v}" for k, v in headers or []]
    return "\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + (body or b"") + extra


def refused(out: Outcome, *codes: int) -> None:
    """A 4xx JSON error (one of `codes`, if given), or a clean close with no answer."""
    assert not out.hung, "the gateway neither answered nor closed"
    if not out.answers:
        assert out.closed, out
        return
    first = out.first
    assert 400 <= first.status < 500, (first.status, first.body[:300])
    if codes:
        assert first.status in codes, (first.status, first.body[:300])
    first.error()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    home = tmp_path_factory.mktemp("probes")
    with running(home, SPEC, "chat ready", lambda s: len(s.ready("chat")) >= 1) as s:
        yield _address(s)
        # After every probe of the module: still serving ordinary requests.
        out = probe(_address(s), request())
        assert out.first.status == 200, out.first.body[:300]


def _address(s: Sluice) -> tuple[str, int]:
    url = urlsplit(s.endpoint)
    assert url.hostname == "127.0.0.1" and url.port is not None
    return url.hostname, url.port


def test_an_ordinary_request_is_answered(gateway: tuple[str, int]) -> None:
    out = probe(gateway, request())
    assert out.first.status == 200, out.first.body[:300]
    assert json.loads(out.first.body)["choices"]


MALFORMED: dict[str, bytes] = {
    "garbage": b"GARBAGE\r\n\r\n",
    "binary": b"\x00\x01\x02\x03\xff\xfe\r\n\r\n",
    "no-target": b"GET\r\n\r\n",
    "no-version": b"GET /v1/models\r\n\r\n",
    "bad-version": b"GET /v1/models HTTP/9.9\r\nHost: x\r\n\r\n",
    "extra-token": b"GET /v1/models HTTP/1.1 extra\r\nHost: x\r\n\r\n",
    "nul-in-target": b"GET /v1/\x00models HTTP/1.1\r\nHost: x\r\n\r\n",
    "space-in-target": b"GET /v1/ models HTTP/1.1\r\nHost: x\r\n\r\n",
    "tls-hello": bytes.fromhex("16030100a5010000a10303") + b"\x00" * 32,
    "unknown-method": b"FOO /v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
    "lowercase-method": b"get /v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
    "method-with-nul": b"GE\x00T /v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
    "connect": b"CONNECT 127.0.0.1:22 HTTP/1.1\r\nHost: 127.0.0.1:22\r\n\r\n",
    "header-without-colon": b"GET /v1/models HTTP/1.1\r\nHost: x\r\nNoColonHere\r\n\r\n",
    "space-before-colon": b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-A : b\r\n\r\n",
    "header-name-nul": b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-\x00A: b\r\n\r\n",
    "header-value-nul": b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n",
    "header-value-cr": b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-A: a\rb\r\n\r\n",
    "header-obs-fold": b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n",
    "bad-content-length": request(headers=[("Content-Length", "abc")], length=False),
    "negative-content-length": request(headers=[("Content-Length", "-1")], length=False),
    "plus-content-length": request(headers=[("Content-Length", f"+{len(CHAT)}")], length=False),
    "huge-content-length": request(headers=[("Content-Length", "9" * 30)], length=False, body=b""),
    "two-content-lengths": request(
        headers=[("Content-Length", str(len(CHAT))), ("Content-Length", "3")], length=False
    ),
    "content-length-list": request(
        headers=[("Content-Length", f"{len(CHAT)}, {len(CHAT)}")], length=False
    ),
    "cl-and-te": request(
        headers=[("Transfer-Encoding", "chunked")],
        body=b"0\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
    ),
    "te-and-cl": request(
        headers=[("Transfer-Encoding", "chunked"), ("Content-Length", "4")],
        length=False,
        body=b"5\r\nhello\r\n0\r\n\r\n",
    ),
    "chunk-size-not-hex": request(
        headers=[("Transfer-Encoding", "chunked")], length=False, body=b"zz\r\nhi\r\n0\r\n\r\n"
    ),
    "chunk-size-overflow": request(
        headers=[("Transfer-Encoding", "chunked")],
        length=False,
        body=b"f" * 40 + b"\r\nhi\r\n0\r\n\r\n",
    ),
    "chunk-size-negative": request(
        headers=[("Transfer-Encoding", "chunked")], length=False, body=b"-2\r\nhi\r\n0\r\n\r\n"
    ),
    "chunk-without-crlf": request(
        headers=[("Transfer-Encoding", "chunked")], length=False, body=b"2\r\nhiXX0\r\n\r\n"
    ),
    "te-not-chunked-last": request(
        headers=[("Transfer-Encoding", "chunked, identity")], length=False, body=b"0\r\n\r\n"
    ),
    "te-unknown": request(headers=[("Transfer-Encoding", "xchunked")], length=False),
    "te-http10": b"POST /v1/chat/completions HTTP/1.0\r\nHost: x\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "te-twice": request(
        headers=[("Transfer-Encoding", "chunked"), ("Transfer-Encoding", "chunked")],
        length=False,
        body=b"0\r\n\r\n",
    ),
    "bare-lf-in-value": b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-A: a\nX-Injected: b\r\n\r\n",
    "bare-lf-lines": b"GET /v1/models HTTP/1.1\nHost: x\nX-A: b\n\n",
    "bare-cr-lines": b"GET /v1/models HTTP/1.1\rHost: x\r\r",
    "empty-header-name": b"GET /v1/models HTTP/1.1\r\nHost: x\r\n: b\r\n\r\n",
    "h2-preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    "absolute-uri": request(path="http://evil.example/v1/chat/completions"),
    "asterisk": b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
    "bad-auth-scheme": request(headers=[("Authorization", "Basic Zm9vOmJhcg==")], auth=False),
    "two-auth-headers": request(headers=[("Authorization", "Bearer other")]),
    "bad-priority": request(headers=[("X-Sluice-Priority", "\x7f" * 100)]),
    "unknown-path": request("GET", "/v1/../../etc/passwd", None),
    "wrong-method": request("DELETE", "/v1/chat/completions", None),
}
"""Probes refused at the HTTP level: 4xx (or a clean close)."""

TOLERATED: dict[str, bytes] = {
    "upgrade-websocket": request(
        "GET",
        "/v1/models",
        None,
        [("Connection", "Upgrade"), ("Upgrade", "websocket"), ("Sec-WebSocket-Version", "13")],
    ),
    "upgrade-h2c": request(
        "GET", "/v1/models", None, [("Connection", "Upgrade, HTTP2-Settings"), ("Upgrade", "h2c")]
    ),
    "expect-unknown": request(headers=[("Expect", "200-ok")]),
    "expect-100-continue": request(headers=[("Expect", "100-continue")]),
    "obs-text-in-value": request("GET", "/v1/models", None, [("X-A", "\xff\xfe\x80")]),
    "no-host": (
        b"GET /v1/models HTTP/1.1\r\nAuthorization: Bearer sk-probe-8b6a72e2322f2fb5\r\n\r\n"
    ),
    "two-hosts": request("GET", "/v1/models", None, [("Host", "evil.example")]),
    "te-with-ows": request(
        headers=[("Transfer-Encoding", " chunked")], length=False, body=b"0\r\n\r\n"
    ),
    "chunk-extension-and-trailer": request(
        headers=[("Transfer-Encoding", "chunked")],
        length=False,
        body=b'%x;ext="v"\r\n%s\r\n0\r\nX-Trailer: 1\r\n\r\n' % (len(CHAT), CHAT),
    ),
    "content-length-leading-zeros": request(
        headers=[("Content-Length", f"000{len(CHAT)}")], length=False
    ),
    "request-id-10kb": request(headers=[("X-Request-Id", "r" * 10_240)]),
    "sluice-group-not-operator": request(headers=[("X-Sluice-Group", "nope")]),
    "query-nul-and-ff": request("GET", "/v1/models?%00=%ff", None),
    "get-with-body": request("GET", "/v1/models", CHAT),
    "http10-keep-alive": request(headers=[("Connection", "keep-alive")]).replace(
        b"HTTP/1.1", b"HTTP/1.0", 1
    ),
}
"""Odd but legal (or harmlessly ignorable) requests: any answer below 500 but 101 (nothing
is upgraded), or a clean close."""


@pytest.mark.parametrize("raw", list(MALFORMED.values()), ids=list(MALFORMED))
def test_malformed_http(gateway: tuple[str, int], raw: bytes) -> None:
    refused(probe(gateway, raw))


@pytest.mark.parametrize("raw", list(TOLERATED.values()), ids=list(TOLERATED))
def test_odd_but_legal_http(gateway: tuple[str, int], raw: bytes) -> None:
    out = probe(gateway, raw)
    assert not out.hung, "the gateway neither answered nor closed"
    if out.answers:
        assert out.first.status < 500 and out.first.status != 101, out.first
        if out.first.status >= 400:
            out.first.error()
    else:
        assert out.closed


def _nested(depth: int) -> bytes:
    return b'{"model": "m-chat", "x": ' + b"[" * depth + b"]" * depth + b"}"


BODIES: dict[str, bytes] = {
    "empty": b"",
    "not-json": b"hello",
    "truncated-json": CHAT[:-5],
    "invalid-utf8": b'{"model": "\xff\xfe\xc3\x28", "messages": []}',
    "utf8-bom": b"\xef\xbb\xbf" + CHAT,
    "lone-surrogate-escape": b'{"model": "\\ud800", "messages": []}',
    "nul-in-json": b'{"model": "m-chat\x00", "messages": []}',
    "array": b"[1, 2, 3]",
    "string": b'"m-chat"',
    "null": b"null",
    "number": b"1e999",
    "nan": b'{"model": "m-chat", "max_tokens": NaN}',
    "model-not-string": b'{"model": ["m-chat"], "messages": []}',
    "model-empty": b'{"model": "", "messages": []}',
    "model-10kb": json.dumps({"model": "m" * 10_240, "messages": []}).encode(),
    "model-unknown": b'{"model": "no-such-model", "messages": []}',
    "duplicate-model": b'{"model": "m-chat", "model": "m-chat", "messages": []}',
    "nested-1500": _nested(1500),
    "nested-100000": _nested(100_000),
    "huge-number": b'{"model": "m-chat", "max_tokens": 1' + b"0" * 5000 + b"}",
}
"""Bodies the gateway must refuse (with the tenant's key): 4xx or a clean close."""
NESTED = {"nested-1500", "nested-100000"}


@pytest.mark.parametrize(("name", "body"), list(BODIES.items()), ids=list(BODIES))
def test_hostile_bodies(gateway: tuple[str, int], name: str, body: bytes) -> None:
    out = probe(gateway, request(body=body))
    if name in NESTED:
        refused(out, 400)
        assert out.first.error()["code"] == "json_too_deep"
    else:
        refused(out)


def test_oversized_head_is_431(gateway: tuple[str, int]) -> None:
    out = probe(gateway, request(headers=[("X-Big", "a" * (1 << 20))]))
    refused(out, 431)


def test_too_many_headers_is_431(gateway: tuple[str, int]) -> None:
    out = probe(gateway, request(headers=[(f"X-H{i}", "v") for i in range(5000)]))
    refused(out, 431)


def test_long_url_is_414(gateway: tuple[str, int]) -> None:
    out = probe(gateway, request(path="/v1/chat/completions?q=" + "a" * 100_000))
    refused(out, 414)


def test_body_over_the_limit_is_413(gateway: tuple[str, int]) -> None:
    """Declared (Content-Length over max_body_bytes, refused before the body) and sent
    (chunked, no length up front)."""
    declared = request(headers=[("Content-Length", str(64 << 20))], length=False, body=b"")
    refused(probe(gateway, declared), 413)
    chunk = b"{" + b" " * ((1 << 20) - 2) + b"}"
    framed = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(9)) + b"0\r\n\r\n"
    chunked = request(headers=[("Transfer-Encoding", "chunked")], length=False, body=framed)
    refused(probe(gateway, chunked), 413)


def test_body_far_longer_than_declared(gateway: tuple[str, int]) -> None:
    """Content-Length 10, then 64 KiB: the first 10 bytes are the body (not JSON: 400), the
    rest is not a request (400 and close), and nothing answers 5xx."""
    raw = request(body=CHAT[:10], extra=b"x" * 65536)
    out = probe(gateway, raw, answers=2)
    refused(out, 400)
    assert all(400 <= a.status < 500 for a in out.answers), [a.status for a in out.answers]


def test_pipelined_requests_are_answered_in_order(gateway: tuple[str, int]) -> None:
    raw = request() + request("GET", "/v1/models", None) + request()
    out = probe(gateway, raw, answers=3)
    assert [a.status for a in out.answers] == [200, 200, 200], [a.body[:200] for a in out.answers]
    assert json.loads(out.answers[1].body)["data"]


def test_a_bad_request_in_a_pipeline_stops_it_there(gateway: tuple[str, int]) -> None:
    raw = request() + b"NOT HTTP AT ALL\r\n\r\n" + request()
    out = probe(gateway, raw, answers=3)
    assert not out.hung
    statuses = [a.status for a in out.answers]
    assert statuses[:1] == [200], statuses
    assert len(statuses) == 2 and 400 <= statuses[1] < 500, statuses
    assert out.closed
    out.answers[1].error()


def test_many_pipelined_requests(gateway: tuple[str, int]) -> None:
    raw = request("GET", "/v1/models", None) * 200
    out = probe(gateway, raw, answers=200)
    assert [a.status for a in out.answers] == [200] * 200


def test_an_unfinished_head_is_408(gateway: tuple[str, int]) -> None:
    """A head sent a byte at a time, then abandoned: 408 once header_timeout_s (2 s here)
    has passed since its first byte, then the close."""
    with socket.create_connection(gateway, timeout=TIMEOUT_S) as sock:
        for b in b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n":
            sock.sendall(bytes([b]))
        start = time.monotonic()
        answer = _read_answer(bytearray(), sock)
        assert answer is not None and answer.status == 408, answer
        assert answer.error()["code"] == "request_timeout"
        assert time.monotonic() - start < 5
        assert sock.recv(1) == b""


def test_a_body_shorter_than_declared_is_408(gateway: tuple[str, int]) -> None:
    """Content-Length 1000, then 10 bytes and silence: 408 after body_timeout_s (2 s here)."""
    out = probe(gateway, request(headers=[("Content-Length", "1000")], length=False, body=b"{"))
    refused(out, 408)


def test_silence_after_connecting_is_closed(gateway: tuple[str, int]) -> None:
    """Not one byte sent: closed after header_timeout_s, with nothing said."""
    with socket.create_connection(gateway, timeout=TIMEOUT_S) as sock:
        assert sock.recv(1) == b""


def test_still_serving_after_the_probes(gateway: tuple[str, int]) -> None:
    """(pytest-randomly may run this first; the fixture checks it again at the end.)"""
    for _ in range(3):
        out = probe(gateway, request())
        assert out.first.status == 200, out.first.body[:300]
        time.sleep(0.05)
