"""The image's compiled wheel, built once per test run and shared by every test that needs
it (the deploy test checks the file the image installs; the compiled-build tests run it).

The build is the Dockerfile's build stage, on the files that stage copies
(pyproject.toml, setup.py, README.md, sluice/): `SLUICE_COMPILE=1 pip wheel --no-deps
--no-build-isolation` (the mypy and setuptools installed here build it). It takes minutes
(mypyc, then the C compiler), so the pytest-xdist workers of one run share one: the first
to ask builds it under a file lock in the run's common temporary directory, the others
wait for that lock and take the file.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONTEXT = ("pyproject.toml", "setup.py", "README.md", "sluice")
"""What the Dockerfile's build stage copies (tests/unit/test_deploy_manifests.py checks)."""
PIP_WHEEL = (sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q")
"""The build stage's `pip wheel` (the same flags, but its --no-cache-dir)."""


def compiled_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The path of the compiled wheel (module docstring). Without a C compiler: skipped,
    or failed under CI (.ci/run installs gcc)."""
    if shutil.which(os.environ.get("CC", "cc")) is None:
        if os.environ.get("CI"):
            pytest.fail("no C compiler for the compiled wheel: .ci/run installs gcc")
        pytest.skip("no C compiler for the compiled wheel")
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # (each worker's own directory is one below the run's)
    home = base / "compiled-wheel"
    home.mkdir(exist_ok=True)
    with open(home / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        wheels = home / "wheels"
        built = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
        if not built:
            built = [_build(home, wheels)]
        [wheel] = built
        return wheel


def _build(home: Path, wheels: Path) -> Path:
    context = home / "context"
    shutil.rmtree(context, ignore_errors=True)
    context.mkdir()
    for name in CONTEXT:
        if (ROOT / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.so")
            shutil.copytree(ROOT / name, context / name, ignore=ignore)
        else:
            shutil.copy(ROOT / name, context / name)
    done = subprocess.run(
        [*PIP_WHEEL, "--wheel-dir", str(wheels), str(context)],
        capture_output=True,
        text=True,
        timeout=1200,
        env={**os.environ, "SLUICE_COMPILE": "1"},
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    [wheel] = wheels.glob("*.whl")
    return wheel
