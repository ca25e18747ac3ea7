"""Every `sluice` command starts quickly: importing the CLI brings none of the policy code's
numeric libraries or the server parts (a report or `sluice up` imports them when it runs).
A second `sluice up` on a held state directory must refuse at once (tests/e2e/test_identity)."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("scipy", "numpy", "matplotlib", "ray", "sluice.control", "sluice.gateway", "sluice.policy")


def test_importing_the_cli_imports_nothing_heavy() -> None:
    code = f"import sys, sluice.cli.main; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"imported at start-up: {out.stdout.strip()}"
