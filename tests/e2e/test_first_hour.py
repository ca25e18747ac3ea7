"""An operator's first hour (issue 38), through the real `sluice` command: the quickstart's
first start raises no alert while its instances start (`/v1/alerts` read through the
start-up and past the rule's `for`), the control API keeps its port across a restart of
`sluice up` on the same state directory, and `sluice get groups | cat` shows whole rows
(a pipe is not cut to the terminal's width, nor to 80 columns)."""

from __future__ import annotations

import fcntl
import os
import pty
import socket
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.e2e.conftest import Sluice, kill_workers_of

ROOT = Path(__file__).resolve().parents[2]

LONG = "a-group-name-long-enough-that-eighty-columns-would-cut-it"
SPEC = f"""
pools:
  - {{name: local, count: 4, memory_gb: 16}}
groups:
  - name: {LONG}
    owner: someone-with-a-long-address@a-business-unit.example.com
    business: a-business-with-a-long-name
    alert_channel: "#oncall"
    models:
      a-model-with-a-long-identifier:
        runtime: sim
        version: a-version-label-of-some-length
        sim: {{startup_s: 0.2, memory_gb: 1}}
    resources: {{pool: local, memory_gb: 1}}
    max_concurrency: 4
    replicas: 1
"""


def control(s: Sluice, path: str) -> Any:
    r = httpx.get(s.control_url + path, headers=s.control_headers(), trust_env=False, timeout=10)
    r.raise_for_status()
    return r.json()


@pytest.mark.embedding
def test_the_quickstart_first_start_raises_no_alert(tmp_path: Path) -> None:
    s = Sluice(tmp_path / "home", ROOT / "examples" / "quickstart.yaml")
    s.start()
    try:
        seen: set[str] = set()
        held: set[str] = set()
        ready_at: float | None = None
        deadline = time.monotonic() + 300
        # through the start-up, then 40 s more: past no-ready-instance's `for: 30s`, so an
        # alert that went pending while the instances started would have fired by then
        while time.monotonic() < deadline:
            try:
                alerts = control(s, "/v1/alerts")
                groups = control(s, "/v1/groups")
            except (httpx.HTTPError, OSError, ValueError):
                time.sleep(0.5)  # control.json not written yet, or the API not up
                continue
            seen |= {f"{a['phase']} {a['group']}/{a['rule']}" for a in alerts["firing"]}
            seen |= {f"{a['phase']} {a['group']}/{a['rule']}" for a in alerts["pending"]}
            held |= {h["group"] for h in alerts["starting"]}
            if ready_at is None and all(g["ready"] >= g["desired"] > 0 for g in groups):
                ready_at = time.monotonic()
            if ready_at is not None and time.monotonic() - ready_at > 40:
                break
            time.sleep(0.5)
        assert ready_at is not None, "the quickstart did not get ready in 300 s"
        assert seen == set(), f"alerts during a first start: {sorted(seen)}"
        assert held, "no group was shown as starting (held) in /v1/alerts"
        assert s.stop() == 0
    finally:
        s.kill()
        kill_workers_of(s.home)


def pipe_through_cat(s: Sluice, *args: str, terminal_columns: int = 60) -> str:
    """`sluice ARGS | cat` as typed in a terminal `terminal_columns` wide: stdin and stderr
    are that terminal (a pty), stdout is the pipe to cat. No $COLUMNS."""
    env = s.env()
    env.pop("COLUMNS", None)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    leader, follower = pty.openpty()
    try:
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, terminal_columns, 0, 0))
        r = subprocess.run(
            ["bash", "-c", " ".join(["sluice", *args, "|", "cat"])],
            stdin=follower,
            stdout=subprocess.PIPE,
            stderr=follower,
            env=env,
            text=True,
            timeout=60,
        )
    finally:
        os.close(follower)
        os.close(leader)
    assert r.returncode == 0, r.stdout
    return r.stdout


def test_the_control_port_survives_a_restart_and_piped_tables_keep_whole_rows(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    spec = home / "platform.yaml"
    spec.write_text(SPEC)
    s = Sluice(home, spec)
    s.start()
    try:
        first = urlsplit(s.control_url).port
        s.wait_for("the group ready", lambda: len(s.ready(LONG)) == 1, timeout=120)
        table = pipe_through_cat(s, "get", "groups")
        row = next(line for line in table.splitlines() if LONG in line)
        for whole in (
            "someone-with-a-long-address@a-business-unit.example.com",
            "a-business-with-a-long-name",
            "a-model-with-a-long-identifier@a-version-label-of-some-length",
        ):
            assert whole in row, table
        assert "…" not in table, table
        assert s.stop() == 0

        s.start(with_spec=False)
        assert urlsplit(s.control_url).port == first
        assert (home / "control.port").read_text().strip() == str(first)
        assert s.stop() == 0

        # the remembered port taken by another process: a new one, said in one line
        with socket.create_server(("127.0.0.1", first)):
            s.start(with_spec=False)
            moved = urlsplit(s.control_url).port
            assert moved != first
            assert any(f"control port {first}" in line for line in s.output), s.output
            assert s.stop() == 0
        s.start(with_spec=False)
        assert urlsplit(s.control_url).port == moved  # the new pick is remembered
        assert s.stop() == 0
    finally:
        s.kill()
        kill_workers_of(home)
