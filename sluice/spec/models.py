"""The operator's language: pools, groups, tenants and routes, as pydantic models.

Field-level rules (types, ranges) live on the fields; cross-references (a group's pool,
memory fit, route targets) are checked in `spec.checks` so each problem gets its own path.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from sluice.spec.autoscaling import AutoscalingSpec, ScheduleEntry, SloSpec
from sluice.spec.control import ControlSpec, InstancesSpec, RaySpec, ReviewSpec
from sluice.spec.devices import DeviceId, pool_devices_problem
from sluice.spec.drills import DrillSchedule
from sluice.spec.hf import TransformersParams
from sluice.spec.keys import (
    DIGEST_PREFIX,
    KEY_SOURCE_FIELDS,
    SECRET_FIELDS,
    ApiKey,
    EnvVarName,
    KeyDigest,
    KeyFilePath,
    KeyPath,
    check_digest,
    digest_entry,
    key_digest,
)
from sluice.spec.names import Name
from sluice.spec.observability import ObservabilitySpec
from sluice.spec.quota import BudgetSpec, QuotaSpec, ReclaimSpec
from sluice.spec.rollouts import RolloutSpec
from sluice.spec.runtimes import (
    EmbeddingParams,
    ServiceTime,
    SimParams,
)
from sluice.spec.sealing import SEALED_PREFIX
from sluice.spec.servers import CommandSpec, ExternalSpec, SleepSpec, external_replicas

__all__ = [
    "DIGEST_PREFIX",
    "SECRET_FIELDS",
    "ControlSpec",
    "GatewayLimits",
    "GatewaySpec",
    "GroupSpec",
    "HealthSpec",
    "InstancesSpec",
    "MirrorSpec",
    "ModelSpec",
    "OutlierSpec",
    "PlatformSpec",
    "PoolSpec",
    "Priority",
    "QueueSpec",
    "RateLimitSpec",
    "RaySpec",
    "ResourcesSpec",
    "ReviewSpec",
    "RouteMatch",
    "RouteSpec",
    "ServiceTime",
    "TenantSpec",
    "TransformersParams",
    "WarmupSpec",
    "WeightedTarget",
    "digest_entry",
    "key_digest",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class PoolSpec(_Strict):
    """An inventory of accelerators of one type. Without real GPUs they are virtual units."""

    name: Name
    accelerator: str = Field(default="virtual", description="accelerator type, e.g. h100-80g")
    count: int = Field(ge=0, le=1_000_000, description="accelerators in the pool")
    memory_gb: float = Field(gt=0, description="memory of ONE accelerator, in GiB")
    price_per_hour: float = Field(default=0.0, ge=0, description="per accelerator")
    host_memory_price_per_gb_hour: float = Field(
        default=0.0,
        ge=0,
        description="per GiB of host memory an instance holds asleep (sleeping standby whose "
        "accelerators are lent is metered at its `command.sleep.host_memory_gb` at this price)",
    )
    purpose: Literal["inference", "training"] = Field(
        default="inference", description="inference groups never use training pools (Q5)"
    )
    devices: list[DeviceId] | None = Field(
        default=None,
        description="this machine's device ids (CUDA indices or UUIDs): each instance is "
        "pinned to its own (CUDA_VISIBLE_DEVICES); unset: virtual units, nothing pinned",
    )
    units_per_device: int = Field(
        default=1, ge=1, le=64, description="quota units per device (fractional accelerators)"
    )
    accelerator_type: str | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9._-]+$",
        description="the cluster's name for these accelerators (`instances.runtime: ray`: "
        "nodes that have them carry the resource `accelerator_type:<name>`, e.g. H200); an "
        "instance is placed only on such a node. Unset: any node",
    )
    inventory: Literal["declared", "cluster"] = Field(
        default="declared",
        description="declared: the pool has `count` accelerators. cluster (`instances.runtime: "
        "ray`): it has what the Ray cluster's nodes of `accelerator_type` have now, read every "
        "few seconds, so a node joining grows it and a node leaving shrinks it (reserved "
        "groups keep theirs first); `count` is then only what it is taken to have until the "
        "cluster first answers",
    )

    @model_validator(mode="after")
    def _devices_add_up(self) -> PoolSpec:
        problem = pool_devices_problem(self.count, self.devices, self.units_per_device)
        if problem:
            raise ValueError(problem)
        return self


_PARAM_BLOCKS = ("sim", "embedding", "transformers", "command", "external")
"""Each runtime's own params block, named as the runtime; a model may hold only its own."""


