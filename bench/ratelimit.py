"""Rate limits that hold fleet-wide (issue 31): one tenant's `rate_limit` through 1, 2 and 4
gateway processes.

    python bench/ratelimit.py                  # a table; progress on stderr
    python bench/ratelimit.py --json           # one JSON document on stdout
    python bench/ratelimit.py --seconds 10     # shorter

Real processes on 127.0.0.1, under a temp state directory: one `sluice up` (controller and
its in-process gateway, one `sim` group) and, for n gateways, n - 1 `sluice gateway`
processes syncing with it. One tenant with `rate_limit: {rps: --limit}` (5) is offered
`--rate` (20) req/s, open loop (request k due at start + k / rate whatever happened to
the others), spread evenly over the n gateways (request k to gateway k mod n), for
`--warmup` (5) s unmeasured and then `--seconds` (30) s measured; `admitted_rps` is the
requests sent in the measured window answered 200, over its length. Before the
change each gateway enforced the whole limit: n gateways admitted about n times it.

Target: `admitted_rps` within 10 % of the limit in every row (`ok`). Exit status 1 if not,
or if any request got another answer than 200 or 429.

Output (`--json`): `{"rows": [{"gateways": n, "limit_rps": 5, "admitted_rps": x,
"ratio_to_limit": x / 5, "offered_rps", "refused_rps", "errors"}, ...], "ok": bool,
"seconds", "warmup_s"}`. Every process it started is stopped on the way out.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

KEY = "sk-ratelimit-7c1e94b2d05a3f68"
SPEC = """
gateway: {{host: 127.0.0.1, port: 0}}
control: {{port: 0}}
pools:
  - {{name: local, count: 4, memory_gb: 16}}
groups:
  - name: chat
    owner: bench@example.com
    business: bench
    alert_channel: "#bench"
    models:
      m-chat:
        runtime: sim
        sim: {{startup_s: 0.2, service_time: {{kind: fixed, seconds: 0.005}}, memory_gb: 1}}
    resources: {{pool: local, accelerators: 1, memory_gb: 1}}
    max_concurrency: 32
    replicas: 1
    slow_start_s: 0
tenants:
  - name: capped
    api_keys: [{key}]
    rate_limit: {{rps: {limit}}}
routes:
  - {{tag: chat-main, match: {{models: [m-chat]}}, to: chat}}
"""


def log(msg: str) -> None:
    print(f"[ratelimit {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """A child process whose output is kept; `seen(text)` waits for a line with it."""

    def __init__(self, cmd: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()

    def seen(self, text: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines:
                    if text in line:
                        return line
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise RuntimeError(f"no {text!r} in the output:\n" + "".join(self.lines))
                self._cond.wait(min(left, 0.5))

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(40)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


class Platform:
    """`sluice up` on a temp home, its control API, and the `sluice gateway` processes."""

    def __init__(self, home: Path, limit: float) -> None:
        self.home = home
        self.limit = limit
        self.env = {**os.environ, "SLUICE_HOME": str(home)}
        self.env.pop("SLUICE_TOKEN", None)
        self.up: Proc | None = None
        self.gateways: list[tuple[Proc, str]] = []
        self.endpoint = ""
        self.control = ""
        self.api: httpx.Client | None = None
        self.gateway_token = ""

    def start(self) -> None:
        spec = self.home / "platform.yaml"
        spec.write_text(SPEC.format(key=KEY, limit=self.limit))
        cmd = [sys.executable, "-m", "sluice", "up", "-f", str(spec), "--log-level", "warning"]
        self.up = Proc(cmd, self.env)
        line = self.up.seen("endpoint: ", 90)
        self.endpoint = line.split(" ", 1)[1].strip()
        self.control = json.loads((self.home / "control.json").read_text())["control_url"]
        admin = (self.home / "admin.token").read_text().strip()
        self.api = httpx.Client(
            base_url=self.control,
            headers={"Authorization": f"Bearer {admin}"},
            trust_env=False,
            timeout=30,
        )
        self.wait("the chat group ready", self._ready, 90)
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "sluice",
                "token",
                "create",
                "rl-gw",
                "--role",
                "gateway",
                "--json",
            ],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=60,
            check=True,
        )
        self.gateway_token = json.loads(r.stdout)["token"]

    def _ready(self) -> bool:
        assert self.api is not None
        got = self.api.get("/v1/instances").json()
        return any(i["group"] == "chat" and i["state"] == "ready" for i in got)

    def live_gateways(self) -> set[str]:
        assert self.api is not None
        return set(self.api.get("/v1/dataplane").json().get("gateways", {}))

    def add_gateway(self) -> str:
        port = free_port()
        cmd = [sys.executable, "-m", "sluice", "gateway", "--control", self.control]
        cmd += ["--port", str(port), "--log-level", "warning"]
        proc = Proc(cmd, {**self.env, "SLUICE_GATEWAY_TOKEN": self.gateway_token})
        proc.seen(": routing v", 60)
        endpoint = f"http://127.0.0.1:{port}"
        self.gateways.append((proc, endpoint))
        return endpoint

    def endpoints(self, n: int) -> list[str]:
        """The endpoints of n gateways: `sluice up`'s own, then n - 1 remote ones."""
        while len(self.gateways) < n - 1:
            self.add_gateway()
        self.wait(f"{n} live gateways", lambda: len(self.live_gateways()) >= n, 30)
        return [self.endpoint] + [e for _, e in self.gateways[: n - 1]]

    def wait(self, what: str, pred: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if pred():
                    return
            time.sleep(0.25)
        raise RuntimeError(f"timed out waiting for {what}")

    def stop(self) -> None:
        if self.api is not None:
            self.api.close()
        for proc, _ in self.gateways:
            proc.stop()
        if self.up is not None:
            self.up.stop()
        kill_workers_of(self.home)


def kill_workers_of(home: Path) -> None:
    """SIGKILL any worker process of `home` left (by the instance ids in its cmdline)."""
    ids = [p.stem for p in (home / "instances").glob("*.log")]
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if b"sluice.worker" in cmdline and any(i.encode() in cmdline for i in ids):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(proc.name), signal.SIGKILL)


