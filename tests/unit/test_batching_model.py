"""The batching server model (`sluice.sim.batching`): closed forms at its limits (one
sequence, a batch arriving together, a KV-bound batch, preemption by recompute), the slot
setting against an independent FIFO multi-server queue, and, on small random workloads, a
naive re-implementation of the same fluid model (every sequence's tokens advanced at every
event, O(n) a step) plus conservation and order properties."""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import deque

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.sim.batching import (
    LLAMA3_8B_H100,
    BatchingInstance,
    BatchingParams,
    Finished,
    simulate_instance,
)

INF = math.inf


def run_all(eng: BatchingInstance, reqs: list[tuple[float, float, float]]) -> list[Finished]:
    """Offer (arrival, prompt, output) in order, advancing between; every Finished."""
    out: list[Finished] = []
    for i, (t, p, o) in enumerate(reqs):
        out += eng.advance(t)
        eng.offer(i, p, o, t)
    out += eng.advance(INF)
    return out


# -- closed forms ---------------------------------------------------------------------------


def test_one_sequence_alone_matches_the_closed_form() -> None:
    p = BatchingParams(
        max_seqs=4,
        kv_tokens=10_000,
        prefill_tps=5_000,
        step_base_s=0.01,
        step_per_seq_s=0.001,
        step_per_kv_token_s=2e-6,
    )
    prompt, out = 500, 100
    r = simulate_instance([3.0], [prompt], [out], p)
    prefill = prompt / p.prefill_tps
    # step j (0-based) holds prompt + j + 1/2 tokens at its midpoint: the arithmetic series
    decode = out * (p.step_base_s + p.step_per_seq_s) + p.step_per_kv_token_s * (
        prompt * out + out * out / 2
    )
    first_step = p.step_s(1, prompt + 0.5)
    assert r.latency_s[0] == pytest.approx(prefill + decode, rel=1e-12)
    assert r.finish_s[0] == pytest.approx(3.0 + prefill + decode, rel=1e-12)
    assert r.ttft_s[0] == pytest.approx(prefill + first_step, rel=1e-12)
    assert r.tpot_s[0] == pytest.approx((decode - first_step) / (out - 1), rel=1e-12)
    assert r.preemptions[0] == 0
    # a one-token answer has no TPOT
    one = simulate_instance([0.0], [prompt], [1], p)
    assert math.isnan(one.tpot_s[0])
    assert one.ttft_s[0] == pytest.approx(one.latency_s[0]) == pytest.approx(prefill + first_step)


@pytest.mark.parametrize("per_kv", [0.0, 1e-6])
def test_a_batch_arriving_together_prefills_one_after_the_other_then_decodes_together(
    per_kv: float,
) -> None:
    b, prompt, out = 5, 200, 50
    p = BatchingParams(
        max_seqs=8,
        kv_tokens=INF,
        prefill_tps=1_000,
        step_base_s=0.02,
        step_per_seq_s=0.003,
        step_per_kv_token_s=per_kv,
    )
    r = simulate_instance([0.0] * b, [prompt] * b, [out] * b, p)
    prefill = b * prompt / p.prefill_tps  # the batch waits for every prefill
    step_mid = p.step_base_s + p.step_per_seq_s * b
    decode = out * step_mid + per_kv * (b * prompt * out + b * out * out / 2)
    first = step_mid + per_kv * (b * prompt + b / 2)
    np.testing.assert_allclose(r.finish_s, prefill + decode, rtol=1e-12)
    np.testing.assert_allclose(r.ttft_s, prefill + first, rtol=1e-12)
    np.testing.assert_allclose(r.tpot_s, (decode - first) / (out - 1), rtol=1e-12)
    assert r.preemptions.sum() == 0


