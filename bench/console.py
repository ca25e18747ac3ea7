"""What an open console tab costs the control process, which also runs the gateway: CPU
seconds per page render (what `live.js` asks for once a second while the tab is visible),
against the peer in the same run, one bearer call of `GET /v1/groups`.

    python bench/console.py [--json] [--requests 100]

Starts `sluice up` on a temporary state directory with three `sim` groups, logs in as an
admin through the login form, then reads the process's own CPU time (/proc) around each
batch. Every request goes to 127.0.0.1; the count is bounded by --requests.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
GROUP = """
  - name: {name}
    owner: ops@example.com
    business: search
    alert_channel: "#ops"
    models:
      m-{name}: {{runtime: sim, sim: {{startup_s: 0.2, memory_gb: 1}}}}
    resources: {{pool: local, accelerators: 1, memory_gb: 1}}
    replicas: 1
"""
SPEC = (
    "gateway: {host: 127.0.0.1, port: 0}\npools:\n  - {name: local, count: 8, memory_gb: 16}\n"
    "groups:\n" + "".join(GROUP.format(name=n) for n in ("chat", "embed", "rank"))
)
PAGES = ("/ui/", "/ui/groups/chat", "/ui/routes", "/ui/quota", "/ui/audit")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def per_request(pid: int, client: httpx.Client, path: str, n: int, **headers: str) -> float:
    """CPU milliseconds the control process spent per request of `path`."""
    client.get(path, headers=headers)  # warm
    before = cpu_s(pid)
    for _ in range(n):
        assert client.get(path, headers=headers).status_code == 200, path
    return 1000 * (cpu_s(pid) - before) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--requests", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "SLUICE_HOME": home}
        (Path(home) / "spec.yaml").write_text(SPEC)
        up = subprocess.Popen(
            [sys.executable, "-m", "sluice", "up", "-f", f"{home}/spec.yaml", "--port", "0"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            control = Path(home) / "control.json"
            deadline = time.monotonic() + 60
            while not control.exists() and time.monotonic() < deadline:
                time.sleep(0.2)
            info = json.loads(control.read_text())
            time.sleep(3)  # instances ready, first ticks done
            token = (Path(home) / "admin.token").read_text().strip()
            with httpx.Client(base_url=info["control_url"], timeout=30) as c:
                login = c.get("/ui/login").text
                nonce = re.search(r'name="nonce" value="([0-9a-f]+)"', login)
                assert nonce, login[:300]
                c.post("/ui/login", data={"nonce": nonce.group(1), "token": token})
                peer = per_request(
                    info["pid"], c, "/v1/groups", args.requests, authorization=f"Bearer {token}"
                )
                pages = {
                    p: per_request(info["pid"], c, p, args.requests, **{"x-sluice-live": "1"})
                    for p in PAGES
                }
        finally:
            up.terminate()
            up.wait(30)
    result = {
        "peer_api_groups_cpu_ms": round(peer, 2),
        "pages_cpu_ms": {p: round(ms, 2) for p, ms in pages.items()},
        "ratio_to_peer": {p: round(ms / peer, 1) for p, ms in pages.items()},
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"peer  GET /v1/groups (bearer)   {peer:6.2f} ms CPU per request")
    for p, ms in pages.items():
        share = f"one tab refreshing: {ms / 10:.1f}% of a core"
        print(f"page  {p:26s} {ms:6.2f} ms CPU  x{ms / peer:.1f}  ({share})")


if __name__ == "__main__":
    main()
