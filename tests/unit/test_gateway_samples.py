"""Samples of servers that keep none (command, external): the gateway's bounded rings, their
rows as `RequestSample`s, the collector reading them in-process, and the analysis skipping
(with the reason) every criterion such rows cannot show instead of judging missing values."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from sluice.control.samples import NO_GATEWAY, SampleCollector
from sluice.gateway.samples import GatewaySampling
from sluice.policy.analysis import GATEWAY_UNSEEN, RequestSample, analyze, unobserved
from sluice.spec.rollouts import CRITERIA, AnalysisSpec

SPEC = AnalysisSpec(min_samples=100)


WORDS = "the quick brown fox jumps over a lazy dog by the warm fire".split(" ")  # noqa: SIM905


def gateway_rows(
    n: int,
    seed: int,
    error_rate: float = 0.0,
    streamed: bool = True,
    truncated_rate: float = 0.0,
    answers: bool = True,
) -> list[RequestSample]:
    """What the gateway records of n answers: status, latency, time to the first byte, and
    (`answers`) what each answer says of itself: tokens, finish reason, time per output
    token, and on one row in 8 the start of its text."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        ttfb = float(rng.lognormal(math.log(0.05), 0.2))
        status = 500 if rng.random() < error_rate else 200
        tokens = int(rng.integers(40, 80))
        row: dict[str, Any] = {
            "seq": k,
            "at": 0.0,
            "status": status,
            "latency_s": ttfb + float(rng.lognormal(math.log(0.2), 0.1)),
            "ttft_s": ttfb if streamed else None,
            "output_bytes": 900,
        }
        if answers:
            row["output_tokens"] = tokens
            row["finish_reason"] = "length" if rng.random() < truncated_rate else "stop"
            row["tpot_s"] = float(rng.lognormal(math.log(0.02), 0.1)) if streamed else None
            if k % 8 == 0:
                row["text"] = " ".join(rng.choice(WORDS, size=tokens // 2))
        out.append(RequestSample.from_json(row))
    return out


# --- the gateway's rings ---------------------------------------------------------------------


def test_only_watched_groups_record_and_rows_read_back_after_a_cursor() -> None:
    s = GatewaySampling(capacity=4)
    assert s.watch(["b", "a"]) and not s.watch(["a", "b"])  # unchanged: False
    for i in range(6):
        s.groups["a"].record("a-1", 200 if i % 2 else 502, 0.1 * i, 0.01 if i else None, 10 * i)
    rows, nxt = s.read("a-1", 0, 100)
    assert len(rows) == 4  # the ring keeps the last 4
    assert [r["status"] for r in rows] == [502, 200, 502, 200]
    assert rows[-1]["seq"] == nxt and rows[0]["ttft_s"] == 0.01
    assert s.read("a-1", nxt, 100) == ([], nxt)
    page, cur = s.read("a-1", 0, 2)
    assert [r["seq"] for r in page] == [rows[0]["seq"], rows[1]["seq"]] and cur == page[-1]["seq"]
    assert s.read("nobody", 7, 10) == ([], 7)
    sample = RequestSample.from_json(rows[0])  # the worker's row shape, minus the text
    assert sample.status == 502 and sample.ttft_s == 0.01
    assert sample.text is None and sample.output_tokens is None and sample.finish_reason is None


def test_instances_out_of_routing_are_forgotten() -> None:
    s = GatewaySampling()
    s.watch(["a"])
    for iid in ("a-1", "a-2"):
        s.groups["a"].record(iid, 200, 0.1, None, 1)
    s.groups["a"].forget({"a-2"})
    assert s.read("a-1", 0, 10)[0] == [] and len(s.read("a-2", 0, 10)[0]) == 1


def test_the_sequence_survives_a_group_leaving_and_coming_back() -> None:
    s = GatewaySampling()
    s.watch(["a"])
    s.groups["a"].record("a-1", 200, 0.1, None, 1)
    _, cur = s.read("a-1", 0, 10)
    s.watch([])
    assert s.groups == {}
    s.watch(["a"])
    s.groups["a"].record("a-1", 200, 0.2, None, 1)
    rows, _ = s.read("a-1", cur, 10)
    assert [r["latency_s"] for r in rows] == [0.2]  # the old cursor still reads the new row


# --- the analysis on such rows ---------------------------------------------------------------


def test_good_canary_on_gateway_rows_passes_and_names_what_it_could_not_see() -> None:
    a = analyze(
        gateway_rows(300, 1),
        gateway_rows(300, 2),
        None,
        None,
        SPEC,
        unobserved=unobserved(True, True),
    )
    assert a.verdict == "pass", a.reason
    by = {c.name: c for c in a.criteria}
    for name in ("error_rate", "latency_p50", "latency_p95", "ttft_p95"):
        assert by[name].verdict == "pass", by[name]
    for name in ("output_length", "empty_rate", "truncated_rate", "tpot_p50", "style_drift"):
        assert by[name].verdict == "pass", by[name]  # read from the answers themselves
    for name, why in GATEWAY_UNSEEN.items():
        assert by[name].verdict == "skip"
        assert by[name].reason == f"not observed (both sides sampled by the gateway): {why}"
    assert f"{len(GATEWAY_UNSEEN)} not observed by the samples' source" in a.reason
    assert set(GATEWAY_UNSEEN) == {"cpu_per_request", "memory"}


def test_truncated_answers_on_gateway_rows_fail_on_truncation() -> None:
    a = analyze(
        gateway_rows(400, 1, truncated_rate=0.02),
        gateway_rows(400, 2, truncated_rate=0.3),
        None,
        None,
        SPEC,
        unobserved=unobserved(True, True),
    )
    assert a.verdict == "fail"
    assert a.criterion("truncated_rate").verdict == "fail"  # type: ignore[union-attr]


def test_bad_canary_on_gateway_rows_fails_on_errors() -> None:
    a = analyze(
        gateway_rows(300, 1),
        gateway_rows(300, 2, error_rate=0.3),
        None,
        None,
        SPEC,
        unobserved=unobserved(True, True),
    )
    assert a.verdict == "fail"
    assert a.criterion("error_rate").verdict == "fail"  # type: ignore[union-attr]


def test_missing_fields_are_skipped_not_zero() -> None:
    """No streamed answers: no TTFT on either side is 'not applicable', not a 0 s TTFT; and
    with no source info at all (the old call), text-less rows still skip text criteria."""
    base = gateway_rows(300, 1, streamed=False, answers=False)
    canary = gateway_rows(300, 2, streamed=False, answers=False)
    a = analyze(base, canary, None, None, SPEC, unobserved=unobserved(True, True))
    ttft = a.criterion("ttft_p95")
    assert ttft is not None and ttft.verdict == "skip" and "no streamed" in ttft.reason
    plain = analyze(base, canary, None, None, SPEC)
    for name in ("output_length", "empty_rate", "truncated_rate", "style_drift"):
        c = plain.criterion(name)
        assert c is not None and c.verdict == "skip", c
    assert plain.verdict == "pass"


def test_one_side_from_the_gateway_does_not_compare_ttft() -> None:
    unseen = unobserved(False, True)
    assert "the canary sampled by the gateway" in unseen["memory"]
    assert unseen["ttft_p95"].startswith("not comparable")
    assert unobserved(False, False) == {}
    a = analyze(gateway_rows(300, 1), gateway_rows(300, 2), None, None, SPEC, unobserved=unseen)
    assert a.criterion("ttft_p95").verdict == "skip"  # type: ignore[union-attr]


def test_between_looks_unseen_criteria_are_skipped_not_waiting() -> None:
    a = analyze(
        gateway_rows(20, 1),
        gateway_rows(20, 2),
        None,
        None,
        SPEC,
        unobserved=unobserved(True, True),
    )
    assert a.verdict == "wait" and a.look == 0
    verdicts = {c.name: c.verdict for c in a.criteria}
    assert {n for n in CRITERIA if verdicts[n] == "skip"} == set(GATEWAY_UNSEEN)


# --- the collector reading the gateway in-process --------------------------------------------


class FakeGateway:
    def __init__(self) -> None:
        self.sampling = GatewaySampling()
        self.watched: list[set[str]] = []

    def sample_groups(self, groups: Any) -> None:
        self.watched.append(set(groups))
        self.sampling.watch(groups)

    def samples(self, instance: str, after: int, limit: int) -> tuple[list[dict[str, Any]], int]:
        return self.sampling.read(instance, after, limit)


@pytest.mark.asyncio
async def test_collector_reads_gateway_rows_for_server_groups_only() -> None:
    gw = FakeGateway()
    col = SampleCollector(gateway=gw, poll_s=3600)
    try:
        col.watch([], from_gateway=["vllm"])
        assert gw.watched == [{"vllm"}]
        col.reset(["vllm"], now=0.0)
        assert col.window("vllm").from_gateway
        ring = gw.sampling.groups["vllm"]
        for i in range(2500):  # more than one page: all of it read in one round
            ring.record("v-1", 500 if i % 10 == 0 else 200, 0.2, 0.05, 100)
        await col.poll([("vllm", "v-1", "http://unused")])
        win = col.window("vllm")
        assert win.seen == 2500 and win.version == 1 and win.requests == 0
        assert sum(s.error for s in win.samples) == 250
        await col.poll([("vllm", "v-1", "http://unused")])
        assert win.seen == 2500  # each row once
        col.watch([])  # no rollout any more: the gateway records nothing
        assert gw.watched[-1] == set() and gw.sampling.groups == {}
    finally:
        await col.aclose()


@pytest.mark.asyncio
async def test_without_a_gateway_server_groups_show_as_failing() -> None:
    col = SampleCollector(poll_s=3600)
    try:
        col.watch([], from_gateway=["vllm"])
        await col.poll([("vllm", "v-1", "http://unused")])
        assert col.status()["failing"]["v-1"]["error"] == NO_GATEWAY
    finally:
        await col.aclose()