class ModelSpec(_Strict):
    """`sim`, `embedding`, `transformers`: Sluice's own worker serves the model; `command`:
    any OpenAI-compatible server Sluice launches; `external`: servers that already run."""

    runtime: Literal["sim", "embedding", "transformers", "command", "external"]
    version: str = Field(default="v1", min_length=1, max_length=64)
    sim: SimParams | None = None
    embedding: EmbeddingParams | None = None
    transformers: TransformersParams | None = None
    command: CommandSpec | None = None
    external: ExternalSpec | None = None

    @model_validator(mode="after")
    def _params_match_runtime(self) -> ModelSpec:
        for other in _PARAM_BLOCKS:
            if other != self.runtime and getattr(self, other) is not None:
                raise ValueError(f"runtime is {self.runtime!r}; remove the '{other}:' block")
        if self.runtime == "transformers" and self.transformers is None:
            raise ValueError("runtime 'transformers' needs a 'transformers:' block with model_path")
        if self.runtime in ("command", "external") and getattr(self, self.runtime) is None:
            raise ValueError(f"runtime {self.runtime!r} needs a '{self.runtime}:' block")
        return self

    @property
    def server(self) -> CommandSpec | ExternalSpec | None:
        """The server that is not Sluice's worker, if the model runs on one."""
        return self.command or self.external

    @property
    def memory_gb(self) -> float:
        if self.transformers is not None:
            return self.transformers.estimated_memory_gb()
        params = self.sim or self.embedding or self.command
        if params is not None:
            return params.memory_gb
        if self.runtime == "external":
            return 0.0  # on machines Sluice does not run
        return SimParams().memory_gb if self.runtime == "sim" else EmbeddingParams().memory_gb


class ResourcesSpec(_Strict):
    pool: Name
    accelerators: int = Field(default=1, ge=1, le=64, description="per instance")
    memory_gb: float = Field(gt=0, description="accelerator memory one instance needs, GiB")
    fractional: bool = Field(
        default=False, description="may take part of one device, shared with other such"
    )


class WarmupSpec(_Strict):
    requests: int = Field(default=1, ge=0, le=1000, description="warm-up passes per model")
    timeout_s: float = Field(default=60.0, gt=0)


class HealthSpec(_Strict):
    interval_s: float = Field(default=1.0, gt=0, le=300)
    timeout_s: float = Field(default=2.0, gt=0, le=300)
    failure_threshold: int = Field(default=3, ge=1, le=100)
    startup_timeout_s: float = Field(default=300.0, gt=0, description="launch to /ready")


class QueueSpec(_Strict):
    """Requests beyond the group's slots (ready instances x max_concurrency) wait here."""

    max_length: int = Field(default=100, ge=0, le=1_000_000)
    max_wait_s: float = Field(default=10.0, gt=0, le=3600)


class PrefixRoutingSpec(_Strict):
    """Send a prompt to the instance most likely to hold its prefix in its KV cache, unless
    that instance is busier than `1 + epsilon` times the group's mean (`policy.prefix`).
    On by default for a group that generates (any runtime but `embedding`): a prompt under
    one block goes by power of two choices as before, so only long prompts are affected."""

    enabled: bool = Field(default=True, description="false: power of two choices only")

    block_bytes: int = Field(
        default=2048,
        ge=64,
        le=1 << 20,
        description="prompt bytes per hashed block (about 512 tokens of English at 2,048)",
    )
    max_blocks: int = Field(
        default=64, ge=1, le=4096, description="leading blocks hashed per request (its cost)"
    )
    epsilon: float = Field(
        default=1.0, ge=0.0, le=100.0, description="load an instance may carry over the mean"
    )
    index_blocks: int = Field(
        default=8192,
        ge=1,
        le=1_000_000,
        description="blocks remembered per instance: about its KV cache's size in blocks",
    )


