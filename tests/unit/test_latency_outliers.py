"""Latency outliers (policy.latency): an A/A group never ejects, whatever its request mix;
a 5x or 10x slow instance is caught within tens of its requests; slow start holds back a
lagging new instance; the verdict goes through the same ejection rules as failures."""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.core import SpecError
from sluice.policy import build_routing_snapshot
from sluice.policy.balance import RampHold, pick_endpoint, slow_start_weight
from sluice.policy.latency import LatencyOutliers
from sluice.policy.outlier import OutlierDetector
from sluice.policy.routing import Endpoint, GroupTraffic
from sluice.spec import load_spec_text

Mix = Callable[[random.Random], float]
"""One request's latency in seconds on a healthy instance."""


def lognormal(sigma: float, median_s: float = 0.05) -> Mix:
    return lambda rng: median_s * math.exp(rng.gauss(0.0, sigma))


def generative(rng: random.Random) -> float:
    """A chat mix: 80 ms to first token, then 20 ms a token, output lengths lognormal around
    150 tokens (1 in 100 over 2,500), 1..4096."""
    tokens = min(4096, max(1, round(150 * math.exp(rng.gauss(0.0, 1.2)))))
    return 0.08 + 0.02 * tokens


def run(
    det: LatencyOutliers,
    mix: Mix,
    instances: int,
    requests: int,
    rng: random.Random,
    slow: dict[str, float] | None = None,
) -> tuple[list[tuple[str, int, str]], Counter[str]]:
    """`requests` answered requests spread at random over `instances` (as the balancer does:
    it never looks at the request), each instance's latency times its `slow` factor. Returns
    the verdicts (instance, its requests so far, reason) and the requests each answered."""
    verdicts: list[tuple[str, int, str]] = []
    served: Counter[str] = Counter()
    factors = slow or {}
    for _ in range(requests):
        iid = f"i{rng.randrange(instances)}"
        served[iid] += 1
        why = det.observe(iid, mix(rng) * factors.get(iid, 1.0))
        if why is not None:
            verdicts.append((iid, served[iid], why))
            det.reset(iid)
    return verdicts, served


def slow_after(det: LatencyOutliers, mix: Mix, instances: int, factor: float, seed: int) -> int:
    """Settle a group, then make i0 `factor` x slower: how many of its requests until the
    first verdict (a large number if none came)."""
    rng = random.Random(seed)
    run(det, mix, instances, 100 * instances, rng)
    verdicts, _ = run(det, mix, instances, 400 * instances, rng, {"i0": factor})
    assert {iid for iid, _, _ in verdicts} <= {"i0"}, verdicts  # only the slow one, ever
    return verdicts[0][1] if verdicts else 10**9


# -- A/A: nothing is wrong, so nothing is ejected ---------------------------------------------


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    sigma=st.floats(0.0, 2.5),
    instances=st.integers(2, 6),
    ratio=st.sampled_from([1.5, 2.0, 3.0, 5.0]),
    min_requests=st.sampled_from([10, 20, 50]),
    seed=st.integers(0, 2**32),
)
def test_an_aa_group_with_heavy_tailed_latencies_never_ejects(
    sigma: float, instances: int, ratio: float, min_requests: int, seed: int
) -> None:
    # sigma 2.5: the slowest 1% of requests take 300x the median, the slowest 0.1% 2,000x
    det = LatencyOutliers(ratio, min_requests)
    verdicts, _ = run(det, lognormal(sigma), instances, 1500 * instances, random.Random(seed))
    assert verdicts == []


@settings(max_examples=20, deadline=None, derandomize=True)
@given(instances=st.integers(2, 6), seed=st.integers(0, 2**32))
def test_an_aa_group_serving_a_generative_mix_never_ejects(instances: int, seed: int) -> None:
    det = LatencyOutliers(3.0, 20)
    verdicts, _ = run(det, generative, instances, 2000 * instances, random.Random(seed))
    assert verdicts == []


def test_a_fleet_that_slows_down_together_ejects_nobody() -> None:
    det = LatencyOutliers(3.0, 20)
    rng = random.Random(5)
    run(det, lognormal(0.3), 4, 400, rng)
    verdicts, _ = run(det, lognormal(0.3, median_s=0.5), 4, 2000, rng)  # all 10x at once
    assert verdicts == []


# -- a slow instance is caught ----------------------------------------------------------------


@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    factor=st.sampled_from([5.0, 10.0]),
    sigma=st.floats(0.0, 0.5),
    instances=st.integers(2, 6),
    seed=st.integers(0, 2**32),
)
def test_a_5x_or_10x_slow_instance_is_caught_within_a_few_dozen_of_its_requests(
    factor: float, sigma: float, instances: int, seed: int
) -> None:
    det = LatencyOutliers(3.0, 20)
    needed = slow_after(det, lognormal(sigma), instances, factor, seed)
    assert needed <= (40 if factor == 5.0 else 25)


