"""Soak: the whole platform under steady load and routine faults for N minutes.

    python bench/soak.py --minutes 10 --json      # one JSON document on stdout
    python bench/soak.py --minutes 2              # a short summary; progress on stderr

Starts its own `sluice up` on a temp state directory (127.0.0.1, ephemeral ports) with four
small `sim` groups: `chat` (manual, 2) and `chat-v2` (2) serve model m-chat, `risk` (2)
and `risk-v2` (1, a bad canary: 20% of its answers are HTTP 500) serve m-risk. Then, for
`--minutes`:

- steady open-loop load: `--rate` req/s of m-chat and `--risk-rate` req/s of m-risk, each
  request due at its scheduled time whatever happened before (bounded: a fixed thread pool);
- every `--kill-every` s, `kill -9` of a random ready instance of the group serving m-chat;
- every `--scale-every` s, that group is scaled 2 -> 3 or 3 -> 2 (`POST .../scale`);
- at a third of the run the good rollout `chat-v2` starts and is left to run (promoted by
  its analysis; the kills and scaling follow the traffic to chat-v2 then);
- every `--bad-rollout-every` s the bad rollout `risk-v2` starts and is rolled back.

Failures are sorted by cause. Expected: `killed_instance` (in flight when an instance was
killed), `rollback_window` (a 500 answered by the bad canary between its rollout's start and
1 s after its rollback). Anything else is `unexpected`. Every `--sample-s` (5) s the RSS of
the `sluice up` process (gateway, controller and control API live in it) and of every
worker is read from /proc; the slope is a least-squares fit in MB/min. The open fds of
`sluice up` (/proc/PID/fd) are counted before the load and after it, once the groups are
back to their first sizes and idle, and sorted by kind (TCP sockets matched to
/proc/net/tcp): `tcp_to_live_instance` are established connections to an instance that
is running (the gateway's keep-alive pool and the probes: more of them after the load
only because more instances have served; bounded by the pools), anything else (files,
pipes, accepted or half-closed sockets, sockets to instances that are gone) is what a
leak would show as.

`--tracemalloc DIR` (debugging, slows `sluice up`): runs `sluice up` with
`SLUICE_TRACEMALLOC_DIR=DIR` (`sluice.cli.heapdump`), has it dump a heap snapshot by
SIGUSR2 before the load (which starts tracing), at `--dump-at` minutes (3) and at the end
of the load, and reports the top growers of each interval (`compare_to(..., "traceback")`)
under `tracemalloc` with the RSS at each dump. Its RSS slopes are not the bare process's.

Exit status: 1 if there was any unexpected failure or the fds other than connections to
live instances grew by more than `--fd-slack` (5), `growth_not_pooled`; 0 otherwise.
Every process it started is stopped on the way out (SIGTERM to `sluice up`, then SIGKILL
of any worker of its state directory that is left).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

GROUP = """
  - name: {name}
    owner: soak@example.com
    business: soak
    alert_channel: "#soak"
    models:
      {model}: {{runtime: sim, version: {version}, sim: {{startup_s: 0.3, \
service_time: {{kind: lognormal, median_s: 0.02, sigma: 0.3}}, memory_gb: 1{extra}}}}}
    resources: {{pool: local, accelerators: 1, memory_gb: 1}}
    max_concurrency: 8
    replicas: {replicas}
    slow_start_s: 0
    warmup: {{requests: 1}}
    health: {{interval_s: 0.5, failure_threshold: 2, timeout_s: 1}}
    drain_timeout_s: 10
"""
SPEC = (
    "gateway: {host: 127.0.0.1, port: 0}\n"
    "pools:\n  - {name: local, count: 16, memory_gb: 64}\n"
    "groups:"
    + GROUP.format(name="chat", model="m-chat", version="v1", replicas=2, extra="")
    + GROUP.format(name="chat-v2", model="m-chat", version="v2", replicas=2, extra="")
    + GROUP.format(name="risk", model="m-risk", version="v1", replicas=2, extra="")
    + GROUP.format(
        name="risk-v2", model="m-risk", version="v2", replicas=1, extra=", error_rate: 0.2"
    )
    + """tenants:
  - {name: soak, api_keys: [sk-soak-df58a2b6bf87b913]}