class OutlierSpec(_Strict):
    """Eject an instance that keeps failing (connect errors, 5xx), like Envoy's outlier
    detection, or that answers but is much slower than the rest of its group (`latency`);
    each repeat ejection lasts longer (base x times ejected, at most `max_ejection_s`), and
    the multiplier decays while the instance stays healthy. Both kinds share the cap."""

    consecutive_failures: int = Field(default=5, ge=1, le=1000)
    base_ejection_s: float = Field(default=30.0, gt=0, le=3600)
    max_ejection_s: float = Field(
        default=300.0, gt=0, le=86_400, description="cap on one ejection (Envoy's default)"
    )
    max_ejected_percent: int = Field(default=50, ge=0, le=100)
    latency: bool = Field(
        default=True, description="also eject an instance that is slow but not failing"
    )
    latency_ratio: float = Field(
        default=3.0,
        ge=1.5,
        le=1000,
        description="slow: its typical (geometric mean) latency is this many times its peers'",
    )
    latency_min_requests: int = Field(
        default=20,
        ge=5,
        le=100_000,
        description="answered requests of an instance (and of a peer) before it is judged; "
        "also the span of its latency average: raise it for a very mixed workload",
    )


class GroupSpec(_Strict):
    """A set of inference instances with a dedicated share of compute (G1, G2, G4)."""

    name: Name
    owner: str = Field(min_length=1)
    business: str = Field(min_length=1)
    alert_channel: str = Field(min_length=1)
    description: str = ""
    models: dict[str, ModelSpec] = Field(min_length=1)
    resources: ResourcesSpec
    max_concurrency: int = Field(default=8, ge=1, le=100_000, description="per instance")
    replicas: int = Field(default=1, ge=0, le=1000)
    max_surge: int = Field(default=1, ge=1, le=1000, description="extra instances while rolling")
    warmup: WarmupSpec = WarmupSpec()
    health: HealthSpec = HealthSpec()
    drain_timeout_s: float = Field(default=30.0, ge=0, le=3600)
    backup: Name | None = Field(default=None, description="`sluice route failover` default")
    queue: QueueSpec = QueueSpec()
    timeout_s: float = Field(default=300.0, gt=0, le=86_400, description="upstream, per request")
    slow_start_s: float = Field(
        default=10.0, ge=0, le=3600, description="a new instance's share ramps up over this"
    )
    affinity_header: str | None = Field(
        default=None, description="requests with the same value stick to one instance"
    )
    prefix_routing: PrefixRoutingSpec | None = Field(
        default=None,
        description="choose instances by the prompt's cached prefix (default: on, with these "
        "settings' defaults, unless every model is an `embedding` one)",
    )
    ask_stream_usage: bool = Field(
        default=True,
        description="ask the server for a stream's token usage (`stream_options.include_usage`) "
        "where the caller did not, and take that chunk out of the caller's answer; false for "
        "a server that refuses the field",
    )
    outlier: OutlierSpec = OutlierSpec()
    autoscaling: AutoscalingSpec | None = Field(
        default=None, description="scale by load; `replicas` is then the starting count"
    )
    slo: SloSpec | None = None
    quota: QuotaSpec = QuotaSpec()
    budget: BudgetSpec | None = None

    @model_validator(mode="after")
    def _one_instance_per_endpoint(self) -> GroupSpec:
        """An external group runs one instance per endpoint: that is its `replicas` unless
        written (`server_problems` refuses a count that differs)."""
        n = external_replicas(self.models)
        if n is not None and "replicas" not in self.model_fields_set:
            object.__setattr__(self, "replicas", n)  # frozen; this runs while it is built
        return self

    def prefix_choice(self) -> PrefixRoutingSpec | None:
        """The prefix-cache-aware choice in force: as written, else the defaults for a group
        that generates text (an embedding server keeps no KV cache to reuse); None: off."""
        if self.prefix_routing is not None:
            return self.prefix_routing if self.prefix_routing.enabled else None
        generates = any(m.runtime != "embedding" for m in self.models.values())
        return PrefixRoutingSpec() if generates else None

    @property
    def sleep(self) -> SleepSpec | None:
        """The sleep and wake calls of the group's servers (`command.sleep`; sleeping standby
        needs every model to declare them: the spec's checks), else None. A group of `sim`
        models only has the sim worker's (vLLM's paths; it holds `sim.host_memory_gb`, else
        `sim.memory_gb`, of host memory asleep, and a wake fails after twice its `sim.wake_s`
        plus 30 s)."""
        for m in self.models.values():
            if m.command is not None and m.command.sleep is not None:
                return m.command.sleep
        sims = [m.sim for m in self.models.values() if m.runtime == "sim"]
        if not sims or len(sims) != len(self.models):
            return None
        params = [p if p is not None else SimParams() for p in sims]
        host = sum(p.memory_gb if p.host_memory_gb is None else p.host_memory_gb for p in params)
        wake = max(p.wake_s for p in params)
        timeout = min(600.0, 2 * wake + 30.0)
        return SleepSpec(host_memory_gb=host, wake_timeout_s=timeout, wake_s=wake)

    def template(self) -> str:
        """Fingerprint of what an instance runs; a change rolls the group's instances."""
        body = {
            "models": {k: v.model_dump(mode="json") for k, v in sorted(self.models.items())},
            "resources": self.resources.model_dump(mode="json"),
            "max_concurrency": self.max_concurrency,
        }
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        return digest[:12]

    def version_label(self) -> str:
        """The model version the group serves (each model's, joined, for several): what a
        capacity test's result belongs to."""
        if len(self.models) == 1:
            return next(iter(self.models.values())).version
        return ",".join(f"{name}:{m.version}" for name, m in sorted(self.models.items()))

    def declared_startup_s(self) -> float:
        """Before any instance came up: the slowest `sim` model's declared start-up time."""
        return max((m.sim.startup_s for m in self.models.values() if m.sim), default=0.0)


