"""Break glass: `sluice token create NAME --store` mints a token in the store itself, with no
control API and no token, for when the admin token is lost (or to put a token straight into
a Kubernetes secret, docs/deploy.md). Whoever can open the store holds the installation: the
token may be an installation admin token, it works at once against a running control plane,
and the audit log says who minted it on which machine account and why."""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.e2e.conftest import Sluice, running, shared_secrets_key

SPEC = """
gateway: {host: 127.0.0.1, port: 0}
pools:
  - {name: local, count: 2, memory_gb: 8}
groups:
  - name: chat
    owner: ops@example.com
    business: search
    alert_channel: "#ops"
    models:
      m-chat:
        runtime: sim
        sim: {startup_s: 0.1, service_time: {kind: fixed, seconds: 0.01}, memory_gb: 1}
    resources: {pool: local, accelerators: 1, memory_gb: 2}
    replicas: 1
tenants:
  - {name: main, api_keys: [sk-store-2c91f0e5b7d4a368]}
"""


def sluice_cli(env: dict[str, str], *args: str) -> tuple[int, Any, str]:
    """`sluice ARGS --json` in `env` (no token of the test's own): exit code, JSON, stderr."""
    r = subprocess.run(
        [sys.executable, "-m", "sluice", *args, "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    return r.returncode, json.loads(r.stdout) if r.stdout.strip() else None, r.stderr


def test_a_lost_admin_token_is_replaced_from_the_store(
    tmp_path: Path, shared_database: str
) -> None:
    """A running control plane on SQLite or PostgreSQL; its `admin.token` is lost. `--store`
    mints `rescue` (an installation admin token: `--owner admin`) in the store; it drives the
    running control API at once, enrolls a person, and the audit row names local:<user>
    and the reason. Without a reason, with --control, or scoped to an unknown group, nothing
    is minted."""
    environ = {"SLUICE_DATABASE_URL": shared_database, **shared_secrets_key(tmp_path)}
    home = tmp_path / "home"
    home.mkdir()
    with running(home, SPEC, "the first admin token", lambda s: bool(s.ready("chat")), 90, environ):
        (home / "admin.token").unlink()  # lost with the host (or the pod) that held it
        # a state directory of its own: only the database is shared, as with a second host
        env = {**os.environ, **environ, "SLUICE_HOME": str(tmp_path / "elsewhere")}
        env.pop("SLUICE_TOKEN", None)
        env["SLUICE_CONTROL_URL"] = Sluice(home, home / "platform.yaml").control_url

        refused = [
            ("token", "create", "x1", "--role", "admin", "--store"),  # no reason
            (
                "token",
                "create",
                "x2",
                "--store",
                "--reason",
                "r",
                "--control",
                "http://127.0.0.1:1",
            ),
            ("token", "create", "x3", "--store", "--reason", "r", "--groups", "nosuch"),
            ("token", "create", "bad name", "--store", "--reason", "r"),
        ]
        codes = [sluice_cli(env, *args)[0] for args in refused]
        assert codes == [2, 2, 4, 2]

        args = ("token", "create", "rescue", "--role", "admin", "--owner", "admin")
        code, minted, err = sluice_cli(env, *args, "--store", "--reason", "admin token lost")
        assert code == 0, err
        assert (minted["name"], minted["role"], minted["person"]) == ("rescue", "admin", "admin")
        assert minted["token"].startswith("slc_")
        assert minted["created_by"] == f"local:{getpass.getuser()}"

        as_rescue = {**env, "SLUICE_TOKEN": minted["token"]}
        code, tokens, err = sluice_cli(as_rescue, "token", "list")
        assert code == 0, err
        assert {t["name"] for t in tokens} == {"admin", "rescue"}  # x1..x3: never minted
        # an installation token: it may enroll another person
        code, alice, err = sluice_cli(
            as_rescue, "token", "create", "alice@example.com", "--role", "viewer"
        )
        assert code == 0 and alice["person"] == "alice@example.com", err
        # and scope a token to a group the live revision has, in the store too
        code, scoped, err = sluice_cli(
            env, "token", "create", "chat-ops", "--role", "operator", "--groups", "chat",
            "--store", "--reason", "on call",
        )  # fmt: skip
        assert code == 0 and scoped["groups"] == ["chat"], err

        code, rows, err = sluice_cli(as_rescue, "audit", "--action", "token-create")
        assert code == 0, err
        [row] = [r for r in rows if r["target"] == "token/rescue"]
        assert row["actor"] == f"local:{getpass.getuser()}"
        assert "admin token lost" in row["reason"] and "--store" in row["reason"]
        assert row["detail"]["owner"] == "admin" and row["detail"]["role"] == "admin"


def test_break_glass_needs_a_store(tmp_path: Path) -> None:
    """On a directory with no state (and no database URL), `--store` creates nothing: it
    says where it looked (exit 4)."""
    env = {**os.environ, "SLUICE_HOME": str(tmp_path / "nothing")}
    for name in ("SLUICE_DATABASE_URL", "SLUICE_TOKEN"):
        env.pop(name, None)
    args = ("token", "create", "rescue", "--role", "admin", "--store", "--reason", "lost")
    code, answer, _ = sluice_cli(env, *args)
    assert code == 4 and "no state database" in answer["error"]["message"]
    assert not (tmp_path / "nothing" / "state.db").exists()
