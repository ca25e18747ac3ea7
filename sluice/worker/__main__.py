"""`python -m sluice.worker --config-json '<JSON>'`: run one inference instance.

Exit codes: 0 after a graceful stop (SIGTERM: stop accepting, finish in-flight requests),
1 if a model fails to load, 2 for a bad config, 3 if the port cannot be bound (uvicorn).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
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


def _exit_cleanly(_signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    config = _load_config(_parse_args(argv))
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
            port=config.port,
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
    # uvicorn drains on SIGTERM and then re-raises it; for an instance, SIGTERM is the normal
    # way to stop, so the re-raised signal (or one before uvicorn starts) ends with status 0.
    signal.signal(signal.SIGTERM, _exit_cleanly)
    server.run()
    return 1 if worker.failure is not None else 0


if __name__ == "__main__":
    sys.exit(main())