Priority = Literal["high", "normal", "low"]


class RateLimitSpec(_Strict):
    """Token bucket: `rps` sustained requests per second, bursts up to `burst`."""

    rps: float = Field(gt=0)
    burst: int = Field(default=0, ge=0, description="0: same as rps, at least 1")


class TenantSpec(_Strict):
    """A business caller: its API keys, default priority, and what it may reach (R7)."""

    name: Name
    business: str = ""
    api_keys: list[ApiKey] = Field(
        default_factory=list,
        description="plain keys, or 'sha256:<hex>' digests (moved to api_key_sha256); "
        "a stored spec has every key redacted to its digest",
    )
    api_key_sha256: list[KeyDigest] = Field(
        default_factory=list, description="keys given as sha256 hex digests (never in clear)"
    )
    api_keys_env: EnvVarName | None = Field(
        default=None,
        description="environment variable holding more keys, separated by commas, spaces or "
        "newlines (see `resolve_key_sources`)",
    )
    api_keys_file: KeyFilePath | None = Field(
        default=None,
        description="file holding more keys, one per line; blank lines and '#' lines ignored",
    )
    priority: Priority = "normal"
    priority_header: bool = Field(
        default=False, description="may pick its priority per request with x-sluice-priority"
    )
    rate_limit: RateLimitSpec | None = None
    models: list[str] = Field(default_factory=lambda: ["*"], description="'*' allows all")
    groups: list[str] = Field(default_factory=lambda: ["*"], description="'*' allows all")
    operator: bool = Field(
        default=False, description="may send x-sluice-group to reach a group directly"
    )
    weight: float = Field(
        default=1.0,
        gt=0,
        le=1000,
        description="its share of a busy group against other tenants of the same priority "
        "(2.0: twice the service of a tenant of weight 1 while both wait)",
    )
    _key_origins: tuple[KeyPath, ...] | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _digests_are_not_plain_keys(self) -> TenantSpec:
        """`api_keys: [sha256:<hex>]` is a digest: move it to `api_key_sha256`, where
        everything downstream looks for digests, and remember where it was written. A
        sealed entry (`sealed:...`, a stored revision read without the installation's key,
        as a client of the API reads it) is no key at all: it is dropped, never taken as a
        plain key a caller could send."""
        if not any(k.startswith((DIGEST_PREFIX, SEALED_PREFIX)) for k in self.api_keys):
            return self
        plain: list[str] = []
        plain_at: list[KeyPath] = []
        moved: list[str] = []
        moved_at: list[KeyPath] = []
        for j, key in enumerate(self.api_keys):
            if key.startswith(SEALED_PREFIX):
                continue
            digest = digest_entry(key)
            if digest is None:
                plain.append(key)
                plain_at.append(("api_keys", j))
            else:
                moved.append(digest)
                moved_at.append(("api_keys", j))
        given = [("api_key_sha256", k) for k in range(len(self.api_key_sha256))]
        # The model is frozen; this runs once, while it is being built.
        object.__setattr__(self, "api_keys", plain)
        object.__setattr__(self, "api_key_sha256", [*self.api_key_sha256, *moved])
        self.__pydantic_fields_set__.add("api_key_sha256")
        self._key_origins = (*plain_at, *given, *moved_at)
        return self

    @property
    def key_origins(self) -> tuple[KeyPath, ...]:
        """Where each entry of `api_keys` then `api_key_sha256` was written, relative to the
        tenant (moving digests out of `api_keys`, or resolving key sources, shifts them)."""
        origins = self._key_origins
        if origins is not None and len(origins) == len(self.api_keys) + len(self.api_key_sha256):
            return origins
        return (
            *(("api_keys", j) for j in range(len(self.api_keys))),
            *(("api_key_sha256", k) for k in range(len(self.api_key_sha256))),
        )

    def key_digests(self) -> list[tuple[KeyPath, str]]:
        """Every key of the tenant as (where it was written, sha256 hex digest)."""
        digests = [*(key_digest(k) for k in self.api_keys), *self.api_key_sha256]
        return list(zip(self.key_origins, digests, strict=True))

    def with_source_digests(self, found: Sequence[tuple[KeyPath, str]]) -> TenantSpec:
        """A copy whose `api_key_sha256` holds `found` (digests read from `api_keys_env` /
        `api_keys_file`) instead of any it held from those sources before."""
        origins = self.key_origins
        n_plain = len(self.api_keys)
        kept = [
            (at, d)
            for at, d in zip(origins[n_plain:], self.api_key_sha256, strict=True)
            if at[0] not in KEY_SOURCE_FIELDS
        ]
        kept += [(at, check_digest(d)) for at, d in found]
        copy = self.model_copy(update={"api_key_sha256": [d for _, d in kept]})
        copy._key_origins = (*origins[:n_plain], *(at for at, _ in kept))
        return copy


