"""The narrow protocol the controller needs from wherever instances run.

A runtime starts one worker process (or actor) per instance and stops it; everything about
readiness, warm-up, health and drain is the controller's job and works the same everywhere.
What the process runs is Sluice's worker, or (`LaunchRequest.command`) a server Sluice did
not write, from an argv template.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["CommandLaunch", "InstanceHandle", "LaunchRequest", "Placement", "Runtime"]


@dataclass(frozen=True, slots=True)
class CommandLaunch:
    """A server that is not Sluice's worker. `argv` and `env` values are templates
    (`sluice.core.argv`): the runtime adds `host` and `port` to `values` and renders them.
    `listen_timeout_s`: how long it may take to listen on its port (a server that loads
    its model first, like vLLM, binds only then)."""

    argv: tuple[str, ...]
    values: Mapping[str, str]
    env: Mapping[str, str] = field(default_factory=dict)
    stop_signal: str = "SIGTERM"
    listen_timeout_s: float = 300.0


@dataclass(frozen=True, slots=True)
class Placement:
    """What one instance holds where a cluster schedules it (the Ray runtime; the local
    runtime pins devices itself instead): `accelerators` of the pool's `accelerator_type`
    (None: the pool names none), as GPUs when `gpu` (a pool of real accelerators)."""

    accelerators: int = 0
    accelerator_type: str | None = None
    gpu: bool = False


@dataclass(frozen=True, slots=True)
class LaunchRequest:
    """`worker_config` is the worker's JSON config without host/port/port_file: the runtime
    sets those (locally: the host, and port 0 so the worker binds a free port itself).
    With `command`, the instance runs that server instead of the worker (`worker_config`
    is then unused). `env` is added to the process's environment either way. `endpoint`:
    the base URL of a server that already runs (the external runtime; nothing starts).
    `withheld_env`: variables of Sluice's own environment the instance must not inherit (they
    hold secrets: tenant keys, endpoint keys) even where the allow-list of what it inherits
    (`runtime.environment`) would pass them; no `SLUICE_*` variable passes anyway.
    `placement`: the accelerators a cluster must reserve for it."""

    instance_id: str
    group: str
    worker_config: dict[str, Any]
    env: dict[str, str]
    command: CommandLaunch | None = None
    endpoint: str | None = None
    withheld_env: frozenset[str] = frozenset()
    placement: Placement = Placement()


@dataclass(frozen=True, slots=True)
class InstanceHandle:
    instance_id: str
    host: str
    port: int
    pid: int | None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


class Runtime(Protocol):
    async def launch(self, req: LaunchRequest) -> InstanceHandle:
        """Start the instance; returns once its process listens on the handle's port (not
        once it is ready: models may still load). Raises SluiceError if the process exits,
        or does not listen in time, first; then nothing of it is left running."""
        ...

    async def stop(self, handle: InstanceHandle, grace_s: float) -> int | None:
        """Ask the instance to exit (SIGTERM), force it after `grace_s`; its exit code."""
        ...

    def exit_code(self, handle: InstanceHandle) -> int | None:
        """None while the instance runs; its exit code (negative: signal) once it is gone."""
        ...

    def adopt(self, handle: InstanceHandle) -> bool:
        """After a restart of Sluice: True if this instance of a previous run still runs
        (and is ours), so it can be taken over instead of started again."""
        ...

    def log_path(self, instance_id: str) -> str | None:
        """Where the instance's output goes, to point a person at it when it fails."""
        ...
