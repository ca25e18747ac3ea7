"""The control API's listening socket, on a port that stays put across restarts: the one
configured (`--control-port` / $SLUICE_CONTROL_PORT, else the spec's `control.port`), or
else the first free port picked, remembered in the state directory (`control.port`) so a
bookmarked console or a scrape job still finds it after a restart. A remembered port that
is taken now is said in one line, and a new one is picked (and remembered)."""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sluice.core import Conflict
from sluice.core.urls import is_loopback_host
from sluice.spec import ControlSpec

__all__ = [
    "PortInUse",
    "bind_control",
    "control_socket",
    "remembered_port",
]

log = logging.getLogger("sluice.up")

PORT_FILE = "control.port"

PortSource = Literal["flag", "spec", "remembered", "picked"]


class PortInUse(Conflict):
    """The control port is held by another process."""


@dataclass(frozen=True, slots=True)
class ControlPort:
    """Where the control API was bound, and why that port (`source`)."""

    sock: socket.socket
    port: int
    source: PortSource


def remembered_port(home: Path) -> int | None:
    """The port a previous start picked on this state directory (None: none kept, or a
    file that does not read as a port)."""
    try:
        port = int((home / PORT_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    return port if 0 < port <= 65535 else None


def _remember(home: Path, port: int) -> None:
    with contextlib.suppress(OSError):  # a port not remembered is picked again next time
        (home / PORT_FILE).write_text(f"{port}\n")


def bind_control(
    control: ControlSpec, home: Path, flag_port: int | None, insecure: bool
) -> ControlPort:
    """Bind the control API: the flag's port, else the spec's, else the remembered one,
    else a free one (remembered for the next start; `flag_port` 0 asks for a free one
    now). A configured port that is taken raises `PortInUse`; a remembered one falls back
    to a free port, saying so."""
    if flag_port:
        sock = control_socket(control.model_copy(update={"port": flag_port}), insecure)
        return ControlPort(sock, flag_port, "flag")
    if control.port and flag_port is None:
        return ControlPort(control_socket(control, insecure), control.port, "spec")
    before = remembered_port(home) if flag_port is None else None
    if before is not None:
        try:
            sock = control_socket(control.model_copy(update={"port": before}), insecure)
            return ControlPort(sock, before, "remembered")
        except PortInUse:
            sock = control_socket(control.model_copy(update={"port": 0}), insecure)
            port = int(sock.getsockname()[1])
            print(
                f"the control port {before} that this state directory remembers "
                f"({home / PORT_FILE}) is taken by another process: the control API listens "
                f"on {port} now (remembered from now on; pin one with --control-port or "
                "control.port)",
                flush=True,
            )
            _remember(home, port)
            return ControlPort(sock, port, "picked")
    sock = control_socket(control.model_copy(update={"port": 0}), insecure)
    port = int(sock.getsockname()[1])
    _remember(home, port)
    return ControlPort(sock, port, "picked")


def control_socket(control: ControlSpec, insecure: bool) -> socket.socket:
    """The control API's listening socket: loopback, or TLS, or explicitly `--insecure`."""
    if not is_loopback_host(control.host) and control.tls is None:
        if not insecure:
            raise Conflict(
                f"the control API would listen on {control.host} without TLS: tokens would "
                "cross the network in clear. Set control.tls {cert_file, key_file}, bind "
                "127.0.0.1, or pass --insecure (a trusted network only)",
                host=control.host,
            )
        log.warning(
            "INSECURE: the control API listens on %s without TLS (--insecure): anyone on "
            "the path can read tokens",
            control.host,
        )
    family = socket.AF_INET6 if ":" in control.host else socket.AF_INET
    try:
        return socket.create_server((control.host, control.port), family=family)
    except OSError as exc:
        kind = PortInUse if exc.errno == errno.EADDRINUSE else Conflict
        raise kind(
            f"the control API cannot listen on {control.host}:{control.port}: {exc.strerror}"
        ) from None