class RouteMatch(_Strict):
    """All given conditions must hold; an empty list or map means any."""

    tenants: list[str] = Field(default_factory=list)
    models: list[str] = Field(default_factory=list)
    priorities: list[Priority] = Field(default_factory=list)
    headers: dict[str, str] = Field(default_factory=dict, description="exact value")
    header_prefixes: dict[str, str] = Field(default_factory=dict, description="value prefix")


class WeightedTarget(_Strict):
    group: Name
    weight: int = Field(ge=0, le=1_000_000)


class MirrorSpec(_Strict):
    """Shadow a share of matching requests to another group; its answers are discarded."""

    group: Name
    percent: float = Field(gt=0, le=100)


class RouteSpec(_Strict):
    """Ordered rule: the first whose `match` holds sends the request `to` a group, or splits
    it by weight over several (R1, R2); every request logs the rule's `tag` (R4)."""

    tag: Name
    match: RouteMatch = RouteMatch()
    to: Name | list[WeightedTarget]
    fallback: list[Name] = Field(
        default_factory=list, description="tried in order when the target has no headroom"
    )
    mirror: MirrorSpec | None = None

    @model_validator(mode="after")
    def _weights_add_up(self) -> RouteSpec:
        if isinstance(self.to, list):
            if not self.to:
                raise ValueError("'to' needs at least one {group, weight}")
            if sum(t.weight for t in self.to) <= 0:
                raise ValueError("the weights in 'to' must add up to more than 0")
        return self


class GatewayLimits(_Strict):
    """What one client may cost the gateway before it is authenticated (defaults in the spirit
    of nginx and Envoy). Each refusal is a JSON error naming the limit and its value."""

    max_header_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        le=1024 * 1024,
        description="the request head as sent (request line and header lines), bytes: 431",
    )
    max_headers: int = Field(default=100, ge=8, le=10_000, description="header lines: 431")
    max_request_line_bytes: int = Field(
        default=8 * 1024, ge=256, le=1024 * 1024, description="the request URL, bytes: 414"
    )
    max_body_bytes: int = Field(
        default=8 * 1024 * 1024, ge=1024, le=1024 * 1024 * 1024, description="bytes: 413"
    )
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description="the whole head must arrive within this long of its first byte (of the "
        "connection's opening, for its first request): 408, then close",
    )
    body_timeout_s: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="the whole body must arrive within this long of the end of the head: 408",
    )
    keepalive_timeout_s: float = Field(
        default=75.0, gt=0, le=3600, description="an idle connection closes after this long"
    )
    max_connections: int = Field(
        default=10_000, ge=0, description="client connections at once (0: no cap): 503"
    )
    max_connections_per_ip: int = Field(
        default=256,
        ge=0,
        description="client connections at once from one address (0: no cap): 503; raise it "
        "behind a load balancer, whose connections all come from few addresses",
    )
    max_json_depth: int = Field(
        default=64, ge=2, le=1000, description="nesting of the request body's JSON: 400"
    )
    write_stall_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="a client that reads nothing of its answer for this long while the "
        "gateway has more for it than its buffers hold is cut off, and the instance's "
        "connection closed so it stops generating",
    )


