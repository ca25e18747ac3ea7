"""The load generator's pure parts: summary and timeline arithmetic over hand-made outcomes,
the target check (loopback or named hosts only), samples files and synthesized bodies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sluice.core.errors import SpecError
from sluice.tools.loadgen import (
    BEHIND_LAG_S,
    LoadLimits,
    LoadRun,
    Outcome,
    check_target,
    load_bodies,
    synthesized_body,
)


def outcome(
    at: float,
    sent: float | None,
    done: float | None,
    status: int | None,
    error: str | None = None,
    **extra: object,
) -> Outcome:
    fields: dict[str, object] = {"ttft_s": None, "itl_s": (), "output_tokens": None}
    fields.update(extra)
    return Outcome(at, sent, done, status, error=error, **fields)  # type: ignore[arg-type]


def sample_run() -> LoadRun:
    return LoadRun(
        outcomes=[
            outcome(0.0, 0.0, 0.1, 200, output_tokens=5, served_by="g1"),
            outcome(
                0.5,
                0.51,
                0.81,
                200,
                ttft_s=0.05,
                itl_s=(0.01, 0.02),
                output_tokens=3,
                served_by="g1",
            ),
            outcome(1.0, 1.05, 1.2, 503, "HTTP 503: busy", served_by="g2"),
            outcome(1.5, 1.6, 2.6, None, "timeout"),
            outcome(2.0, None, None, None, "unsent: in-flight cap"),
        ],
        started_at=1000.0,
        duration_s=2.6,
    )


def test_summary_counts_rates_and_latencies() -> None:
    s = sample_run().summary()
    assert (s["requests"], s["sent"], s["unsent"], s["ok"], s["errors"], s["shed"]) == (
        5,
        4,
        1,
        2,
        2,
        1,
    )
    assert s["status"] == {"200": 2, "503": 1, "error": 1}
    assert s["error_rate"] == 0.5
    assert s["offered_rps"] == pytest.approx(5 / 2.0)  # span: last at_s - first at_s
    assert s["achieved_rps"] == pytest.approx(2 / 2.0)
    assert s["latency_ms"]["p50"] == pytest.approx(200.0)
    assert s["latency_ms"]["mean"] == pytest.approx(200.0)
    assert s["latency_ms"]["max"] == pytest.approx(300.0)
    assert s["latency_from_schedule_ms"]["p50"] == pytest.approx((100 + 310) / 2)
    assert s["ttft_ms"] == {"p50": pytest.approx(50.0), "p95": pytest.approx(50.0)}
    assert s["itl_ms"]["p50"] == pytest.approx(15.0)
    assert s["output_tokens"] == 8
    assert s["mean_in_flight"] == pytest.approx((0.1 + 0.3 + 0.15 + 1.0) / 2.0)
    assert s["lag_ms"]["max"] == pytest.approx(100.0)
    assert s["lag_ms"]["p50"] == pytest.approx(30.0)
    assert s["served_by"] == {"g1": 2, "g2": 1}
    assert s["behind"] is True
    assert "1 of 5 arrivals unsent" in s["behind_reason"]
    assert "p99 schedule lag" in s["behind_reason"]
    json.dumps(s)  # JSON-safe


def test_summary_window_selects_by_scheduled_time_and_uses_its_span() -> None:
    s = sample_run().summary(since_s=0.0, until_s=1.0)
    assert (s["requests"], s["sent"], s["ok"], s["unsent"]) == (2, 2, 2, 0)
    assert s["offered_rps"] == pytest.approx(2.0)
    assert s["lag_ms"]["max"] == pytest.approx(10.0)
    assert s["behind"] is False and s["behind_reason"] is None
    late = sample_run().summary(since_s=1.0)
    assert (late["requests"], late["ok"], late["errors"]) == (3, 0, 2)
    assert late["latency_ms"]["p50"] is None and late["ttft_ms"]["p50"] is None


def test_lag_alone_over_the_threshold_is_behind() -> None:
    lag = BEHIND_LAG_S * 2
    run = LoadRun([outcome(i * 0.1, i * 0.1 + lag, i * 0.1 + 0.3, 200) for i in range(5)], 0, 1)
    s = run.summary()
    assert s["unsent"] == 0 and s["behind"] is True
    assert s["behind_reason"].startswith("p99 schedule lag 100 ms > 50 ms")


def test_a_broken_stream_after_200_is_an_error_not_ok() -> None:
    broken = outcome(0.0, 0.0, 0.5, 200, "stream: ended before data: [DONE]", ttft_s=0.1)
    s = LoadRun([broken], 0, 0.5).summary()
    assert (s["ok"], s["errors"], s["status"]) == (0, 1, {"error": 1})
    assert s["ttft_ms"]["p50"] is None


def test_empty_run_summary_and_timeline() -> None:
    run = LoadRun([], started_at=0.0, duration_s=0.0)
    s = run.summary()
    assert (s["requests"], s["sent"], s["error_rate"], s["behind"]) == (0, 0, 0.0, False)
    assert s["latency_ms"] == {"p50": None, "p95": None, "p99": None, "mean": None, "max": None}
    assert s["lag_ms"] == {"p50": None, "p99": None, "max": None}
    assert run.timeline() == [
        {
            "t_s": 0.0,
            "scheduled": 0,
            "sent": 0,
            "ok": 0,
            "errors": 0,
            "shed": 0,
            "p95_ms": None,
            "in_flight": 0,
        }
    ]


def test_timeline_bins() -> None:
    rows = sample_run().timeline(1.0)
    assert [r["t_s"] for r in rows] == [0.0, 1.0, 2.0]
    assert [r["scheduled"] for r in rows] == [2, 2, 1]
    assert [r["sent"] for r in rows] == [2, 2, 0]
    assert [r["ok"] for r in rows] == [2, 0, 0]
    assert [r["errors"] for r in rows] == [0, 1, 1]
    assert [r["shed"] for r in rows] == [0, 1, 0]
    assert rows[0]["p95_ms"] == pytest.approx(100 + 0.95 * 200)
    assert rows[1]["p95_ms"] is None
    assert [r["in_flight"] for r in rows] == [0, 1, 0]
    assert len(sample_run().timeline(0.5)) == 6
    with pytest.raises(ValueError):
        sample_run().timeline(0)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080",
        "http://127.3.4.5/v1",
        "https://[::1]:8443",
        "http://localhost:8000",
        "http://LOCALHOST",
    ],
)
def test_loopback_targets_pass(url: str) -> None:
    check_target(url, ())


def test_other_hosts_are_refused_unless_named() -> None:
    with pytest.raises(SpecError) as err:
        check_target("http://10.0.0.5:8080", (), option="--target")
    issue = err.value.issues[0]
    assert issue.field == "--target" and issue.file == "<command line>"
    assert "--allow-host 10.0.0.5" in issue.message
    check_target("http://10.0.0.5:8080", ["10.0.0.5"])
    check_target("http://gw.example.com", ["GW.example.com"])
    with pytest.raises(SpecError):
        check_target("http://gw.example.com", ["other.example.com"])


@pytest.mark.parametrize("url", ["ftp://127.0.0.1/x", "file:///etc/passwd", "127.0.0.1:8080"])
def test_non_http_urls_are_refused(url: str) -> None:
    with pytest.raises(SpecError) as err:
        check_target(url, ["127.0.0.1"])
    assert err.value.issues[0].field == "--endpoint"


def test_load_bodies_reads_each_kind_and_drops_ids(tmp_path: Path) -> None:
    path = tmp_path / "samples.jsonl"
    lines = [
        {"id": "a", "model": "m", "messages": [{"role": "user", "content": "hi"}]},
        {"model": "m", "prompt": "once upon"},
        {"model": "e", "input": ["x"]},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines[:2]) + "\n\n" + json.dumps(lines[2]))
    bodies = load_bodies(path)
    assert [p for p, _ in bodies] == ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"]
    assert "id" not in bodies[0][1] and bodies[0][1]["model"] == "m"


def test_a_bad_json_line_names_its_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text('{"model": "m", "prompt": "x"}\n{"model": "m", "prompt": \n')
    with pytest.raises(SpecError) as err:
        load_bodies(path)
    (issue,) = err.value.issues
    assert (issue.file, issue.line) == (str(path), 2)
    assert "not valid JSON" in issue.message and "one body a line" in issue.message
    assert f"{path}:2" in str(err.value)


def test_a_line_of_no_known_kind_is_refused_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text('{"model": "m", "text": "x"}\n[1, 2]\n')
    with pytest.raises(SpecError) as err:
        load_bodies(path)
    first, second = err.value.issues
    assert first.line == 1 and "'messages'" in first.message and "'input'" in first.message
    assert second.line == 2 and "JSON object" in second.message


def test_an_empty_or_missing_samples_file_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n  \n")
    with pytest.raises(SpecError, match="no requests"):
        load_bodies(empty)
    with pytest.raises(SpecError, match="cannot read"):
        load_bodies(tmp_path / "missing.jsonl")


def test_synthesized_body() -> None:
    path, body = synthesized_body("m", 12, 7)
    assert path == "/v1/chat/completions"
    assert body["model"] == "m" and body["max_tokens"] == 7 and "stream" not in body
    assert len(body["messages"][0]["content"].split()) == 12
    _, streamed = synthesized_body("m", 0, 0, stream=True)
    assert streamed["stream"] is True and streamed["stream_options"] == {"include_usage": True}
    assert streamed["max_tokens"] == 1 and streamed["messages"][0]["content"]


def test_limits_must_be_positive() -> None:
    with pytest.raises(SpecError) as err:
        LoadLimits(max_in_flight=0, timeout_s=-1)
    assert [i.field for i in err.value.issues] == ["max_in_flight", "timeout_s"]
