"""`sluice simulate --fit`: a `command` group (a real server the simulator cannot run) is
simulated as the batching server `sluice loadtest --fit` measured, and the run says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sluice.core.errors import SpecError
from sluice.sim.model import with_fitted_batching
from sluice.spec import load_spec_text
from tests.integration.test_simulate_cli import SLICE, sluice

SPEC = """
pools: [{name: gpu, accelerator: fake-gpu, count: 8, memory_gb: 80, price_per_hour: 2.0}]
groups:
  - name: chat
    owner: ops@example.com
    business: search
    alert_channel: "#ops"
    models:
      m-chat:
        runtime: command
        version: v7
        command: {argv: [vllm, serve, m, --port, "{port}"]}
    resources: {pool: gpu, accelerators: 1, memory_gb: 1}
    max_concurrency: 32
    slo: {latency_ms: 20000}
    autoscaling: {min: 1, max: 8}
"""
FIT = {
    "group": "chat",
    "version": "v7",
    "fit": {
        "params": {"step_base_s": 0.02, "step_per_seq_s": 0.0005, "step_per_kv_token_s": 0.0,
                   "prefill_tps": 12000.0},
        "startup_s": 45.0,
    },
}  # fmt: skip


def test_a_command_group_is_simulated_as_the_server_its_load_test_fitted(tmp_path: Path) -> None:
    spec, fit = tmp_path / "spec.yaml", tmp_path / "fit.json"
    spec.write_text(SPEC)
    fit.write_text(json.dumps({"id": 12, "version": "v7", "report": FIT}))  # a stored run
    without = sluice("simulate", "--spec", str(spec), "--trace", str(SLICE), "--json",
                     home=tmp_path)  # fmt: skip
    assert without.returncode == 2 and "sluice simulate --fit" in without.stdout
    r = sluice("simulate", "--spec", str(spec), "--trace", str(SLICE), "--fit", str(fit),
               "--json", home=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["fitted"]["group"] == "chat" and out["fitted"]["from"] == str(fit)
    assert out["fitted"]["startup_s"] == 45.0 and out["fitted"]["batching"]["max_seqs"] == 32
    assert out["instance_model"]["instances"]["kind"] == "batching"
    assert out["requests"] > 0 and out["ttft_p95_ms"] is not None
    table = sluice("simulate", "--spec", str(spec), "--trace", str(SLICE), "--fit", str(fit),
                   home=tmp_path)  # fmt: skip
    assert "chat: the server fitted by" in table.stdout and "start-up 45 s" in table.stdout


def test_a_fit_that_is_not_one_names_what_to_give() -> None:
    spec = load_spec_text(SPEC).spec
    with pytest.raises(SpecError, match="no fitted batching model"):
        with_fitted_batching(spec, {"group": "chat", "knee": {}}, "run.json")
    with pytest.raises(SpecError, match="which this spec does not have"):
        with_fitted_batching(spec, {**FIT, "group": "other"}, "run.json")
    no_step = {**FIT, "fit": {"params": {"step_base_s": None}, "error": "one batch size"}}
    with pytest.raises(SpecError, match="no step time \\(one batch size\\)"):
        with_fitted_batching(spec, no_step, "run.json")
