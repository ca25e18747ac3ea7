"""The operator's language: pools, groups, tenants and routes, as pydantic models.

Field-level rules (types, ranges) live on the fields; cross-references (a group's pool,
memory fit, route targets) are checked in `spec.checks` so each problem gets its own path.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sluice.spec.autoscaling import AutoscalingSpec, ScheduleEntry, SloSpec
from sluice.spec.quota import BudgetSpec, QuotaSpec
from sluice.spec.rollout import RolloutSpec

__all__ = [
    "ControlSpec",
    "EmbeddingParams",
    "GatewaySpec",
    "GroupSpec",
    "HealthSpec",
    "MirrorSpec",
    "ModelSpec",
    "OutlierSpec",
    "PlatformSpec",
    "PoolSpec",
    "Priority",
    "QueueSpec",
    "RateLimitSpec",
    "ResourcesSpec",
    "ReviewSpec",
    "RouteMatch",
    "RouteSpec",
    "ServiceTime",
    "SimParams",
    "TenantSpec",
    "WarmupSpec",
    "WeightedTarget",
]

Name = Annotated[str, Field(pattern=r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")]
"""Lowercase letters, digits, '.', '_' and '-'; starts and ends alphanumeric; <= 63 chars."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PoolSpec(_Strict):
    """An inventory of accelerators of one type. Without real GPUs they are virtual units."""

    name: Name
    accelerator: str = Field(default="virtual", description="accelerator type, e.g. h100-80g")
    count: int = Field(ge=0, description="accelerators in the pool")
    memory_gb: float = Field(gt=0, description="memory of ONE accelerator, in GiB")
    price_per_hour: float = Field(default=0.0, ge=0, description="per accelerator")
    purpose: Literal["inference", "training"] = Field(
        default="inference", description="inference groups never use training pools (Q5)"
    )


class FixedServiceTime(_Strict):
    kind: Literal["fixed"] = "fixed"
    seconds: float = Field(ge=0)


class LognormalServiceTime(_Strict):
    kind: Literal["lognormal"]
    median_s: float = Field(gt=0)
    sigma: float = Field(ge=0, le=5)


class LinearServiceTime(_Strict):
    """seconds = a + b * input_tokens + c * output_tokens (prefill and decode cost)."""

    kind: Literal["linear"]
    a: float = Field(ge=0)
    b: float = Field(default=0.0, ge=0)
    c: float = Field(default=0.0, ge=0)


ServiceTime = Annotated[
    FixedServiceTime | LognormalServiceTime | LinearServiceTime, Field(discriminator="kind")
]


class SimParams(_Strict):
    """A stand-in for a heavy model that really takes its time (asyncio sleeps)."""

    startup_s: float = Field(default=1.0, ge=0, description="model load time before /ready")
    service_time: ServiceTime = FixedServiceTime(seconds=0.05)
    memory_gb: float = Field(default=1.0, ge=0, description="declared model memory, GiB")
    output_tokens: int = Field(default=16, ge=1, le=100_000, description="when max_tokens unset")
    seed: int = Field(
        default=0,
        description="0: text reads 'tok0 tok1 ...'; else words keyed by seed, version, prompt",
    )
    error_rate: float = Field(
        default=0.0, ge=0, le=1, description="share of requests answered HTTP 500 (bad canary)"
    )
    empty_rate: float = Field(
        default=0.0, ge=0, le=1, description="share of generations answered with empty text"
    )


class EmbeddingParams(_Strict):
    """A real sentence-transformers model on CPU (all-MiniLM-L6-v2, shipped offline)."""

    memory_gb: float = Field(default=0.5, ge=0)
    max_batch: int = Field(default=64, ge=1, le=4096)


class ModelSpec(_Strict):
    runtime: Literal["sim", "embedding"]
    version: str = Field(default="v1", min_length=1, max_length=64)
    sim: SimParams | None = None
    embedding: EmbeddingParams | None = None

    @model_validator(mode="after")
    def _params_match_runtime(self) -> ModelSpec:
        other = "embedding" if self.runtime == "sim" else "sim"
        if getattr(self, other) is not None:
            raise ValueError(f"runtime is {self.runtime!r}; remove the '{other}:' block")
        return self

    @property
    def memory_gb(self) -> float:
        params = self.sim or self.embedding
        if params is not None:
            return params.memory_gb
        return SimParams().memory_gb if self.runtime == "sim" else EmbeddingParams().memory_gb


class ResourcesSpec(_Strict):
    pool: Name
    accelerators: int = Field(default=1, ge=1, le=64, description="per instance")
    memory_gb: float = Field(gt=0, description="accelerator memory one instance needs, GiB")


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


class OutlierSpec(_Strict):
    """Eject an instance that keeps failing (connect errors, 5xx), like Envoy's outlier
    detection; each repeat ejection lasts longer (base x times ejected)."""

    consecutive_failures: int = Field(default=5, ge=1, le=1000)
    base_ejection_s: float = Field(default=30.0, gt=0, le=3600)
    max_ejected_percent: int = Field(default=50, ge=0, le=100)


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
    outlier: OutlierSpec = OutlierSpec()
    autoscaling: AutoscalingSpec | None = Field(
        default=None, description="scale by load; `replicas` is then the starting count"
    )
    slo: SloSpec | None = None
    quota: QuotaSpec = QuotaSpec()
    budget: BudgetSpec | None = None

    def template(self) -> str:
        """Fingerprint of what an instance runs; a change rolls the group's instances."""
        body = {
            "models": {k: v.model_dump(mode="json") for k, v in sorted(self.models.items())},
            "resources": self.resources.model_dump(mode="json"),
            "max_concurrency": self.max_concurrency,
        }
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        return digest[:12]


Priority = Literal["high", "normal", "low"]


class RateLimitSpec(_Strict):
    """Token bucket: `rps` sustained requests per second, bursts up to `burst`."""

    rps: float = Field(gt=0)
    burst: int = Field(default=0, ge=0, description="0: same as rps, at least 1")


class TenantSpec(_Strict):
    """A business caller: its API keys, default priority, and what it may reach (R7)."""

    name: Name
    business: str = ""
    api_keys: list[str] = Field(default_factory=list, description="plain keys; stored hashed")
    api_key_sha256: list[str] = Field(
        default_factory=list, description="keys given as sha256 hex digests (never in clear)"
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


class GatewaySpec(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)


class ReviewSpec(_Strict):
    """R5: which changes need a second person (`sluice propose` then `sluice approve`)."""

    routes: bool = Field(
        default=False,
        description="routes, tenants and rollouts change only through an approved proposal",
    )


class ControlSpec(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=0, ge=0, le=65535, description="0: any free port")
    review: ReviewSpec = ReviewSpec()


class PlatformSpec(_Strict):
    """The whole desired state an operator writes (one YAML file)."""

    gateway: GatewaySpec = GatewaySpec()
    control: ControlSpec = ControlSpec()
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

    def group(self, name: str) -> GroupSpec | None:
        return next((g for g in self.groups if g.name == name), None)

    def pool(self, name: str) -> PoolSpec | None:
        return next((p for p in self.pools if p.name == name), None)
