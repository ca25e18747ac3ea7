"""`sluice loadtest GROUP --fit` through the real `sluice` command (issue 36): a fake
OpenAI-compatible server with known batching parameters (`openai_stub.py --step-base-s
--step-per-seq-s --prefill-tps`) is measured through the gateway, and the fitted
parameters come back within 10 % (step time) and 25 % (prefill rate).

Why prefill is looser: its slope is read off TTFT, which also carries the gateway's and the
client's per-request overhead (a few ms, with the scatter of a busy 2-core machine) against
a prefill of 6 to 200 ms, from 15 answers; the step parameters come from some 500 chunk
gaps, where a late read of one chunk only moves time to the next gap.

Steps of 20 + 5 x b ms (25 ms alone, 60 ms at 8): tens of ms, well above the timer and
scheduling jitter of a busy machine. Everything goes to 127.0.0.1, every load is bounded
(3 s per concurrency, 16 requests at concurrency 1), and the whole test takes under a minute.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Sluice, running

pytestmark = pytest.mark.serial  # it measures time: run alone (Makefile)

STEP_BASE_S, STEP_PER_SEQ_S, PREFILL_TPS = 0.02, 0.005, 20_000.0
STUB = str(Path(__file__).with_name("openai_stub.py"))
ARGV = [
    sys.executable, STUB, "--host", "{host}", "--port", "{port}", "--model", "{model}",
    "--step-base-s", str(STEP_BASE_S), "--step-per-seq-s", str(STEP_PER_SEQ_S),
    "--prefill-tps", str(PREFILL_TPS),
]  # fmt: skip
KEY = "sk-ops-5d1e0b7c93a24f68"
SPEC = f"""
gateway: {{host: 127.0.0.1, port: 0}}
pools:
  - {{name: gpu, accelerator: fake-gpu, count: 2, memory_gb: 16}}
groups:
  - name: llm
    owner: ops@example.com
    business: search
    alert_channel: "#ops"
    models:
      m-llm:
        runtime: command
        version: v7
        command:
          argv: [{", ".join(f'"{a}"' for a in ARGV)}]
          metrics_path: /metrics
          stop_grace_s: 1
    resources: {{pool: gpu, accelerators: 1, memory_gb: 1}}
    max_concurrency: 8
    replicas: 1
    slow_start_s: 0
    warmup: {{requests: 1}}
    health: {{interval_s: 0.5, failure_threshold: 2, timeout_s: 1, startup_timeout_s: 20}}
tenants:
  - {{name: ops, api_keys: [{KEY}], operator: true}}
"""


def sluice(s: Sluice, *args: str, timeout: float = 120) -> tuple[int, Any, str]:
    """`sluice ARGS --json` as the operator tenant: (exit code, its JSON, its stderr)."""
    r = subprocess.run(
        [sys.executable, "-m", "sluice", *args, "--json"],
        capture_output=True,
        text=True,
        env={**s.env(), "SLUICE_API_KEY": KEY},
        timeout=timeout,
    )
    assert r.stdout, r.stderr
    return r.returncode, json.loads(r.stdout), r.stderr


def test_the_fit_finds_the_servers_batching_parameters(tmp_path: Path) -> None:
    with running(tmp_path, SPEC, "llm ready", lambda s: len(s.ready("llm")) == 1) as s:
        code, report, stderr = sluice(s, "loadtest", "llm", "--fit", "--fit-step", "3s")
        assert code == 0, (report, stderr)
        fit = report["fit"]
        assert fit is not None and "error" not in fit, fit
        got = fit["params"]
        print("fitted:", json.dumps(got), "true:", STEP_BASE_S, STEP_PER_SEQ_S, PREFILL_TPS)
        print("errors:", {k: fit[k] for k in ("step_base_s", "step_per_seq_s", "prefill_tps")})
        assert got["step_base_s"] == pytest.approx(STEP_BASE_S, rel=0.10), fit
        assert got["step_per_seq_s"] == pytest.approx(STEP_PER_SEQ_S, rel=0.10), fit
        assert got["prefill_tps"] == pytest.approx(PREFILL_TPS, rel=0.25), fit
        # the errors are stated (small here: the stub keeps its steps on a schedule)
        for key in ("step_base_s", "step_per_seq_s", "prefill_tps"):
            est = fit[key]
            assert est["stderr"] > 0 and est["rel_err"] < 0.1, est
        # the stub sends one token a chunk and reports its prompt's words as usage
        assert fit["chunks"]["not_one_token_each"] == 0, fit["chunks"]
        assert fit["prompt_tokens_from"] == "usage"
        assert [p["prompt_tokens"] for p in fit["prompts"]] == [128, 1024, 4096]
        assert [lv["concurrency"] for lv in fit["levels"]] == [1, 2, 4, 8]
        assert all(lv["errors"] == 0 and lv["used"] > 0 for lv in fit["levels"]), fit["levels"]
        # the stub has no KV-token cost: identified by the prompt lengths, and about 0
        assert fit["kv_identified"], fit["kv_note"]
        assert abs(got["step_per_kv_token_s"]) < 1e-6, fit["kv_note"]
        # a fit only: no knee, stored under the model version with its verdict
        assert report["knee"] is None and report["steps"] == []
        assert report["stored"]["verdict"] == "fitted"
        runs = s.cli("capacity", "llm", "--kind", "loadtest")
        assert runs[0]["version"] == "v7" and runs[0]["report"]["fit"]["params"] == got
        # the pin held the group at one instance and is gone
        kinds = [e["kind"] for e in s.cli("events", "llm", "--limit", "100")]
        assert "pin" in kinds and "unpin" in kinds
