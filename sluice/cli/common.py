"""What every `sluice` command shares: the consoles, the common options, and how a command's
result or error is printed (--json: exactly one JSON document; errors: one line and their
exit code, listed in the README: 1 internal, 2 invalid spec, 3 conflict, 4 not found, 5
unauthorized or forbidden, 6 unavailable (the control API does not answer), 7 the state
store does not answer or take writes); a command whose report carries a verdict prints it
and exits by it (`sluice.core.verdicts`: 8 failed, 9 inconclusive). A store that fails under
a command that reads it directly is an error too, not a traceback."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from sluice.cli.client import ControlClient
from sluice.cli.terminal import FittedConsole
from sluice.config import Settings
from sluice.core import SluiceError, SpecError, SpecIssue, StoreUnavailable
from sluice.spec import load_spec_file

if TYPE_CHECKING:
    from sluice.store import Store

__all__ = [
    "ControlOpt",
    "FileOpt",
    "HomeOpt",
    "JsonOpt",
    "ReasonOpt",
    "client_for",
    "duration_s",
    "err",
    "gateway_endpoint",
    "out",
    "point_in_time",
    "post",
    "post_spec",
    "print_error",
    "run",
    "set_token",
    "state_store",
    "ts",
]

out = FittedConsole()
err = FittedConsole(stderr=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON document")]
HomeOpt = Annotated[str | None, typer.Option("--home", help="state directory ($SLUICE_HOME)")]
ControlOpt = Annotated[str | None, typer.Option("--control", help="control API URL")]
FileOpt = Annotated[Path, typer.Option("-f", "--file", help="spec YAML")]
ReasonOpt = Annotated[str, typer.Option("--reason", help="why; recorded in the audit log")]


def run(
    as_json: bool,
    fn: Callable[[], Any],
    render: Callable[[Any], None],
    exit_code: Callable[[Any], int] | None = None,
) -> None:
    """Run a command; print its result as JSON or via `render`; map errors to exit codes.
    `exit_code`: the code the command ends with once its result is printed (a verdict's:
    `sluice.core.verdicts.verdict_exit`)."""
    try:
        result = fn()
    except Exception as exc:
        error = exc if isinstance(exc, SluiceError) else _store_outage(exc)
        if error is None:
            raise  # a bug: its traceback
        if as_json:
            print(json.dumps(error.to_json()))
        else:
            print_error(error)
        raise typer.Exit(error.exit_code) from None
    if as_json:
        print(json.dumps(result, default=str))
    else:
        render(result)
    code = exit_code(result) if exit_code is not None else 0
    if code:
        raise typer.Exit(code)


def print_error(exc: SluiceError) -> None:
    """One line per problem, never wrapped: `file:line: field: message` must stay greppable."""
    if isinstance(exc, SpecError):
        err.print(f"[red]error:[/red] the spec has {len(exc.issues)} problem(s):")
        for issue in exc.issues:
            err.print(f"  {issue}", markup=False, highlight=False, soft_wrap=True)
    else:
        # one line, even when a driver's message (quoted in it) spans several
        message = escape(re.sub(r"\s*\n\s*", " ", exc.message.strip()))
        err.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)


def _store_outage(exc: Exception) -> StoreUnavailable | None:
    """`exc` as a `StoreUnavailable` if it says the state store cannot be reached or written
    (a report reading it as PostgreSQL goes away); None for anything else. SQLAlchemy is
    imported only if it raised `exc`."""
    if not type(exc).__module__.startswith(_DB_MODULES):
        return None
    from sluice.store import store_unavailable

    return store_unavailable(exc)


_DB_MODULES = ("sqlalchemy", "sqlite3", "psycopg")


_token_flag: str | None = None


def set_token(token: str | None) -> None:
    """The global `--token` option (read by every command's client)."""
    global _token_flag
    _token_flag = token


def client_for(home: str | None, control: str | None) -> tuple[Settings, ControlClient]:
    settings = Settings.from_env(home, control, _token_flag)
    return settings, ControlClient(settings)


def post(home: str | None, control: str | None, path: str, body: dict[str, Any]) -> Any:
    """POST a change to the control API; the audit log names the token's holder."""
    return client_for(home, control)[1].post(path, body)


def post_spec(home: str | None, control: str | None, path: str, file: Path, reason: str) -> Any:
    """POST a spec file (validated here first, so its errors name file:line)."""
    loaded = load_spec_file(file)
    return post(home, control, path, {"yaml": loaded.text, "source": str(file), "reason": reason})


def state_store(settings: Settings) -> Store:
    """The one way a command opens the state: `settings.database_url` ($SLUICE_DATABASE_URL,
    e.g. PostgreSQL) if set, else the SQLite file in the state directory; migrated to head.
    A file that cannot be opened or written (a read-only or full state directory) is a
    `StoreUnavailable` naming it. (Imported here, not at the top: other commands need not
    pay for SQLAlchemy.)"""
    from sluice.store import Store, redacted, store_unavailable

    try:
        return Store.for_home(settings.home, settings.database_url)
    except Exception as exc:
        if isinstance(exc, SluiceError):
            raise
        url = settings.database_url
        where = redacted(url) if url else f"sqlite:///{settings.home / 'state.db'}"
        outage = store_unavailable(exc, where)
        if outage is None:
            raise
        raise outage from None


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def gateway_endpoint(home: str | None) -> str | None:
    """The gateway URL a running `sluice up` wrote to control.json, if any."""
    try:
        info = json.loads(Settings.from_env(home).control_file.read_text())
    except (OSError, ValueError):
        return None
    endpoint = info.get("endpoint") if isinstance(info, dict) else None
    return str(endpoint) if endpoint else None


def duration_s(text: str) -> float:
    """`90d`, `12h`, `30m`, `45s`, `2w` -> seconds; a clear error otherwise."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text)
    if match is None or float(match[1]) <= 0:
        raise SpecError(
            [SpecIssue("duration", f"{text!r}: expected a number and a unit, e.g. 90d or 12h")]
        )
    return float(match[1]) * _UNITS[match[2]]


def point_in_time(text: str | None) -> float | None:
    """`2h` / `7d` (that long ago) or an ISO date/time (local time) -> Unix time."""
    if text is None:
        return None
    if text and text[-1] in _UNITS and text[:-1].replace(".", "", 1).isdigit():
        return time.time() - duration_s(text)
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise SpecError(
            [SpecIssue("time", f"{text!r}: expected e.g. 2h, 7d or 2026-12-01T09:00")]
        ) from None


def ts(t: float | None) -> str:
    return "-" if t is None else datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")
