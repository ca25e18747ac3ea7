"""Byte-level HTTP/1.1 building blocks: status lines, header filters, JSON responses.

Everything here is precomputed or joined once, because it runs on every request.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

__all__ = [
    "CHUNK_END",
    "CONTINUE_100",
    "HOP_BY_HOP",
    "REVEALING",
    "STATUS_LINES",
    "json_body",
    "json_response",
    "retry_after",
    "sluice_headers",
    "status_line",
]

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"transfer-encoding",
        b"te",
        b"trailer",
        b"upgrade",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
    }
)
"""Lower-cased header names that describe one hop and are never forwarded (RFC 9110 7.6.1)."""

REVEALING = frozenset(
    {
        b"server",  # uvicorn sends `server: uvicorn`
        b"via",
        b"x-powered-by",
        b"x-aspnet-version",
        b"x-aspnetmvc-version",
        b"x-backend-server",
        b"x-forwarded-server",
        b"x-served-by",
        b"x-server",
        b"x-upstream",
        b"x-upstream-addr",
    }
)
"""Lower-cased response header names that name an instance's software, host or port: never
relayed to clients (nor is any `x-sluice-*` an instance sends; the gateway sets its own). The
gateway sends no `server` of its own either: a fixed one would only tell a prober what it is
talking to. `date` is harmless and passes."""

CHUNK_END = b"0\r\n\r\n"
CONTINUE_100 = b"HTTP/1.1 100 Continue\r\n\r\n"

STATUS_LINES = {s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode()) for s in HTTPStatus}
"""Status lines of the known codes; `status_line()` renders any other."""
_JSON_HEAD = b"content-type: application/json\r\ncontent-length: "
_RETRY_AFTER = {n: b"retry-after: %d\r\n" % n for n in range(1, 61)}
_CLOSE = b"connection: close\r\n"


def status_line(status: int) -> bytes:
    line = STATUS_LINES.get(status)
    return line if line is not None else b"HTTP/1.1 %d Unknown\r\n" % status


def sluice_headers(route: str | None, group: str | None, instance: str | None) -> bytes:
    """`x-sluice-*` lines for what is known about where a request went."""
    lines = [
        b"%s: %s\r\n" % (name, value.encode("latin-1", "replace"))
        for name, value in (
            (b"x-sluice-group", group),
            (b"x-sluice-instance", instance),
            (b"x-sluice-route", route),
        )
        if value is not None
    ]
    return b"".join(lines)


def json_body(payload: Any) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


def retry_after(seconds: int) -> bytes:
    """A `Retry-After` header line for a whole number of seconds (at least 1)."""
    line = _RETRY_AFTER.get(seconds)
    return line if line is not None else b"retry-after: %d\r\n" % max(1, seconds)


def json_response(
    status: int, body: bytes, extra: bytes, keep_alive: bool, retry_after_s: int = 1
) -> bytes:
    """A complete response: status, JSON content headers, `extra` header lines, `body`.

    503 and 429 carry `Retry-After` (`retry_after_s`), so callers know when to come back.
    """
    return b"".join(
        (
            status_line(status),
            _JSON_HEAD,
            b"%d\r\n" % len(body),
            extra,
            retry_after(retry_after_s) if status in (429, 503) else b"",
            b"" if keep_alive else _CLOSE,
            b"\r\n",
            body,
        )
    )
