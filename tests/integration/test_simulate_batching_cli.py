"""`sluice simulate` on a group of batching servers (a model's `sim.batching`, issue 36), as a
person runs it: the TTFT/TPOT line, the JSON percentiles and instance model, the report's
KV-cache chart, and a bad block refused naming its field."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.integration.test_simulate_cli import SLICE, SPEC, sluice

BATCHING = {
    "max_seqs": 16,
    "kv_tokens": 20_000,
    "prefill_tps": 20_000,
    "step_base_s": 0.01,
    "step_per_seq_s": 0.0005,
    "step_per_kv_token_s": 1e-7,
}


def batching_spec(tmp_path: Path, **batching: object) -> Path:
    data = yaml.safe_load(SPEC.read_text())
    g = data["groups"][0]
    g["max_concurrency"] = 24
    for m in g["models"].values():
        m["sim"]["batching"] = {**BATCHING, **batching}
    path = tmp_path / "batching.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_batching_group_shows_ttft_tpot_and_kv_use(tmp_path: Path) -> None:
    spec = batching_spec(tmp_path)
    args = ("simulate", "--spec", str(spec), "--trace", str(SLICE), "--policy", "fixed:2")
    r = sluice(*args, "--report", str(tmp_path / "rep"), home=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "batching instances: TTFT p50/p95/p99" in r.stdout
    assert "preemptions" in r.stdout
    assert (tmp_path / "rep" / "kv_cache.png").exists()
    assert "TPOT" in (tmp_path / "rep" / "index.html").read_text()
    doc = json.loads(sluice(*args, "--json", home=tmp_path).stdout)
    assert doc["instance_model"]["instances"]["kind"] == "batching"
    assert doc["ttft_p50_ms"] <= doc["ttft_p95_ms"] <= doc["ttft_p99_ms"]
    assert doc["tpot_p50_ms"] >= BATCHING["step_base_s"] * 1000
    assert 0 < doc["kv_cache_usage_max"] <= 1


def test_a_bad_batching_block_exits_2_naming_the_field(tmp_path: Path) -> None:
    spec = batching_spec(tmp_path, max_seqs=0)
    r = sluice("simulate", "--spec", str(spec), "--trace", str(SLICE), home=tmp_path)
    assert r.returncode == 2
    assert "batching.max_seqs" in r.stdout + r.stderr
