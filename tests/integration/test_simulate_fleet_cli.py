"""`sluice simulate` on a whole fleet, as a person runs it: a trace per group (or one CSV
with a `group` column), one JSON document, the report, a what-if pool size, and clear
errors for a trace of a group the spec does not have."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.integration.test_simulate_cli import ROOT, sluice

SPEC = ROOT / "tests" / "data" / "fleet3.yaml"
BY_GROUP = ROOT / "tests" / "data" / "fleet3_traces.csv"
ROW_KEYS = (
    "group",
    "requests",
    "slo_attainment",
    "slo_target",
    "p50_ms",
    "p99_ms",
    "rejected",
    "failed",
    "instance_seconds",
    "unit_hours",
    "cost",
    "borrowed_unit_hours",
    "lent_unit_hours",
    "reclaims",
    "reclaim_max_latency_s",
    "refusals",
    "peak_instances",
)


def fleet(*args: str, home: Path) -> dict[str, Any]:
    r = sluice("simulate", "--spec", str(SPEC), *args, "--json", home=home)
    assert r.returncode == 0, r.stderr
    out: dict[str, Any] = json.loads(r.stdout)
    assert out["mode"] == "fleet"
    return out


def test_a_trace_per_group_prints_one_document_and_writes_the_report(tmp_path: Path) -> None:
    rep = tmp_path / "rep"
    out = fleet(
        *("--trace", "core=family:poisson-4@1", "--trace", "chat=family:flash-crowd@2"),
        *("--duration", "660", "--report", str(rep)),
        home=tmp_path,
    )
    rows = {r["group"]: r for r in out["groups"]}
    assert set(rows) == {"core", "chat", "batch"}
    for r in rows.values():
        for key in ROW_KEYS:
            assert key in r, key
    assert rows["batch"]["requests"] == 0 and rows["batch"]["unit_hours"] > 0  # it holds one
    assert rows["chat"]["borrowed_unit_hours"] > 0  # the crowd (at 600 s) ran above its 2
    assert out["totals"]["requests"] == sum(r["requests"] for r in rows.values())
    assert any(x["borrower"] == "chat" for x in out["ledger"])
    assert out["report"] == str(rep / "index.html")
    page = (rep / "index.html").read_text()
    for png in ("pool-gpu.png", "group-core.png", "group-chat.png", "group-batch.png"):
        assert (rep / png).stat().st_size > 1000
        assert png in page


def test_one_csv_with_a_group_column_and_a_smaller_pool(tmp_path: Path) -> None:
    lines = BY_GROUP.read_text().splitlines()[1:]
    want = {g: sum(1 for x in lines if x.endswith("," + g)) for g in ("core", "chat")}
    out = fleet("--trace", str(BY_GROUP), home=tmp_path)
    got = {r["group"]: r["requests"] for r in out["groups"]}
    assert got == {**want, "batch": 0}
    small = fleet("--trace", str(BY_GROUP), "--pool", "gpu=5", home=tmp_path)
    assert small["pools"] == [{"name": "gpu", "count": 5, "price_per_hour": 2.0}]


def test_a_trace_for_a_group_the_spec_lacks_is_a_clear_error(tmp_path: Path) -> None:
    r = sluice(
        *("simulate", "--spec", str(SPEC), "--trace", "core=family:poisson-1"),
        *("--trace", "search=family:poisson-1"),
        home=tmp_path,
    )
    assert r.returncode == 2
    assert "no group named 'search'" in r.stderr and "--trace" in r.stderr
    bad = tmp_path / "bad.csv"
    bad.write_text("t_s,input_tokens,output_tokens,model,group\n0,1,1,m,core\n1,1,1,m,serch\n")
    r = sluice("simulate", "--spec", str(SPEC), "--trace", str(bad), "--json", home=tmp_path)
    assert r.returncode == 2
    (issue,) = json.loads(r.stdout)["error"]["issues"]
    assert issue["line"] == 3 and "'serch'" in issue["message"]
