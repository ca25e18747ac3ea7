"""Model servers Sluice did not write: a `command` it launches, or `external` URLs it fronts.

Both speak the OpenAI HTTP API and know nothing of Sluice, so what Sluice's own worker says
through `/ready`, `/health` and `/stats` comes from elsewhere: readiness from the server's own
path (default: the first `/v1/models` that lists the model), health from `health_path`, and
the in-flight count for a drain from the gateway, which proxies every request.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from sluice.core.argv import placeholders_in

if TYPE_CHECKING:
    from sluice.spec.models import GroupSpec

__all__ = [
    "STOP_SIGNALS",
    "CommandSpec",
    "EndpointSpec",
    "ExternalSpec",
    "ReadinessSpec",
    "SleepSpec",
    "external_replicas",
    "external_scale_problem",
    "names_model_dir",
    "server_problems",
    "usable_key",
]

STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGQUIT", "SIGHUP", "SIGUSR1", "SIGUSR2")

Problem = tuple[tuple[str | int, ...], str]

UrlPath = Annotated[str, Field(pattern=r"^/[!-~]*$", max_length=2048)]
"""An absolute URL path of printable ASCII (no spaces), e.g. /health."""
EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=255)]

_SLUICE_ENV = frozenset({"CUDA_VISIBLE_DEVICES", "SLUICE_INSTANCE_ID", "SLUICE_STOP_SIGNAL"})
"""Set by Sluice for every command; an `env` entry may not override them."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _template(text: str) -> str:
    placeholders_in(text)  # raises ValueError naming the bad placeholder
    return text


Template = Annotated[str, AfterValidator(_template), Field(max_length=8192)]


class ReadinessSpec(_Strict):
    """GET `path` on the instance; it is ready once the answer has `status`."""

    path: UrlPath
    status: int = Field(default=200, ge=100, le=599)


class _ServerSpec(_Strict):
    ready: ReadinessSpec | None = Field(
        default=None,
        description="unset: ready once GET /v1/models answers 200 with JSON listing the model",
    )
    health_path: UrlPath | None = Field(
        default=None, description="probed every health.interval_s for 200 (unset: ready's path)"
    )
    metrics_path: UrlPath | None = Field(
        default=None, description="where the server exposes Prometheus metrics, e.g. /metrics"
    )
    api: Literal["chat", "completions", "embeddings"] = Field(
        default="chat", description="what warm-up requests ask: /v1/chat/completions, ..."
    )

    @property
    def probe_path(self) -> str:
        """What the health probe asks while the instance serves."""
        if self.health_path is not None:
            return self.health_path
        return self.ready.path if self.ready is not None else "/v1/models"


class SleepSpec(_Strict):
    """A server that can sleep (vLLM's sleep mode, `--enable-sleep-mode`): POST `sleep_path`
    with `?level=N` offloads its weights to host memory (level 1) or drops them (level 2) and
    frees the accelerator's memory; POST `wake_path` loads them again, in seconds rather than
    a start-up's minutes. Sleeping standby (`autoscaling.sleeping_standby`) is kept this way."""

    sleep_path: UrlPath = "/sleep"
    level: Literal[1, 2] = Field(default=1, description="1: weights to host memory; 2: dropped")
    wake_path: UrlPath = "/wake_up"
    status_path: UrlPath | None = Field(
        default="/is_sleeping",
        description='GET: {"is_sleeping": true|false}, asked of instances a restarted '
        "controller adopts (unset: it counts them asleep and wakes what it routes)",
    )
    wake_timeout_s: float = Field(
        default=30.0, gt=0, le=600, description="a wake that takes longer has failed"
    )
    wake_s: float | None = Field(
        default=None,
        ge=0,
        le=600,
        description="how long a wake takes, as measured on this server (the controller's "
        "`woken` events say it; vLLM level 1: about a second for an 8B model on one GPU): "
        "the held tier (`autoscaling.sleep_held_after_s`) keeps capacity asleep only where "
        "it is well within the first-token bound; unset: unknown, none is held",
    )
    host_memory_gb: float = Field(
        default=0.0, ge=0, description="host memory a sleeping instance holds (its cost)"
    )