routes:
  - {tag: chat-main, match: {models: [m-chat]}, to: chat}
  - {tag: risk-main, match: {models: [m-risk]}, to: risk}
rollouts:
  - name: chat-v2
    baseline: chat
    canary: chat-v2
    steps: [20, 50, 100]
    hold_s: 5
    analysis: {min_samples: 30}
  - name: risk-v2
    baseline: risk
    canary: risk-v2
    steps: [20, 50, 100]
    hold_s: 3
    # 100 a side: with 20 (an override far below the plan), a 20 %-error canary at 20 % of
    # 10 req/s was promoted once in five (the slow path has no power at 20 a side, and 20 %
    # is the fast path's own boundary); at 100 the first step's looks catch it in ~50 s
    analysis: {min_samples: 100}
"""
)
BAD_CANARY = "risk-v2"
INITIAL = {"chat": 2, "chat-v2": 2, "risk": 2, "risk-v2": 1}


def log(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- the platform -----------------------------------------------------------------------


class Platform:
    """One `sluice up` on `home`, and its control API with the admin token; `heap_dir`:
    where it dumps heap snapshots on SIGUSR2 (None: it does not)."""

    def __init__(self, home: Path, heap_dir: Path | None = None) -> None:
        self.home = home
        self.heap_dir = heap_dir
        self.dumps = 0
        self.proc: subprocess.Popen[str] | None = None
        self.endpoint = ""
        self.control = ""
        self.output: list[str] = []
        self.api: httpx.Client | None = None

    def start(self) -> None:
        spec = self.home / "platform.yaml"
        spec.write_text(SPEC)
        env = {**os.environ, "SLUICE_HOME": str(self.home)}
        env.pop("SLUICE_TOKEN", None)
        cmd = [sys.executable, "-m", "sluice", "up", "-f", str(spec), "--log-level", "warning"]
        if self.heap_dir is not None:  # not passed on to the workers (no SLUICE_* is)
            env["SLUICE_TRACEMALLOC_DIR"] = str(self.heap_dir)
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        seen = threading.Event()

        def pump() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                self.output.append(line)
                if line.startswith("endpoint: "):
                    self.endpoint = line.split(" ", 1)[1].strip()
                    seen.set()

        threading.Thread(target=pump, daemon=True).start()
        if not seen.wait(90):
            raise RuntimeError("sluice up did not print its endpoint:\n" + "".join(self.output))
        self.control = json.loads((self.home / "control.json").read_text())["control_url"]
        token = (self.home / "admin.token").read_text().strip()
        self.api = httpx.Client(
            base_url=self.control,
            headers={"Authorization": f"Bearer {token}"},
            trust_env=False,
            timeout=30,
        )

    def get(self, path: str, **params: Any) -> Any:
        assert self.api is not None
        r = self.api.get(path, params=params)
        r.raise_for_status()
        return r.json()

    def post(self, path: str, body: dict[str, Any]) -> Any:
        assert self.api is not None
        r = self.api.post(path, json=body)
        if r.status_code >= 400:
            raise RuntimeError(f"POST {path} -> {r.status_code}: {r.text}")
        return r.json()

    def instances(self) -> list[dict[str, Any]]:
        return list(self.get("/v1/instances"))

    def ready(self, group: str) -> list[dict[str, Any]]:
        return [i for i in self.instances() if i["group"] == group and i["state"] == "ready"]

    def settled(self, sizes: dict[str, int]) -> bool:
        """Every group has exactly `sizes[g]` instances, all ready."""
        got: dict[str, list[str]] = {}
        for i in self.instances():
            got.setdefault(i["group"], []).append(i["state"])
        return all(
            len(got.get(g, [])) == n and all(s == "ready" for s in got.get(g, []))
            for g, n in sizes.items()
        )

    def ports(self) -> tuple[set[int], set[int]]:
        """(ports of the live instances, the gateway's and control API's own ports)."""
        inst = {int(i["url"].rsplit(":", 1)[1]) for i in self.instances() if i["url"]}
        own = {int(u.rsplit(":", 1)[1]) for u in (self.endpoint, self.control)}
        return inst, own

    def fds(self) -> dict[str, int]:
        assert self.proc is not None
        return fd_kinds(self.proc.pid, *self.ports())

    def rollout_phase(self, name: str) -> str:
        (r,) = [r for r in self.get("/v1/rollouts") if r["name"] == name]
        return str(r["phase"])

    def dump_heap(self) -> Path:
        """Have `sluice up` write a heap snapshot (SIGUSR2) and wait for it."""
        assert self.proc is not None and self.heap_dir is not None
        self.dumps += 1
        path = self.heap_dir / f"{self.proc.pid}-{self.dumps}.tracemalloc"
        self.proc.send_signal(signal.SIGUSR2)
        wait(f"heap snapshot {path.name}", path.exists, 300)
        return path

    def stop(self) -> int | None:
        code = None
        if self.api is not None:
            self.api.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                code = self.proc.wait(90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        kill_workers_of(self.home)
        return code


def worker_processes(home: Path) -> dict[str, int]:
    """Instance id -> pid of every live worker of `home` (by /proc cmdline)."""
    ids = [p.stem for p in (home / "instances").glob("*.log")]
    found: dict[str, int] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            state = (proc / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if b"sluice.worker" not in cmdline or state == "Z":
            continue
        for iid in ids:
            if f'"instance_id": "{iid}"'.encode() in cmdline:
                found[iid] = int(proc.name)
    return found


def kill_workers_of(home: Path) -> None:
    for pid in worker_processes(home).values():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


TCP_STATES = {"01": "established", "06": "time_wait", "08": "close_wait", "0A": "listen"}


def tcp_sockets() -> dict[str, tuple[int, int, str]]:
    """Socket inode -> (local port, remote port, state) of every TCP socket here."""
    out: dict[str, tuple[int, int, str]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                f = line.split()
                local, remote, state, inode = f[1], f[2], f[3], f[9]
                out[inode] = (
                    int(local.rsplit(":", 1)[1], 16),
                    int(remote.rsplit(":", 1)[1], 16),
                    TCP_STATES.get(state, state),
                )
    return out


def fd_kinds(pid: int, instance_ports: set[int], own_ports: set[int]) -> dict[str, int]:
    """The open fds of `pid` by kind: TCP sockets to live instances (the gateway's pooled
    keep-alive connections and the probes'), to anything else (a dead instance: a leak),
    accepted ones (`own_ports`: gateway, control API), listening ones, and non-TCP fds by
    type (file, pipe, anon_inode, unix/other socket)."""
    tcp = tcp_sockets()
    kinds: dict[str, int] = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            sock = tcp.get(target[8:-1])
            if sock is None:
                kind = "socket_other"
            elif sock[2] == "listen":
                kind = "tcp_listen"
            elif sock[0] in own_ports:
                kind = "tcp_accepted"
            elif sock[1] in instance_ports and sock[2] == "established":
                kind = "tcp_to_live_instance"
            else:
                kind = f"tcp_other_{sock[2]}"
        elif target.startswith("pipe:"):
            kind = "pipe"
        elif target.startswith("anon_inode:"):
            kind = "anon_inode"
        else:
            kind = "file"
        kinds[kind] = kinds.get(kind, 0) + 1
    return dict(sorted(kinds.items()))


def slope_per_min(samples: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, MB) samples, in MB per minute."""
    if len(samples) < 3:
        return None
    n = len(samples)
    mx = sum(t for t, _ in samples) / n
    my = sum(v for _, v in samples) / n
    sxx = sum((t - mx) ** 2 for t, _ in samples)
    if sxx == 0:
        return None
    sxy = sum((t - mx) * (v - my) for t, v in samples)
    return round(60.0 * sxy / sxx, 3)


# --- the load ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Outcome:
    model: str
    due: float
    sent: float
    done: float
    status: int  # 0: no HTTP answer
    group: str
    instance: str
    error: str


class Load:
    """Open loop: request k of a model is due at start + k / rate; a bounded pool sends."""

    def __init__(self, endpoint: str, rates: dict[str, float], seconds: float) -> None:
        self.client = httpx.Client(
            base_url=endpoint,
            trust_env=False,
            timeout=60,
            limits=httpx.Limits(max_connections=48, max_keepalive_connections=48),
        )
        self.rates = rates
        self.seconds = seconds
        self.pool = ThreadPoolExecutor(max_workers=48)
        self.out: list[Outcome] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [
            threading.Thread(target=self._schedule, args=(m, r), daemon=True)
            for m, r in rates.items()
        ]
        self.start = 0.0

    def run(self) -> None:
        self.start = time.monotonic()
        for t in self.threads:
            t.start()

    def _schedule(self, model: str, rate: float) -> None:
        k = 0
        while not self.stopping.is_set():
            due = self.start + k / rate
            if due - self.start >= self.seconds:
                return
            wait = due - time.monotonic()
            if wait > 0 and self.stopping.wait(wait):
                return
            self.pool.submit(self._one, model, due)
            k += 1

    def _one(self, model: str, due: float) -> None:
        sent = time.monotonic()
        body = {"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}
        try:
            r = self.client.post(
                "/v1/chat/completions",
                headers={"Authorization": "Bearer sk-soak-df58a2b6bf87b913"},
                json=body,
            )
            o = Outcome(
                model,
                due,
                sent,
                time.monotonic(),
                r.status_code,
                r.headers.get("x-sluice-group", ""),
                r.headers.get("x-sluice-instance", ""),
                "" if r.status_code == 200 else r.text[:200],
            )
        except httpx.HTTPError as exc:
            o = Outcome(model, due, sent, time.monotonic(), 0, "", "", repr(exc)[:200])
        with self.lock:
            self.out.append(o)

    def finish(self) -> list[Outcome]:
        for t in self.threads:
            t.join()
        self.pool.shutdown(wait=True)
        self.client.close()
        return sorted(self.out, key=lambda o: o.due)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


# --- the run ----------------------------------------------------------------------------


def soak(args: argparse.Namespace, home: Path) -> dict[str, Any]:
    p = Platform(home, None if args.tracemalloc is None else Path(args.tracemalloc))
    started = time.monotonic()
    try:
        p.start()  # (a start that times out still stops what it started)
        return drive(args, p, started)
    finally:
        code = p.stop()
        log(f"sluice up stopped (exit {code})")


def wait(what: str, pred: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.25)


class Driver:
    """The faults and the sampling, from the main thread, on a 0.2 s beat."""

    def __init__(self, args: argparse.Namespace, p: Platform, t0: float, wall: float) -> None:
        self.args, self.p, self.t0, self.wall = args, p, t0, wall
        self.rng = random.Random(args.seed)
        self.serving = "chat"  # the group m-chat goes to (chat-v2 once its rollout promoted)
        self.size = 2
        self.kills: list[dict[str, Any]] = []
        self.scales: list[dict[str, Any]] = []
        self.rollouts: list[dict[str, Any]] = []
        self.active: dict[str, dict[str, Any]] = {}
        self.errors: list[str] = []
        self.rss_up: list[tuple[float, float]] = []
        self.rss_workers: dict[str, list[tuple[float, float]]] = {}

    def act(self, what: str, fn: Any, *fargs: Any) -> Any:
        """Run one action; a failed one is reported and the soak goes on."""
        try:
            return fn(*fargs)
        except Exception as exc:
            self.errors.append(f"{time.monotonic() - self.t0:.1f}s {what}: {exc!r}"[:300])
            log(f"{what} failed: {exc!r}")
            return None

    def sample(self, up_pid: int) -> None:
        at = time.monotonic() - self.t0
        mb = rss_mb(up_pid)
        if mb is not None:
            self.rss_up.append((at, mb))
        for iid, pid in worker_processes(self.p.home).items():
            wmb = rss_mb(pid)
            if wmb is not None:
                self.rss_workers.setdefault(iid, []).append((at, wmb))

    def kill(self) -> None:
        ready = self.p.ready(self.serving)
        if ready:
            victim = self.rng.choice(ready)
            os.kill(int(victim["pid"]), signal.SIGKILL)
            self.kills.append({"at": time.monotonic(), "instance": victim["id"]})

    def scale(self, group: str, to: int, reason: str) -> bool:
        self.p.post(f"/v1/groups/{group}/scale", {"replicas": to, "reason": reason})
        self.scales.append({"at_s": round(time.monotonic() - self.t0, 1), "group": group, "to": to})
        return True

    def toggle_size(self) -> None:
        to = 3 if self.size == 2 else 2
        if self.act("scale", self.scale, self.serving, to, f"soak: {self.size} -> {to}"):
            self.size = to

    def start_rollout(self, name: str) -> None:
        asked = time.monotonic()  # the split may take traffic before the POST has returned
        if self.act(
            f"rollout start {name}", self.p.post, f"/v1/rollouts/{name}/start", {"reason": "soak"}
        ):
            self.active[name] = {"name": name, "start": asked}

    def follow_rollouts(self) -> None:
        for name, run in list(self.active.items()):
            phase = self.act(f"rollout status {name}", self.p.rollout_phase, name)
            if phase in (None, "stepping", "paused"):
                continue
            report = self.act(f"rollout report {name}", self.p.get, f"/v1/rollouts/{name}")
            end = time.monotonic()
            if report:
                end = report["state"]["transitions"][-1]["at"] - self.wall
            run.update(phase=phase, end=end)
            self.rollouts.append(run)
            del self.active[name]
            log(f"rollout {name}: {phase} after {end - run['start']:.1f} s")
            if name == "chat-v2" and phase == "promoted" and self.serving == "chat":
                # the traffic, so the kills and the scaling, moves to chat-v2; chat goes back
                # to its first size
                self.act("scale chat back", self.scale, "chat", 2, "soak: promoted")
                self.serving, self.size = "chat-v2", 2


def drive(args: argparse.Namespace, p: Platform, started: float) -> dict[str, Any]:
    assert p.proc is not None
    up_pid = p.proc.pid
    wait("every group ready", lambda: p.settled(INITIAL), 120)
    log(f"platform ready in {time.monotonic() - started:.1f} s at {p.endpoint}")
    seconds = args.minutes * 60.0
    time.sleep(2.0)
    fds_before = fd_count(up_pid)
    kinds_before = p.fds()
    heap = HeapDumps(p)
    heap.dump("before the load")
    load = Load(p.endpoint, {"m-chat": args.rate, "m-risk": args.risk_rate}, seconds)
    wall = time.time() - time.monotonic()
    load.run()
    t0 = load.start
    d = Driver(args, p, t0, wall)
    next_sample = t0
    next_kill = t0 + args.kill_every / 2
    next_scale = t0 + args.scale_every * 0.8
    next_bad = t0 + min(args.bad_rollout_every / 2, seconds / 2)
    good_at: float | None = t0 + seconds / 3
    dump_at: float | None = t0 + args.dump_at * 60 if args.dump_at * 60 < seconds else None
    next_progress = t0 + 30
    while (now := time.monotonic()) < t0 + seconds:
        if now >= next_sample:
            next_sample += args.sample_s
            d.sample(up_pid)
        if dump_at is not None and now >= dump_at:
            dump_at = None
            heap.dump(f"minute {args.dump_at:g}", background=True)
        if now >= next_kill:
            next_kill += args.kill_every
            d.act("kill", d.kill)
        if now >= next_scale:
            next_scale += args.scale_every
            d.toggle_size()
        if good_at is not None and now >= good_at:
            good_at = None
            d.start_rollout("chat-v2")
        if now >= next_bad and BAD_CANARY not in d.active:
            next_bad += args.bad_rollout_every
            d.start_rollout(BAD_CANARY)
        d.follow_rollouts()
        if now >= next_progress:
            next_progress += 30
            with load.lock:
                done = len(load.out)
                bad = sum(1 for o in load.out if o.status != 200)
            log(
                f"{now - t0:.0f}/{seconds:.0f} s: {done} answered, {bad} failed, "
                f"{len(d.kills)} kills"
            )
        time.sleep(0.2)

    outcomes = load.finish()
    heap.dump("end of the load")
    log(f"load done: {len(outcomes)} requests")
    for run in d.active.values():  # still stepping at the end: its window lasts to the end
        run.update(phase="still running at the end", end=time.monotonic())
        d.rollouts.append(run)
    # back to the first sizes, idle, then count the fds again
    d.act("scale back", d.scale, d.serving, 2, "soak: end")
    d.act("settle", wait, "the first sizes again", lambda: p.settled(INITIAL), 90)
    time.sleep(3.0)
    fds_after = fd_count(up_pid)
    kinds_after = p.fds()
    fds = {"before": fds_before, "after": fds_after, "growth": fds_after - fds_before}
    pooled = kinds_after.get("tcp_to_live_instance", 0) - kinds_before.get(
        "tcp_to_live_instance", 0
    )
    fds.update(growth_not_pooled=fds["growth"] - pooled)
    result = summarize(args, outcomes, d, fds, {"before": kinds_before, "after": kinds_after})
    if p.heap_dir is not None:
        result["tracemalloc"] = heap.growth()
    return result


class HeapDumps:
    """Heap snapshots of `sluice up` (`--tracemalloc`; nothing otherwise), each with its
    label and the RSS when it was asked for."""

    def __init__(self, p: Platform) -> None:
        self.p = p
        self.taken: list[tuple[str, float | None, Path]] = []
        self.pending: threading.Thread | None = None

    def dump(self, label: str, background: bool = False) -> None:
        if self.p.heap_dir is None:
            return
        assert self.p.proc is not None
        rss = rss_mb(self.p.proc.pid)
        rss = None if rss is None else round(rss, 1)

        def take() -> None:
            path = self.p.dump_heap()
            self.taken.append((label, rss, path))
            log(f"heap snapshot at {label}: {path}")

        if self.pending is not None:
            self.pending.join()
        self.pending = threading.Thread(target=take, daemon=True)
        self.pending.start()
        if not background:
            self.pending.join()

    def growth(self, top: int = 15) -> list[dict[str, Any]]:
        """Per interval between snapshots: RSS and traced bytes at both ends, and the top
        growers by allocation site (`lineno`) and by whole traceback."""
        if self.pending is not None:
            self.pending.join()
        own = tracemalloc.Filter(False, tracemalloc.__file__)
        out: list[dict[str, Any]] = []
        older = None
        for (label0, rss0, path0), (label1, rss1, path1) in zip(
            self.taken, self.taken[1:], strict=False
        ):
            if older is None:
                older = tracemalloc.Snapshot.load(str(path0)).filter_traces([own])
            newer = tracemalloc.Snapshot.load(str(path1)).filter_traces([own])
            by_line = newer.compare_to(older, "lineno")
            by_tb = newer.compare_to(older, "traceback")
            traced = [sum(t.size for t in s.traces) for s in (older, newer)]
            out.append(
                {
                    "from": label0,
                    "to": label1,
                    "rss_mb": [rss0, rss1],
                    "traced_mb": [round(b / 2**20, 2) for b in traced],
                    "native_mb": native_mb(path0, path1),
                    "by_line": [
                        {
                            "kb": round(st.size_diff / 1024, 1),
                            "count": st.count_diff,
                            "at": short_frame(st.traceback[-1]),
                        }
                        for st in by_line[:top]
                    ],
                    "by_traceback": [
                        {
                            "kb": round(st.size_diff / 1024, 1),
                            "count": st.count_diff,
                            "stack": [short_frame(f) for f in st.traceback][-10:],
                        }
                        for st in by_tb[:top]
                    ],
                }
            )
            older = newer
        return out


def native_mb(*dumps: Path) -> dict[str, list[float]]:
    """`sluice.cli.heapdump.native_memory` beside each dump, MB: what tracemalloc misses."""
    read = [json.loads(p.with_suffix(".json").read_text()) for p in dumps]
    return {k: [round(r[k] / 2**20, 2) for r in read] for k in read[0] if k in read[-1]}


def short_frame(frame: tracemalloc.Frame) -> str:
    """`path:line`, the path from the package (or library) root on."""
    name = re.sub(r"^.*/(site-packages|lib/python3\.\d+)/", "", frame.filename)
    name = name.removeprefix(f"{Path(__file__).resolve().parent.parent}/")
    return f"{name}:{frame.lineno}"


def summarize(
    args: argparse.Namespace,
    outcomes: list[Outcome],
    d: Driver,
    fds: dict[str, int],
    kinds: dict[str, dict[str, int]],
) -> dict[str, Any]:
    kills, rollouts, rss_up, rss_workers = d.kills, d.rollouts, d.rss_up, d.rss_workers
    windows = [
        (r["start"], r["end"] + 1.0) for r in rollouts if r["name"] == BAD_CANARY and "end" in r
    ]
    causes = {"killed_instance": 0, "rollback_window": 0, "unexpected": 0}
    unexpected: list[str] = []
    t0 = min((o.due for o in outcomes), default=0.0)
    for o in outcomes:
        if o.status == 200:
            continue
        if any(o.sent <= k["at"] < o.done for k in kills):
            causes["killed_instance"] += 1
        elif (
            o.status == 500 and o.group == BAD_CANARY and any(a <= o.sent <= b for a, b in windows)
        ):
            causes["rollback_window"] += 1
        else:
            causes["unexpected"] += 1
            unexpected.append(f"t={o.sent - t0:.2f}s status={o.status} group={o.group} {o.error}")
    slopes = {i: slope_per_min(s) for i, s in rss_workers.items() if len(s) >= 6}
    known = [v for v in slopes.values() if v is not None]
    lat = [o.done - o.due for o in outcomes if o.status == 200]
    ok = causes["unexpected"] == 0 and fds["growth_not_pooled"] <= args.fd_slack
    return {
        "ok": ok,
        "minutes": args.minutes,
        "rate_per_s": {"m-chat": args.rate, "m-risk": args.risk_rate},
        "requests_sent": len(outcomes),
        "requests_ok": sum(1 for o in outcomes if o.status == 200),
        "failures": {
            "expected": {
                "killed_instance": causes["killed_instance"],
                "rollback_window": causes["rollback_window"],
            },
            "unexpected": causes["unexpected"],
            "unexpected_first": unexpected[:10],
        },
        "latency_ms": {
            "p50": round(1000 * (percentile(lat, 0.5) or 0), 1),
            "p99": round(1000 * (percentile(lat, 0.99) or 0), 1),
            "max": round(1000 * max(lat, default=0), 1),
        },
        "kills": len(kills),
        "scale_changes": d.scales,
        "rollouts": [
            {
                "name": r["name"],
                "at_s": round(r["start"] - t0, 1),
                "phase": r.get("phase"),
                "took_s": round(r["end"] - r["start"], 1) if "end" in r else None,
            }
            for r in rollouts
        ],
        "rss_mb_per_min": {
            "sluice_up": slope_per_min(rss_up),
            "sluice_up_first_mb": round(rss_up[0][1], 1) if rss_up else None,
            "sluice_up_last_mb": round(rss_up[-1][1], 1) if rss_up else None,
            "sluice_up_second_half": slope_per_min(rss_up[len(rss_up) // 2 :]),
            "sluice_up_mb_each_minute": [
                round(mb, 1)
                for k, (t, mb) in enumerate(rss_up)
                if k == 0 or int(t // 60) > int(rss_up[k - 1][0] // 60)
            ],
            "workers_measured": len(known),
            "workers_max": max(known, default=None),
            "workers_median": percentile(known, 0.5),
            "workers": slopes,
        },
        "sample_s": args.sample_s,
        "fds": {**fds, "by_kind": kinds},
        "action_errors": d.errors,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--json", action="store_true", help="one JSON document on stdout")
    ap.add_argument("--rate", type=float, default=20.0, help="m-chat requests per second")
    ap.add_argument("--risk-rate", type=float, default=10.0, help="m-risk requests per second")
    ap.add_argument("--kill-every", type=float, default=30.0)
    ap.add_argument("--scale-every", type=float, default=40.0)
    ap.add_argument("--bad-rollout-every", type=float, default=120.0)
    ap.add_argument("--sample-s", type=float, default=5.0)
    ap.add_argument("--fd-slack", type=int, default=5)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--keep", action="store_true", help="keep the state directory")
    ap.add_argument(
        "--tracemalloc",
        metavar="DIR",
        default=None,
        help="run sluice up under tracemalloc, dump heap snapshots to DIR, report growers",
    )
    ap.add_argument("--dump-at", type=float, default=3.0, help="minute of the middle dump")
    args = ap.parse_args()
    if min(args.rate, args.risk_rate) <= 0 or max(args.rate, args.risk_rate) > 200:
        ap.error("rates must be in (0, 200] requests per second")
    home = Path(tempfile.mkdtemp(prefix="sluice-soak-"))
    try:
        result = soak(args, home)
    finally:
        if args.keep:
            log(f"state kept in {home}")
        else:
            shutil.rmtree(home, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        f = result["failures"]
        print(
            f"{'ok' if result['ok'] else 'FAILED'}: {result['requests_sent']} requests in "
            f"{args.minutes:g} min, failures expected {f['expected']}, unexpected "
            f"{f['unexpected']}; RSS slope sluice up {result['rss_mb_per_min']['sluice_up']} "
            f"MB/min, workers max {result['rss_mb_per_min']['workers_max']} MB/min; fds "
            f"{result['fds']['before']} -> {result['fds']['after']}"
        )
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
