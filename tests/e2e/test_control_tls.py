"""The control API off loopback: TLS or an explicit --insecure; with TLS the CLI verifies
the certificate (a private CA through $SLUICE_CA_FILE)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import trustme

from tests.e2e.conftest import Sluice, running

SPEC = """
gateway: {{host: 127.0.0.1, port: 0}}
control: {{host: {host}{tls}}}
pools:
  - {{name: local, count: 2, memory_gb: 4}}
groups:
  - name: chat
    owner: ops@example.com
    business: search
    alert_channel: "#ops"
    models:
      m: {{runtime: sim, sim: {{startup_s: 0.1, service_time: {{kind: fixed, seconds: 0.01}}}}}}
    resources: {{pool: local, memory_gb: 1}}
    replicas: 1
tenants:
  - {{name: t, api_keys: [sk-t-12ccad2ae47ed66b]}}
"""


def test_a_non_loopback_control_api_without_tls_refuses_to_start(tmp_path: Path) -> None:
    spec = tmp_path / "open.yaml"
    spec.write_text(SPEC.format(host="0.0.0.0", tls=""))
    started = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "sluice", "up", "-f", str(spec), "--home", str(tmp_path / "h")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 3, r.stderr
    assert "without TLS" in r.stderr and "--insecure" in r.stderr
    assert time.monotonic() - started < 30
    assert not (tmp_path / "h" / "control.json").exists()


def test_with_tls_the_cli_verifies_the_control_api(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    pem = tmp_path / "server.pem"
    tls = f", tls: {{cert_file: {pem}, key_file: {pem}}}"
    with running(tmp_path, SPEC.format(host="127.0.0.1", tls=tls), "chat ready", ready) as s:
        assert s.control_url.startswith("https://127.0.0.1:")
        trusted = {**s.env(), "SLUICE_CA_FILE": str(tmp_path / "ca.pem")}
        r = subprocess.run(
            [sys.executable, "-m", "sluice", "get", "groups", "--json"],
            capture_output=True,
            text=True,
            env=trusted,
            timeout=60,
        )
        assert r.returncode == 0 and '"name": "chat"' in r.stdout, r.stderr
        r = subprocess.run(  # the system's CAs do not know this certificate
            [sys.executable, "-m", "sluice", "get", "groups", "--json"],
            capture_output=True,
            text=True,
            env=s.env(),
            timeout=60,
        )
        assert r.returncode == 6 and "CERTIFICATE_VERIFY_FAILED" in r.stdout, r.stdout


def ready(s: Sluice) -> bool:
    trusted = {**s.env(), "SLUICE_CA_FILE": str(s.home / "ca.pem")}
    r = subprocess.run(
        [sys.executable, "-m", "sluice", "get", "instances", "--json"],
        capture_output=True,
        text=True,
        env=trusted,
        timeout=60,
    )
    return r.returncode == 0 and '"state": "ready"' in r.stdout