def test_kv_bound_batch_runs_k_at_a_time_at_the_closed_form_throughput() -> None:
    # prompts of 1000 and answers of 100 in a 4500-token cache: four prompts fit with room to
    # grow (4 x 1100 = 4400), a fifth does not (5000), so it runs in waves of k = 4
    k, prompt, out, waves = 4, 1000, 100, 6
    p = BatchingParams(
        max_seqs=16,
        kv_tokens=4_500,
        prefill_tps=10_000,
        step_base_s=0.01,
        step_per_seq_s=0.002,
        step_per_kv_token_s=1e-6,
    )
    n = k * waves
    r = simulate_instance([0.0] * n, [prompt] * n, [out] * n, p)
    cycle = k * prompt / p.prefill_tps + out * p.step_s(k, k * prompt + k * out / 2)
    expected = np.repeat(np.arange(1, waves + 1) * cycle, k)
    np.testing.assert_allclose(r.finish_s, expected, rtol=1e-12)
    assert n / r.finish_s.max() == pytest.approx(k / cycle, rel=1e-12)
    assert r.preemptions.sum() == 0
    # the same waves observed from outside: k admitted (the cache holds k prompts), but as
    # vLLM counts them only the one being prefilled runs, the rest wait (`waiting_at`)
    eng = BatchingInstance(p)
    for i in range(n):
        eng.offer(i, prompt, out, 0.0)
    assert (eng.admitted, eng.kv_used) == (k, k * prompt)
    assert (eng.running, eng.waiting) == (1, n - 1)
    t_pf = k * prompt / p.prefill_tps
    assert eng.next_event_at() == pytest.approx(t_pf)
    assert eng.advance(t_pf) == []
    assert (eng.running, eng.waiting) == (k, n - k)
    mid = t_pf + (cycle - t_pf) / 2
    assert k * prompt < eng.kv_used_at(mid) < k * (prompt + out)
    done = eng.advance(cycle)
    assert [f.req_id for f in done] == list(range(k))
    assert eng.admitted == k and (eng.running, eng.waiting) == (1, n - k - 1)  # next wave


def test_waiting_counts_admitted_sequences_queued_behind_a_prefill_as_vllm_does() -> None:
    # vLLM moves a request from `waiting` to `running` in the step that prefills it: three
    # prompts of 1000 tokens at 1000 tokens/s admitted at 0 into an empty batch prefill at
    # [0, 1), [1, 2), [2, 3); a fourth arriving at 0.5 joins the pause, its prefill at [3, 4)
    p = BatchingParams(max_seqs=8, kv_tokens=100_000, prefill_tps=1_000, step_base_s=0.01)
    eng = BatchingInstance(p)
    for i in range(3):
        eng.offer(i, 1000, 10, 0.0)
    assert (eng.admitted, eng.running, eng.waiting) == (3, 1, 2)
    assert [eng.waiting_at(t) for t in (0.0, 0.99, 1.0, 1.5, 2.0)] == [2, 2, 1, 1, 0]
    assert [eng.running_at(t) for t in (0.0, 1.0, 2.0)] == [1, 2, 3]
    eng.offer(3, 1000, 10, 0.5)
    assert (eng.admitted, eng.running, eng.waiting) == (4, 1, 3)  # at 0.5, the latest seen
    assert (eng.waiting_at(2.5), eng.waiting_at(3.0)) == (1, 0)
    assert eng.next_event_at() == pytest.approx(4.0)
    assert eng.advance(4.0) == []  # the pause ends: all four decode
    assert (eng.running, eng.waiting) == (4, 0)
    # with no prefill time (the slot setting) nothing admitted waits: only the queue
    slots = BatchingInstance(BatchingParams.slots(2, 0.1))
    for i in range(5):
        slots.offer(i, 100, 10, 0.0)
    assert (slots.admitted, slots.running, slots.waiting) == (2, 2, 3)


