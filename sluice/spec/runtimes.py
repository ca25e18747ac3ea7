"""The params blocks of Sluice's own model runtimes (`sim`, `embedding`): what a stand-in
model costs (start-up, service time, faults) and how the real embedding model batches.
`transformers` has its own module (`spec.hf`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from sluice.spec.autoscaling import _Strict

__all__ = [
    "EmbeddingParams",
    "FixedServiceTime",
    "LinearServiceTime",
    "LognormalServiceTime",
    "ServiceTime",
    "SimParams",
]


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
    shared_backend: str | None = Field(
        default=None,
        description="a lock file every instance's requests take turns holding for their "
        "service time: a backend outside the group that serves one request at a time",
    )


class EmbeddingParams(_Strict):
    """A real sentence-transformers model on CPU (all-MiniLM-L6-v2, shipped offline)."""

    memory_gb: float = Field(default=0.5, ge=0)
    max_batch: int = Field(default=64, ge=1, le=4096)