@pytest.mark.parametrize(("factor", "most"), [(5.0, 250), (10.0, 120)])
def test_a_slow_instance_under_a_generative_mix_is_caught_too(factor: float, most: int) -> None:
    needed = [slow_after(LatencyOutliers(3.0, 20), generative, 3, factor, s) for s in range(10)]
    assert max(needed) <= most, needed


def test_the_verdict_names_the_numbers_and_needs_judged_peers() -> None:
    det = LatencyOutliers(3.0, 20)
    for _ in range(19):
        assert det.observe("slow", 0.48) is None
    assert det.observe("slow", 0.48) is None  # 20 requests, but nobody to compare with
    for _ in range(19):
        det.observe("fast", 0.052)
    assert det.estimate("slow") == (20, pytest.approx(0.48))
    assert det.observe("slow", 0.48) is None  # the peer has 19: not judged yet
    det.observe("fast", 0.052)
    # judged from here; its first requests counted none as long (nobody knew what long was
    # yet), so the share test takes a few more to agree
    verdicts = [det.observe("slow", 0.48) for _ in range(12)]
    seen = next(k for k, v in enumerate(verdicts) if v is not None) + 22
    assert seen <= 30 and verdicts[seen - 22] == (
        f"latency 480 ms vs peers 52 ms (9.2x) over its last ~20 requests ({seen} seen)"
    )
    det.reset("slow")
    assert det.estimate("slow") is None
    assert all(det.observe("slow", 0.48) is None for _ in range(19))  # judged afresh
    det.forget({"slow"})
    assert det.estimate("fast") is None
    assert det.observe("slow", 0.48) is None  # its peer is gone


def test_faster_than_its_peers_is_never_slow_and_a_sub_millisecond_gap_is_noise() -> None:
    det = LatencyOutliers(3.0, 20)
    rng = random.Random(7)
    verdicts, _ = run(det, lognormal(0.2), 3, 600, rng, {"i0": 0.1})
    assert verdicts == []
    tiny = LatencyOutliers(3.0, 20)
    for _ in range(100):
        tiny.observe("a", 0.0002)
        assert tiny.observe("b", 0.0009) is None  # 4.5x, but both under FLOOR_S


def test_a_short_burst_of_long_requests_is_not_a_slow_instance() -> None:
    """A mix of 90% 10 ms and 10% 5 s requests (a cache, or a rare long class): one
    instance drawing four long ones in a row moves its mean past 3x its peers' for a moment;
    the spread test and the persistence keep that from being a verdict."""

    def bimodal(rng: random.Random) -> float:
        return 5.0 if rng.random() < 0.1 else 0.01

    det = LatencyOutliers(3.0, 20)
    rng = random.Random(11)
    verdicts, _ = run(det, bimodal, 3, 600, rng)
    outcomes = [det.observe("i0", 5.0) for _ in range(4)]
    outcomes += [det.observe("i0", bimodal(rng)) for _ in range(30)]
    assert verdicts == [] and outcomes == [None] * 34


def test_a_cold_first_request_does_not_get_a_new_instance_ejected() -> None:
    """A new instance's first request often pays for a cold cache or a compile (here 1000x);
    its mean starts as a plain one, so that request fades as 1/n before it is judged."""
    det = LatencyOutliers(3.0, 20)
    for _ in range(100):
        det.observe("a", 0.005)
        det.observe("b", 0.005)
    outcomes = [det.observe("new", 5.0)] + [det.observe("new", 0.005) for _ in range(60)]
    assert outcomes == [None] * 61
    estimate = det.estimate("new")
    assert estimate is not None and estimate[1] == pytest.approx(0.005, rel=0.05)


# -- through the shared ejection rules --------------------------------------------------------


def test_a_latency_verdict_is_ejected_with_the_shared_cap_and_multiplier() -> None:
    det = OutlierDetector(5, base_ejection_s=30.0, max_ejected_percent=50, max_ejection_s=45.0)
    first = det.eject(
        "a", 0.0, 4, ("latency 480 ms vs peers 52 ms (9.2x) over its last ~20 requests (22 seen)")
    )
    assert first is not None and first.until == 30.0 and first.times == 1
    assert first.reason.startswith("latency 480 ms")
    assert det.eject("a", 1.0, 4, "again") is None  # already out
    assert det.record_failure("b", 1.0, 4, "HTTP 500") is None  # 1 of 5 failures
    for _ in range(4):
        det.record_failure("b", 1.0, 4, "HTTP 500")
    assert set(det.ejected(2.0)) == {"a", "b"}
    assert det.eject("c", 2.0, 4, "slow") is None  # 50% of 4 are out: the cap holds
    second = det.eject("a", 31.0, 4, "slow again")  # back for 1 s, slow again: longer
    assert second is not None and second.times == 2 and second.until == 31.0 + 45.0


# -- slow start that listens to latency -------------------------------------------------------


