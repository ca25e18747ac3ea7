"""`python -m sluice.worker --config-json '<JSON>'`: run one inference instance.

The worker binds its listening socket first, before uvicorn, the app or any model is loaded:
with `port: 0` the kernel picks a free port, and with `port_file` set the port it got is
written there within a fraction of a second of the start, for the runtime to read.

Exit codes: 0 after a graceful stop (SIGTERM: stop accepting, finish in-flight requests),
1 if a model fails to load, 2 for a bad config (or a `port_file` that cannot be written),
3 if the port cannot be bound.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import sys
import tempfile
from pathlib import Path
from types import FrameType

from pydantic import ValidationError

from sluice.worker.config import WorkerConfig

__all__ = ["main"]


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m sluice.worker", description="Run one Sluice inference instance."
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config-json", metavar="JSON", help="the WorkerConfig as JSON text")
    source.add_argument("--config", metavar="FILE", type=Path, help="a file holding that JSON")
    return parser.parse_args(argv)


def _load_config(args: argparse.Namespace) -> WorkerConfig:
    """The validated config, or SystemExit(2) with the reason on stderr."""
    try:
        text = args.config_json if args.config is None else args.config.read_text()
        return WorkerConfig.model_validate(json.loads(text))
    except (OSError, json.JSONDecodeError, ValidationError) as exc:
        print(f"sluice.worker: invalid config: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _bind(host: str, port: int) -> socket.socket:
    """The listening socket (SO_REUSEADDR, as uvicorn binds), or SystemExit(3) on stderr."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family)
    except OSError as exc:
        print(f"sluice.worker: cannot listen on {host}:{port}: {exc}", file=sys.stderr)
        raise SystemExit(3) from None


def _write_port_file(path: str, port: int) -> None:
    """Write `port` to `path` atomically: readers see no file or the whole number, never a
    partial one. SystemExit(2) (the file is part of the config) if it cannot be written."""
    target = Path(path)
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as out:
            out.write(f"{port}\n")
        os.replace(tmp, target)
        tmp = None
    except OSError as exc:
        print(f"sluice.worker: cannot write the port file {path}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    finally:
        if tmp is not None:  # failed, or a SIGTERM came in between: leave no temp file
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _exit_cleanly(_signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    config = _load_config(_parse_args(argv))
    # uvicorn drains on SIGTERM and then re-raises it; for an instance, SIGTERM is the normal
    # way to stop, so the re-raised signal (or one before uvicorn starts) ends with status 0.
    signal.signal(signal.SIGTERM, _exit_cleanly)
    sock = _bind(config.host, config.port)
    try:
        if config.port_file is not None:
            _write_port_file(config.port_file, int(sock.getsockname()[1]))
        return _serve(config, sock)
    finally:
        sock.close()  # uvicorn closes it when it stops; this covers every earlier exit


def _serve(config: WorkerConfig, sock: socket.socket) -> int:
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    logging.getLogger("uvicorn").setLevel(logging.WARNING)

    import uvicorn

    from sluice.worker.engine import Worker
    from sluice.worker.server import build_app

    worker = Worker(config)
    server = uvicorn.Server(
        uvicorn.Config(
            build_app(worker),
            host=config.host,
            port=int(sock.getsockname()[1]),
            loop="uvloop",
            http="httptools",
            lifespan="on",
            log_level="warning",
            access_log=False,
        )
    )

    def stop() -> None:
        server.should_exit = True

    worker.on_failure = stop
    server.run(sockets=[sock])
    return 1 if worker.failure is not None else 0


if __name__ == "__main__":
    sys.exit(main())
