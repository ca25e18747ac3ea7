"""A batching server's capacity at the SLO (`sluice.policy.autoscale.batching`) against its
closed forms, and the Sluice policy sizing a batching group on it (issue 36)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest
from scipy.stats import poisson

from sluice.policy.autoscale import (
    Decision,
    GroupLoad,
    SluiceMemory,
    SluicePolicy,
    TokenLoad,
    build_policy,
)
from sluice.policy.autoscale.batching import ServerModel, batching_capacity
from sluice.policy.autoscale.factory import declared_server
from sluice.sim import InstanceModel, generate, prepare, run
from sluice.sim.batching import LLAMA3_8B_H100, BatchingParams
from sluice.sim.model import batch_tokens
from sluice.spec import load_spec_file
from sluice.spec.autoscaling import SloSpec
from tests.unit.test_autoscale_sluice import World, spec

ROOT = Path(__file__).resolve().parents[2]
CALM = {"panic": {"enabled": False}}


def server(**kw: float) -> ServerModel:
    base: dict[str, float] = {
        "max_seqs": 256,
        "kv_tokens": math.inf,
        "prefill_tps": math.inf,
        "step_base_s": 0.01,
    }
    return ServerModel(**(base | kw))  # type: ignore[arg-type]


def test_the_slot_model_serves_its_slots_over_each_request_s_time() -> None:
    # no prefill, no batch cost: max_seqs sequences of O tokens at c0 a step
    cap = batching_capacity(BatchingParams.slots(256, 0.01), 0.0, 50.0, None, None)
    assert cap.limit == "max_seqs"
    assert cap.rps == pytest.approx(256 / (50 * 0.01), rel=1e-9)
    assert cap.tpot_mean_s == pytest.approx(0.01) and cap.prefill_share == 0.0


def test_a_tpot_bound_without_prefill_is_the_closed_form() -> None:
    # t = c0 / (1 - a rate O), a = c1 + c2 (P + O/2); t = tau -> rate = (1 - c0/tau) / (a O)
    s = server(max_seqs=4096, step_base_s=0.008, step_per_seq_s=5e-5, step_per_kv_token_s=4e-8)
    p, o, tau = 1000.0, 200.0, 0.05
    cap = batching_capacity(s, p, o, None, tau)
    a = 5e-5 + 4e-8 * (p + o / 2)
    assert cap.limit == "tpot"
    assert cap.rps == pytest.approx((1 - 0.008 / tau) / (a * o), rel=1e-6)
    assert cap.tpot_mean_s == pytest.approx(tau, rel=1e-6)
    assert cap.batch == pytest.approx(cap.rps * o * tau, rel=1e-9)


def test_a_ttft_bound_is_the_mm1_wait_quantile_plus_prefill_and_a_step() -> None:
    s = server(prefill_tps=10_000.0, step_base_s=0.01)
    p, theta, q = 2000.0, 1.5, 0.99
    cap = batching_capacity(s, p, 1.0, theta, None, q)  # one-token answers: no TPOT
    assert cap.limit == "ttft"
    pre = p / 10_000.0
    phi = cap.rps * pre
    assert phi == pytest.approx(cap.prefill_share)
    wait = pre / (1 - phi) * math.log(phi / (1 - q))
    assert wait + pre + 0.01 == pytest.approx(theta, rel=1e-6)  # a step is c0 alone here


def test_a_tpot_bound_with_prefill_counts_the_poisson_quantile_of_prefills() -> None:
    p, o, tau, q = 2048.0, 28.0, 0.1, 0.99
    cap = batching_capacity(LLAMA3_8B_H100, p, o, None, tau, q)
    assert cap.limit == "tpot"
    b = LLAMA3_8B_H100

    def tpot_q(rate: float) -> float:
        pre = p / b.prefill_tps
        k = p + o / 2
        t = b.step_base_s / (
            1 - rate * pre - (b.step_per_seq_s + b.step_per_kv_token_s * k) * rate * o
        )
        step = b.step_base_s + (b.step_per_seq_s + b.step_per_kv_token_s * k) * rate * o * t
        return step + pre * poisson.ppf(q, rate * (o - 1) * t) / (o - 1)

    assert tpot_q(cap.rps) <= tau < tpot_q(cap.rps * 1.001)
    # a looser quantile serves more
    assert batching_capacity(LLAMA3_8B_H100, p, o, None, tau, 0.9).rps > cap.rps


def test_both_bounds_share_the_miss_budget() -> None:
    """With TTFT and TPOT bounds, each is held at 1 - (1 - q) / 2, so the typical request
    meets both with probability q (Bonferroni): the capacity is the lower of the two."""
    p, o = 2048.0, 28.0
    both = batching_capacity(LLAMA3_8B_H100, p, o, 2.0, 0.1, 0.99)
    ttft = batching_capacity(LLAMA3_8B_H100, p, o, 2.0, None, 0.995)
    tpot = batching_capacity(LLAMA3_8B_H100, p, o, None, 0.1, 0.995)
    assert both.rps == pytest.approx(min(ttft.rps, tpot.rps), abs=1e-6)
    assert both.limit == min((ttft, tpot), key=lambda c: c.rps).limit
    # a one-token answer has no TPOT: the TTFT bound alone, at q
    one = batching_capacity(LLAMA3_8B_H100, p, 1.0, 2.0, 0.1, 0.99)
    assert one.rps == batching_capacity(LLAMA3_8B_H100, p, 1.0, 2.0, None, 0.99).rps


def test_the_kv_cache_bounds_the_mean_sequences_it_holds() -> None:
    s = server(kv_tokens=100_000.0, step_base_s=0.01)
    p, o = 3000.0, 400.0
    cap = batching_capacity(s, p, o, None, None)
    assert cap.limit == "kv_cache"
    assert cap.batch * (p + o / 2) == pytest.approx(100_000.0, rel=1e-6)


def test_a_request_that_misses_its_bounds_alone_has_no_capacity() -> None:
    cap = batching_capacity(LLAMA3_8B_H100, 40_000.0, 100.0, 2.0, 0.1)  # 2.7 s of prefill
    assert cap.rps == 0.0 and cap.limit == "alone"


def test_longer_prompts_and_tighter_bounds_serve_fewer_requests() -> None:
    caps = [batching_capacity(LLAMA3_8B_H100, p, 100.0, 2.0, 0.1).rps for p in (200, 1000, 4000)]
    assert caps[0] > caps[1] > caps[2] > 0
    assert batching_capacity(LLAMA3_8B_H100, 1000, 100, 1.0, 0.05).rps < caps[1]


@pytest.mark.parametrize(
    ("prompt", "output", "ttft", "tpot", "q"),
    [(-1, 10, 2, 0.1, 0.99), (10, 0.5, 2, 0.1, 0.99), (10, 10, 0, 0.1, 0.99), (10, 10, 2, 0.1, 1)],
)
def test_lengths_and_bounds_out_of_range_are_refused(
    prompt: float, output: float, ttft: float, tpot: float, q: float
) -> None:
    with pytest.raises(ValueError):
        batching_capacity(LLAMA3_8B_H100, prompt, output, ttft, tpot, q)


def test_a_fitted_model_without_a_step_time_sizes_nothing() -> None:
    assert ServerModel.from_fit({"step_base_s": None}, 64) is None
    m = ServerModel.from_fit(
        {
            "step_base_s": 0.01,
            "step_per_seq_s": 1e-4,
            "step_per_kv_token_s": None,
            "prefill_tps": None,
        },
        64,
    )
    assert m == ServerModel(64, math.inf, math.inf, 0.01, 1e-4, 0.0)


def test_the_factory_reads_the_declared_batching_server() -> None:
    loaded = load_spec_file(ROOT / "examples" / "reference-sim-batching.yaml").spec
    g = loaded.groups[0]
    declared = declared_server(g)
    assert declared == ServerModel(256, 400_000.0, 15_000.0, 0.008, 5e-5, 4e-8)
    pol = build_policy(g, {})
    assert isinstance(pol, SluicePolicy) and pol.server == declared
    fitted = ServerModel(256, math.inf, 9_000.0, 0.01)
    pol2 = build_policy(g, {}, server=fitted)
    assert isinstance(pol2, SluicePolicy) and pol2.server == fitted


class _Counted:
    """The policy fed a `TokenLoad`: `tokens` of the requests counted so far."""

    def __init__(self, policy: SluicePolicy, **tokens: int) -> None:
        self.policy, self.name, self.tokens = policy, policy.name, tokens

    def initial(self) -> SluiceMemory:
        return self.policy.initial()

    def step(
        self, memory: SluiceMemory, load: GroupLoad, now: float
    ) -> tuple[Decision, SluiceMemory]:
        fields = {f.name: getattr(load, f.name) for f in dataclasses.fields(load)}
        return self.policy.step(memory, TokenLoad(**fields, **self.tokens), now)


TOKENS = {"token_requests": 1000, "prompt_tokens": 6_000_000, "output_tokens": 28_000}


def _world(with_server: bool, counted: bool = True) -> World:
    slo = SloSpec(ttft_ms=2000, tpot_ms=100, target=0.99)
    pol = SluicePolicy(spec(**CALM), slo=slo, server=LLAMA3_8B_H100 if with_server else None)
    scaler: Any = _Counted(pol, **TOKENS) if counted else pol
    return World(scaler, current=2, service_s=0.5)


def test_a_batching_group_is_sized_on_its_capacity_and_says_so() -> None:
    """10 requests in flight at 0.5 s: 20 req/s. On 4 slots an instance, 3 instances hold
    them at the default utilization with the steady margin (5); the batching server's
    capacity at 6,000-token prompts and 28-token answers is about 0.37 req/s (its TTFT
    bound: 0.4 s prefills), so at least 54 are needed, and the reason names the sizing."""
    slots = _world(False)
    d_slots = slots.run(90, 10)
    batch = _world(True)
    d_batch = batch.run(90, 10)
    cap = batching_capacity(LLAMA3_8B_H100, 6000, 28, 2.0, 0.1, 0.99)
    assert cap.limit == "ttft"
    assert d_batch.signals["capacity_rps"] == round(cap.rps, 3)
    per_instance = cap.rps * d_batch.signals["service_s"]
    assert d_batch.signals["slots_per_instance"] == pytest.approx(per_instance, rel=1e-2)
    assert "batching capacity" in d_batch.reason and "ttft bound" in d_batch.reason
    assert d_batch.desired >= math.ceil(20 / cap.rps) > d_slots.desired == 5
    assert "capacity_rps" not in d_slots.signals and "batching" not in d_slots.reason


def test_without_token_counts_a_batching_group_keeps_its_slots() -> None:
    a, b = _world(False, counted=False), _world(True, counted=False)
    da, db = a.run(90, 10), b.run(90, 10)
    assert a.counts == b.counts and da.signals == db.signals and da.reason == db.reason


def test_the_simulator_feeds_the_tokens_of_the_requests_answered_so_far() -> None:
    loaded = load_spec_file(ROOT / "examples" / "reference-sim-batching.yaml").spec
    work = prepare(InstanceModel.from_spec(loaded, loaded.groups[0]), generate("poisson-1", 0))
    seen: list[GroupLoad] = []

    class Spy:
        name = "spy"

        def initial(self) -> None:
            return None

        def step(self, memory: None, load: GroupLoad, now: float) -> tuple[Decision, None]:
            seen.append(load)
            return Decision(load.current, "spy"), None

    run(work, Spy())  # type: ignore[arg-type]
    prompt, output = batch_tokens(LLAMA3_8B_H100, work.trace.input_tokens, work.trace.output_tokens)
    last = seen[-1]
    assert all(isinstance(x, TokenLoad) for x in seen)
    assert isinstance(last, TokenLoad) and last.token_requests == last.completions > 0
    # the answered ones' tokens: at most all of the trace's, and their mean lengths
    assert 0 < last.prompt_tokens <= round(prompt.sum())
    assert 0 < last.output_tokens <= round(output.sum())
    mean = last.prompt_tokens / last.token_requests
    assert 0.5 * prompt.mean() < mean < 2 * prompt.mean()
