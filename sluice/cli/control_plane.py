"""`sluice up` and `sluice controller`: the commands that run a control plane (the second
without a gateway of its own). They hold the state directory before the heavy imports, so a
second one on the same directory is refused at once; `sluice.cli.up` is the process."""

from __future__ import annotations

import logging
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated

import typer
import uvloop

from sluice.cli.common import HomeOpt, print_error
from sluice.config import Settings
from sluice.core import SluiceError
from sluice.spec import load_spec_file

__all__ = ["controller", "up"]

SpecFileOpt = Annotated[Path | None, typer.Option("-f", "--file", help="spec YAML")]
FileReasonOpt = Annotated[
    str | None,
    typer.Option(help="apply a FILE that differs from the live revision, saying why"),
]
InsecureOpt = Annotated[
    bool, typer.Option("--insecure", help="allow a non-loopback control API without TLS")
]
LogLevelOpt = Annotated[str, typer.Option(help="debug, info, warning")]


def up(
    file: SpecFileOpt = None,
    reason: FileReasonOpt = None,
    port: Annotated[int | None, typer.Option(help="gateway port (overrides spec)")] = None,
    insecure: InsecureOpt = False,
    home: HomeOpt = None,
    log_level: LogLevelOpt = "info",
) -> None:
    """Run controller, gateway and control API in one process until Ctrl-C.

    `up -f FILE` starts from FILE on an empty state directory; later, FILE must match the
    live revision or come with --reason (it then becomes a new revision). `up` alone
    resumes the live revision."""
    _serve(home, log_level, file, UpArgs(reason=reason, port=port, insecure=insecure))


def controller(
    file: SpecFileOpt = None,
    reason: FileReasonOpt = None,
    endpoint: Annotated[
        str | None,
        typer.Option(
            help="where clients reach the gateways, e.g. the load balancer's URL (drills "
            "send their load there; default: the spec's gateway address)"
        ),
    ] = None,
    insecure: InsecureOpt = False,
    home: HomeOpt = None,
    log_level: LogLevelOpt = "info",
) -> None:
    """Run the controller and control API without a gateway, until Ctrl-C: the data plane
    is `sluice gateway --control URL` processes (any number, on any host) that sync with it.

    On a shared database (`SLUICE_DATABASE_URL`) one controller leads, the others wait as
    standbys. FILE is as for `sluice up`."""
    args = UpArgs(reason=reason, insecure=insecure, gateway=False, endpoint=endpoint)
    _serve(home, log_level, file, args)


@dataclass(frozen=True, slots=True)
class UpArgs:
    """What `up` and `controller` were asked besides the spec file (`UpOptions` less the
    loaded spec: the heavy control-plane imports wait until the state dir is held)."""

    reason: str | None = None
    port: int | None = None
    insecure: bool = False
    gateway: bool = True
    endpoint: str | None = None


def _serve(home: str | None, log_level: str, file: Path | None, args: UpArgs) -> None:
    from sluice.cli.statedir import hold_state_dir

    logging.basicConfig(
        level=log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for chatty in ("httpx", "alembic"):  # per-probe and per-migration lines drown the events
        logging.getLogger(chatty).setLevel(logging.WARNING)
    settings = Settings.from_env(home)
    try:
        loaded = load_spec_file(file) if file is not None else None
        # Held before the heavy imports: a second `up` on this directory is refused at once.
        with hold_state_dir(settings.home, settings.control_file):
            from sluice.cli.up import UpOptions, serve

            options = UpOptions(loaded=loaded, **asdict(args))
            uvloop.run(serve(settings, options))
    except SluiceError as exc:
        print_error(exc)
        raise typer.Exit(exc.exit_code) from None
