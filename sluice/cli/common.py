"""What every `sluice` command shares: the consoles, the common options, and how a command's
result or error is printed (--json: exactly one JSON document; errors: their exit code)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from sluice.cli.client import ControlClient
from sluice.config import Settings
from sluice.core import SluiceError, SpecError
from sluice.spec import load_spec_file

__all__ = [
    "ControlOpt",
    "FileOpt",
    "HomeOpt",
    "JsonOpt",
    "ReasonOpt",
    "client_for",
    "err",
    "out",
    "post_as_actor",
    "post_spec",
    "print_error",
    "run",
    "ts",
]

out = Console()
err = Console(stderr=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON document")]
HomeOpt = Annotated[str | None, typer.Option("--home", help="state directory ($SLUICE_HOME)")]
ControlOpt = Annotated[str | None, typer.Option("--control", help="control API URL")]
FileOpt = Annotated[Path, typer.Option("-f", "--file", help="spec YAML")]
ReasonOpt = Annotated[str, typer.Option("--reason", help="why; recorded in the audit log")]


def run(as_json: bool, fn: Callable[[], Any], render: Callable[[Any], None]) -> None:
    """Run a command; print its result as JSON or via `render`; map errors to exit codes."""
    try:
        result = fn()
    except SluiceError as exc:
        if as_json:
            print(json.dumps(exc.to_json()))
        else:
            print_error(exc)
        raise typer.Exit(exc.exit_code) from None
    if as_json:
        print(json.dumps(result, default=str))
    else:
        render(result)


def print_error(exc: SluiceError) -> None:
    """One line per problem, never wrapped: `file:line: field: message` must stay greppable."""
    if isinstance(exc, SpecError):
        err.print(f"[red]error:[/red] the spec has {len(exc.issues)} problem(s):")
        for issue in exc.issues:
            err.print(f"  {issue}", markup=False, highlight=False, soft_wrap=True)
    else:
        err.print(f"[red]error:[/red] {exc.message}", highlight=False, soft_wrap=True)


def client_for(home: str | None, control: str | None) -> tuple[Settings, ControlClient]:
    settings = Settings.from_env(home, control)
    return settings, ControlClient(settings)


def post_as_actor(
    home: str | None, control: str | None, path: str, body: dict[str, Any], field: str = "actor"
) -> Any:
    """POST a change to the control API, signed with who makes it (for the audit log)."""
    settings, client = client_for(home, control)
    return client.post(path, {**body, field: settings.actor})


def post_spec(home: str | None, control: str | None, path: str, file: Path, reason: str) -> Any:
    """POST a spec file (validated here first, so its errors name file:line) as its author."""
    loaded = load_spec_file(file)
    body = {"yaml": loaded.text, "source": str(file), "reason": reason}
    return post_as_actor(home, control, path, body, field="author")


def ts(t: float | None) -> str:
    return "-" if t is None else datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")