class CommandSpec(_ServerSpec):
    """Launch any OpenAI-compatible server per instance from an argv template. Placeholders
    (`sluice.core.argv.PLACEHOLDERS`): {port} {host} {model} {model_path} {gpu_ids}. The
    runtime picks the port; the server must listen on it (else the instance fails with the
    ports it did listen on). Its stdout and stderr go to the instance's log."""

    argv: list[Template] = Field(min_length=1, max_length=1024)
    model_path: str | None = Field(default=None, max_length=4096, description="for {model_path}")
    env: dict[EnvName, Template] = Field(default_factory=dict, description="extra environment")
    stop_signal: Literal["SIGTERM", "SIGINT", "SIGQUIT", "SIGHUP", "SIGUSR1", "SIGUSR2"] = "SIGTERM"
    stop_grace_s: float = Field(
        default=30.0, ge=0, le=3600, description="stop_signal to SIGKILL, at least"
    )
    memory_gb: float = Field(default=0.0, ge=0, description="declared model memory, GiB")
    sleep: SleepSpec | None = Field(
        default=None, description="the server's sleep/wake endpoints (vLLM's sleep mode)"
    )

    @model_validator(mode="after")
    def _placeholders_make_sense(self) -> CommandSpec:
        used = {name for text in [*self.argv, *self.env.values()] for name in placeholders_in(text)}
        if "port" not in used:
            raise ValueError(
                "neither argv nor env uses {port}: the server must listen on the port Sluice "
                "gives it (e.g. '--port', '{port}')"
            )
        if "model_path" in used and not self.model_path:
            raise ValueError("argv uses {model_path}; set model_path")
        if not self.argv[0].strip():
            raise ValueError("argv[0] must name the program to run")
        taken = sorted(_SLUICE_ENV & set(self.env))
        if taken:
            raise ValueError(
                f"env may not set {', '.join(taken)}: Sluice sets it (devices come from the "
                "pool's `devices`; use {gpu_ids} to pass them on)"
            )
        return self

    def uses(self, placeholder: str) -> bool:
        return any(placeholder in placeholders_in(t) for t in [*self.argv, *self.env.values()])


def _http_url(url: str) -> str:
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "http" or not parts.hostname or port is None:
        raise ValueError(
            f"{url!r} must be http://HOST:PORT (https and a path prefix are not supported yet; "
            "put a local proxy in front)"
        )
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise ValueError(f"{url!r} must be http://HOST:PORT, with no path, query or user")
    return f"http://{parts.netloc}"


def names_model_dir(model_path: str) -> bool:
    """Whether a command's `model_path` is a local model directory for validate to read
    (config.json, the memory estimate): a path written as one (`/`, `./`, `../`, `~`) that
    is not an existing file. A hub id (`Qwen/Qwen2.5-0.5B-Instruct`) is the server's to
    fetch, and a single-file model (a GGUF) has no config.json; neither is read."""
    if not model_path.startswith(("/", "./", "../", "~")):
        return False
    return not Path(model_path).expanduser().is_file()


def usable_key(key: str) -> bool:
    """A key that can go in an `Authorization: Bearer` header as it is: 1 to 4096
    printable ASCII characters, no spaces (so never a line break into a request head)."""
    return 0 < len(key) <= 4096 and key.isascii() and key.isprintable() and " " not in key


class EndpointSpec(_Strict):
    """One existing server. Its key, if any, comes from `api_key_env` in the environment of
    Sluice (controller for probes, gateway for requests); it is never stored or logged."""

    url: Annotated[str, AfterValidator(_http_url), Field(max_length=2048)]
    api_key_env: EnvName | None = Field(
        default=None, description="variable holding the key sent as 'Authorization: Bearer'"
    )


class ExternalSpec(_ServerSpec):
    """A group whose instances are servers that already run: one instance per endpoint,
    nothing started or stopped; health probes take an endpoint out of routing and put it
    back; a drain waits for the requests the gateway has in flight to it."""

    endpoints: list[EndpointSpec] = Field(min_length=1, max_length=1000)

    @model_validator(mode="after")
    def _urls_unique(self) -> ExternalSpec:
        seen = Counter(e.url for e in self.endpoints)
        twice = sorted(u for u, n in seen.items() if n > 1)
        if twice:
            raise ValueError(f"endpoint(s) listed twice: {', '.join(twice)}")
        return self


def external_replicas(models: Mapping[str, Any]) -> int | None:
    """The endpoint count of a group whose model is `external` (its instance count), else None."""
    for m in models.values():
        external = getattr(m, "external", None)
        if isinstance(external, ExternalSpec):
            return len(external.endpoints)
    return None


def external_scale_problem(group: GroupSpec, replicas: int) -> str:
    """Why `sluice scale` may not give an external group `replicas` ('' if it may): one
    instance per endpoint, so at most as many as it lists."""
    n = external_replicas(group.models)
    if n is None or replicas <= n:
        return ""
    return (
        f"group {group.name!r} fronts {n} external endpoint(s), one instance each; it can "
        f"have at most {n} replicas"
    )


def server_problems(i: int, group: GroupSpec) -> Iterator[Problem]:
    """Cross-field rules of a group running a command or external server: it is the group's
    only model (one process, or one URL, is one instance), and an external group's instance
    count is its endpoint count (no autoscaling, `replicas` if given must match)."""
    servers = [(mid, m) for mid, m in group.models.items() if m.runtime in ("command", "external")]
    if not servers:
        return
    path: tuple[str | int, ...] = ("groups", i)
    if len(group.models) > 1:
        mid = servers[0][0]
        yield (
            (*path, "models", mid, "runtime"),
            f"a {servers[0][1].runtime} model must be its group's only model (one server per "
            f"instance); move the other models of group {group.name!r} to a group of their own",
        )
    for _, m in servers:
        if m.external is None:
            continue
        n = len(m.external.endpoints)
        if group.autoscaling is not None:
            yield (
                (*path, "autoscaling"),
                "an external group has one instance per endpoint; remove autoscaling",
            )
        if group.replicas != n:
            yield (
                (*path, "replicas"),
                f"replicas = {group.replicas} but the group lists {n} endpoint(s); an external "
                "group has one instance per endpoint: remove replicas or make it match",
            )
