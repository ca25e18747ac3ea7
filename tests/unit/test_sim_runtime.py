"""The sim runtime's arithmetic: service times, token counts, determinism, pacing."""

from __future__ import annotations

import asyncio
import math
import random
import statistics

import pytest

from sluice.spec.models import ModelSpec
from sluice.spec.runtimes import (
    FixedServiceTime,
    LinearServiceTime,
    LognormalServiceTime,
    SimParams,
)
from sluice.worker.runtimes import TextRequest
from sluice.worker.runtimes.sim import (
    EMBEDDING_DIM,
    SimRuntime,
    count_tokens,
    pseudo_vector,
    service_seconds,
)


def _runtime(instance_id: str = "grp-a", **params: object) -> SimRuntime:
    spec = ModelSpec(runtime="sim", sim=SimParams.model_validate(params))
    return SimRuntime("m", spec, instance_id)


@pytest.mark.parametrize(
    ("text", "tokens"),
    [("", 1), ("   ", 1), ("hello", 1), ("hello  big\nworld\tagain", 4)],
)
def test_count_tokens_is_a_word_count_of_at_least_one(text: str, tokens: int) -> None:
    assert count_tokens(text) == tokens


def test_fixed_service_time_ignores_tokens() -> None:
    rng = random.Random(0)
    assert service_seconds(FixedServiceTime(seconds=0.25), rng, 10, 1000) == 0.25


def test_linear_service_time_is_prefill_plus_decode() -> None:
    model = LinearServiceTime(kind="linear", a=0.1, b=0.01, c=0.002)
    assert service_seconds(model, random.Random(0), 20, 50) == pytest.approx(0.1 + 0.2 + 0.1)


def test_lognormal_without_spread_is_its_median() -> None:
    model = LognormalServiceTime(kind="lognormal", median_s=0.3, sigma=0.0)
    assert service_seconds(model, random.Random(0), 1, 1) == pytest.approx(0.3)


def test_lognormal_draws_center_on_the_median_and_stay_positive() -> None:
    model = LognormalServiceTime(kind="lognormal", median_s=0.2, sigma=0.5)
    rng = random.Random(42)
    draws = [service_seconds(model, rng, 1, 1) for _ in range(4000)]
    assert min(draws) > 0
    assert statistics.median(draws) == pytest.approx(0.2, rel=0.05)
    assert statistics.stdev(math.log(d) for d in draws) == pytest.approx(0.5, rel=0.05)


def test_output_tokens_come_from_max_tokens_else_the_spec() -> None:
    sim = _runtime(output_tokens=7)
    default = sim.plan(TextRequest("two words"))
    capped = sim.plan(TextRequest("two words", max_tokens=3))
    assert (default.input_tokens, default.output_tokens, default.finish_reason) == (2, 7, "stop")
    assert (capped.output_tokens, capped.finish_reason) == (3, "length")


def test_linear_plan_uses_the_request_token_counts() -> None:
    sim = _runtime(service_time={"kind": "linear", "a": 0.5, "b": 0.1, "c": 0.01})
    plan = sim.plan(TextRequest("a b c d", max_tokens=10))
    assert plan.seconds == pytest.approx(0.5 + 0.4 + 0.1)


def test_same_seed_and_instance_give_the_same_times() -> None:
    lognormal = {"kind": "lognormal", "median_s": 0.1, "sigma": 1.0}
    first, second = (_runtime("grp-a", service_time=lognormal, seed=7) for _ in range(2))
    times = [first.plan(TextRequest("x")).seconds for _ in range(20)]
    assert times == [second.plan(TextRequest("x")).seconds for _ in range(20)]
    assert len(set(times)) == 20


def test_instances_and_seeds_differ() -> None:
    lognormal = {"kind": "lognormal", "median_s": 0.1, "sigma": 1.0}

    def times(instance_id: str, seed: int) -> list[float]:
        sim = _runtime(instance_id, service_time=lognormal, seed=seed)
        return [sim.plan(TextRequest("x")).seconds for _ in range(5)]

    assert times("grp-a", 1) != times("grp-b", 1)
    assert times("grp-a", 1) != times("grp-a", 2)


def test_sim_never_touches_the_global_random() -> None:
    random.seed(123)
    expected = random.random()
    random.seed(123)
    sim = _runtime(service_time={"kind": "lognormal", "median_s": 0.1, "sigma": 1.0})
    sim.plan(TextRequest("x"))
    assert random.random() == expected


def test_complete_and_stream_produce_the_same_text() -> None:
    sim = _runtime(service_time={"kind": "fixed", "seconds": 0.02}, output_tokens=4)

    async def run() -> tuple[str, list[str]]:
        done = await sim.complete(TextRequest("hi"))
        stream = await sim.stream(TextRequest("hi"))
        return done.text, [piece async for piece in stream.pieces]

    text, pieces = asyncio.run(run())
    assert text == "tok0 tok1 tok2 tok3"
    assert pieces == ["tok0", " tok1", " tok2", " tok3"]


def test_stream_spreads_tokens_over_the_service_time() -> None:
    sim = _runtime(service_time={"kind": "fixed", "seconds": 0.2}, output_tokens=4)

    async def arrival_times() -> list[float]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        stream = await sim.stream(TextRequest("hi"))
        return [loop.time() - start async for _ in stream.pieces]

    times = asyncio.run(arrival_times())
    assert times[0] == pytest.approx(0.05, abs=0.03)
    assert times[-1] == pytest.approx(0.2, abs=0.05)


def test_pseudo_vectors_are_deterministic_unit_vectors() -> None:
    first, again, other = (pseudo_vector("m", t) for t in ("cat", "cat", "dog"))
    assert len(first) == EMBEDDING_DIM
    assert first == again != other
    assert math.fsum(x * x for x in first) == pytest.approx(1.0)


def test_sim_embeddings_count_words() -> None:
    sim = _runtime(service_time={"kind": "fixed", "seconds": 0.0})
    result = asyncio.run(sim.embed(["one two", "three"]))
    assert result.prompt_tokens == 3
    assert [len(v) for v in result.vectors] == [EMBEDDING_DIM, EMBEDDING_DIM]
