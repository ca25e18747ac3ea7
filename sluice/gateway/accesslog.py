"""One JSON line per request (R4): the gateway's record of who asked for what and how it went.

This runs once per request, so lines are rendered from a template (about twice as fast as
`json.dumps` for this fixed shape) and flushed at most every `FLUSH_INTERVAL_S`, not per line:
a flush is a system call, and losing the last fraction of a second of log on a crash is fine.
Floats cost most to render, so `ts` (when the request started, Unix seconds) has millisecond
precision and is rendered once per millisecond, `latency_ms` strings are kept per
microsecond value, and `queue_ms` is rendered only when not 0.
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

_HEAD = '"method":%s,"path":%s,"status":%d,"latency_ms":'
_WHERE = (
    ',"tenant":%s,"model":%s,"priority":%s,"route":%s,"group":%s,"instance":%s,"via":%s,'
    '"mirror":%s,"retried":%s,"error":%s,"bytes_out":'
)
_MEMO_MAX = 4096  # entries; cleared when full (values may be caller-chosen garbage)

_Fixed = tuple[
    bytes, bytes, int, str | None, str | None, str | None, str | None, str | None,
    str | None, str | None, str | None, bool, str | None,
]  # fmt: skip


def _opt(value: str | None) -> str:
    return "null" if value is None else _quote(value)


class AccessLog:
    """Writes finished exchanges as JSON lines to a text stream.

    The fields that repeat from request to request (what, who, where, how it ended) are
    rendered once per combination and kept in a small memo, so a line costs one tuple, one
    dict hit and one f-string instead of a dozen quoting calls.
    """

    __slots__ = ("_fixed", "_flush_timer", "_latency", "_stream", "_ts", "_ts_ms")

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._flush_timer: asyncio.TimerHandle | None = None
        self._ts_ms = -1  # `perf_counter()` ms `_ts` renders: many requests start in the same
        self._ts = ""
        self._latency: dict[int, str] = {}  # microseconds -> "1.234" (milliseconds)
        self._fixed: dict[_Fixed, tuple[str, str]] = {}  # -> the text around latency_ms

    def record(self, ex: Exchange, latency: float) -> None:
        """Log `ex` as it ends; `latency`: seconds from its first parsed byte until now.

        `group` is where it was served (after any failover or fallback, which `via` tells);
        `queue_ms` is the time it waited for a slot; `mirror` the group a copy went to.
        """
        key: _Fixed = (
            ex.method,
            ex.url,
            ex.status,
            ex.tenant,
            ex.model,
            ex.priority,
            ex.route,
            ex.group,
            ex.instance,
            ex.via,
            ex.mirror,
            ex.retried,
            ex.error_code,
        )
        fixed = self._fixed.get(key)
        if fixed is None:
            fixed = self._render_fixed(key)
        head, where = fixed
        start_ms = int(ex.t0 * 1000.0)
        if start_ms != self._ts_ms:
            self._ts_ms = start_ms
            wall_ms = int((time.time() - latency) * 1000.0)
            self._ts = f"{wall_ms // 1000}.{wall_ms % 1000:03d}"
        latency_us = int(latency * 1e6)
        latency_ms = self._latency.get(latency_us)
        if latency_ms is None:
            latency_ms = self._render_latency(latency_us)
        queue_ms = f"{ex.queue_ms:.3f}" if ex.queue_ms else "0.0"
        # Keys, in order: ts, request_id, method, path, status, latency_ms, queue_ms, tenant,
        # model, priority, route, group, instance, via, mirror, retried, error, bytes_out.
        # (An f-string: a third cheaper than the same line formatted with `%`.)
        self._stream.write(
            f'{{"ts":{self._ts},"request_id":{_quote(ex.request_id.decode("latin-1"))},'
            f'{head}{latency_ms},"queue_ms":{queue_ms}{where}{ex.bytes_out}}}\n'
        )
        if self._flush_timer is None:
            self._flush_timer = asyncio.get_running_loop().call_later(FLUSH_INTERVAL_S, self.flush)

    def _render_latency(self, us: int) -> str:
        text = f"{us // 1000}.{us % 1000:03d}"
        if len(self._latency) >= 20_000:  # 20 ms of distinct microseconds: plenty for hits
            self._latency.clear()
        self._latency[us] = text
        return text

    def _render_fixed(self, key: _Fixed) -> tuple[str, str]:
        method, url, status, *names, retried, error = key
        path = url.partition(b"?")[0]
        head = _HEAD % (_quote(method.decode("latin-1")), _quote(path.decode("latin-1")), status)
        where = _WHERE % (*(_opt(n) for n in names), "true" if retried else "false", _opt(error))
        if len(self._fixed) >= _MEMO_MAX:
            self._fixed.clear()
        fixed = self._fixed[key] = (head, where)
        return fixed

    def swap(self, stream: TextIO) -> TextIO:
        """Write to `stream` from now on (the log was rotated); returns the old stream,
        flushed, for the caller to close."""
        self.flush()
        old, self._stream = self._stream, stream
        return old

    def flush(self) -> None:
        """Write out buffered lines; also cancels a pending timed flush (the gateway calls
        this on stop, so no timer fires after the caller closed the stream)."""
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        self._stream.flush()
