"""`sluice up` and `sluice controller`: the commands that run a control plane (the second
without a gateway of its own). They hold the state directory before the heavy imports, so a
second one on the same directory is refused at once; `sluice.cli.up` is the process."""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
import uvloop

from sluice.cli.common import (
    ControlOpt,
    HomeOpt,
    JsonOpt,
    ReasonOpt,
    client_for,
    out,
    print_error,
    run,
)
from sluice.config import Settings
from sluice.core import SluiceError
from sluice.spec import load_spec_file

__all__ = ["controller", "down", "up"]

SpecFileOpt = Annotated[Path | None, typer.Option("-f", "--file", help="spec YAML")]
FileReasonOpt = Annotated[
    str | None,
    typer.Option(help="apply a FILE that differs from the live revision, saying why"),
]
InsecureOpt = Annotated[
    bool, typer.Option("--insecure", help="allow a non-loopback control API without TLS")
]
LogLevelOpt = Annotated[str, typer.Option(help="debug, info, warning")]
HealthPortOpt = Annotated[
    int | None,
    typer.Option(
        help="serve GET /livez (the process runs) and /readyz (it leads and serves) over "
        "plain HTTP on this port, for an orchestrator's probes; answered by standbys too"
    ),
]
HealthHostOpt = Annotated[str, typer.Option(help="address of the health port")]
ControlPortOpt = Annotated[
    int | None,
    typer.Option(
        "--control-port",
        envvar="SLUICE_CONTROL_PORT",
        min=0,
        max=65535,
        help="control API and console port (overrides the spec's control.port; 0: any free "
        "one). Unset, with no control.port, the first free port picked is remembered in the "
        "state directory and kept across restarts",
        show_default=False,
    ),
]

STOPPING = """Stopping: SIGTERM hands over (the lease is released at once and every instance
keeps running for the next leader: a standby, or the next start, adopts them); Ctrl-C
(SIGINT) and `sluice down` stop every instance too."""


def up(
    file: SpecFileOpt = None,
    reason: FileReasonOpt = None,
    port: Annotated[int | None, typer.Option(help="gateway port (overrides spec)")] = None,
    insecure: InsecureOpt = False,
    home: HomeOpt = None,
    log_level: LogLevelOpt = "info",
    health_port: HealthPortOpt = None,
    health_host: HealthHostOpt = "127.0.0.1",
    control_port: ControlPortOpt = None,
) -> None:
    """Run controller, gateway and control API in one process until stopped.

    `up -f FILE` seeds an empty state directory with FILE. After that the store holds the
    spec: `up` (with or without -f) runs the live revision and says so if FILE differs;
    `sluice apply` changes it, or `up -f FILE --reason WHY` applies FILE as the next
    revision."""
    args = UpArgs(
        reason=reason,
        port=port,
        insecure=insecure,
        health_port=health_port,
        health_host=health_host,
        control_port=control_port,
    )
    _serve(home, log_level, file, args)


up.__doc__ = f"{up.__doc__}\n\n{STOPPING}"


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
    health_port: HealthPortOpt = None,
    health_host: HealthHostOpt = "127.0.0.1",
    control_port: ControlPortOpt = None,
) -> None:
    """Run the controller and control API without a gateway, until stopped: the data plane
    is `sluice gateway --control URL` processes (any number, on any host) that sync with it.

    On a shared database (`SLUICE_DATABASE_URL`) one controller leads, the others wait as
    standbys. FILE is as for `sluice up`: it seeds an empty store, never reverts a live
    revision (a standby started with -f runs what is live when it takes over)."""
    args = UpArgs(
        reason=reason,
        insecure=insecure,
        gateway=False,
        endpoint=endpoint,
        health_port=health_port,
        health_host=health_host,
        control_port=control_port,
    )
    _serve(home, log_level, file, args)


controller.__doc__ = f"{controller.__doc__}\n\n{STOPPING}"


@dataclass(frozen=True, slots=True)
class UpArgs:
    """What `up` and `controller` were asked besides the spec file (`UpOptions` less the
    loaded spec: the heavy control-plane imports wait until the state dir is held)."""

    reason: str | None = None
    port: int | None = None
    insecure: bool = False
    gateway: bool = True
    endpoint: str | None = None
    health_port: int | None = None
    health_host: str = "127.0.0.1"
    control_port: int | None = None


def down(
    reason: ReasonOpt,
    wait: Annotated[float, typer.Option(help="seconds to wait for it to stop (0: no wait)")] = 300,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    control: ControlOpt = None,
) -> None:
    """Stop every instance and the control plane that leads (what Ctrl-C on `sluice up`
    does), audited; waits until its control API is gone. A standby on the same store would
    take over and start the fleet again: stop standbys first (a SIGTERM hands over)."""

    def do() -> dict[str, Any]:
        client = client_for(home, control)[1]
        answer = dict(client.post("/v1/control/stop", {"reason": reason}))
        deadline = time.monotonic() + wait
        answer["stopped"] = False
        while time.monotonic() < deadline:
            try:
                client.get("/healthz")
            except SluiceError:  # it no longer answers: drained and gone
                answer["stopped"] = True
                break
            time.sleep(0.5)
        return answer

    def render(r: dict[str, Any]) -> None:
        n = r["instances"]
        if r["stopped"]:
            out.print(f"stopped: the control plane and its {n} instance(s)")
        else:
            out.print(f"stopping: the control plane and its {n} instance(s) (still draining)")

    run(as_json, do, render)


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
    except Exception as exc:  # the store failing at start: one line, exit 7
        from sluice.store import store_unavailable
        from sluice.store.store import redacted

        where = redacted(settings.database_url) if settings.database_url else str(settings.home)
        outage = store_unavailable(exc, where)
        if outage is None:
            raise
        print_error(outage)
        raise typer.Exit(outage.exit_code) from None
