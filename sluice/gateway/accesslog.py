"""One JSON line per request (R4): the gateway's record of who asked for what and how it went.

This runs once per request, so lines are rendered from a template (about twice as fast as
`json.dumps` for this fixed shape) and flushed at most every `FLUSH_INTERVAL_S`, not per line:
a flush is a system call, and losing the last fraction of a second of log on a crash is fine.
Floats cost most to render, so `ts` (when the request started, Unix seconds) has millisecond
precision and is rendered once per millisecond, `latency_ms` strings are kept per
microsecond value, and `queue_ms` is rendered only when not 0.

A file's lines are kept here and written with one `os.write` per flush, so that a write
the disk refuses (ENOSPC, EIO) costs exactly the lines it lost: they are counted
(`dropped`, exported as `sluice_gateway_access_log_dropped_lines_total` once `register`ed)
and said on one log line, then at most once per `REPEAT_LOG_S`, and once more when writes go
through again; requests are never failed for it. A line cut by a partial write is ended
before the next one, so every other line stays one JSON document. A stream with no file
descriptor (an `io.StringIO`) is written line by line, as it comes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from json.encoder import encode_basestring_ascii as _quote
from typing import TYPE_CHECKING, Final, TextIO

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from sluice.policy.route_choice import ExchangeRecord

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

__all__ = ["FLUSH_INTERVAL_S", "REPEAT_LOG_S", "AccessLog"]

log = logging.getLogger(__name__)

FLUSH_INTERVAL_S: Final = 0.1
REPEAT_LOG_S: Final = 60.0
"""While writes keep failing, one log line a minute at most (with the count of lines lost)."""

_HEAD: Final = '"method":%s,"path":%s,"status":%d,"latency_ms":'
_WHERE: Final = (
    ',"tenant":%s,"model":%s,"priority":%s,"route":%s,"group":%s,"instance":%s,"via":%s,'
    '"mirror":%s,"retried":%s,"error":%s,"bytes_out":'
)
_MEMO_MAX: Final = 4096  # entries; cleared when full (values may be caller-chosen garbage)

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

    __slots__ = (
        "_failing",
        "_fd",
        "_fixed",
        "_flush_timer",
        "_latency",
        "_monotonic",
        "_pending",
        "_stream",
        "_torn",
        "_ts",
        "_ts_ms",
        "dropped",
        "write_errors",
    )

    def __init__(self, stream: TextIO, monotonic: Callable[[], float] = time.monotonic) -> None:
        """`monotonic`: the clock the failure reports are spaced by."""
        self._stream = stream
        self._fd = _fd_of(stream)
        self._pending: list[str] = []  # lines of a file stream not written yet
        self._torn = False  # a partial write left a line without its end
        self._flush_timer: asyncio.TimerHandle | None = None
        self._ts_ms = -1  # `perf_counter()` ms `_ts` renders: many requests start in the same
        self._ts = ""
        self._latency: dict[int, str] = {}  # microseconds -> "1.234" (milliseconds)
        self._fixed: dict[_Fixed, tuple[str, str]] = {}  # -> the text around latency_ms
        self._monotonic = monotonic
        self._failing: _Failing | None = None
        self.dropped = 0
        """Lines lost ever: a write refused them (a full disk, an I/O error)."""
        self.write_errors = 0
        """Writes refused ever (each may have lost several lines)."""

    def record(self, rec: ExchangeRecord) -> None:
        """Log one finished exchange (see `ExchangeRecord` for what each field means)."""
        key: _Fixed = rec[:13]  # (`FIXED_FIELDS`, spelt out for the type checker)
        # The rest unpacked in one step, in field order: `rec.name` is a descriptor call each.
        (_, _, _, _, _, _, _, _, _, _,
         _, _, _, request_id, t0, queue_ms_f, latency, _, bytes_out, _) = rec  # fmt: skip
        fixed = self._fixed.get(key)
        if fixed is None:
            fixed = self._render_fixed(key)
        head, where = fixed
        start_ms = int(t0 * 1000.0)
        if start_ms != self._ts_ms:
            self._ts_ms = start_ms
            wall_ms = int((time.time() - latency) * 1000.0)
            self._ts = f"{wall_ms // 1000}.{wall_ms % 1000:03d}"
        latency_us = int(latency * 1e6)
        latency_ms = self._latency.get(latency_us)
        if latency_ms is None:
            latency_ms = self._render_latency(latency_us)
        queue_ms = f"{queue_ms_f:.3f}" if queue_ms_f else "0.0"
        # Keys, in order: ts, request_id, method, path, status, latency_ms, queue_ms, tenant,
        # model, priority, route, group, instance, via, mirror, retried, error, bytes_out.
        # (An f-string: a third cheaper than the same line formatted with `%`.)
        line = (
            f'{{"ts":{self._ts},"request_id":{_quote(request_id.decode("latin-1"))},'
            f'{head}{latency_ms},"queue_ms":{queue_ms}{where}{bytes_out}}}\n'
        )
        if self._fd is not None:
            self._pending.append(line)
        else:
            try:
                self._stream.write(line)
            except OSError as exc:
                self._refused(exc, 1)
            else:
                if self._failing is not None:
                    self._back()
        if self._flush_timer is None:
            self._flush_timer = asyncio.get_running_loop().call_later(FLUSH_INTERVAL_S, self.flush)

    def _render_latency(self, us: int) -> str:
        text = f"{us // 1000}.{us % 1000:03d}"
        if len(self._latency) >= _MEMO_MAX:  # 4 ms of distinct microseconds, ~0.5 MB; at
            # 20,000 it still grew after a 10-minute soak (1.2 MB, of ~2.7 MB when full)
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
        self._fd, self._torn = _fd_of(stream), False
        return old

    def flush(self) -> None:
        """Write out buffered lines; also cancels a pending timed flush (the gateway calls
        this on stop, so no timer fires after the caller closed the stream). Never raises
        for a write the system refuses: the lines are counted as dropped (see the module)."""
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        if self._fd is None:
            try:
                self._stream.flush()
            except OSError as exc:
                self._refused(exc, 0)
        elif self._pending:
            text = "".join(self._pending)
            lines = len(self._pending)
            self._pending.clear()
            if self._write(text.encode("utf-8"), lines) and self._failing is not None:
                self._back()

    def register(self, registry: CollectorRegistry) -> None:
        """Export `dropped` and `write_errors` with the gateway's metrics (`registry`)."""
        registry.register(_Counters(self))

    def _write(self, data: bytes, lines: int) -> bool:
        """Write `data` (`lines` whole lines) to the file; False if the system refused some,
        which are then counted and said."""
        assert self._fd is not None
        if self._stream.closed:  # its descriptor may be another file's by now
            self._refused(OSError("the access log was closed"), lines)
            return False
        if self._torn:
            data = b"\n" + data  # end the line a partial write cut, on its own line
        view = memoryview(data)
        written = 0
        try:
            while written < len(data):
                written += os.write(self._fd, view[written:])
        except OSError as exc:
            start = 1 if self._torn else 0  # the "\n" that ends a cut line is no line
            whole = data.count(b"\n", start, written) if written > start else 0
            if written > start:  # else: as it was (a cut line is still open)
                self._torn = data[written - 1] != 0x0A
            self._refused(exc, lines - whole)
            return False
        self._torn = False
        return True

    def _refused(self, exc: OSError, lines: int) -> None:
        """Count `lines` lost to `exc`; say so on one line, then once per REPEAT_LOG_S."""
        now = self._monotonic()
        self.dropped += lines
        self.write_errors += 1
        why = exc.strerror or str(exc)
        failing = self._failing
        if failing is None:
            self._failing = _Failing(now, self.dropped - lines)
            log.error(
                "access log %s cannot be written (%s): %d line(s) lost; lines are dropped "
                "and counted (sluice_gateway_access_log_dropped_lines_total) until it can: "
                "free space on its disk. Requests are served as usual",
                self._name,
                why,
                lines,
            )
        elif now - failing.said_at >= REPEAT_LOG_S:
            failing.said_at = now
            log.warning(
                "access log %s still cannot be written (%s): %d line(s) lost in %.0f s",
                self._name,
                why,
                self.dropped - failing.dropped_before,
                now - failing.since,
            )

    def _back(self) -> None:
        failing, self._failing = self._failing, None
        assert failing is not None
        log.warning(
            "access log %s is written again after %.0f s; %d line(s) were lost meanwhile",
            self._name,
            self._monotonic() - failing.since,
            self.dropped - failing.dropped_before,
        )

    @property
    def _name(self) -> str:
        return str(getattr(self._stream, "name", "(stream)"))


class _Failing:
    """Since when writes fail, when that was last said, and `dropped` before it began."""

    __slots__ = ("dropped_before", "said_at", "since")

    def __init__(self, since: float, dropped_before: int) -> None:
        self.since = self.said_at = since
        self.dropped_before = dropped_before


class _Counters(Collector):
    def __init__(self, access_log: AccessLog) -> None:
        self._log = access_log

    def collect(self) -> Iterator[Metric]:
        dropped = CounterMetricFamily(
            "sluice_gateway_access_log_dropped_lines",
            "Access-log lines lost because the system refused the write (a full disk, an "
            "I/O error); the requests themselves were served.",
            value=self._log.dropped,
        )
        errors = CounterMetricFamily(
            "sluice_gateway_access_log_write_errors",
            "Access-log writes the system refused (each may have lost several lines).",
            value=self._log.write_errors,
        )
        yield from (dropped, errors)


def _fd_of(stream: TextIO) -> int | None:
    """The file descriptor to write `stream`'s lines to, with whatever it buffered written
    out first; None for a stream that has none (then it is written through its own API)."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        return None
    with contextlib.suppress(OSError, ValueError):
        stream.flush()
    return fd
