"""The `sluice` command as a person runs it: exit codes, located errors, --json output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

QUICKSTART = Path(__file__).parents[2] / "examples" / "quickstart.yaml"


def sluice(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SLUICE_HOME": str(home)}
    env.pop("SLUICE_CONTROL_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "sluice", *args], capture_output=True, text=True, env=env, timeout=60
    )


def test_validate_accepts_the_quickstart(tmp_path: Path) -> None:
    r = sluice("validate", "-f", str(QUICKSTART), "--json", home=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["valid"] and out["groups"] == ["chat", "embed"]


def test_validate_names_file_line_and_field(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    text = QUICKSTART.read_text().replace("max_concurrency: 16", "max_concurrency: 0")
    broken.write_text(text)
    line = next(i for i, s in enumerate(text.splitlines(), 1) if "max_concurrency: 0" in s)
    r = sluice("validate", "-f", str(broken), home=tmp_path)
    assert r.returncode == 2
    assert f"{broken}:{line}: groups[0].max_concurrency" in r.stderr
    assert "greater than or equal to 1" in r.stderr

    r = sluice("validate", "-f", str(broken), "--json", home=tmp_path)
    assert r.returncode == 2
    [issue] = json.loads(r.stdout)["error"]["issues"]
    assert issue == {
        "file": str(broken),
        "line": line,
        "field": "groups[0].max_concurrency",
        "message": issue["message"],
    }


def test_commands_that_need_a_running_sluice_say_how_to_start_it(tmp_path: Path) -> None:
    r = sluice("get", "groups", home=tmp_path)
    assert r.returncode == 6
    assert "sluice up -f" in r.stderr
    r = sluice("scale", "chat", "2", "--reason", "x", "--json", home=tmp_path)
    assert r.returncode == 6 and json.loads(r.stdout)["error"]["code"] == "unavailable"