class GatewaySpec(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    limits: GatewayLimits = GatewayLimits()


class RetentionSpec(_Strict):
    """How much history is kept: logs rotate by size (renamed, and their writer, the
    gateway or an instance's worker, moves to a fresh file: no line is lost), store rows
    expire by age; the audit log is kept longest, and revoked or expired tokens as long as
    it (its rows name them). Nothing still in use goes, whatever its age: a running drill
    or rollout, a pending proposal, a live token, and the latest drill firing of each
    schedule, capacity run of each group/kind/model version (and a group's latest load
    tests), and run of each rollout. A scheduled drill's token is deleted as its run ends.
    Applied every `interval_s` and by `sluice gc`."""

    access_log_max_mb: float = Field(default=100.0, gt=0, le=100_000)
    access_log_keep: int = Field(default=5, ge=1, le=100, description="rotated files kept")
    instance_log_max_mb: float = Field(default=20.0, gt=0, le=100_000)
    instance_log_keep: int = Field(default=2, ge=1, le=100)
    stopped_instance_logs_days: float = Field(default=7.0, gt=0, le=3650)
    events_days: float = Field(default=30.0, gt=0, le=3650)
    decisions_days: float = Field(default=30.0, gt=0, le=3650)
    loans_days: float = Field(default=90.0, gt=0, le=3650, description="ended loans")
    audit_days: float = Field(default=400.0, gt=0, le=36_500)
    drill_fires_days: float = Field(
        default=90.0, gt=0, le=3650, description="finished scheduled-drill firings"
    )
    capacity_runs_days: float = Field(
        default=365.0, gt=0, le=3650, description="load test and drill reports"
    )
    proposals_days: float = Field(
        default=180.0, gt=0, le=3650, description="approved or rejected proposals"
    )
    rollouts_days: float = Field(default=365.0, gt=0, le=3650, description="ended rollout runs")
    tokens_days: float | None = Field(
        default=None,
        gt=0,
        le=36_500,
        description="revoked or expired tokens, from when they ended; default: audit_days, "
        "and never less (the audit log's rows name tokens)",
    )
    interval_s: float = Field(default=300.0, ge=10, le=86_400)

    @property
    def tokens_kept_days(self) -> float:
        """How long a revoked or expired token is kept: `tokens_days`, else `audit_days`."""
        return self.audit_days if self.tokens_days is None else self.tokens_days

    @model_validator(mode="after")
    def _audit_kept_longest(self) -> RetentionSpec:
        longest = max(self.events_days, self.decisions_days, self.loans_days)
        if self.audit_days < longest:
            raise ValueError(
                f"audit_days = {self.audit_days:g} must be >= every other retention "
                f"({longest:g}): the audit log is kept longest"
            )
        if self.tokens_days is not None and self.tokens_days < self.audit_days:
            raise ValueError(
                f"tokens_days = {self.tokens_days:g} must be >= audit_days "
                f"({self.audit_days:g}): audit rows name tokens, so a token is kept as long "
                "as the audit log"
            )
        return self


class PlatformSpec(_Strict):
    """The whole desired state an operator writes (one YAML file)."""

    gateway: GatewaySpec = GatewaySpec()
    control: ControlSpec = ControlSpec()
    retention: RetentionSpec = RetentionSpec()
    observability: ObservabilitySpec = ObservabilitySpec()
    instances: InstancesSpec = InstancesSpec()
    pools: list[PoolSpec] = Field(min_length=1)
    groups: list[GroupSpec] = Field(default_factory=list)
    tenants: list[TenantSpec] = Field(default_factory=list)
    routes: list[RouteSpec] = Field(default_factory=list)
    budget: BudgetSpec | None = Field(default=None, description="all groups together (Q6)")
    schedule_templates: dict[str, list[ScheduleEntry]] = Field(
        default_factory=dict, description="named scheduled floors groups refer to (S8)"
    )
    rollouts: list[RolloutSpec] = Field(
        default_factory=list, description="canary rollouts, baseline group -> canary group (C1)"
    )
    drills: list[DrillSchedule] = Field(
        default_factory=list, description="peak drills run on a cron (O5)"
    )
    reclaim: ReclaimSpec = Field(
        default=ReclaimSpec(), description="chronic under-use proposed back to the pool (Q3)"
    )

    def group(self, name: str) -> GroupSpec | None:
        return next((g for g in self.groups if g.name == name), None)

    def pool(self, name: str) -> PoolSpec | None:
        return next((p for p in self.pools if p.name == name), None)
