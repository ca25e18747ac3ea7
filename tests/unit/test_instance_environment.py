"""No tenant key, drill key, token or other `SLUICE_*` secret reaches an instance: its
process starts from an allow-list of Sluice's environment (what a model server needs), less
the variables the spec reads keys from, plus what the runtime and the spec set for it."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import httpx
import pytest

from sluice.runtime import LaunchRequest, LocalRuntime
from sluice.runtime.environment import instance_environment, passes
from sluice.spec import load_spec_text
from sluice.spec.secrets import secret_env_names

DRILL_KEY = "sk-ops-drill-key-000000001"
TENANT_KEY = "sk-tenant-key-0000000002"

SECRETS = {
    "SLUICE_DRILL_KEY": DRILL_KEY,
    "SLUICE_TOKEN": "slc_cli_token",
    "SLUICE_GATEWAY_TOKEN": "slc_gateway_token",
    "SLUICE_DATABASE_URL": "postgresql://sluice:hunter2@db/sluice",
    "SLUICE_API_KEY": TENANT_KEY,
    "ACME_KEYS": TENANT_KEY,  # a tenant's api_keys_env
    "AWS_SECRET_ACCESS_KEY": "aws-secret",
    "GITHUB_TOKEN": "ghp_secret",
}
NEEDED = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/home/svc",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "TMPDIR": "/scratch",
    "PYTHONPATH": "/opt/lib",
    "CUDA_HOME": "/usr/local/cuda",
    "CUDA_VISIBLE_DEVICES": "0",
    "NVIDIA_VISIBLE_DEVICES": "all",
    "LD_LIBRARY_PATH": "/usr/local/cuda/lib64",
    "HF_HOME": "/models/cache",
    "TRANSFORMERS_CACHE": "/models/tf",
    "TORCH_HOME": "/models/torch",
    "TORCHINDUCTOR_CACHE_DIR": "/models/inductor",
    "OMP_NUM_THREADS": "4",
    "MKL_NUM_THREADS": "4",
    "OPENBLAS_NUM_THREADS": "4",
}


def test_only_what_a_model_server_needs_passes() -> None:
    env = instance_environment({**SECRETS, **NEEDED})
    assert env == NEEDED
    assert not any(passes(name) for name in SECRETS)
    assert not passes("SLUICE_HOME") and not passes("SLUICE_INSTANCE_ID")  # set, not inherited


def test_a_name_the_spec_reads_a_key_from_never_passes_even_if_allowed() -> None:
    text = """\
pools: [{name: p, count: 4, memory_gb: 16}]
groups:
  - name: chat
    owner: o
    business: b
    alert_channel: c
    models: {m: {runtime: sim}}
    resources: {pool: p, memory_gb: 1}
    slo: {latency_ms: 500}
    autoscaling: {max: 2}
routes:
  - {tag: main, match: {models: [m]}, to: chat}
tenants:
  - {name: acme, api_keys_env: HF_ACME_KEYS}
drills:
  - {name: d, group: chat, cron: '0 3 * * *', api_key_env: PYTHON_DRILL_KEY}
"""
    withheld = secret_env_names(load_spec_text(text).spec)
    assert withheld == {"HF_ACME_KEYS", "PYTHON_DRILL_KEY"}
    environ = {"HF_ACME_KEYS": TENANT_KEY, "PYTHON_DRILL_KEY": DRILL_KEY, "HF_HOME": "/m"}
    assert instance_environment(environ, withheld) == {"HF_HOME": "/m"}


@pytest.mark.timeout(60)
def test_a_real_worker_has_no_key_in_its_environment_or_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`SLUICE_DRILL_KEY=sk-ops-c391959605db2757 sluice up ...`: the instance processes must
    not have it."""
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HF_HOME", "/models/cache")
    iid = f"grp-{uuid.uuid4().hex[:8]}"
    sim = {
        "runtime": "sim",
        "version": "v1",
        "sim": {"service_time": {"kind": "fixed", "seconds": 0}},
    }
    config = {"instance_id": iid, "group": "grp", "models": {"m": sim}}
    req = LaunchRequest(
        iid, "grp", config, {"OMP_NUM_THREADS": "1"}, withheld_env=frozenset({"ACME_KEYS"})
    )

    async def run() -> tuple[dict[str, str], bytes]:
        rt = LocalRuntime(tmp_path)
        handle = await rt.launch(req)
        try:
            assert handle.pid is not None
            raw = Path(f"/proc/{handle.pid}/environ").read_bytes().decode()
            cmdline = Path(f"/proc/{handle.pid}/cmdline").read_bytes()
            async with httpx.AsyncClient(trust_env=False) as http:  # it works without them
                deadline = time.monotonic() + 20
                while True:
                    try:
                        if (await http.get(handle.url + "/health", timeout=5)).is_success:
                            break
                    except httpx.TransportError:
                        pass
                    assert time.monotonic() < deadline, "the worker never got healthy"
                    await asyncio.sleep(0.05)
        finally:
            await rt.stop(handle, grace_s=5)
        return dict(i.split("=", 1) for i in raw.split("\0") if "=" in i), cmdline

    env, cmdline = asyncio.run(run())
    assert not set(SECRETS) & set(env)
    blob = "\0".join(f"{k}={v}" for k, v in env.items()).encode() + cmdline
    for value in SECRETS.values():
        assert value.encode() not in blob
    assert env["HF_HOME"] == "/models/cache" and env["OMP_NUM_THREADS"] == "1"
    assert "PATH" in env and env["PYTHONUNBUFFERED"] == "1"
