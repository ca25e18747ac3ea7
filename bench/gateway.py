"""Gateway benchmark: Sluice vs nginx as a reverse proxy, side by side, on one core each.

    python bench/gateway.py [--json] [--rounds 3] [--duration 5] [--connections 64]
                            [--tree build/native]
                            [--workers N]

Starts on 127.0.0.1, pinned with `taskset`:
  * the fast backend: nginx answering `return 200 '<chat completion JSON>'` (load core);
  * nginx as a reverse proxy to it with upstream keepalive: the native limit (server core);
  * the Sluice gateway (`_gateway_server.py`, uvloop, access log on) with a generated spec of
    100 groups and 1,000 route rules, compiled by `build_routing_snapshot` (server core).
Throughput: `wrk -t1 -c64` POSTs with a valid API key matching a late rule, interleaved
rounds nginx, sluice, ...; medians. Added latency: `_openloop.py` at 500 req/s against a
20 ms backend (`_backend.py`), directly, through nginx (a control) and through the gateway.
Streamed answers (`--stream-events`, 16; 0 skips): the same wrk rounds against a backend
streaming that many one-token chunks (`_backend.py --sse`), through nginx with
`proxy_buffering off` (as SSE proxies are set up) and through the gateway, which asks the
backend for the stream's usage and takes that chunk out, as it does for every real stream;
the CPU per extra chunk is (streamed - JSON CPU per request) / chunks.
Route lookup: in-process. `--workers N`: also 1..N gateway processes sharing one port
(SO_REUSEPORT, as `sluice gateway --workers N`), interleaved rounds (`workers_bench`).

`--json` prints one JSON line on stdout; progress goes to stderr. See bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import http.client
import json
import os
import platform
import random
import re
import shutil
import signal
import socket
import statistics
import string
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _backend import BODY as BACKEND_BODY  # noqa: E402
from _spec import lookup_args, make_snapshot, make_spec, pick_target  # noqa: E402

REQUEST_PATH = "/v1/chat/completions"
CONTENDED_PCT = 10.0
"""Other processes using more CPU than this (percent of a core) during a measurement."""


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- tools ------------------------------------------------------------------------------------


def find_nginx() -> str | None:
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)), None
    )


def ensure_tools() -> tuple[str, str]:
    """nginx and wrk, installed with apt-get when missing (the bench may assume root)."""
    if find_nginx() is None or shutil.which("wrk") is None:
        missing = [n for n, ok in (("nginx", find_nginx()), ("wrk", shutil.which("wrk"))) if not ok]
        log(f"installing {' '.join(missing)} with apt-get")
        if shutil.which("apt-get") is None or os.geteuid() != 0:
            sys.exit(f"bench: {', '.join(missing)} missing and apt-get (as root) is not available")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        cmd = ["apt-get", "install", "-y", "-q", *missing]
        if subprocess.run(cmd, env=env, stdout=sys.stderr, check=False).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], env=env, stdout=sys.stderr, check=False)
            subprocess.run(cmd, env=env, stdout=sys.stderr, check=False)
    nginx, wrk = find_nginx(), shutil.which("wrk")
    if nginx is None or wrk is None:
        sys.exit("bench: could not install nginx and wrk (try: apt-get install -y nginx wrk)")
    if shutil.which("taskset") is None:
        sys.exit("bench: taskset (util-linux) is needed to pin processes to cores")
    return nginx, wrk


def nginx_version(nginx: str) -> str:
    out = subprocess.run([nginx, "-v"], capture_output=True, text=True, check=False).stderr
    m = re.search(r"nginx/(\S+)", out)
    return m.group(1) if m else out.strip()


# -- child processes --------------------------------------------------------------------------


class Procs:
    """Every child runs in its own session (process group); all are killed on the way out."""

    def __init__(self) -> None:
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, cmd: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(cmd, start_new_session=True, **kwargs)
        self.procs.append((name, proc))
        return proc

    def stop(self, proc: subprocess.Popen[bytes], timeout: float = 5.0) -> None:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        # the group may outlive its leader (nginx workers): make sure it is gone
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        self.procs = [(n, p) for n, p in self.procs if p is not proc]

    def stop_all(self) -> None:
        for _, proc in reversed(self.procs):
            try:
                self.stop(proc, timeout=3.0)
            except Exception as exc:  # keep going: the others must die too
                log(f"could not stop pid {proc.pid}: {exc}")

    def run(self, name: str, cmd: list[str], timeout: float) -> str:
        """Run to completion; its stdout as text. Killed (group and all) after `timeout`."""
        proc = self.start(name, cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop(proc)
            raise RuntimeError(f"{name} ran past {timeout:.0f}s") from None
        self.procs = [(n, p) for n, p in self.procs if p is not proc]
        if proc.returncode != 0:
            tail = (out + err).decode(errors="replace")[-2000:]
            raise RuntimeError(f"{name} exited {proc.returncode}: {tail}")
        return out.decode()


def pinned(core: int | None, cmd: list[str]) -> list[str]:
    return cmd if core is None else ["taskset", "-c", str(core), *cmd]


def read_port(proc: subprocess.Popen[bytes], name: str, timeout: float = 30.0) -> int:
    """Children print `PORT <n>` once listening."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    os.set_blocking(proc.stdout.fileno(), False)
    buf = b""
    while time.monotonic() < deadline:
        chunk = proc.stdout.read()
        if chunk:
            buf += chunk
            m = re.search(rb"PORT (\d+)\n", buf)
            if m:
                return int(m.group(1))
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode} before listening")
        time.sleep(0.02)
    raise RuntimeError(f"{name} did not start listening within {timeout:.0f}s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(port: int, proc: subprocess.Popen[bytes], name: str, errlog: Path) -> None:
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = errlog.read_text()[-2000:] if errlog.exists() else ""
            raise RuntimeError(f"{name} exited with {proc.returncode}: {tail}")
        with socket.socket() as s, contextlib.suppress(OSError):
            s.connect(("127.0.0.1", port))
            return
        time.sleep(0.02)
    raise RuntimeError(f"{name} did not listen on {port}")


# -- nginx ------------------------------------------------------------------------------------

BACKEND_SERVER = """\
    server {
        listen 127.0.0.1:${port} backlog=1024;
        default_type application/json;
        location / {
            return 200 '${body}';
        }
    }"""

PROXY_SERVER = """\
    upstream backend {
        server 127.0.0.1:${backend_port};
        keepalive 128;
        keepalive_requests 1000000;
    }
    server {
        listen 127.0.0.1:${port} backlog=1024;
        location / {
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }"""


def start_nginx(
    procs: Procs,
    nginx: str,
    name: str,
    workdir: Path,
    server: str,
    access_log: str,
    core: int | None,
    port: int,
) -> subprocess.Popen[bytes]:
    workdir.mkdir(parents=True)
    tmpl = string.Template((HERE / "nginx.conf.tmpl").read_text())
    conf = tmpl.substitute(
        dir=workdir,
        user_line="user root;" if os.geteuid() == 0 else "",
        access_log=access_log,
        server=server,
    )
    conf_path = workdir / "nginx.conf"
    conf_path.write_text(conf)
    cmd = pinned(core, [nginx, "-p", str(workdir), "-c", str(conf_path), "-e", "stderr"])
    proc = procs.start(name, cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_listening(port, proc, name, workdir / "error.log")
    return proc


# -- measurements -----------------------------------------------------------------------------


def request_once(port: int, body: bytes, api_key: str) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(
            "POST",
            REQUEST_PATH,
            body=body,
            headers={"content-type": "application/json", "authorization": f"Bearer {api_key}"},
        )
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def wrk_lua(body: bytes, api_key: str) -> str:
    return (
        'wrk.method = "POST"\n'
        f"wrk.body = {json.dumps(body.decode())}\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
        f'wrk.headers["Authorization"] = "Bearer {api_key}"\n'
    )


def run_wrk(
    procs: Procs,
    wrk: str,
    core: int | None,
    port: int,
    script: Path,
    seconds: int,
    conns: int,
    cores: list[int],
    server: subprocess.Popen[bytes] | None = None,
) -> dict[str, Any]:
    """One wrk run; also how busy each of `cores` was meanwhile (percent), and the CPU time
    `server` (its process group) spent per request, in microseconds."""
    cmd = [wrk, "-t1", f"-c{conns}", f"-d{seconds}s", "--latency", "-s", str(script)]
    cmd.append(f"http://127.0.0.1:{port}{REQUEST_PATH}")
    watch = CpuWatch(cores)
    server_cpu0 = group_cpu_s(server.pid) if server is not None else 0.0
    out = procs.run("wrk", pinned(core, cmd), timeout=seconds + 30)
    server_cpu = group_cpu_s(server.pid) - server_cpu0 if server is not None else 0.0
    cpu = watch.read()
    done = re.search(r"(\d+) requests in", out)
    if server is not None and done and int(done.group(1)):
        cpu["cpu_us_per_req"] = round(server_cpu / int(done.group(1)) * 1e6, 2)
    m = re.search(r"Requests/sec:\s*([\d.]+)", out)
    if not m:
        raise RuntimeError(f"cannot read wrk output:\n{out}")
    bad = re.search(r"Non-2xx or 3xx responses:\s*(\d+)", out)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    non2xx = int(bad.group(1)) if bad else 0
    errors = sum(int(x) for x in sock.groups()) if sock else 0
    if non2xx:
        raise RuntimeError(f"{non2xx} non-2xx responses from port {port}; the run is invalid")
    p50 = re.search(r"^\s*50%\s+([\d.]+)(us|ms|s)\b", out, re.M)
    p99 = re.search(r"^\s*99%\s+([\d.]+)(us|ms|s)\b", out, re.M)
    return {
        "rps": float(m.group(1)),
        "socket_errors": errors,
        "p50_ms": _ms(p50),
        "p99_ms": _ms(p99),
        **cpu,
    }


def _ms(m: re.Match[str] | None) -> float:
    if m is None:
        return float("nan")
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}[m.group(2)]
    return round(float(m.group(1)) * scale, 3)


@contextlib.contextmanager
def on_core(core: int | None) -> Iterator[None]:
    """Pin this process for an in-process measurement, then restore its affinity."""
    before = os.sched_getaffinity(0)
    if core is not None:
        os.sched_setaffinity(0, {core})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def time_per_call(fn: Callable[..., object], calls: list[tuple[Any, ...]]) -> float:
    """Mean microseconds per call, best of 3 passes (loop overhead included)."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for a in calls:
            fn(*a)
        best = min(best, time.perf_counter() - t0)
    return best / len(calls) * 1e6


def route_lookup_bench(args: argparse.Namespace, core: int | None) -> dict[str, Any]:
    with on_core(core):
        t0 = time.perf_counter()
        spec = make_spec(**spec_params(args))  # pydantic validation + check_platform
        spec_ms = (time.perf_counter() - t0) * 1000
        build_ms = []
        for _ in range(3):
            t0 = time.perf_counter()
            snapshot = make_snapshot(spec, 1)
            build_ms.append((time.perf_counter() - t0) * 1000)
        rng = random.Random(7)
        tenants = {a.name: a for a in snapshot.tenants_by_key.values()}
        models = sorted(snapshot.all_models)
        names = sorted(tenants)
        calls = [
            lookup_args(tenants[rng.choice(names)], rng.choice(models)) for _ in range(args.lookups)
        ]
        lookup_us = time_per_call(snapshot.routes.lookup, [c[0] for c in calls])
        resolve_us = time_per_call(snapshot.resolve, [c[1] for c in calls])
    return {
        "spec_build_ms": round(spec_ms, 1),
        "snapshot_build_ms": round(min(build_ms), 1),
        "route_lookup_us": round(lookup_us, 3),
        "route_resolve_us": round(resolve_us, 3),
        "rules": len(snapshot.routes.rules),
    }


def spec_params(args: argparse.Namespace) -> dict[str, int]:
    return {
        "groups": args.groups,
        "routes": args.routes,
        "tenants": args.tenants,
        "models": args.models,
        "replicas": args.replicas,
    }


def spec_argv(args: argparse.Namespace) -> list[str]:
    return [f"--{k}={v}" for k, v in spec_params(args).items()]


def cpu_ticks(cores: list[int]) -> dict[int, tuple[int, int]]:
    """(total, idle) jiffies of each core, from /proc/stat; empty where unreadable."""
    out = {}
    with contextlib.suppress(OSError), open("/proc/stat") as f:
        for line in f:
            name, *fields = line.split()
            if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cores:
                ticks = [int(x) for x in fields]
                out[int(name[3:])] = (sum(ticks), ticks[3] + ticks[4])  # idle + iowait
    return out


_PF_KTHREAD = 0x00200000


def group_cpu_s(pgid: int) -> float:
    """User + system CPU seconds of the processes in group `pgid` (an nginx master and its
    worker, or the gateway), from /proc: a throughput figure that other load on the
    machine disturbs much less than req/s."""
    ticks = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                data = f.read()
        except OSError:
            continue
        fields = data[data.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid:
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def foreign_ticks() -> dict[int, int]:
    """CPU jiffies of every user process that is not this one or below it.

    The bench shares the machine with whatever else runs there; this says how much of it
    ran while we measured. A process's count includes its reaped children's (so short-lived
    commands show up at their parent once they exit). Kernel threads are left out.
    """
    procs: dict[int, tuple[int, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                data = f.read()
        except OSError:
            continue
        fields = data[data.rindex(")") + 2 :].split()
        if int(fields[6]) & _PF_KTHREAD:
            continue
        ticks = sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
        procs[int(entry)] = (int(fields[1]), ticks)
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    ours, todo = set(), [os.getpid()]
    while todo:
        pid = todo.pop()
        ours.add(pid)
        todo.extend(children.get(pid, ()))
    return {pid: t for pid, (_, t) in procs.items() if pid not in ours}


class CpuWatch:
    """How busy the bench's cores were, and how much CPU other processes took, meanwhile."""

    def __init__(self, cores: list[int]) -> None:
        self.cores = cores
        self.t0 = time.monotonic()
        self.cpu0 = cpu_ticks(cores)
        self.foreign0 = foreign_ticks()

    def read(self) -> dict[str, Any]:
        elapsed = max(1e-3, time.monotonic() - self.t0)
        cpu1, foreign1 = cpu_ticks(self.cores), foreign_ticks()
        busy = {
            c: round(100.0 * (1 - (cpu1[c][1] - a[1]) / max(1, cpu1[c][0] - a[0])), 1)
            for c, a in self.cpu0.items()
            if c in cpu1
        }
        before = self.foreign0
        spent = sum(max(0, t - before.get(pid, 0)) for pid, t in foreign1.items())
        # A process that exited shows up again in its parent's children's time, whole:
        # take back what it had used before we started.
        spent = max(0, spent - sum(t for pid, t in before.items() if pid not in foreign1))
        hz = os.sysconf("SC_CLK_TCK")
        return {"busy_pct": busy, "foreign_pct": round(100.0 * spent / hz / elapsed, 1)}


def wait_quiet(cores: list[int], max_wait: float) -> dict[str, Any]:
    """Sample 1 s windows until other processes use under 10% of a core (or give up)."""
    deadline = time.monotonic() + max_wait
    while True:
        watch = CpuWatch(cores)
        time.sleep(1.0)
        seen = watch.read()
        if seen["foreign_pct"] < CONTENDED_PCT or time.monotonic() >= deadline:
            if seen["foreign_pct"] >= CONTENDED_PCT:
                log(f"warning: other processes use {seen['foreign_pct']}% CPU: numbers are noisy")
            return seen
        log(f"other processes use {seen['foreign_pct']}% CPU; waiting for quiet")


def realtime_prefix() -> list[str]:
    """`chrt -f 10` where it works (root): the latency bench's backend and load generator
    share a core, and under the normal scheduler one waits up to a few ms for the other."""
    chrt = shutil.which("chrt")
    if chrt is None:
        return []
    cmd = [chrt, "-f", "10"]
    ok = subprocess.run([*cmd, "true"], capture_output=True, check=False).returncode == 0
    return cmd if ok else []


def count_lines(path: Path) -> int:
    n = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            n += chunk.count(b"\n")
    return n


# -- the run ----------------------------------------------------------------------------------


def bench(args: argparse.Namespace, procs: Procs, tmp: Path) -> dict[str, Any]:
    nginx, wrk = ensure_tools()
    cpus = sorted(os.sched_getaffinity(0))
    if args.load_core is None or args.server_core is None:
        if len(cpus) >= 2:
            args.load_core, args.server_core = cpus[0], cpus[1]
        else:
            log("only one CPU: nothing is pinned, numbers mean little")
    load, srv = args.load_core, args.server_core
    py = sys.executable
    cores = [c for c in (load, srv) if c is not None]
    before = wait_quiet(cores, args.wait_quiet)

    log(f"route lookups ({args.lookups} random pairs, {args.routes} rules) on core {srv}")
    lookups = route_lookup_bench(args, srv)
    spec = make_spec(**spec_params(args))
    target = pick_target(spec, make_snapshot(spec, 1))
    log(f"requests: tenant {target.tenant}, model {target.model} -> rule #{target.index + 1}")
    body = json.dumps(
        {
            "model": target.model,
            "messages": [{"role": "user", "content": "Say hello in one short sentence."}],
            "max_tokens": 16,
        },
        separators=(",", ":"),
    ).encode()
    body_file = tmp / "body.json"
    body_file.write_bytes(body)
    script = tmp / "post.lua"
    script.write_text(wrk_lua(body, target.api_key))

    # Throughput: nginx backend (load core), nginx proxy and Sluice gateway (server core).
    backend_port, proxy_port = free_port(), free_port()
    backend_server = string.Template(BACKEND_SERVER).substitute(
        port=backend_port, body=BACKEND_BODY.decode()
    )
    start_nginx(
        procs, nginx, "nginx-backend", tmp / "backend", backend_server, "off", load, backend_port
    )
    gw_log = tmp / "gateway-access.log"
    (proxy, proxy_port), (gateway, gw_port) = proxies(
        args, procs, nginx, tmp, "", backend_port, None if args.access_log_off else gw_log
    )

    for name, port in (("direct", backend_port), ("nginx", proxy_port), ("sluice", gw_port)):
        status, headers, answer = request_once(port, body, target.api_key)
        if status != 200 or answer != BACKEND_BODY:
            raise RuntimeError(f"{name}: status {status}, body {answer[:300]!r}")
        if name == "sluice" and headers.get("x-sluice-route") != target.tag:
            raise RuntimeError(
                f"sluice routed by {headers.get('x-sluice-route')!r}, not {target.tag}"
            )

    conns = args.connections
    log(f"direct to the backend: {args.duration:g}s")
    direct = run_wrk(procs, wrk, load, backend_port, script, args.duration, conns, cores)
    rounds, retries = interleaved_rounds(
        args, procs, wrk, script, load, cores, (proxy_port, proxy), (gw_port, gateway), args.retries
    )
    procs.stop(proxy)
    procs.stop(gateway)  # SIGTERM: the gateway drains and flushes its access log
    log_lines = count_lines(gw_log) if gw_log.exists() else 0
    workers = (
        workers_bench(args, procs, tmp, wrk, script, backend_port, load, cpus)
        if args.workers > 1
        else {}
    )
    with contextlib.suppress(FileNotFoundError):
        gw_log.unlink()  # can be large; the temp dir goes anyway
    stream: dict[str, Any] = {}
    if args.stream_events > 0:
        stream, retries = stream_bench(args, procs, tmp, nginx, wrk, target, cores, retries)

    # Added latency: a 20 ms backend (load core), open-loop load, direct then via the gateway.
    latency: dict[str, Any] = {}
    rt = realtime_prefix()
    if args.latency_duration > 0:
        slow = procs.start(
            "slow-backend",
            rt + pinned(load, [py, str(HERE / "_backend.py"), "--delay-ms", str(args.delay_ms)]),
            stdout=subprocess.PIPE,
        )
        slow_port = read_port(slow, "20 ms backend")
        # nginx in front of the same backend, as a control: what any proxy on the other
        # core adds here (loopback hops, waking an idle core), not just what Sluice adds.
        (proxy2, proxy2_port), (gateway2, gw2_port) = proxies(
            args, procs, nginx, tmp, "latency", slow_port, tmp / "gateway2-access.log"
        )
        targets = (("direct", slow_port), ("nginx", proxy2_port), ("sluice", gw2_port))
        for name, port in targets:
            log(f"open loop {args.rate:g} req/s for {args.latency_duration:g}s: {name}")
            cmd = [
                py,
                str(HERE / "_openloop.py"),
                f"--port={port}",
                f"--rate={args.rate}",
                f"--duration={args.latency_duration}",
                f"--body-file={body_file}",
                "--header",
                f"authorization: Bearer {target.api_key}",
            ]
            while True:
                watch = CpuWatch(cores)
                timeout = args.latency_duration + 30
                out = procs.run(f"openloop-{name}", rt + pinned(load, cmd), timeout)
                res = {**json.loads(out.strip().splitlines()[-1]), **watch.read()}
                if res["errors"] or set(res["statuses"]) != {"200"} or res["unanswered"]:
                    raise RuntimeError(f"open loop against {name} had failures: {res}")
                if res["foreign_pct"] < CONTENDED_PCT or retries <= 0:
                    break
                retries -= 1
                log(f"other processes took {res['foreign_pct']}% CPU; repeating")
            latency[name] = res
        procs.stop(gateway2)
        procs.stop(proxy2)
        procs.stop(slow)

    result: dict[str, Any] = {**versus_nginx(rounds), "rps_direct": round(direct["rps"])}
    if stream and "cpu_us_per_req_sluice" in stream and "cpu_us_per_req_sluice" in result:
        extra = stream["cpu_us_per_req_sluice"] - result["cpu_us_per_req_sluice"]
        stream["cpu_us_per_chunk_sluice"] = round(extra / args.stream_events, 2)
        extra = stream["cpu_us_per_req_nginx"] - result["cpu_us_per_req_nginx"]
        stream["cpu_us_per_chunk_nginx"] = round(extra / args.stream_events, 2)
    if latency:
        d, s, n = latency["direct"], latency["sluice"], latency["nginx"]
        result["added_p50_ms"] = round(s["p50_ms"] - d["p50_ms"], 3)
        result["added_p99_ms"] = round(s["p99_ms"] - d["p99_ms"], 3)
        result["added_p50_ms_nginx"] = round(n["p50_ms"] - d["p50_ms"], 3)
        result["added_p99_ms_nginx"] = round(n["p99_ms"] - d["p99_ms"], 3)
    result.update(
        route_lookup_us=lookups["route_lookup_us"],
        route_resolve_us=lookups["route_resolve_us"],
        rps_sluice_rounds=[round(x["rps"]) for x in rounds["sluice"]],
        rps_nginx_rounds=[round(x["rps"]) for x in rounds["nginx"]],
        wrk_p50_ms={
            k: round(statistics.median(x["p50_ms"] for x in v), 3) for k, v in rounds.items()
        },
        wrk_p99_ms={
            k: round(statistics.median(x["p99_ms"] for x in v), 3) for k, v in rounds.items()
        },
        core_busy_pct={
            k: {
                role: statistics.median(x["busy_pct"].get(c, float("nan")) for x in v)
                for role, c in (("load", load), ("server", srv))
                if c is not None
            }
            for k, v in (*rounds.items(), ("direct", [direct]))
        },
        wrk_socket_errors=sum(int(x["socket_errors"]) for v in rounds.values() for x in v),
        latency=latency,
        stream=stream,
        workers=workers,
        rounds=args.rounds,
        duration_s=args.duration,
        connections=conns,
        latency_rate=args.rate,
        latency_duration_s=args.latency_duration,
        backend_delay_ms=args.delay_ms,
        groups=args.groups,
        rules=lookups["rules"],
        rule_matched=target.index + 1,
        spec_build_ms=lookups["spec_build_ms"],
        snapshot_build_ms=lookups["snapshot_build_ms"],
        gateway_access_log_lines=log_lines,
        cores={"load": load, "server": srv},
        busy_before_pct=before["busy_pct"],
        foreign_cpu_pct_max=max(
            [before["foreign_pct"]]
            + [x["foreign_pct"] for v in rounds.values() for x in v]
            + [x["foreign_pct"] for x in latency.values()]
        ),
        latency_load_sched="SCHED_FIFO" if rt else "normal",
        access_log="off" if args.access_log_off else "on",
        throughput_backend="nginx return 200",
        latency_backend="bench/_backend.py (uvloop)",
        latency_loadgen="bench/_openloop.py",
        nginx_version=nginx_version(nginx),
        python_version=platform.python_version(),
        gateway_compiled=gateway_compiled(),
        date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )
    return result


def gateway_compiled() -> bool:
    """Whether the gateway processes run `make native`'s build (`--tree`): their request
    path compiled with mypyc."""
    probe = "import sluice.gateway.exchange as m; print(m.__file__)"
    out = subprocess.run(  # -P: not the cwd, as the servers (scripts in bench/) import
        [sys.executable, "-P", "-c", probe], capture_output=True, text=True, check=True
    )
    return not out.stdout.strip().endswith(".py")


def proxies(
    args: argparse.Namespace,
    procs: Procs,
    nginx: str,
    tmp: Path,
    name: str,
    backend_port: int,
    gateway_log: Path | None,
    nginx_server: str = PROXY_SERVER,
) -> tuple[tuple[subprocess.Popen[bytes], int], tuple[subprocess.Popen[bytes], int]]:
    """nginx (`nginx_server`, its access log buffered) and the Sluice gateway (the bench's
    generated spec; `gateway_log`: its access log, None for none) in front of the backend
    on `backend_port`, both on the server core: ((nginx, port), (gateway, port))."""
    tag = f"-{name}" if name else ""
    proxy_port, srv = free_port(), args.server_core
    server = string.Template(nginx_server).substitute(port=proxy_port, backend_port=backend_port)
    workdir = tmp / f"proxy{tag}"
    access = f"{workdir / 'access.log'} combined buffer=64k flush=1s"
    proxy = start_nginx(procs, nginx, f"nginx-proxy{tag}", workdir, server, access, srv, proxy_port)
    argv = [sys.executable, str(HERE / "_gateway_server.py"), f"--backend-port={backend_port}"]
    argv += [f"--access-log={gateway_log or ''}", *spec_argv(args)]
    gateway = procs.start(f"sluice-gateway{tag}", pinned(srv, argv), stdout=subprocess.PIPE)
    return (proxy, proxy_port), (gateway, read_port(gateway, f"sluice gateway{tag}"))


def interleaved_rounds(
    args: argparse.Namespace,
    procs: Procs,
    wrk: str,
    script: Path,
    load: int | None,
    cores: list[int],
    nginx: tuple[int, subprocess.Popen[bytes]],
    sluice: tuple[int, subprocess.Popen[bytes]],
    retries: int,
) -> tuple[dict[str, list[dict[str, Any]]], int]:
    """A warm-up, then `args.rounds` wrk rounds, nginx then sluice (each `(port, process)`),
    a round taken again while other processes used the CPU (at most `retries` in all; what
    is left is returned too)."""
    conns = args.connections
    log(f"warm-up: {args.warmup:g}s of wrk on each")
    for port, _ in (nginx, sluice):
        run_wrk(procs, wrk, load, port, script, args.warmup, conns, cores)
    rounds: dict[str, list[dict[str, Any]]] = {"nginx": [], "sluice": []}
    for r in range(args.rounds):
        for name, (port, server) in (("nginx", nginx), ("sluice", sluice)):
            while True:
                res = run_wrk(procs, wrk, load, port, script, args.duration, conns, cores, server)
                log(
                    f"round {r + 1}/{args.rounds} {name:6s} {res['rps']:>9.0f} req/s"
                    f"  {res.get('cpu_us_per_req', float('nan')):.1f} CPU us/req"
                    f"  (core busy %: {res['busy_pct']}, others {res['foreign_pct']}%)"
                )
                if res["foreign_pct"] < CONTENDED_PCT or retries <= 0:
                    break
                retries -= 1  # other processes took CPU meanwhile: measure this one again
                log(f"other processes were busy; repeating ({retries} repeats left)")
            rounds[name].append(res)
    return rounds, retries


def versus_nginx(rounds: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians of interleaved rounds: throughput and CPU per request, and their ratios."""
    med = {k: statistics.median(x["rps"] for x in v) for k, v in rounds.items()}
    out: dict[str, Any] = {
        "rps_sluice": round(med["sluice"]),
        "rps_nginx": round(med["nginx"]),
        "ratio_vs_nginx": round(med["sluice"] / med["nginx"], 3),
    }
    cpu = {
        k: statistics.median(x["cpu_us_per_req"] for x in v)
        for k, v in rounds.items()
        if all("cpu_us_per_req" in x for x in v)
    }
    if len(cpu) == 2:
        out["cpu_us_per_req_sluice"] = round(cpu["sluice"], 2)
        out["cpu_us_per_req_nginx"] = round(cpu["nginx"], 2)
        out["cpu_ratio_vs_nginx"] = round(cpu["nginx"] / cpu["sluice"], 3)
    return out


STREAM_PROXY_SERVER = PROXY_SERVER.replace(
    'proxy_set_header Connection "";',
    'proxy_set_header Connection "";\n            proxy_buffering off;',
)
"""nginx as an SSE proxy is configured: each event passed on as it comes, not buffered."""


def stream_bench(
    args: argparse.Namespace,
    procs: Procs,
    tmp: Path,
    nginx: str,
    wrk: str,
    target: Any,
    cores: list[int],
    retries: int,
) -> tuple[dict[str, Any], int]:
    """Streamed answers (`--stream-events` chunks each, from `_backend.py --sse`, load core)
    through nginx (`proxy_buffering off`) and the gateway (server core), as `bench` does for
    JSON answers. The caller did not ask for usage: the gateway asks the backend for it and
    takes its chunk out (`policy.answers.UsageStripper`), the work of every real stream."""
    load, py, n = args.load_core, sys.executable, args.stream_events
    backend = procs.start(
        "sse-backend",
        pinned(load, [py, str(HERE / "_backend.py"), "--delay-ms", "0", "--sse", str(n)]),
        stdout=subprocess.PIPE,
    )
    gw_log = tmp / "gateway-sse-access.log"
    (proxy, proxy_port), (gateway, gw_port) = proxies(
        args, procs, nginx, tmp, "sse", read_port(backend, "streaming backend"), gw_log,
        STREAM_PROXY_SERVER,
    )  # fmt: skip
    body = json.dumps(
        {"model": target.model, "messages": [{"role": "user", "content": "Say hello."}],
         "max_tokens": n, "stream": True},
        separators=(",", ":"),
    ).encode()  # fmt: skip
    for name, port in (("nginx", proxy_port), ("sluice", gw_port)):
        status, _, answer = request_once(port, body, target.api_key)
        if status != 200 or answer.count(b"data: ") != n + 1 or b'"usage"' in answer:
            raise RuntimeError(f"{name} (stream): status {status}, body {answer[:300]!r}")
    script = tmp / "stream.lua"
    script.write_text(wrk_lua(body, target.api_key))
    log(f"streamed answers of {n} chunks")
    rounds, retries = interleaved_rounds(
        args, procs, wrk, script, load, cores, (proxy_port, proxy), (gw_port, gateway), retries
    )
    for proc in (proxy, gateway, backend):
        procs.stop(proc)
    with contextlib.suppress(FileNotFoundError):
        gw_log.unlink()
    return {"events": n, **versus_nginx(rounds)}, retries


def workers_bench(
    args: argparse.Namespace,
    procs: Procs,
    tmp: Path,
    wrk: str,
    script: Path,
    backend_port: int,
    load: int | None,
    cpus: list[int],
) -> dict[str, Any]:
    """Throughput of 1, 2, ... N gateway processes sharing one port (SO_REUSEPORT, as
    `sluice gateway --workers N` runs them), measured in interleaved rounds against the same
    backend. Worker k runs on the k-th CPU after the server core: with fewer CPUs than
    workers + 1, the workers share cores with wrk and the backend, and the ratio shows what
    is left of a core, not what a process adds on a larger machine."""
    order = (
        cpus[cpus.index(args.server_core) :] + cpus[: cpus.index(args.server_core)]
        if (args.server_core in cpus)
        else cpus
    )
    counts = list(range(1, args.workers + 1))
    rps: dict[int, list[float]] = {k: [] for k in counts}
    for r in range(args.rounds):
        for k in counts:
            port = free_port()
            started = []
            for j in range(k):
                core = order[j % len(order)] if order else None
                cmd = [
                    sys.executable,
                    str(HERE / "_gateway_server.py"),
                    f"--backend-port={backend_port}",
                    f"--access-log={tmp / f'workers-{k}-{j}.log'}",
                    f"--port={port}",
                    "--reuse-port",
                    *spec_argv(args),
                ]
                proc = procs.start(
                    f"sluice-worker-{k}-{j}", pinned(core, cmd), stdout=subprocess.PIPE
                )
                read_port(proc, f"gateway worker {j + 1} of {k}")
                started.append(proc)
            cores = sorted({c for c in (load, *order[:k]) if c is not None})
            run_wrk(procs, wrk, load, port, script, args.warmup, args.connections, cores)
            res = run_wrk(procs, wrk, load, port, script, args.duration, args.connections, cores)
            log(f"round {r + 1}/{args.rounds} {k} gateway process(es): {res['rps']:>9.0f} req/s")
            rps[k].append(res["rps"])
            for proc in started:
                procs.stop(proc)
            for f in tmp.glob(f"workers-{k}-*.log"):
                f.unlink()
    med = {k: statistics.median(v) for k, v in rps.items()}
    return {
        "rps": {str(k): round(v) for k, v in med.items()},
        "rounds": {str(k): [round(x) for x in v] for k, v in rps.items()},
        "ratio_vs_one": {str(k): round(v / med[1], 3) for k, v in med.items()},
        "cpus": len(cpus),
    }


def print_table(r: dict[str, Any]) -> None:
    rows = [
        (
            f"throughput (wrk -t1 -c{r['connections']}, median of {r['rounds']} x "
            f"{r['duration_s']:g}s)",
            "",
        ),
        ("  direct to backend", f"{r['rps_direct']:>10,} req/s"),
        ("  nginx proxy", f"{r['rps_nginx']:>10,} req/s   rounds {r['rps_nginx_rounds']}"),
        ("  sluice gateway", f"{r['rps_sluice']:>10,} req/s   rounds {r['rps_sluice_rounds']}"),
        ("  sluice / nginx", f"{r['ratio_vs_nginx']:>10.3f}"),
    ]
    if "cpu_us_per_req_sluice" in r:
        rows.append(
            (
                "  CPU per request nginx / sluice",
                f"{r['cpu_us_per_req_nginx']:.1f} / {r['cpu_us_per_req_sluice']:.1f} us"
                f"   (ratio {r['cpu_ratio_vs_nginx']:.3f})",
            )
        )
    if r.get("stream"):
        st = r["stream"]
        rows += [
            (f"streamed answers ({st['events']} chunks each, nginx proxy_buffering off)", ""),
            ("  nginx / sluice", f"{st['rps_nginx']:,} / {st['rps_sluice']:,} req/s"
             f"   (ratio {st['ratio_vs_nginx']:.3f})"),
        ]  # fmt: skip
        if "cpu_us_per_chunk_sluice" in st:
            rows.append(
                (
                    "  CPU per request / per extra chunk",
                    f"nginx {st['cpu_us_per_req_nginx']:.1f} / {st['cpu_us_per_chunk_nginx']:.2f}"
                    f" us, sluice {st['cpu_us_per_req_sluice']:.1f} / "
                    f"{st['cpu_us_per_chunk_sluice']:.2f} us",
                )
            )
    if "added_p50_ms" in r:
        d, s, n = r["latency"]["direct"], r["latency"]["sluice"], r["latency"]["nginx"]
        rows += [
            (
                f"added latency ({r['latency_rate']:g} req/s, "
                f"{r['backend_delay_ms']:g} ms backend)",
                "",
            ),
            (
                "  p50 direct / nginx / sluice",
                f"{d['p50_ms']:.2f} / {n['p50_ms']:.2f} / {s['p50_ms']:.2f} ms",
            ),
            (
                "  p99 direct / nginx / sluice",
                f"{d['p99_ms']:.2f} / {n['p99_ms']:.2f} / {s['p99_ms']:.2f} ms",
            ),
            (
                "  added p50 / p99 by sluice",
                f"{r['added_p50_ms']:+.2f} / {r['added_p99_ms']:+.2f} ms",
            ),
            (
                "  added p50 / p99 by nginx",
                f"{r['added_p50_ms_nginx']:+.2f} / {r['added_p99_ms_nginx']:+.2f} ms",
            ),
        ]
    if r.get("workers"):
        w = r["workers"]
        rows.append((f"gateway processes on one port ({w['cpus']} CPUs in all)", ""))
        rows += [
            (f"  {k} process(es)", f"{v:>10,} req/s   x{w['ratio_vs_one'][k]:.2f} of one")
            for k, v in w["rps"].items()
        ]
    rows += [
        (f"route lookup ({r['rules']} rules, matched #{r['rule_matched']})", ""),
        ("  routes.lookup", f"{r['route_lookup_us']:.3f} us"),
        ("  snapshot.resolve", f"{r['route_resolve_us']:.3f} us"),
        ("nginx / python", f"{r['nginx_version']} / {r['python_version']}"),
        ("gateway build", "compiled (make native)" if r["gateway_compiled"] else "pure Python"),
        ("other processes' CPU, worst run", f"{r['foreign_cpu_pct_max']}% of a core"),
    ]
    width = max(len(k) for k, _ in rows) + 2
    for k, v in rows:
        print(f"{k:<{width}}{v}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON line only")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=int, default=5, help="seconds per wrk round")
    ap.add_argument("--warmup", type=int, default=1, help="wrk warm-up seconds per server")
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--rate", type=float, default=500.0, help="open-loop requests per second")
    ap.add_argument("--latency-duration", type=float, default=10.0, help="0 skips it")
    ap.add_argument("--delay-ms", type=float, default=20.0, help="slow backend's delay")
    ap.add_argument("--groups", type=int, default=100)
    ap.add_argument("--routes", type=int, default=1000)
    ap.add_argument("--tenants", type=int, default=20)
    ap.add_argument("--models", type=int, default=50)
    ap.add_argument("--replicas", type=int, default=2, help="endpoints per group")
    ap.add_argument("--lookups", type=int, default=200_000)
    ap.add_argument("--wait-quiet", type=float, default=30.0, help="max s to wait for idle CPUs")
    ap.add_argument("--retries", type=int, default=3, help="repeats of contended runs, total")
    ap.add_argument("--access-log-off", action="store_true", help="experiment: no access log")
    ap.add_argument(
        "--stream-events", type=int, default=16, help="chunks per streamed answer; 0 skips it"
    )
    ap.add_argument("--load-core", type=int, default=None, help="wrk and backends (default 0)")
    ap.add_argument("--server-core", type=int, default=None, help="the proxies (default 1)")
    ap.add_argument(
        "--workers", type=int, default=1, help="also measure 1..N gateway processes on one port"
    )
    ap.add_argument(
        "--tree",
        type=Path,
        default=None,
        help="run the gateway from the sluice under this directory (make native: build/native)",
    )
    args = ap.parse_args()
    if args.tree is not None:  # the gateway processes import sluice from there
        os.environ["PYTHONPATH"] = str(args.tree.resolve())

    def terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, terminate)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with it ignored
    procs = Procs()
    try:
        with tempfile.TemporaryDirectory(prefix="sluice-bench-") as tmp:
            try:
                result = bench(args, procs, Path(tmp))
            finally:
                procs.stop_all()
    except KeyboardInterrupt:
        log("interrupted; children stopped")
        sys.exit(130)
    except RuntimeError as exc:
        log(f"failed: {exc}")
        sys.exit(1)
    if args.json:
        print(json.dumps(result), flush=True)
    else:
        print_table(result)


if __name__ == "__main__":
    main()
