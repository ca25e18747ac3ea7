"""`sluice gateway`: a data-plane process apart from the controller (issue 21). It serves the
inference endpoint from the routing snapshot it syncs from the control API, and pushes its
counters there; several behind a TCP load balancer share every group's slots.

`--workers N` runs N such processes on one port (SO_REUSEPORT: the kernel spreads the
connections), each its own gateway of the fleet, so the data plane uses every core: each
holds its own share of every instance's slots and of every tenant's rate limit
(`sluice.policy.rate_shares`), so N workers admit what one would, not N times it. This
module is the command; the processes' code is imported when it runs (`gateway_run`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from sluice.cli.common import print_error
from sluice.core import SluiceError, SpecError, SpecIssue

__all__ = ["gateway"]

TOKEN_ENV = "SLUICE_GATEWAY_TOKEN"


def gateway(
    control: Annotated[
        list[str],
        typer.Option(
            "--control",
            help="control API URL; repeat it for each controller (the leader answers)",
        ),
    ],
    token_file: Annotated[
        Path | None,
        typer.Option(help=f"a file holding a gateway token (else ${TOKEN_ENV})"),
    ] = None,
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8080,
    workers: Annotated[int, typer.Option(min=1, max=256, help="gateway processes")] = 1,
    name: Annotated[
        str | None,
        typer.Option(
            "--id",
            help="this gateway's id: the token's name N, or N-SUFFIX "
            "(default: N-HOSTNAME-PORT; worker i of --workers adds -wI)",
        ),
    ] = None,
    access_log: Annotated[
        Path | None, typer.Option(help="append a line per request here (a worker's id is added)")
    ] = None,
    ca_file: Annotated[
        Path | None, typer.Option(help="CA bundle that signed the control API's TLS certificate")
    ] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning")] = "info",
    metrics_port: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=65535,
            help="serve each process's Prometheus /metrics on this port (worker i: port + i)",
        ),
    ] = None,
    metrics_host: Annotated[
        str, typer.Option(help="address of the /metrics listener (no token asked)")
    ] = "127.0.0.1",
) -> None:
    """Serve the inference endpoint from the controller's routes until Ctrl-C; keep the
    last good routes while no controller answers.

    It listens at once, unready until its first sync brings routes: `GET /readyz` (the
    readiness probe) and every request answer 503 with `Retry-After` until then; `GET
    /healthz` (liveness) answers 200 while it runs. Both, and `--metrics-port`, say when
    the routes served are stale (no controller answered for a few seconds).

    Create its token once: `sluice token create gw-1 --role gateway` (the role may sync and
    nothing else). A gateway token names its gateway: the token `gw-1` syncs only the ids
    `gw-1` and `gw-1-SUFFIX`; another `--id` is refused at start."""
    try:
        token = _token(token_file)
        if workers > 1 and port == 0:
            raise SpecError(
                [SpecIssue("--port", "--workers N shares one port: give it (0 picks one each)")]
            )
        from sluice.cli.gateway_run import GatewayOptions, run_gateways

        code = run_gateways(
            GatewayOptions(
                controls=tuple(control),
                token=token,
                host=host,
                port=port,
                workers=workers,
                gateway_id=name,
                access_log=access_log,
                ca_file=ca_file,
                log_level=log_level,
                metrics_host=metrics_host,
                metrics_port=metrics_port,
            )
        )
    except SluiceError as exc:
        print_error(exc)
        raise typer.Exit(exc.exit_code) from None
    if code:
        raise typer.Exit(code)


def _token(token_file: Path | None) -> str:
    if token_file is not None:
        try:
            text = token_file.read_text().strip()
        except OSError as exc:
            raise SpecError(
                [SpecIssue("--token-file", f"cannot read it: {exc.strerror}")]
            ) from None
        if not text:
            raise SpecError([SpecIssue("--token-file", f"{token_file} is empty")])
        return text
    text = os.environ.get(TOKEN_ENV, "").strip()
    if not text:
        raise SpecError(
            [
                SpecIssue(
                    "--token-file",
                    f"no token: give --token-file or set ${TOKEN_ENV} "
                    "(`sluice token create NAME --role gateway`)",
                )
            ]
        )
    return text