def test_growth_past_the_kv_cache_preempts_the_newest_and_recomputes_it() -> None:
    # four sequences of 10 + 1000 tokens in 2100: all admitted, then the batch's growth
    # overflows the cache twice before the two oldest finish (worked through below)
    p = BatchingParams(
        max_seqs=8, kv_tokens=2_100, prefill_tps=1_000, step_base_s=0.01, step_per_seq_s=0.001
    )
    eng = BatchingInstance(p)
    for i in range(4):
        eng.offer(i, 10, 1000, 0.0)
    t = 0.04  # four prefills of 10 tokens
    t1 = t + 515 * p.step_s(4, 0)  # 40 + 4u = 2100 at u = 515
    assert eng.advance(t1 - 1e-9) == []
    assert (eng.running, eng.waiting) == (4, 0)
    assert eng.kv_used_at(t1 - 1e-9) == pytest.approx(2100, abs=1e-3)
    assert eng.advance(t1) == []
    # the newest (3) is preempted, back to the head of the queue, holding nothing
    assert (eng.running, eng.waiting) == (3, 1)
    assert eng.kv_used == pytest.approx(3 * 525)
    t2 = t1 + 175 * p.step_s(3, 0)  # 1575 + 3u = 2100
    t3 = t2 + 310 * p.step_s(2, 0)  # two left, 1400 + 2u: 0 and 1 finish first, at 1000
    t4 = t3 + (700 + 525) / p.prefill_tps  # 2 then 3 re-admitted (order kept), recomputed
    t5 = t4 + 310 * p.step_s(2, 0)  # 2 had 690 tokens, 3 had 515
    t6 = t5 + 175 * p.step_s(1, 0)
    done = eng.advance(INF)
    assert [f.req_id for f in done] == [0, 1, 2, 3]
    np.testing.assert_allclose([f.at_s for f in done], [t3, t3, t5, t6], rtol=1e-12)
    assert [f.preemptions for f in done] == [0, 0, 1, 1]
    # the first token was streamed before the preemption: TTFT does not move
    first = t + p.step_s(4, 0)
    np.testing.assert_allclose([f.ttft_s for f in done], [first] * 4, rtol=1e-12)
    assert (eng.running, eng.waiting, eng.kv_used, eng.next_event_at()) == (0, 0, 0, INF)
    # the whole-workload function agrees
    r = simulate_instance([0.0] * 4, [10] * 4, [1000] * 4, p)
    np.testing.assert_allclose(r.finish_s, [t3, t3, t5, t6], rtol=1e-12)
    assert r.preemptions.tolist() == [0, 0, 1, 1]


# -- the slot model as one setting ----------------------------------------------------------


def fifo_slots(arr: list[float], service: list[float], c: int) -> tuple[list[float], list[float]]:
    """A FIFO queue in front of c identical servers (M/D/c, M/G/c): (start, finish)."""
    free = [0.0] * c
    start, finish = [], []
    for a, x in zip(arr, service, strict=True):
        s = max(a, heapq.heappop(free))
        start.append(s)
        finish.append(s + x)
        heapq.heappush(free, s + x)
    return start, finish


@pytest.mark.parametrize("fixed", [True, False])
def test_the_slot_setting_is_a_fifo_queue_in_front_of_c_slots(fixed: bool) -> None:
    rng = np.random.default_rng(7)
    n, c, spt = 400, 3, 0.01
    arr = np.sort(rng.uniform(0, 40, n)).tolist()
    out = [25.0] * n if fixed else rng.integers(1, 60, n).astype(float).tolist()
    p = BatchingParams.slots(c, spt)
    r = simulate_instance(arr, rng.integers(0, 3000, n), out, p)
    start, finish = fifo_slots(arr, [o * spt for o in out], c)
    np.testing.assert_allclose(r.finish_s, finish, rtol=0, atol=1e-9)
    np.testing.assert_allclose(r.ttft_s, np.subtract(start, arr) + spt, rtol=0, atol=1e-9)
    assert r.preemptions.sum() == 0
    assert max(np.subtract(start, arr)) > 0.5  # it did queue
    # a fixed service time of x seconds: x / seconds_per_token output tokens
    x = 0.137
    r1 = simulate_instance([1.0, 1.0], [0, 0], [x / spt] * 2, BatchingParams.slots(1, spt))
    np.testing.assert_allclose(r1.finish_s, [1 + x, 1 + 2 * x], rtol=1e-12)


# -- a naive implementation of the same model, for random workloads --------------------------


