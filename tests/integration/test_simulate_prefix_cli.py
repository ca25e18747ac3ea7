"""`sluice simulate --trace FILE.jsonl`: a block trace (Mooncake's format, `hash_ids`) through
a group's prefix-cache-aware choice against power of two choices and affinity, in the real
command."""

from __future__ import annotations

import json
from pathlib import Path

from tests.integration.test_simulate_cli import sluice
from tests.unit.test_prefix_routing import conversations

SPEC = """
pools: [{name: p, count: 8, memory_gb: 80}]
groups:
  - name: chat
    owner: a@example.com
    business: b
    alert_channel: '#b'
    models: {m: {runtime: sim}}
    resources: {pool: p, memory_gb: 1}
    replicas: 6
    max_concurrency: 64
    prefix_routing: {index_blocks: 200}
  - name: other
    owner: a@example.com
    business: b
    alert_channel: '#b'
    models: {n: {runtime: sim}}
    resources: {pool: p, memory_gb: 1}
"""


def write_trace(path: Path) -> Path:
    """The unit tests' multi-turn chats (`conversations`), as Mooncake JSONL lines."""
    with path.open("w") as f:
        for r in conversations(n=1200):
            row = {"timestamp": int(r.at * 1000), "input_length": r.input_tokens,
                   "output_length": r.output_tokens, "hash_ids": list(r.blocks)}  # fmt: skip
            f.write(json.dumps(row) + "\n")
    return path


def test_a_block_trace_compares_the_groups_prefix_choice(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    trace = write_trace(tmp_path / "chats.jsonl")
    r = sluice("simulate", "--spec", str(spec), "--trace", str(trace), "--prefill-tps", "60000",
               "--json", home=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["mode"] == "prefix" and out["group"] == "chat" and out["prefix_routing"] == "spec"
    assert out["instances"] == 6 and out["cache_blocks_per_instance"] == 200
    assert out["requests"] == 1200
    rates = {p["picker"]: p["hit_rate"] for p in out["pickers"]}
    assert rates["prefix"] > rates["p2c"] and out["hit_rate_vs_fleet_bound"] >= 0.8, out
    table = sluice("simulate", "--spec", str(spec), "--trace", str(trace), "--group", "other",
                   home=tmp_path)  # fmt: skip
    assert table.returncode == 0, table.stderr
    assert "group other, prefix_routing from the defaults" in table.stdout
    assert "of the fleet bound" in table.stdout


def test_a_bad_block_trace_is_a_clear_error(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 10}\n')
    r = sluice("simulate", "--spec", str(spec), "--trace", str(bad), home=tmp_path)
    assert r.returncode == 2
    assert "bad.jsonl:1: not a Mooncake trace line" in r.stderr and "Traceback" not in r.stderr
    r = sluice("simulate", "--spec", str(spec), "--trace", str(bad), "--group", "nope",
               home=tmp_path)  # fmt: skip
    assert r.returncode == 2 and "no group 'nope'" in r.stderr
