"""One JSON line per request (R4): the gateway's record of who asked for what and how it went.

This runs once per request, so lines are rendered from a template (about twice as fast as
`json.dumps` for this fixed shape) and flushed at most every `FLUSH_INTERVAL_S`, not per line:
a flush is a system call, and losing the last fraction of a second of log on a crash is fine.
"""

from __future__ import annotations

import asyncio
import time
from json.encoder import encode_basestring_ascii as _quote
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from sluice.gateway.exchange import Exchange

__all__ = ["FLUSH_INTERVAL_S", "AccessLog"]

FLUSH_INTERVAL_S = 0.1

_LINE = (
    '{"ts":%.6f,"request_id":%s,"method":%s,"path":%s,"status":%d,"latency_ms":%.3f,'
    '"tenant":%s,"model":%s,"route":%s,"group":%s,"instance":%s,"retried":%s,"error":%s,'
    '"bytes_out":%d}\n'
)


def _opt(value: str | None) -> str:
    return "null" if value is None else _quote(value)


class AccessLog:
    """Writes finished exchanges as JSON lines to a text stream."""

    __slots__ = ("_flush_pending", "_stream")

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._flush_pending = False

    def record(self, ex: Exchange) -> None:
        """Log `ex` as it ends; latency runs from its first parsed byte until now."""
        latency = time.perf_counter() - ex.t0
        self._stream.write(
            _LINE
            % (
                time.time() - latency,
                _quote(ex.request_id.decode("latin-1")),
                _quote(ex.method.decode("latin-1")),
                _quote(ex.url.partition(b"?")[0].decode("latin-1")),
                ex.status,
                latency * 1000.0,
                _opt(ex.tenant),
                _opt(ex.model),
                _opt(ex.route),
                _opt(ex.group),
                _opt(ex.instance),
                "true" if ex.retried else "false",
                _opt(ex.error_code),
                ex.bytes_out,
            )
        )
        if not self._flush_pending:
            self._flush_pending = True
            asyncio.get_running_loop().call_later(FLUSH_INTERVAL_S, self.flush)

    def flush(self) -> None:
        self._flush_pending = False
        self._stream.flush()
