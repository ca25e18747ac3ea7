"""What runs in an instance decides how it is launched and asked whether it is ready,
healthy, warm and idle:

    Sluice's worker (sim, embedding):   GET /ready 200, GET /health 200, /stats "inflight"
    command / external server:          its `ready` path and status (default: the first
                                        GET /v1/models that lists the model), its
                                        `health_path`, and the gateway's in-flight count
                                        (the server knows nothing of Sluice; every request
                                        reaches it through the gateway, which counts them)

Warm-up asks each model what it serves (chat, completions or embeddings). An external
endpoint with `api_key_env` gets its key on every probe; the key is resolved here, from the
controller's environment, and kept in `Probes.headers`, which nothing logs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from sluice.runtime import CommandLaunch, InstanceHandle, LaunchRequest, Placement
from sluice.spec import GroupSpec, PoolSpec
from sluice.spec.models import WarmupSpec
from sluice.spec.servers import EndpointSpec

__all__ = [
    "ProbeFailed",
    "Prober",
    "Probes",
    "WarmupCall",
    "launch_request",
    "least_held_endpoint",
    "placement_of",
    "probes_for",
    "ready_verdict",
    "runs_command",
    "stop_grace_s",
]


class ProbeFailed(Exception):
    """An instance did not answer as it must (warm-up, in-flight count)."""


@dataclass(frozen=True, slots=True)
class WarmupCall:
    model: str
    path: str
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Probes:
    """How to ask one instance. `lists_model`: readiness also needs /v1/models to list this
    model id (the default readiness of a server Sluice did not write). `own_inflight`: the
    instance reports its in-flight count (/stats); else the gateway's count is used."""

    ready_path: str = "/ready"
    ready_status: int = 200
    lists_model: str | None = None
    health_path: str = "/health"
    own_inflight: bool = True
    warmups: tuple[WarmupCall, ...] = ()
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)


def _warmup(model: str, api: str) -> WarmupCall:
    if api == "embeddings":
        return WarmupCall(model, "/v1/embeddings", {"model": model, "input": "warm-up"})
    if api == "completions":
        return WarmupCall(
            model, "/v1/completions", {"model": model, "max_tokens": 4, "prompt": "warm-up"}
        )
    return WarmupCall(
        model,
        "/v1/chat/completions",
        {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "warm-up"}]},
    )


def probes_for(spec: GroupSpec, api_key: str | None = None) -> Probes:
    """The probes of `spec`'s instances; `api_key` for an external endpoint that needs one."""
    calls = tuple(
        _warmup(mid, "embeddings" if m.runtime == "embedding" else "chat")
        if m.server is None
        else _warmup(mid, m.server.api)
        for mid, m in spec.models.items()
    )
    server = next(((mid, m.server) for mid, m in spec.models.items() if m.server), None)
    if server is None:
        return Probes(warmups=calls)
    mid, srv = server
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    if srv.ready is None:
        return Probes("/v1/models", 200, mid, srv.probe_path, False, calls, headers)
    return Probes(srv.ready.path, srv.ready.status, None, srv.probe_path, False, calls, headers)


def ready_verdict(probes: Probes, status: int, body: bytes) -> str:
    """'' when this answer to the readiness probe means ready, else why not (for the
    reason shown while it waits, and the event if it never gets there)."""
    if status != probes.ready_status:
        return f"{probes.ready_path} answered {status}, not {probes.ready_status}"
    if probes.lists_model is None:
        return ""
    try:
        data = json.loads(body)
        ids = [str(m["id"]) for m in data["data"]]
    except (ValueError, KeyError, TypeError):
        shown = body[:80].decode("utf-8", "replace")
        return f"/v1/models answered 200 but not an OpenAI model list: {shown!r}"
    if probes.lists_model not in ids:
        listed = ", ".join(ids[:10]) or "none"
        return (
            f"/v1/models does not list model {probes.lists_model!r} (it lists: {listed}); "
            "serve it under that name (e.g. --served-model-name {model})"
        )
    return ""


