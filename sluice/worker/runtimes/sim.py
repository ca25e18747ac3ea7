"""`sim`: a stand-in for a heavy model that really takes its time, without any hardware.

It sleeps (asyncio) for its start-up time and for each request's service time, so a fleet of
sim workers behaves like real inference under load: queues build, latency grows, draining
takes time. Service times come from a `random.Random` seeded by the spec's `seed` and the
instance id, so a run is reproducible and two instances still differ.

Generated text never depends on the instance, so a compare suite sent twice to one behaviour
matches exactly: with seed 0 it reads "tok0 tok1 ..." (predictable for tests); with any other
seed it is words drawn from a generator seeded by (seed, version, prompt), so two versions read
visibly differently. `error_rate` and `empty_rate` make a deliberately bad canary.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import math
import os
import random
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass

from sluice.core.errors import SluiceError
from sluice.spec.models import ModelSpec
from sluice.spec.runtimes import (
    FixedServiceTime,
    LinearServiceTime,
    LognormalServiceTime,
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
    "SimFailure",
    "SimPlan",
    "SimRuntime",
    "count_tokens",
    "pseudo_vector",
    "service_seconds",
    "token_text",
    "word_pieces",
]

EMBEDDING_DIM = 384
"""Same width as the real embedding runtime, so callers can switch between the two."""


def count_tokens(text: str) -> int:
    """A cheap token estimate: whitespace-separated words, at least 1."""
    return max(1, len(text.split()))


def token_text(index: int) -> str:
    """The `index`-th generated piece; joined, the pieces read "tok0 tok1 tok2 ..."."""
    return f"tok{index}" if index == 0 else f" tok{index}"


_VOCABULARY = (
    "the a of to and in is it that for on with as was at by this be from or an are not but "
    "have all one can will more when up out so what about into than them its only time new "
    "some could these two may first then do any like now over such our make way even most "
    "model river stone quiet bright answer system simple green window number signal"
)
_WORDS = tuple(_VOCABULARY.split())


def word_pieces(seed: int, version: str, prompt: str, count: int) -> list[str]:
    """`count` pieces of text for one generation. Seed 0 gives the counter text; any other
    seed draws words from a generator keyed by (seed, version, prompt): the same request to
    the same behaviour reads the same on every instance, and another version reads otherwise."""
    if seed == 0:
        return [token_text(i) for i in range(count)]
    key = hashlib.sha256(f"{seed}\0{version}\0{prompt}".encode()).digest()
    rng = random.Random(key)
    words = rng.choices(_WORDS, k=count)
    return [word if i == 0 else f" {word}" for i, word in enumerate(words)]


class SimFailure(SluiceError):
    """A failure the sim answers on purpose (`error_rate`), like a broken model server."""

    http_status = 500
    code = "internal_error"


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
    empty: bool = False
    """An `empty_rate` draw: the model answers nothing (0 tokens, finish "stop")."""


class SimRuntime(Runtime):
    endpoints = frozenset(Endpoint)

    def __init__(self, model: str, spec: ModelSpec, instance_id: str) -> None:
        super().__init__(model, spec, instance_id)
        self.params = spec.sim or SimParams()
        self._rng = random.Random(f"{self.params.seed}:{instance_id}")
        self._backend = SharedBackend(self.params.shared_backend)

    async def load(self) -> None:
        await asyncio.sleep(self.params.startup_s)

    def inject_fault(self) -> None:
        """Fail a share `error_rate` of requests with HTTP 500; draws only when it is > 0, so
        the service-time sequence of a spec without faults is unchanged."""
        rate = self.params.error_rate
        if rate > 0 and self._rng.random() < rate:
            raise SimFailure(
                f"simulated failure of model {self.model!r} (sim error_rate {rate})",
                type="server_error",
            )

    def pieces(self, request: TextRequest, plan: SimPlan) -> list[str]:
        if plan.empty:
            return []
        return word_pieces(self.params.seed, self.spec.version, request.prompt, plan.output_tokens)

    def plan(self, request: TextRequest) -> SimPlan:
        """Token counts and service time for `request`; draws from the seeded generator."""
        input_tokens = count_tokens(request.prompt)
        if request.max_tokens is not None:
            output_tokens, finish_reason = request.max_tokens, "length"
        else:
            output_tokens, finish_reason = self.params.output_tokens, "stop"
        seconds = service_seconds(self.params.service_time, self._rng, input_tokens, output_tokens)
        rate = self.params.empty_rate
        if rate > 0 and self._rng.random() < rate:
            return SimPlan(input_tokens, 0, seconds, "stop", empty=True)
        return SimPlan(input_tokens, output_tokens, seconds, finish_reason)

    async def complete(self, request: TextRequest) -> Completion:
        plan = self.plan(request)
        async with self._backend.turn():
            await asyncio.sleep(plan.seconds)
        text = "".join(self.pieces(request, plan))
        return Completion(text, plan.input_tokens, plan.output_tokens, plan.finish_reason)

    async def stream(self, request: TextRequest) -> TokenStream:
        plan = self.plan(request)
        pieces = self.pieces(request, plan)
        tokens = self._backend.holding(_paced_tokens(plan, pieces))
        return TokenStream(plan.input_tokens, plan.finish_reason, tokens)

    async def embed(self, inputs: list[str]) -> Embeddings:
        input_tokens = sum(count_tokens(text) for text in inputs)
        seconds = service_seconds(self.params.service_time, self._rng, input_tokens, 0)
        async with self._backend.turn():
            await asyncio.sleep(seconds)
        return Embeddings([pseudo_vector(self.model, text) for text in inputs], input_tokens)


class SharedBackend:
    """`sim.shared_backend`: a backend outside the group that serves one request at a time
    (a database, a downstream API), shared by every instance through an exclusive lock on
    one file; more instances then add no throughput (S12's "did it help?" sees that). Within
    an instance requests queue on an asyncio lock, so one thread at most waits on the file."""

    def __init__(self, path: str | None) -> None:
        self._path = path
        self._local = asyncio.Lock()
        self._fd: int | None = None

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        if self._path is None:
            yield
            return
        async with self._local:
            if self._fd is None:
                self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600)
            await asyncio.to_thread(fcntl.flock, self._fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    async def holding(self, tokens: AsyncGenerator[str, None]) -> AsyncGenerator[str, None]:
        """`tokens`, generated while holding the backend (a stream is one long turn)."""
        async with self.turn():
            async for piece in tokens:
                yield piece


async def _paced_tokens(plan: SimPlan, pieces: list[str]) -> AsyncGenerator[str, None]:
    """Yield the pieces evenly over the plan's service time (deadlines, so no drift)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    if not pieces:
        await asyncio.sleep(plan.seconds)
        return
    step = plan.seconds / len(pieces)
    for index, piece in enumerate(pieces):
        await asyncio.sleep(max(0.0, start + (index + 1) * step - loop.time()))
        yield piece
