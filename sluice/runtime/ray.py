"""Instances as Ray actors on a Ray cluster (bare hosts, or Kubernetes through KubeRay).

Each instance is one detached actor, named by its instance id in Sluice's namespace, that
holds the group's accelerators: `num_gpus` of a GPU pool, and its `accelerator_type`. Ray
marks a GPU node with `accelerator_type:<type>` = 1 (one per node, not per GPU), so a GPU
instance asks for the GPUs plus a sliver of that marker; a pool of virtual units asks for
`accelerator_type:<type>` = one per accelerator, a resource its nodes declare
(`ray start --resources`). The actor runs the process on its node exactly as the local
runtime does (`LocalRuntime`, bound to the node's IP, with the port-file handshake, the
command template, the environment scrubbed to `runtime.environment`'s allow-list: the
actor's environment is the Ray node's, which may hold secrets too) and dies with it: the
kernel kills the process when the actor's process goes.

Spreading: every actor is scheduled with Ray's SPREAD strategy, so a group's instances go
to different nodes among those that have its resources. A placement group per group would
force it (STRICT_SPREAD), but its bundles are fixed when it is made: every scale-up or
replacement would mean a new placement group. SPREAD is best effort and needs nothing kept.

Death: each actor has one call outstanding that returns when its process exits, so
`exit_code` is a non-blocking look at that call: the process's exit code, or `LOST` once
Ray says the actor (or its node) is dead. Ray then frees the node's resources, so the
replacement the controller launches lands elsewhere. Detached actors outlive Sluice: after
a restart `adopt` looks the instance up by name and takes it over if its process still
runs as recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sluice.core import SluiceError
from sluice.runtime.base import InstanceHandle, LaunchRequest, Placement
from sluice.runtime.local import LocalRuntime

__all__ = [
    "GPU_MARKER",
    "LOST",
    "RESOURCE_PREFIX",
    "RayRuntime",
    "accelerator_inventory",
    "actor_resources",
]

log = logging.getLogger("sluice.runtime.ray")

RESOURCE_PREFIX = "accelerator_type:"
"""Ray's resource name prefix for a node's accelerator type."""
GPU_MARKER = 0.001
"""How much of a GPU node's `accelerator_type:<type>` (1 per node) a GPU instance takes,
as Ray's own `accelerator_type=` option does: it says which node, not how many GPUs."""
LOST = -1
"""The exit code of an instance whose actor or node died (its process's is unknown)."""
PLACE_TIMEOUT_S = 300.0
"""How long an actor may wait for a node with free resources (an autoscaling cluster adds
nodes in minutes)."""
CALL_TIMEOUT_S = 30.0
"""A call to a live actor that does not answer within this is treated as lost."""


def actor_resources(p: Placement) -> tuple[float, dict[str, float]]:
    """`num_gpus` and custom resources of one instance's actor (module docstring)."""
    if p.gpu:
        marker = {RESOURCE_PREFIX + p.accelerator_type: GPU_MARKER} if p.accelerator_type else {}
        return float(p.accelerators), marker
    if p.accelerator_type:
        return 0.0, {RESOURCE_PREFIX + p.accelerator_type: float(p.accelerators)}
    return 0.0, {}


def accelerator_inventory(cluster_resources: Mapping[str, float]) -> dict[str, int]:
    """Accelerators per type in a cluster's resources (`ray.cluster_resources()`): the
    declared `accelerator_type:<type>` units, or for GPU nodes (whose marker counts nodes,
    each a fraction below 1 once instances hold slivers of it) the cluster's GPUs when they
    are all of one type."""
    types = {
        k.removeprefix(RESOURCE_PREFIX): v
        for k, v in cluster_resources.items()
        if k.startswith(RESOURCE_PREFIX)
    }
    gpus = int(cluster_resources.get("GPU", 0))
    if gpus and len(types) == 1:
        return {next(iter(types)): gpus}
    return {t: int(v) for t, v in types.items()}