class Prober:
    """The HTTP asks themselves, on one shared client."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self._http = http

    async def not_ready(self, handle: InstanceHandle, probes: Probes) -> str:
        """'' if the instance answers its readiness probe as ready now, else why not."""
        try:
            r = await self._http.get(
                handle.url + probes.ready_path, headers=probes.headers, timeout=2.0
            )
        except httpx.HTTPError as exc:
            return f"{probes.ready_path}: {type(exc).__name__}"
        return ready_verdict(probes, r.status_code, r.content)

    async def healthy(self, handle: InstanceHandle, probes: Probes, timeout_s: float) -> bool:
        try:
            r = await self._http.get(
                handle.url + probes.health_path, headers=probes.headers, timeout=timeout_s
            )
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    async def warm_up(self, handle: InstanceHandle, probes: Probes, warm: WarmupSpec) -> None:
        """S3: each model answers `warm.requests` real requests; ProbeFailed if one fails."""
        for call in probes.warmups:
            for _ in range(warm.requests):
                try:
                    r = await self._http.post(
                        handle.url + call.path,
                        json=call.body,
                        headers=probes.headers,
                        timeout=warm.timeout_s,
                    )
                except httpx.HTTPError as exc:
                    raise ProbeFailed(f"warm-up of {call.model} failed: {exc!r}") from None
                if r.status_code != 200:
                    raise ProbeFailed(
                        f"warm-up of {call.model} answered {r.status_code}: {r.text[:200]}"
                    )

    async def worker_inflight(self, handle: InstanceHandle, timeout_s: float) -> int:
        """What Sluice's worker says it serves now (/stats); ProbeFailed if it did not say."""
        try:
            r = await self._http.get(f"{handle.url}/stats", timeout=timeout_s)
            r.raise_for_status()
            return int(r.json()["inflight"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            raise ProbeFailed(f"{type(exc).__name__}: {exc}"[:200]) from None


def launch_request(
    instance_id: str, spec: GroupSpec, devices: tuple[str, ...], listen_timeout_s: float
) -> LaunchRequest:
    """What the runtime starts: the group's command server, else Sluice's worker; pinned to
    `devices` (CUDA_VISIBLE_DEVICES, {gpu_ids}) when there are any."""
    pinned = {"CUDA_VISIBLE_DEVICES": ",".join(devices)} if devices else {}
    for model_id, model in spec.models.items():
        cmd = model.command
        if cmd is None:
            continue
        values = {
            "model": model_id,
            "model_path": cmd.model_path or "",
            "gpu_ids": ",".join(devices),
        }
        launch = CommandLaunch(
            tuple(cmd.argv), values, dict(cmd.env), cmd.stop_signal, listen_timeout_s
        )
        return LaunchRequest(instance_id, spec.name, {}, pinned, command=launch)
    config: dict[str, Any] = {
        "instance_id": instance_id,
        "group": spec.name,
        "max_concurrency": spec.max_concurrency,
        "models": {k: m.model_dump(mode="json") for k, m in spec.models.items()},
    }
    # one thread per worker process: instances share the machine's cores
    env = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **pinned}
    return LaunchRequest(instance_id, spec.name, config, env)


def placement_of(spec: GroupSpec, pool: PoolSpec | None) -> Placement:
    """What a cluster reserves for one instance of `spec`: its accelerators, of its pool's
    type; GPUs unless the pool's accelerators are virtual units."""
    if pool is None:
        return Placement()
    return Placement(
        spec.resources.accelerators, pool.accelerator_type, gpu=pool.accelerator != "virtual"
    )


def stop_grace_s(spec: GroupSpec, at_least: float) -> float:
    """`at_least`, or longer if the group's command asks for more time to stop."""
    return max([at_least, *(m.command.stop_grace_s for m in spec.models.values() if m.command)])


def least_held_endpoint(spec: GroupSpec, held: list[str]) -> EndpointSpec | None:
    """For a new instance of an external group: the endpoint fewest of its instances (of
    the same template; `held`: their URLs) front, the first such in the spec's order. A
    rolling update thus puts one new instance on each endpoint. None: not external."""
    external = next((m.external for m in spec.models.values() if m.external), None)
    if external is None:
        return None
    return min(external.endpoints, key=lambda e: held.count(e.url))


def runs_command(spec: GroupSpec) -> bool:
    """The group's instances run a command server (not Sluice's worker, not a URL)."""
    return any(m.command is not None for m in spec.models.values())