def reference(
    arr: list[float], prompt: list[float], out: list[float], p: BatchingParams
) -> tuple[list[float], list[float], list[int]]:
    """The fluid model by brute force: all sequences' tokens advanced at every event and
    arrival, the KV cache summed each time. (finish, first token, preemptions)."""
    n = len(arr)
    cap, rate = float(p.kv_tokens), float(p.prefill_tps)
    g = [0.0] * n
    first = [math.nan] * n
    fin = [math.nan] * n
    pre = [0] * n
    waiting: deque[int] = deque()
    running: list[int] = []  # admission order
    decoding: list[int] = []
    pf: list[int] = []
    pf_end = 0.0
    t = 0.0
    order = sorted(range(n), key=lambda i: (arr[i], i))
    j = 0

    def kv() -> float:
        return sum(prompt[i] + g[i] for i in running)

    def admit(now: float) -> None:
        nonlocal pf_end
        while waiting and len(running) < p.max_seqs:
            i = waiting[0]
            need = prompt[i] + g[i]
            if running and kv() + need + len(running) + 1 > cap:
                return
            waiting.popleft()
            running.append(i)
            if need / rate > 0:
                pf_end = (pf_end if pf else now) + need / rate
                pf.append(i)
            else:
                decoding.append(i)

    def move(du: float, a0: float, beta: float) -> None:
        for i in decoding:
            if math.isnan(first[i]) and 1 - g[i] <= du + 1e-9:
                x = min(1 - g[i], du)
                first[i] = t + x * (a0 + beta * x / 2)
        for i in decoding:
            g[i] += du

    while True:
        ta = arr[order[j]] if j < n else INF
        du_f = du_k = INF
        a0 = beta = 0.0
        if pf:
            te = pf_end
        elif decoding:
            b = len(decoding)
            a0 = p.step_s(b, kv())
            beta = p.step_per_kv_token_s * b
            du_f = min(out[i] - g[i] for i in decoding)
            du_k = (cap - kv()) / b if b > 1 else INF
            du = max(0.0, min(du_f, du_k))
            te = t + du * (a0 + beta * du / 2)
        else:
            te = INF
        if te == INF and ta == INF:
            break
        if te <= ta:
            if pf:
                t = te
                decoding += pf
                pf.clear()
            else:
                move(du, a0, beta)
                t = te
                done = [i for i in decoding if g[i] >= out[i] - 1e-7]
                for i in done:
                    fin[i] = t
                    if math.isnan(first[i]):  # a one-token answer within the tolerance
                        first[i] = t
                    decoding.remove(i)
                    running.remove(i)
                if du_k < du_f and not done:
                    i = running.pop()
                    decoding.remove(i)
                    pre[i] += 1
                    waiting.appendleft(i)
                while len(decoding) > 1 and kv() >= cap:
                    i = running.pop()
                    decoding.remove(i)
                    pre[i] += 1
                    waiting.appendleft(i)
            admit(t)
        else:
            i = order[j]
            j += 1
            if decoding and not pf:
                dt = ta - t
                move(2 * dt / (a0 + math.sqrt(a0 * a0 + 2 * beta * dt)), a0, beta)
            if not pf:
                t = ta
            waiting.append(i)
            admit(ta)
    return fin, first, pre


@st.composite
def workloads(draw: st.DrawFn) -> tuple[BatchingParams, list[float], list[float], list[float]]:
    n = draw(st.integers(1, 25))
    arr = draw(st.lists(st.floats(0, 5), min_size=n, max_size=n))
    prompt = draw(st.lists(st.integers(1, 60), min_size=n, max_size=n))
    out = draw(st.lists(st.integers(1, 60), min_size=n, max_size=n))
    longest = max(a + b for a, b in zip(prompt, out, strict=True))
    kv = draw(st.one_of(st.just(INF), st.integers(longest, 4 * longest).map(lambda k: k + 0.5)))
    p = BatchingParams(
        max_seqs=draw(st.integers(1, 6)),
        kv_tokens=kv,
        prefill_tps=draw(st.one_of(st.just(INF), st.floats(100, 5000))),
        step_base_s=draw(st.floats(0.001, 0.05)),
        step_per_seq_s=draw(st.one_of(st.just(0.0), st.floats(0, 0.01))),
        step_per_kv_token_s=draw(st.one_of(st.just(0.0), st.floats(0, 1e-4))),
    )
    return p, arr, [float(x) for x in prompt], [float(x) for x in out]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.lists(st.floats(0, 8), max_size=30))