class InstanceHost:
    """The actor: one instance's process on its node (a `LocalRuntime` of one)."""

    def __init__(self, directory: str | None) -> None:
        import ray  # on the node, in the actor's process

        # ray leaves get_node_ip_address unannotated (an untyped call under strict)
        self._ip: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        self._node_id = ray.get_runtime_context().get_node_id()
        base = Path(directory or Path(tempfile.gettempdir()) / "sluice-ray")
        self._runtime = LocalRuntime(base, host=self._ip, die_with_parent=True)
        self._handle: InstanceHandle | None = None
        self._log: str | None = None

    def where(self) -> tuple[str, str]:
        """The node id and IP this actor was placed on (answers once it is placed)."""
        return self._node_id, self._ip

    async def launch(self, req: LaunchRequest) -> InstanceHandle | str:
        """The handle once the process listens, or why it did not (a SluiceError's text:
        exceptions cross Ray wrapped, their fields lost)."""
        self._log = self._runtime.log_path(req.instance_id)
        try:
            self._handle = await self._runtime.launch(req)
        except SluiceError as exc:
            return str(exc)
        return self._handle

    def handle(self) -> InstanceHandle | None:
        """The instance's handle while its process runs; None once it exited."""
        if self._handle is None or self._runtime.exit_code(self._handle) is not None:
            return None
        return self._handle

    async def wait_exit(self) -> int:
        """Returns the process's exit code once it exits."""
        while self._handle is None:
            await asyncio.sleep(0.2)
        while (code := self._runtime.exit_code(self._handle)) is None:
            await asyncio.sleep(0.2)
        return code

    async def stop(self, grace_s: float) -> int | None:
        if self._handle is None:
            return None
        return await self._runtime.stop(self._handle, grace_s)

    def log_path(self) -> str | None:
        return self._log


