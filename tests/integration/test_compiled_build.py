"""The build compiled with mypyc (setup.py's `SLUICE_COMPILE=1` build, as the image's
wheel and `make native` make it: the decision kernel and the gateway's request path)
behaves as the pure Python does: every module pyproject.toml names is an extension module
in the build; bench/decide.py's digests of every tick's decision and memory are the same
from both (the slot model: autoscalers, quota, loans, plan); `sluice simulate --json` on
the batching reference (token loads, the batching capacity, `TokenMemory`) prints the same
document from both; and the gateway's own tests pass on the compiled gateway."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.compiled_wheel import compiled_wheel

ROOT = Path(__file__).resolve().parents[2]
SLICE = ROOT / "examples" / "traces" / "azure_code_first600.norm.csv"


def _python(path: Path, *args: str, timeout: float = 600) -> str:
    """`python -P ARGS` with `sluice` imported from `path` only (-P: not from the cwd)."""
    env = {**os.environ, "PYTHONPATH": str(path)}
    r = subprocess.run(
        [sys.executable, "-P", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image's compiled wheel (tests/compiled_wheel.py), unpacked apart: a tree whose
    `sluice` is the very build the image installs."""
    target = tmp_path_factory.mktemp("native")
    with zipfile.ZipFile(compiled_wheel(tmp_path_factory)) as whl:
        whl.extractall(target)
    return target


def test_every_named_module_is_compiled(native: Path) -> None:
    with open(ROOT / "pyproject.toml", "rb") as f:
        named = tomllib.load(f)["tool"]["sluice"]["compiled"]
    modules = [p.removesuffix(".py").replace("/", ".") for p in named]
    probe = "import importlib, json, sys; "
    probe += "print(json.dumps([importlib.import_module(m).__file__ for m in sys.argv[1:]]))"
    files = json.loads(_python(native, "-c", probe, *modules))
    for module, file in zip(modules, files, strict=True):
        assert file.startswith(str(native)) and file.endswith(".so"), (module, file)


def test_the_compiled_kernel_decides_as_the_pure_python(native: Path) -> None:
    args = ("bench/decide.py", "--json", "--digest", "--groups", "120", "--pools", "4")
    run = (*args, "--per-group", "6", "--ticks", "10", "--warmup", "80")
    pure = json.loads(_python(ROOT, *run))
    compiled = json.loads(_python(native, *run, "--tree", str(native)))
    assert (pure["compiled"], compiled["compiled"]) == (False, True)
    assert pure["actions_per_tick"] > 0  # groups scaled: launches and drains were planned
    for key in ("decisions_sha256", "memories_sha256", "instances_at_end"):
        assert compiled[key] == pure[key], key


def test_the_compiled_simulator_prints_the_same_batching_run(native: Path) -> None:
    spec = ROOT / "examples" / "reference-sim-batching.yaml"
    run = ("-m", "sluice", "simulate", "--spec", str(spec), "--trace", str(SLICE), "--json")
    pure = json.loads(_python(ROOT, *run))
    compiled = json.loads(_python(native, *run))
    assert pure["scale_events"] > 0 and pure["instance_model"]["instances"]["kind"] == "batching"
    assert compiled == pure


def test_the_gateway_tests_pass_on_the_compiled_gateway(native: Path) -> None:
    """The gateway's integration tests, run by pytest in a process whose `sluice` is the
    build's: its compiled modules are imported first (so every test gets them), and
    `--import-mode=append` keeps the checkout behind them on the path."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        named = tomllib.load(f)["tool"]["sluice"]["compiled"]
    gateway = [p.removesuffix(".py").replace("/", ".") for p in named if "/gateway/" in p]
    run = (
        "import importlib, sys, pytest\n"
        "for name in sys.argv[1:]:\n"
        "    assert importlib.import_module(name).__file__.endswith('.so'), name\n"
        "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-p', 'no:randomly',\n"
        "    '-p', 'no:benchmark', '--import-mode=append',\n"
        "    'tests/integration/test_gateway.py', 'tests/integration/test_gateway_limits.py']))\n"
    )
    out = _python(native, "-c", run, *gateway, timeout=900)
    assert " passed" in out and "failed" not in out, out[-3000:]