def test_random_workloads_agree_with_the_naive_model_and_keep_their_invariants(
    w: tuple[BatchingParams, list[float], list[float], list[float]], polls: list[float]
) -> None:
    p, arr, prompt, out = w
    n = len(arr)
    r = simulate_instance(arr, prompt, out, p)
    # every request finishes, its times in order and non-negative
    assert not np.isnan(r.finish_s).any()
    a = np.asarray(arr)
    assert (r.ttft_s > 0).all()
    assert (r.ttft_s <= r.latency_s + 1e-12).all()
    np.testing.assert_allclose(r.finish_s, a + r.latency_s, rtol=1e-12, atol=1e-12)
    one = np.asarray(out) == 1
    assert np.isnan(r.tpot_s[one]).all() and (r.tpot_s[~one] > 0).all()
    # TPOT is at least the cheapest step (one sequence, no context)
    assert (r.tpot_s[~one] >= p.step_s(1, 0) * (1 - 1e-9)).all()
    # the naive model gives the same times and preemptions
    fin, first, pre = reference(arr, prompt, out, p)
    np.testing.assert_allclose(r.finish_s, fin, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(r.ttft_s, np.subtract(first, arr), rtol=1e-6, atol=1e-9)
    assert r.preemptions.tolist() == pre
    # without preemption, first tokens come in arrival order (FIFO admission)
    if r.preemptions.sum() == 0:
        order = np.argsort(a, kind="stable")
        firsts = (a + r.ttft_s)[order]
        assert (np.diff(firsts) >= -1e-12).all()
    # driven by hand with extra polls in between (a tick's advance): the very same numbers,
    # each request finished once, and what /metrics would show within bounds throughout
    eng = BatchingInstance(p)
    seen: dict[int, Finished] = {}
    events = sorted([(t, 0, i) for i, t in enumerate(arr)] + [(t, 1, -1) for t in polls])
    for t, kind, i in events:
        for f in eng.advance(t):
            assert f.req_id not in seen
            seen[f.req_id] = f
        assert eng.now <= t
        assert eng.running <= p.max_seqs
        assert 0 <= eng.kv_used_at(t) <= p.kv_tokens * (1 + 1e-9)
        assert 0 <= eng.kv_usage(t) <= 1 + 1e-9
        if kind == 0:
            eng.offer(i, prompt[i], out[i], t)
    for f in eng.advance(INF):
        assert f.req_id not in seen
        seen[f.req_id] = f
    assert sorted(seen) == list(range(n))
    assert [seen[i].at_s for i in range(n)] == r.finish_s.tolist()
    assert [seen[i].preemptions for i in range(n)] == r.preemptions.tolist()
    assert (eng.running, eng.waiting, eng.kv_used) == (0, 0, 0)


# -- the API's edges ------------------------------------------------------------------------


def test_offers_out_of_order_or_too_long_are_refused() -> None:
    p = BatchingParams(max_seqs=2, kv_tokens=100, prefill_tps=1000, step_base_s=0.01)
    eng = BatchingInstance(p)
    with pytest.raises(ValueError, match="max_model_len"):
        eng.offer(0, 60, 41, 0.0)
    with pytest.raises(ValueError, match="output_tokens >= 1"):
        eng.offer(0, 10, 0, 0.0)
    eng.offer(0, 50, 10, 1.0)
    with pytest.raises(ValueError, match="advance"):
        eng.offer(1, 10, 10, 0.5)  # before the instance's now
    with pytest.raises(ValueError, match="advance"):
        eng.offer(1, 10, 10, 5.0)  # past its next event: advance first
    with pytest.raises(ValueError):
        BatchingParams(max_seqs=0, kv_tokens=1, prefill_tps=1, step_base_s=1)
    with pytest.raises(ValueError):
        BatchingParams(max_seqs=1, kv_tokens=1, prefill_tps=1, step_base_s=0)


def test_clear_drops_everything_and_the_instance_serves_again() -> None:
    p = BatchingParams(max_seqs=1, kv_tokens=INF, prefill_tps=INF, step_base_s=0.01)
    eng = BatchingInstance(p)
    eng.offer(7, 10, 100, 0.0)
    eng.offer(8, 10, 100, 0.0)
    assert eng.advance(0.5) == []
    assert eng.clear() == [7, 8]
    assert (eng.running, eng.waiting, eng.next_event_at()) == (0, 0, INF)
    eng.offer(9, 10, 10, 2.0)
    (f,) = eng.advance(INF)
    assert f.req_id == 9
    assert f.latency_s == pytest.approx(0.1)


def test_the_default_setting_is_vllm_like() -> None:
    p = LLAMA3_8B_H100
    assert 0.005 < p.step_s(1, 1000) < 0.015  # ~100 tokens/s for one stream
    assert 0.010 < p.step_s(64, 64 * 2000) < 0.030 < p.step_s(256, 256 * 1000) < 0.040
    assert 10_000 <= p.prefill_tps <= 20_000
    # a heavier load costs each stream more per token: TPOT grows with the batch
    rng = np.random.default_rng(3)
    n = 2000
    tpot = []
    for rate in (1.0, 8.0):
        arr = np.cumsum(rng.exponential(1 / rate, n))
        r = simulate_instance(arr, rng.integers(100, 1000, n), rng.integers(50, 400, n), p)
        tpot.append(float(np.nanmedian(r.tpot_s)))
    assert tpot[0] < tpot[1]
    assert dataclasses.replace(p, max_seqs=1).max_seqs == 1
