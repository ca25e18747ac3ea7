"""Trace files: the shared format, windowing, time and rate scaling, located errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sluice.core.errors import NotFound, SpecError
from sluice.sim import load_trace, trace_from_rows

SLICE = Path(__file__).parents[2] / "examples" / "traces" / "azure_code_first600.norm.csv"


def test_reads_the_shared_normalized_format() -> None:
    tr = load_trace(SLICE)
    assert len(tr) == 600
    assert tr.t[0] == 0.0 and np.all(np.diff(tr.t) >= 0)
    assert tr.input_tokens[0] == 4808 and tr.output_tokens[0] == 10
    assert tr.models == ("",)


def test_optional_tenant_and_priority_columns(tmp_path: Path) -> None:
    f = tmp_path / "t.csv"
    f.write_text(
        "t_s,input_tokens,output_tokens,model,tenant,priority\n"
        "1.5,10,2,a,acme,high\n0.5,20,3,b,zeta,\n"
    )
    tr = load_trace(f)
    assert tr.t.tolist() == [0.5, 1.5]  # sorted by time
    assert [tr.models[i] for i in tr.model] == ["b", "a"]
    assert [tr.tenants[i] for i in tr.tenant] == ["zeta", "acme"]
    assert tr.priority.tolist() == [1, 0]  # normal (default), high


@pytest.mark.parametrize(
    ("body", "line", "words"),
    [
        ("t_s,input_tokens,output_tokens,model\n0,1,1,\nx,1,1,\n", 3, "not a number"),
        ("t_s,input_tokens,output_tokens,model\n0,1,1,\n1,1,\n", 3, "3 fields"),
        ("t_s,input_tokens,output_tokens,model\n0,-1,1,\n", 2, ">= 0"),
        ("t_s,input_tokens,model\n0,1,\n", 1, "missing column(s) output_tokens"),
        ("t_s,input_tokens,output_tokens,model,priority\n0,1,1,,urgent\n", 2, "unknown priority"),
    ],
)
def test_a_bad_trace_names_file_and_line(tmp_path: Path, body: str, line: int, words: str) -> None:
    f = tmp_path / "bad.csv"
    f.write_text(body)
    with pytest.raises(SpecError) as info:
        load_trace(f)
    issue = info.value.issues[0]
    assert issue.file == str(f) and issue.line == line
    assert words in str(info.value)
    assert f"{f}:{line}:" in str(info.value)


def test_a_missing_file_is_reported_as_missing(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="trace file not found"):
        load_trace(tmp_path / "nope.csv")


def test_window_and_speedup() -> None:
    tr = trace_from_rows((float(t), 1, 1) for t in range(100))
    w = tr.transform(start=10, duration=20)
    assert len(w) == 20 and w.t[0] == 0.0 and w.t[-1] == 19.0
    fast = tr.transform(speedup=10)
    assert len(fast) == 100 and fast.t[-1] == pytest.approx(9.9)


def test_rate_scale_thins_and_replicates_reproducibly() -> None:
    tr = trace_from_rows((t * 0.1, t % 7, 1) for t in range(10_000))
    half = tr.transform(rate_scale=0.5, seed=1)
    assert 4_700 < len(half) < 5_300
    double = tr.transform(rate_scale=2.5, seed=1)
    assert 24_500 < len(double) < 25_500
    assert np.all(np.diff(double.t) >= 0)
    again = tr.transform(rate_scale=2.5, seed=1)
    assert np.array_equal(double.t, again.t)
    # copies keep the request's tokens and land within 1 s after the original
    assert sorted(set(double.input_tokens.tolist())) == list(range(7))
    assert double.t.max() < tr.t.max() + 1.0
