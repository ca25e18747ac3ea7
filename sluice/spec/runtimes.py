"""The params blocks of Sluice's own model runtimes (`sim`, `embedding`): what a stand-in
model costs (start-up, service time, faults) and how the real embedding model batches.
`transformers` has its own module (`spec.hf`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from sluice.spec.autoscaling import _Strict

__all__ = [
    "BatchingSpec",
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


class BatchingSpec(_Strict):
    """A simulated instance as a continuously batching server (vLLM-like), in place of
    `service_time`'s independent slots: the simulator's `sluice.sim.batching` model, whose
    fields these are. A request of `p` prompt and `o` output tokens is prefilled at
    `prefill_tps` (pausing the batch), then gains a token per decode step of `step_base_s +
    step_per_seq_s x sequences + step_per_kv_token_s x KV tokens held`; at most `max_seqs`
    run, the rest wait inside the server (FIFO), and a KV cache full of growing sequences
    preempts the newest. TTFT and TPOT come out of it. Read by the simulator only (`sluice
    simulate`, bench/); the live `sim` runtime still sleeps `service_time`."""

    max_seqs: int = Field(
        ge=1, le=65_536, description="sequences running at once (vLLM's max_num_seqs)"
    )
    kv_tokens: float | None = Field(
        default=None,
        ge=1,
        le=1e10,
        description="KV-cache capacity in tokens; unset: unbounded (no preemption)",
    )
    prefill_tps: float | None = Field(
        default=None,
        gt=0,
        le=1e9,
        description="prompt tokens prefilled per second; unset: prefill takes no time",
    )
    step_base_s: float = Field(
        ge=0, le=10, description="decode step time whatever the batch (weights read once)"
    )
    step_per_seq_s: float = Field(
        default=0.0, ge=0, le=1, description="decode step time per sequence in the batch"
    )
    step_per_kv_token_s: float = Field(
        default=0.0,
        ge=0,
        le=1e-3,
        description="decode step time per token the batch holds in its KV cache",
    )

    @model_validator(mode="after")
    def _a_step_takes_time(self) -> BatchingSpec:
        if self.step_base_s + self.step_per_seq_s <= 0:
            raise ValueError(
                "step_base_s + step_per_seq_s must be > 0: a decode step takes time "
                "(e.g. step_base_s: 0.008)"
            )
        return self


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
    batching: BatchingSpec | None = Field(
        default=None,
        description="simulate the instances as a continuously batching server (max_seqs, "
        "KV cache, prefill rate, step time) instead of service_time's slots: TTFT, TPOT and "
        "KV-cache use come out of it (the simulator only)",
    )
    sleep_s: float = Field(
        default=1.0,
        ge=0,
        le=600,
        description="the simulator's sleeping standby: an idle instance put to sleep is asleep "
        "this long after (vLLM's POST /sleep?level=1; an assumption, about a second)",
    )
    wake_s: float = Field(
        default=3.0,
        ge=0,
        le=600,
        description="the simulator's sleeping standby: a wake (POST /wake_up) serves this long "
        "after; vLLM's blog measures a level-1 wake of an 8B model well under 3 s",
    )
    host_memory_gb: float | None = Field(
        default=None,
        ge=0,
        description="host memory an asleep instance holds (level 1: the offloaded weights), "
        "what the simulator prices its asleep time at; unset: memory_gb",
    )


class EmbeddingParams(_Strict):
    """A real sentence-transformers model on CPU (all-MiniLM-L6-v2, shipped offline)."""

    memory_gb: float = Field(default=0.5, ge=0)
    max_batch: int = Field(default=64, ge=1, le=4096)