def test_a_lagging_new_instance_stops_gaining_share_and_one_in_line_ramps_on_time() -> None:
    det = LatencyOutliers(3.0, 20)
    for _ in range(40):
        det.observe("old1", 0.05)
        det.observe("old2", 0.05)
    for _ in range(4):
        det.observe("new", 0.10)  # 2x: not bad enough to eject, not in line either
    assert not det.slower("new")  # 4 requests: too few to judge
    det.observe("new", 0.10)
    assert det.slower("new") and det.observe("new", 0.10) is None
    assert not det.slower("old1")

    new = Endpoint("new", "h", 1, 64, ready_at=1000.0)
    hold = RampHold()
    assert not hold.answered(new, 1002.0, 10.0, lagging=False)  # in line: ramps on
    assert hold.answered(new, 1003.0, 10.0, lagging=True)  # lagging: that second taken back
    assert hold.answered(new, 1006.0, 10.0, lagging=True)
    assert hold.held == {"new": pytest.approx(4.0)}
    assert slow_start_weight(new, 1006.0, 10.0, hold.held["new"]) == pytest.approx(0.2)
    assert not hold.answered(new, 1007.0, 10.0, lagging=False)  # back in line: grows again
    assert slow_start_weight(new, 1007.0, 10.0, hold.held["new"]) == pytest.approx(0.3)
    for t in range(1008, 1200):  # lagging for good: held, but for at most 5 ramps
        hold.answered(new, float(t), 10.0, lagging=True)
    assert hold.held["new"] == pytest.approx(50.0)
    assert slow_start_weight(new, 1200.0, 10.0, hold.held["new"]) == 1.0
    assert not hold.answered(Endpoint("old", "h", 1, 64), 1000.0, 10.0, lagging=True)
    hold.forget(set())
    assert hold.held == {}


def ramp_share(new_latency_s: float, seed: int = 4) -> tuple[float, float]:
    """Closed loop as the gateway runs it over a 10 s ramp: 40 requests always in flight
    over two settled instances (50 ms) and a new one, the ramp fed by the same estimates.
    Returns the new instance's share of the picks and the ramp seconds it lost."""
    now, slow_start_s = 1000.0, 10.0
    pool = [Endpoint(f"old{k}", "h", 1, 64) for k in range(2)]
    pool.append(Endpoint("new", "h", 1, 64, ready_at=now))
    det, hold = LatencyOutliers(3.0, 20), RampHold()
    rng = random.Random(seed)
    for _ in range(60):
        det.observe("old0", 0.05)
        det.observe("old1", 0.05)
    load: Counter[str] = Counter()
    inflight: list[Endpoint] = []
    picks: Counter[str] = Counter()
    steps = 4000
    for step in range(steps):
        t = now + step * slow_start_s / steps
        ep = pick_endpoint(pool, load, rng, t, slow_start_s, held=hold.held)
        assert ep is not None
        load[ep.instance_id] += 1
        inflight.append(ep)
        picks[ep.instance_id] += 1
        if len(inflight) >= 40:  # one finishes, at random
            done = inflight.pop(rng.randrange(len(inflight)))
            load[done.instance_id] -= 1
            latency = new_latency_s if done.instance_id == "new" else 0.05
            det.observe(done.instance_id, latency * math.exp(rng.gauss(0.0, 0.1)))
            if done.instance_id == "new":
                hold.answered(done, t, slow_start_s, det.slower("new"))
    return picks["new"] / steps, hold.held.get("new", 0.0)


def test_a_lagging_new_instance_keeps_a_small_share_through_its_ramp() -> None:
    in_line, in_line_held = ramp_share(0.05)
    lagging, lagging_held = ramp_share(0.10)  # 2x: not bad enough to eject
    assert in_line_held == 0.0 and lagging_held > 5.0
    assert lagging < 0.6 * in_line, (lagging, in_line)


# -- the spec's knobs -------------------------------------------------------------------------

SPEC = """\
pools: [{name: p, count: 4, memory_gb: 16}]
groups:
  - name: chat
    owner: o
    business: b
    alert_channel: c
    models: {m: {runtime: sim}}
    resources: {pool: p, memory_gb: 1}
OUTLIER
routes:
  - {tag: main, match: {models: [m]}, to: chat}
"""


def traffic(outlier: str) -> GroupTraffic:
    spec = load_spec_text(SPEC.replace("OUTLIER", outlier)).spec
    return build_routing_snapshot(spec, {}, 1).traffic["chat"]


def test_latency_ejection_is_on_by_default_and_its_knobs_reach_the_gateway() -> None:
    assert (traffic("").outlier_latency_ratio, traffic("").outlier_latency_min_requests) == (3, 20)
    tuned = traffic("    outlier: {latency_ratio: 5, latency_min_requests: 100}")
    assert (tuned.outlier_latency_ratio, tuned.outlier_latency_min_requests) == (5, 100)
    assert traffic("    outlier: {latency: false}").outlier_latency_ratio == 0.0  # off
    with pytest.raises(SpecError, match="latency_ratio"):
        traffic("    outlier: {latency_ratio: 1.0}")  # 1x its peers is not an outlier
