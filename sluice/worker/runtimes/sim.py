"""`sim`: a stand-in for a heavy model that really takes its time, without any hardware.

It sleeps (asyncio) for its start-up time and for each request's service time, so a fleet of
sim workers behaves like real inference under load: queues build, latency grows, draining
takes time. Service times come from a `random.Random` seeded by the spec's `seed` and the
instance id, so a run is reproducible and two instances still differ.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from sluice.spec.models import (
    FixedServiceTime,
    LinearServiceTime,
    LognormalServiceTime,
    ModelSpec,
    ServiceTime,
    SimParams,
)
from sluice.worker.runtimes.base import (
    Completion,
    Embeddings,
    Endpoint,
    Runtime,
    TextRequest,
    TokenStream,
)

__all__ = [
    "EMBEDDING_DIM",
    "SimPlan",
    "SimRuntime",
    "count_tokens",
    "pseudo_vector",
    "service_seconds",
    "token_text",
]

EMBEDDING_DIM = 384
"""Same width as the real embedding runtime, so callers can switch between the two."""


def count_tokens(text: str) -> int:
    """A cheap token estimate: whitespace-separated words, at least 1."""
    return max(1, len(text.split()))


def token_text(index: int) -> str:
    """The `index`-th generated piece; joined, the pieces read "tok0 tok1 tok2 ..."."""
    return f"tok{index}" if index == 0 else f" tok{index}"


def service_seconds(
    service_time: ServiceTime, rng: random.Random, input_tokens: int, output_tokens: int
) -> float:
    """How long one request takes, from the spec's service-time model."""
    match service_time:
        case FixedServiceTime(seconds=seconds):
            return seconds
        case LognormalServiceTime(median_s=median_s, sigma=sigma):
            return rng.lognormvariate(math.log(median_s), sigma)
        case LinearServiceTime(a=a, b=b, c=c):
            return a + b * input_tokens + c * output_tokens
    raise TypeError(f"unknown service time model: {service_time!r}")


def pseudo_vector(model: str, text: str, dim: int = EMBEDDING_DIM) -> list[float]:
    """A deterministic unit vector for `text`: same input, same vector, on every instance."""
    rng = random.Random(hashlib.sha256(f"{model}\0{text}".encode()).digest())
    raw = [rng.gauss(0.0, 1.0) for _ in range(dim)]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return [x / norm for x in raw]


@dataclass(frozen=True, slots=True)
class SimPlan:
    """What one generation will cost before it runs."""

    input_tokens: int
    output_tokens: int
    seconds: float
    finish_reason: str


class SimRuntime(Runtime):
    endpoints = frozenset(Endpoint)

    def __init__(self, model: str, spec: ModelSpec, instance_id: str) -> None:
        super().__init__(model, spec, instance_id)
        self.params = spec.sim or SimParams()
        self._rng = random.Random(f"{self.params.seed}:{instance_id}")

    async def load(self) -> None:
        await asyncio.sleep(self.params.startup_s)

    def plan(self, request: TextRequest) -> SimPlan:
        """Token counts and service time for `request`; draws from the seeded generator."""
        input_tokens = count_tokens(request.prompt)
        if request.max_tokens is not None:
            output_tokens, finish_reason = request.max_tokens, "length"
        else:
            output_tokens, finish_reason = self.params.output_tokens, "stop"
        seconds = service_seconds(self.params.service_time, self._rng, input_tokens, output_tokens)
        return SimPlan(input_tokens, output_tokens, seconds, finish_reason)

    async def complete(self, request: TextRequest) -> Completion:
        plan = self.plan(request)
        await asyncio.sleep(plan.seconds)
        text = "".join(token_text(i) for i in range(plan.output_tokens))
        return Completion(text, plan.input_tokens, plan.output_tokens, plan.finish_reason)

    async def stream(self, request: TextRequest) -> TokenStream:
        plan = self.plan(request)
        return TokenStream(plan.input_tokens, plan.finish_reason, _paced_tokens(plan))

    async def embed(self, inputs: list[str]) -> Embeddings:
        input_tokens = sum(count_tokens(text) for text in inputs)
        await asyncio.sleep(service_seconds(self.params.service_time, self._rng, input_tokens, 0))
        return Embeddings([pseudo_vector(self.model, text) for text in inputs], input_tokens)


async def _paced_tokens(plan: SimPlan) -> AsyncGenerator[str, None]:
    """Yield the plan's tokens evenly over its service time (deadlines, so no drift)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    step = plan.seconds / plan.output_tokens
    for index in range(plan.output_tokens):
        await asyncio.sleep(max(0.0, start + (index + 1) * step - loop.time()))
        yield token_text(index)
