"""`sluice simulate` as a person runs it: one JSON document, the HTML report, located errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
SPEC = ROOT / "examples" / "reference-sim.yaml"
SLICE = ROOT / "examples" / "traces" / "azure_code_first600.norm.csv"
KEYS = (
    "requests",
    "slo_attainment",
    "p50_ms",
    "p99_ms",
    "instance_seconds",
    "cost",
    "scale_events",
    "peak_instances",
    "rejected",
)


def sluice(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SLUICE_HOME": str(home), "MPLBACKEND": "Agg"}
    return subprocess.run(
        [sys.executable, "-m", "sluice", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=ROOT,
    )


def test_simulate_prints_one_json_document(tmp_path: Path) -> None:
    r = sluice("simulate", "--spec", str(SPEC), "--trace", str(SLICE), "--json", home=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for key in KEYS:
        assert key in out, key
    assert out["requests"] == 600
    assert out["policy"] == "sluice"
    assert 0.0 <= out["slo_attainment"] <= 1.0
    assert out["instance_seconds"] >= out["work_floor_instance_seconds"]
    assert out["instance_model"]["slots_per_instance"] == 4


def test_policies_and_what_if_knobs(tmp_path: Path) -> None:
    rows = SLICE.read_text().splitlines()[1:]
    in_window = sum(1 for row in rows if float(row.split(",")[0]) < 200)
    for policy in ("hpa", "kpa", "fixed:3", "oracle"):
        r = sluice(
            "simulate",
            "--spec",
            str(SPEC),
            "--trace",
            str(SLICE),
            "--policy",
            policy,
            "--speedup",
            "2",
            "--rate-scale",
            "1.5",
            "--duration",
            "200",
            "--json",
            home=tmp_path,
        )
        assert r.returncode == 0, (policy, r.stderr)
        out = json.loads(r.stdout)
        assert out["policy"] == policy
        assert abs(out["requests"] - 1.5 * in_window) < 0.15 * in_window  # window, then x1.5
        assert out["duration_s"] < 200 / 2 + 60  # times halved


def test_report_writes_html_and_plots(tmp_path: Path) -> None:
    rep = tmp_path / "rep"
    r = sluice(
        "simulate",
        "--spec",
        str(SPEC),
        "--trace",
        str(SLICE),
        "--policy",
        "hpa",
        "--slo-ms",
        "3000",
        "--report",
        str(rep),
        "--json",
        home=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["report"] == str(rep / "index.html")
    page = (rep / "index.html").read_text()
    for png in ("load.png", "instances.png", "queue.png", "latency.png"):
        assert (rep / png).stat().st_size > 1000
        assert png in page
    assert "Decision log" in page


def test_a_bad_trace_exits_2_naming_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("t_s,input_tokens,output_tokens,model\n0,1,1,\n1,two,1,\n")
    r = sluice("simulate", "--spec", str(SPEC), "--trace", str(bad), home=tmp_path)
    assert r.returncode == 2
    assert f"{bad}:3:" in r.stderr
    r = sluice("simulate", "--spec", str(SPEC), "--trace", str(bad), "--json", home=tmp_path)
    assert r.returncode == 2
    assert json.loads(r.stdout)["error"]["issues"][0]["line"] == 3


def test_an_unknown_policy_is_a_clear_error(tmp_path: Path) -> None:
    r = sluice(
        "simulate", "--spec", str(SPEC), "--trace", str(SLICE), "--policy", "magic", home=tmp_path
    )
    assert r.returncode == 2
    assert "unknown autoscaling policy 'magic'" in r.stderr


def test_a_spec_the_simulator_cannot_run_is_refused_at_its_file_and_line(tmp_path: Path) -> None:
    """Checks made after loading name a field by its group's name (`groups.chat.slo`): the
    error gives the spec's file and that field's line (its group's, where it is missing)."""
    spec = tmp_path / "two.yaml"
    group = """  - name: {name}
    owner: o@example.com
    business: b
    alert_channel: "#c"
    models: {{m-{name}: {{runtime: sim}}}}
    resources: {{pool: p, memory_gb: 1}}
"""
    spec.write_text(
        "pools:\n  - {name: p, count: 8, memory_gb: 16}\ngroups:\n"
        + group.format(name="embed")
        + "    slo: {latency_ms: 500}\n"
        + group.format(name="chat")  # line 11, and no slo
        + "    slo: {ttft_ms: 200}\n"  # line 17: a first token, on slots
    )
    r = sluice("simulate", "--spec", str(spec), "--trace", str(SLICE), "--group", "chat", "--json",
               home=tmp_path)  # fmt: skip
    assert r.returncode == 2, r.stdout
    (issue,) = json.loads(r.stdout)["error"]["issues"]
    assert (issue["file"], issue["line"], issue["field"]) == (str(spec), 17, "groups.chat.slo")
    spec.write_text(spec.read_text().replace("    slo: {ttft_ms: 200}\n", ""))
    r = sluice("simulate", "--spec", str(spec), "--trace", str(SLICE), "--group", "chat",
               home=tmp_path)  # fmt: skip
    assert r.returncode == 2
    assert f"{spec}:11: groups.chat.slo: the group has no slo" in r.stderr, r.stderr
