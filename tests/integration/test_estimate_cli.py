"""`sluice estimate MODEL_DIR` as a person runs it: the breakdown, --json, the pool it
recommends from a spec, and clear errors (exit 4) for a directory without a model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parents[2]

LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}

SPEC = """
pools:
  - {name: l4, accelerator: l4-24g, count: 8, memory_gb: 24}
  - {name: h100, accelerator: h100-80g, count: 8, memory_gb: 80}
"""


def sluice(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SLUICE_HOME": str(home), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "sluice", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=ROOT,
    )


def model_dir(tmp_path: Path, config: dict[str, Any] | str = LLAMA3_8B) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    return d


def test_json_breakdown_and_recommended_pool(tmp_path: Path) -> None:
    d = model_dir(tmp_path)
    spec = tmp_path / "pools.yaml"
    spec.write_text(SPEC)
    r = sluice(
        "estimate", str(d), "--max-context", "8192", "--concurrency", "16", "-f", str(spec),
        "--json", home=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["weights_source"] == "config" and out["dtype"] == "bf16"
    assert abs(out["params"] - 8.03e9) < 0.01 * 8.03e9
    assert out["kv_bytes_per_token"] == 128 * 1024
    assert out["gib"]["kv_cache"] == 16.0
    b = out["bytes"]
    assert b["total"] == b["weights"] + b["kv_cache"] + b["overhead"]
    # 36.5 GiB: two L4s (tensor parallel) hold it in 48 GiB, less than one H100's 80.
    best = out["recommended"]
    assert (best["pool"], best["accelerators"], best["tensor_parallel"]) == ("l4", 2, True)
    assert [p["pool"] for p in out["pools"]] == ["l4", "h100"]


def test_table_and_safetensors_size(tmp_path: Path) -> None:
    d = model_dir(tmp_path)
    # Real bytes win over the count (8.03B x 2 B = 14.96 GiB): say the checkpoint has more.
    index = {"metadata": {"total_size": 17 * 2**30}, "weight_map": {}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    r = sluice("estimate", str(d), home=tmp_path)
    assert r.returncode == 0, r.stderr
    for text in ("weights", "17.00", "KV cache", "128 KiB/token", "context 8192", "total"):
        assert text in r.stdout, text
    assert "safetensors" in r.stdout
    # --dtype asks what-if: the count at that width, not the files' bytes.
    r = sluice("estimate", str(d), "--dtype", "int4", "--json", home=tmp_path)
    out = json.loads(r.stdout)
    assert out["weights_source"] == "config" and out["dtype"] == "int4"
    # 6.98B layer weights x 0.5 B + embeddings and LM head (1.05B) x 2 B = 5.21 GiB
    assert out["gib"]["weights"] == 5.207


def test_missing_directory_or_config_is_not_found(tmp_path: Path) -> None:
    r = sluice("estimate", str(tmp_path / "nope"), home=tmp_path)
    assert r.returncode == 4
    assert "model directory not found" in r.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    r = sluice("estimate", str(empty), "--json", home=tmp_path)
    assert r.returncode == 4
    error = json.loads(r.stdout)["error"]
    assert error["code"] == "not_found" and "no config.json" in error["message"]


def test_bad_config_names_the_file_and_field(tmp_path: Path) -> None:
    d = model_dir(tmp_path, {k: v for k, v in LLAMA3_8B.items() if k != "hidden_size"})
    r = sluice("estimate", str(d), home=tmp_path)
    assert r.returncode == 2
    assert f"{d / 'config.json'}: hidden_size: missing" in r.stderr
    r = sluice("estimate", str(d), "--dtype", "fp7", home=tmp_path)
    assert r.returncode == 2 and "--dtype: unknown dtype 'fp7'" in r.stderr
