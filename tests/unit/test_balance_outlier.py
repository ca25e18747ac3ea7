"""Balancing (p2c, slow start, headroom, affinity), outlier ejection and token buckets."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from sluice.policy.balance import RampHold, pick_affinity, pick_endpoint, slow_start_weight
from sluice.policy.outlier import OutlierDetector
from sluice.policy.ratelimit import TokenBucket
from sluice.policy.routing import Endpoint


def iid(ep: Endpoint | None) -> str:
    assert ep is not None
    return ep.instance_id


def eps(n: int, max_concurrency: int = 8, ready_at: float = 0.0) -> list[Endpoint]:
    return [Endpoint(f"i{k}", "127.0.0.1", 9000 + k, max_concurrency, ready_at) for k in range(n)]


# -- power of two choices ---------------------------------------------------------------------


def test_p2c_prefers_the_less_loaded() -> None:
    pool = eps(4)
    load = {"i0": 0, "i1": 2, "i2": 4, "i3": 7}
    rng = random.Random(1)
    picks = Counter(iid(pick_endpoint(pool, load, rng, 100.0)) for _ in range(3000))
    assert picks["i3"] == 0  # the most loaded loses every pair it is drawn in
    assert picks["i0"] > picks["i1"] > picks["i2"] > 0
    assert picks["i0"] == pytest.approx(1500, rel=0.1)  # in 3 of the 6 pairs
    two = eps(2)
    assert {iid(pick_endpoint(two, {"i0": 3}, rng, 0.0)) for _ in range(50)} == {"i1"}


def test_a_full_winner_gives_way_to_the_least_loaded_with_headroom() -> None:
    pool = [*eps(2, max_concurrency=1), Endpoint("big", "h", 1, 100)]
    load = {"i0": 1, "i1": 1, "big": 9}
    rng = random.Random(2)
    assert {iid(pick_endpoint(pool, load, rng, 0.0)) for _ in range(200)} == {"big"}
    load["big"] = 100  # nobody has headroom: the p2c winner anyway, never None
    assert {iid(pick_endpoint(pool, load, rng, 0.0)) for _ in range(200)} <= {"i0", "i1"}


def test_skip_and_empty() -> None:
    pool = eps(3)
    rng = random.Random(3)
    assert {iid(pick_endpoint(pool, {}, rng, 0.0, skip={"i0", "i1"})) for _ in range(20)} == {"i2"}
    assert pick_endpoint(pool, {}, rng, 0.0, skip={"i0", "i1", "i2"}) is None
    assert pick_endpoint([], {}, rng, 0.0) is None


def share_of_new(
    age_s: float, slow_start_s: float = 10.0, seed: int = 4, held: dict[str, float] | None = None
) -> float:
    """Closed-loop simulation: 40 requests always in flight over two settled instances and one
    that became ready `age_s` ago; the share of picks the new one gets."""
    now = 1000.0
    pool = [*eps(2, max_concurrency=64), Endpoint("new", "h", 1, 64, ready_at=now - age_s)]
    rng = random.Random(seed)
    load: Counter[str] = Counter()
    inflight: list[str] = []
    picks: Counter[str] = Counter()
    for step in range(6000):
        ep = pick_endpoint(pool, load, rng, now, slow_start_s, held=held or {})
        assert ep is not None
        load[ep.instance_id] += 1
        inflight.append(ep.instance_id)
        if step >= 1000:
            picks[ep.instance_id] += 1
        if len(inflight) >= 40:  # one finishes, at random
            load[inflight.pop(rng.randrange(len(inflight)))] -= 1
    return picks["new"] / sum(picks.values())


def test_slow_start_gives_a_new_instance_a_share_that_grows_with_age() -> None:
    shares = [share_of_new(age) for age in (0.0, 3.0, 6.0, 10.0)]
    assert shares[0] < 0.15  # at 10% weight: a small share, not none
    assert shares[0] > 0.0
    assert shares == sorted(shares)
    assert shares[-1] == pytest.approx(1 / 3, abs=0.05)  # settled: a fair third
    assert slow_start_weight(Endpoint("x", "h", 1, 1, ready_at=0.0), 5.0, 10.0) == 0.5
    assert slow_start_weight(Endpoint("x", "h", 1, 1, ready_at=0.0), 5.0, 0.0) == 1.0


def test_slow_start_listens_failures_take_the_ramp_back() -> None:
    new = Endpoint("new", "h", 1, 64, ready_at=994.0)  # 6 s into a 10 s ramp at t=1000
    hold = RampHold()
    assert hold.failed(new, 1000.0, 10.0)  # a failure while ramping: 2.5 s taken back
    assert hold.held == {"new": 2.5}
    assert slow_start_weight(new, 1000.0, 10.0, hold.held["new"]) == pytest.approx(0.35)
    assert hold.settle_at([new], 10.0) == pytest.approx(994.0 + 2.5 + 10.0)
    answering_well = share_of_new(6.0)
    answering_badly = share_of_new(6.0, held=hold.held)
    assert answering_badly < answering_well * 0.75  # its share stopped growing
    for _ in range(10):  # it keeps failing: held at the floor, never below
        hold.failed(new, 1000.0, 10.0)
    assert hold.held["new"] == pytest.approx(6.0)
    assert slow_start_weight(new, 1000.0, 10.0, hold.held["new"]) == 0.1
    settled = Endpoint("old", "h", 1, 64, ready_at=0.0)
    assert not hold.failed(settled, 1000.0, 10.0)  # settled instances: outlier ejection's job
    assert not hold.failed(new, 1000.0, 0.0)  # slow start off
    hold.forget({"old"})
    assert hold.held == {}


# -- affinity ---------------------------------------------------------------------------------


def test_affinity_is_stable_and_only_moves_keys_of_a_removed_instance() -> None:
    pool = eps(5)
    keys = [f"user-{k}" for k in range(2000)]
    before = {k: iid(pick_affinity(pool, k)) for k in keys}
    assert before == {k: iid(pick_affinity(pool, k)) for k in keys}
    counts = Counter(before.values())
    assert len(counts) == 5 and min(counts.values()) > 300  # spread over all of them
    after = {k: iid(pick_affinity(pool[:2] + pool[3:], k)) for k in keys}
    skipped = {k: iid(pick_affinity(pool, k, skip={"i2"})) for k in keys}
    assert after == skipped
    for k in keys:
        if before[k] != "i2":
            assert after[k] == before[k]
        else:
            assert after[k] != "i2"
    assert pick_affinity([], "k") is None


# -- outlier ejection -------------------------------------------------------------------------


def test_ejected_after_n_failures_in_a_row_and_a_success_resets() -> None:
    det = OutlierDetector(3, base_ejection_s=10.0, max_ejected_percent=50)
    assert det.record_failure("a", 0.0, 4, "HTTP 500") is None
    assert det.record_failure("a", 0.1, 4, "HTTP 500") is None
    det.record_success("a")  # the count starts over
    assert det.record_failure("a", 0.2, 4, "HTTP 500") is None
    assert det.record_failure("a", 0.3, 4, "HTTP 500") is None
    ejection = det.record_failure("a", 0.4, 4, "HTTP 502")
    assert ejection is not None and ejection.until == pytest.approx(10.4)
    assert ejection.times == 1 and ejection.reason == "3 failures in a row, last: HTTP 502"
    assert set(det.ejected(5.0)) == {"a"}


def test_ejection_expires_and_a_repeat_lasts_longer() -> None:
    det = OutlierDetector(1, base_ejection_s=10.0, max_ejected_percent=100)
    first = det.record_failure("a", 0.0, 2, "connect")
    assert first is not None and first.until == 10.0
    assert det.record_failure("a", 1.0, 2, "connect") is None  # already ejected
    assert set(det.ejected(9.99)) == {"a"}
    assert det.ejected(10.0) == {}
    second = det.record_failure("a", 15.0, 2, "connect")  # back only 5 s: no decay yet
    assert second is not None and second.times == 2 and second.until == 35.0


def test_an_ejection_is_capped_and_the_multiplier_decays_while_healthy() -> None:
    det = OutlierDetector(1, base_ejection_s=10.0, max_ejected_percent=100, max_ejection_s=45.0)
    now, untils = 0.0, []
    for _ in range(6):  # fails again the moment it returns
        ejection = det.record_failure("a", now, 2, "HTTP 500")
        assert ejection is not None
        untils.append(ejection.until - now)
        now = ejection.until
    assert untils == [10.0, 20.0, 30.0, 40.0, 45.0, 45.0]  # base x times, at most the cap
    # 6 ejections deep; 35 s healthy takes 3 off the multiplier: the next lasts 4 x base
    later = det.record_failure("a", now + 35.0, 2, "HTTP 500")
    assert later is not None and later.times == 4 and later.until - (now + 35.0) == 40.0
    # a day later it starts again at the base
    fresh = det.record_failure("a", later.until + 86_400, 2, "HTTP 500")
    assert fresh is not None and fresh.times == 1 and fresh.until == later.until + 86_400 + 10.0


def test_ejected_share_is_capped_and_forget_drops_gone_instances() -> None:
    det = OutlierDetector(1, base_ejection_s=10.0, max_ejected_percent=50)
    ejected = [det.record_failure(i, 0.0, 4, "HTTP 500") for i in ("a", "b", "c", "d")]
    assert [e is not None for e in ejected] == [True, True, False, False]  # 50% of 4
    assert set(det.ejected(1.0)) == {"a", "b"}
    det.forget({"b", "c", "d"})
    assert set(det.ejected(1.0)) == {"b"}
    assert det.record_failure("c", 1.0, 3, "HTTP 500") is None  # 50% of 3 -> 1, taken by b
    lone = OutlierDetector(1, 10.0, 50)
    assert lone.record_failure("x", 0.0, 1, "HTTP 500") is not None  # at least one, as Envoy
    never = OutlierDetector(1, 10.0, 0)
    assert never.record_failure("x", 0.0, 4, "HTTP 500") is None


# -- token bucket -----------------------------------------------------------------------------


def test_token_bucket_rate_burst_and_retry_after() -> None:
    bucket = TokenBucket(rate=2.0, burst=3, now=0.0)
    assert [bucket.try_take(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]  # starts full: a burst
    assert bucket.try_take(0.0) == pytest.approx(0.5)  # one token every 1/rate s
    assert bucket.try_take(0.25) == pytest.approx(0.25)
    assert bucket.try_take(0.5) == 0.0
    assert bucket.try_take(100.0) == 0.0  # refills, but never beyond the burst
    taken = sum(1 for _ in range(10) if bucket.try_take(100.0) == 0.0)
    assert taken == 2
    allowed = sum(1 for k in range(1000) if bucket.try_take(200.0 + k * 0.01) == 0.0)
    assert allowed == pytest.approx(2.0 * 10 + 3, abs=1)  # rate x 10 s, plus the burst
