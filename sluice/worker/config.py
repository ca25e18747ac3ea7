"""What one worker process serves, as handed over by the controller on its command line."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from sluice.spec.models import ModelSpec

__all__ = ["WorkerConfig"]


class WorkerConfig(BaseModel):
    """The JSON behind `--config-json` / `--config`; `models` maps model id -> ModelSpec.

    `port` 0 lets the worker pick a free port when it binds; `port_file`, if set, is where it
    then writes the port it got (atomically, as decimal text), so whoever started it can learn
    the port without the race of choosing one for it. `log_file`, if set, is where its output
    goes, kept so across log rotation.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    instance_id: str = Field(min_length=1, max_length=200)
    group: str = Field(min_length=1, max_length=200)
    host: str = "127.0.0.1"
    port: int = Field(ge=0, le=65535)
    port_file: str | None = Field(default=None, min_length=1, max_length=4096)
    log_file: str | None = Field(default=None, min_length=1, max_length=4096)
    """The file the runtime put stdout and stderr on; the worker follows it when log rotation
    renames it (`sluice.worker.logfile`)."""
    max_concurrency: int = Field(default=8, ge=1, le=100_000)
    models: dict[str, ModelSpec] = Field(min_length=1)