async def offer(
    endpoints: list[str], rate: float, warmup: float, seconds: float, key: str = KEY
) -> list[int]:
    """Open loop to 127.0.0.1 only: request k (to model `m-chat`, with tenant key `key`) due
    at start + k / rate, to endpoints[k % n]; the statuses of the requests due after
    `warmup` (0: no HTTP answer). Bounded: (warmup + seconds) * rate requests in all. The
    e2e test of tests/e2e/test_rate_limits.py offers its load with it too."""
    body = {"model": "m-chat", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}
    headers = {"Authorization": f"Bearer {key}"}
    clients = [
        httpx.AsyncClient(base_url=e, trust_env=False, timeout=30, headers=headers)
        for e in endpoints
    ]
    total = int((warmup + seconds) * rate)
    measured_from = int(warmup * rate)
    statuses: list[int] = [0] * (total - measured_from)

    async def one(k: int) -> None:
        try:
            r = await clients[k % len(clients)].post("/v1/chat/completions", json=body)
            status = r.status_code
        except httpx.HTTPError:
            status = 0
        if k >= measured_from:
            statuses[k - measured_from] = status

    loop = asyncio.get_running_loop()
    start = loop.time()
    tasks = []
    for k in range(total):
        delay = start + k / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(k)))
    await asyncio.gather(*tasks)
    for c in clients:
        await c.aclose()
    return statuses


def run(args: argparse.Namespace, home: Path) -> dict[str, Any]:
    p = Platform(home, args.limit)
    rows = []
    try:
        started = time.monotonic()
        p.start()
        log(f"sluice up ready in {time.monotonic() - started:.1f} s at {p.endpoint}")
        for n in args.gateways:
            endpoints = p.endpoints(n)
            total_s = args.warmup + args.seconds
            log(f"{n} gateway(s): offering {args.rate:g} req/s for {total_s:g} s")
            statuses = asyncio.run(offer(endpoints, args.rate, args.warmup, args.seconds))
            admitted = sum(s == 200 for s in statuses)
            refused = sum(s == 429 for s in statuses)
            row = {
                "gateways": n,
                "limit_rps": args.limit,
                "admitted_rps": round(admitted / args.seconds, 3),
                "ratio_to_limit": round(admitted / args.seconds / args.limit, 3),
                "offered_rps": round(len(statuses) / args.seconds, 3),
                "refused_rps": round(refused / args.seconds, 3),
                "errors": len(statuses) - admitted - refused,
            }
            log(f"  {row}")
            rows.append(row)
    finally:
        p.stop()
    ok = all(abs(r["ratio_to_limit"] - 1.0) <= 0.10 and not r["errors"] for r in rows)
    return {"rows": rows, "ok": ok, "seconds": args.seconds, "warmup_s": args.warmup}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=30.0, help="measured seconds per row")
    ap.add_argument("--warmup", type=float, default=5.0, help="unmeasured seconds first")
    ap.add_argument("--rate", type=float, default=20.0, help="offered req/s, all gateways")
    ap.add_argument("--limit", type=float, default=5.0, help="the tenant's rate_limit rps")
    ap.add_argument(
        "--gateways",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 2, 4],
        help="comma-separated gateway counts (sluice up's own is one of them)",
    )
    ap.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = ap.parse_args()
    if not 0 < args.rate <= 200 or args.seconds <= 0 or args.warmup < 0 or args.limit <= 0:
        ap.error("--rate in (0, 200], --seconds > 0, --warmup >= 0, --limit > 0")
    if min(args.gateways) < 1 or max(args.gateways) > 8:
        ap.error("--gateways: counts from 1 to 8")
    home = Path(tempfile.mkdtemp(prefix="sluice-ratelimit-"))
    try:
        result = run(args, home)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{'gateways':>8}  {'limit rps':>9}  {'admitted rps':>12}  {'ratio':>5}  errors")
        for r in result["rows"]:
            print(
                f"{r['gateways']:>8}  {r['limit_rps']:>9g}  {r['admitted_rps']:>12.2f}  "
                f"{r['ratio_to_limit']:>5.2f}  {r['errors']}"
            )
        print("ok" if result["ok"] else "FAILED: admitted is not within 10 % of the limit")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