class RayRuntime:
    def __init__(
        self,
        address: str = "auto",
        namespace: str = "sluice",
        node_dir: str | None = None,
        place_timeout_s: float = PLACE_TIMEOUT_S,
        num_cpus: float = 1.0,
    ) -> None:
        """Connects to the cluster at `address` (`ray.init`) now, so that a wrong one fails
        `sluice up` at once. `node_dir`: where each node keeps its instances' logs (default:
        its temp dir / sluice-ray). `num_cpus`: what each actor reserves besides accelerators
        (the worker's one thread)."""
        self._namespace = namespace
        self._node_dir = node_dir
        self._place_timeout_s = place_timeout_s
        self._num_cpus = num_cpus
        self._ray = _connect(address, namespace)
        self._host_class = self._ray.remote(InstanceHost)
        self._actors: dict[str, Any] = {}
        self._exits: dict[str, Any] = {}
        """Per instance: the outstanding `wait_exit` call (an ObjectRef)."""
        self._codes: dict[str, int] = {}
        self._logs: dict[str, str] = {}
        self._nodes: dict[str, str] = {}

    async def launch(self, req: LaunchRequest) -> InstanceHandle:
        """Place the actor, start the process on its node; SluiceError (the actor killed)
        if no node takes it within `place_timeout_s` or the process does not listen."""
        ray = self._ray
        num_gpus, resources = actor_resources(req.placement)
        actor = self._host_class.options(
            name=req.instance_id,
            namespace=self._namespace,
            lifetime="detached",
            max_restarts=0,
            num_cpus=self._num_cpus,
            num_gpus=num_gpus,
            resources=resources,
            scheduling_strategy="SPREAD",
        ).remote(self._node_dir)
        try:
            try:
                async with asyncio.timeout(self._place_timeout_s):
                    node_id, ip = await _awaited(actor.where.remote())
            except TimeoutError:
                wants = ", ".join(f"{k}={v:g}" for k, v in resources.items())
                raise SluiceError(
                    f"no node of the Ray cluster took instance {req.instance_id} within "
                    f"{self._place_timeout_s:g}s (it needs {num_gpus:g} GPUs, "
                    f"{self._num_cpus:g} CPUs{', ' + wants if wants else ''})",
                    instance_id=req.instance_id,
                ) from None
            got: InstanceHandle | str = await _awaited(actor.launch.remote(req))
            path = await _awaited(actor.log_path.remote())
            self._logs[req.instance_id] = f"{path} on node {ip} ({node_id[:12]})"
            self._nodes[req.instance_id] = node_id
            if isinstance(got, str):
                raise SluiceError(
                    f"{got} (on node {ip})",
                    instance_id=req.instance_id,
                    log=self._logs[req.instance_id],
                )
        except BaseException as exc:  # a failure, or cancelled: leave nothing running
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
            if isinstance(exc, ray.exceptions.RayError):
                raise SluiceError(
                    f"the actor of instance {req.instance_id} died while it started: {_brief(exc)}",
                    instance_id=req.instance_id,
                ) from None
            raise
        self._track(req.instance_id, actor)
        return got

    def _track(self, instance_id: str, actor: Any) -> None:
        self._actors[instance_id] = actor
        self._exits[instance_id] = actor.wait_exit.remote()
        self._codes.pop(instance_id, None)

    async def stop(self, handle: InstanceHandle, grace_s: float) -> int | None:
        """The process's stop signal, SIGKILL after `grace_s` (on its node, by its actor);
        then the actor is killed too."""
        iid = handle.instance_id
        actor = self._actors.get(iid) or self._named(iid)
        if actor is None:
            return self.exit_code(handle)
        code: int | None
        try:
            async with asyncio.timeout(grace_s + CALL_TIMEOUT_S):
                code = await _awaited(actor.stop.remote(grace_s))
        except (TimeoutError, self._ray.exceptions.RayError):
            code = self.exit_code(handle)
        finally:
            with contextlib.suppress(Exception):
                self._ray.kill(actor, no_restart=True)
            self._actors.pop(iid, None)
            self._exits.pop(iid, None)
            self._nodes.pop(iid, None)
        self._codes[iid] = LOST if code is None else code
        return code

    def exit_code(self, handle: InstanceHandle) -> int | None:
        iid = handle.instance_id
        if iid in self._codes:
            return self._codes[iid]
        ref = self._exits.get(iid)
        if ref is None:
            return LOST  # not launched or adopted here: nothing of ours runs it
        ray = self._ray
        done, _ = ray.wait([ref], timeout=0)
        if not done:
            return None
        try:
            code = int(ray.get(ref))
        except ray.exceptions.RayError as exc:
            log.warning("instance %s lost with its actor: %s", iid, _brief(exc))
            code = LOST
        self._codes[iid] = code
        return code

    def adopt(self, handle: InstanceHandle) -> bool:
        """True if the actor named `handle.instance_id` lives and runs the process of the
        record (same host, port, pid); an actor of ours that does not is killed."""
        actor = self._named(handle.instance_id)
        if actor is None:
            return False
        ray = self._ray
        try:
            theirs = ray.get(actor.handle.remote(), timeout=CALL_TIMEOUT_S)
            path = ray.get(actor.log_path.remote(), timeout=CALL_TIMEOUT_S)
            node_id, _ = ray.get(actor.where.remote(), timeout=CALL_TIMEOUT_S)
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
            theirs = None
        if theirs is None or (theirs.host, theirs.port, theirs.pid) != (
            handle.host,
            handle.port,
            handle.pid,
        ):
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
            return False
        self._logs[handle.instance_id] = f"{path} on node {handle.host} ({node_id[:12]})"
        self._nodes[handle.instance_id] = node_id
        self._track(handle.instance_id, actor)
        return True

    def log_path(self, instance_id: str) -> str | None:
        """The log file on the instance's node, and which node (it is not on this one)."""
        return self._logs.get(instance_id)

    def inventory(self) -> dict[str, int]:
        """Accelerators per type the cluster has now (`accelerator_inventory`)."""
        return accelerator_inventory(self._ray.cluster_resources())

    def node_of(self, instance_id: str) -> str | None:
        """The Ray node id the instance was placed on (None: not one of this runtime's)."""
        return self._nodes.get(instance_id)

    def instances(self) -> list[str]:
        """The instance ids of every actor in Sluice's namespace (to find strays)."""
        named = self._ray.util.list_named_actors(all_namespaces=True)
        return sorted(a["name"] for a in named if a.get("namespace") == self._namespace)

    def _named(self, instance_id: str) -> Any:
        try:
            return self._ray.get_actor(instance_id, namespace=self._namespace)
        except ValueError:  # no such actor (or it is dead)
            return None


def _connect(address: str, namespace: str) -> Any:
    """The `ray` module, connected to the cluster (once per process: Ray has one driver)."""
    try:
        import ray
    except ImportError:
        raise SluiceError(
            "instances.runtime is ray but Ray is not installed: pip install 'sluice-serve[ray]'"
        ) from None
    if not ray.is_initialized():
        try:
            ray.init(
                address=address,
                namespace=namespace,
                log_to_driver=False,  # instances log on their nodes, not into Sluice's output
                logging_level=logging.WARNING,
            )
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise SluiceError(
                f"cannot connect to the Ray cluster at {address!r}: {_brief(exc)}",
                address=address,
            ) from None
    return ray


async def _awaited(ref: Any) -> Any:
    """An ObjectRef's value, awaited on this event loop."""
    return await ref


def _brief(exc: BaseException) -> str:
    """A Ray error in one line: its first line, and its last (where the cause is), not the
    traces between."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    return lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
