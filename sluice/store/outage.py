"""Which database errors mean "the state store cannot be reached or written" (an outage to
report on one line and retry), as opposed to a bug (a traceback); and that line.

PostgreSQL away (refused, reset, shut down, timed out, out of pool connections), a server
that turned read-only or whose disk filled, and SQLite's locked, read-only, full or failing
file all read as `StoreUnavailable`, naming the store without its password. The store itself
raises them as they come; the edges (the control API, the CLI, the loops that restart a
task) ask here what they mean.
"""

from __future__ import annotations

import re
import sqlite3

from sqlalchemy import exc as sa_exc

from sluice.core import StoreUnavailable

__all__ = ["outage_reason", "store_unavailable"]

_REASON_CHARS = 200
_BACKGROUND = re.compile(r"\s*\(Background on this error at: [^)]*\)")
_NOT_WRITABLE_SQLSTATES = frozenset(
    {
        "25006",  # read_only_sql_transaction: a hot standby, or default_transaction_read_only
        "53100",  # disk_full
        "53200",  # out_of_memory
        "53300",  # too_many_connections
    }
)


def outage_reason(exc: BaseException) -> str | None:
    """The driver's short reason ("connection refused ...", "database is locked") when
    `exc`, or an error it was raised from, says the store cannot be reached or written;
    None for any other error (a bug, a constraint, bad SQL)."""
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 4:
        if isinstance(current, StoreUnavailable):
            return str(current.detail.get("reason") or current.message)
        if _is_outage(current):
            return _short(current)
        current = current.__cause__
        seen += 1
    return None


def store_unavailable(exc: BaseException, store: str | None = None) -> StoreUnavailable | None:
    """`exc` as the `StoreUnavailable` to answer or print, naming `store` (where the state
    lives, without its password: `Store.location`) if given, or None if `exc` is no
    outage."""
    if isinstance(exc, StoreUnavailable):
        return exc
    reason = outage_reason(exc)
    if reason is None:
        return None
    text = reason.lower()
    if "readonly" in text or "read-only" in text or "read only" in text:
        what = "does not take writes (read-only)"
    elif "disk is full" in text or "disk full" in text or "no space" in text:
        what = "does not take writes (disk full)"
    elif "locked" in text or "busy" in text:
        what = "is busy (locked)"
    else:
        what = "does not answer"
    named = f"the state store ({store})" if store else "the state store"
    return StoreUnavailable(
        f"{named} {what}: {reason}; the data plane keeps serving; retry shortly",
        store=store,
        problem=what,
        reason=reason,
    )


def _is_outage(exc: BaseException) -> bool:
    if isinstance(exc, sa_exc.OperationalError | sa_exc.InterfaceError | sa_exc.TimeoutError):
        return True  # TimeoutError: every pooled connection is stuck on a server gone quiet
    if isinstance(exc, sa_exc.DBAPIError):
        if exc.connection_invalidated:
            return True
        return getattr(exc.orig, "sqlstate", None) in _NOT_WRITABLE_SQLSTATES
    if isinstance(exc, sqlite3.OperationalError):
        return True
    return _is_psycopg_outage(exc)


def _is_psycopg_outage(exc: BaseException) -> bool:
    """A psycopg error that SQLAlchemy did not wrap (raised by a pool's ping, say)."""
    module = type(exc).__module__
    if not module.startswith("psycopg"):
        return False
    import psycopg  # loaded already: it raised `exc`

    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return True
    return getattr(exc, "sqlstate", None) in _NOT_WRITABLE_SQLSTATES


def _short(exc: BaseException) -> str:
    """The driver's message on one line, without SQLAlchemy's statement and link."""
    text = str(getattr(exc, "orig", None) or exc)
    text = _BACKGROUND.sub("", text)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = lines[0] if lines else type(exc).__name__
    if len(first) > _REASON_CHARS:
        first = first[: _REASON_CHARS - 1] + "…"
    return first
