"""Drive the real system: `sluice up` as a subprocess, workers as its subprocesses."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from sluice.runtime.local import pid_runs_instance
from tests.databases import BACKENDS, database_for


@dataclass
class Sluice:
    """One `sluice up` (or `sluice controller`) process on a state directory, plus CLI
    helpers against it."""

    home: Path
    spec: Path
    proc: subprocess.Popen[str] | None = None
    endpoint: str = ""
    output: list[str] = field(default_factory=list)
    _pump: threading.Thread | None = None

    _tokens: dict[str, str] = field(default_factory=dict)
    port: int = 0
    """The gateway's port: 0 picks a free one at each start (so a restart may move it)."""
    environ: dict[str, str] = field(default_factory=dict)
    """Set for `sluice up` and the CLI on top of this process's environment."""
    command: str = "up"
    """`controller`: no gateway in the process (`endpoint` stays empty)"""
    extra_args: list[str] = field(default_factory=list)
    """More options for the command (say `--health-port N`)"""
    _clients: list[openai.OpenAI] = field(default_factory=list)
    """Every client handed out, closed when the platform stops: one left to the garbage
    collector warns of its unclosed keep-alive socket in whichever test collects it"""

    def env(self) -> dict[str, str]:
        """The CLI's environment: it finds the admin token `sluice up` wrote in the home."""
        env = {**os.environ, **self.environ, "SLUICE_HOME": str(self.home)}
        env.pop("SLUICE_TOKEN", None)
        return env

    def token(self, name: str, role: str = "admin", groups: str | None = None) -> str:
        """A token for `name` (created once per platform, by the bootstrap admin)."""
        if name not in self._tokens:
            args = ["token", "create", name, "--role", role]
            self._tokens[name] = self.cli(*args, *(["--groups", groups] if groups else []))["token"]
        return self._tokens[name]

    def as_user(self, name: str, *args: str) -> tuple[int, Any]:
        """`sluice ARGS --json` with `name`'s token: (exit code, JSON output)."""
        r = subprocess.run(
            [sys.executable, "-m", "sluice", *args, "--json"],
            capture_output=True,
            text=True,
            env={**self.env(), "SLUICE_TOKEN": self.token(name)},
            timeout=60,
        )
        return r.returncode, json.loads(r.stdout)

    def control_headers(self) -> dict[str, str]:
        """For raw calls to the control API: its URL's host and the admin token."""
        return {"Authorization": f"Bearer {(self.home / 'admin.token').read_text().strip()}"}

    @property
    def control_url(self) -> str:
        return str(json.loads((self.home / "control.json").read_text())["control_url"])

    def start(self, with_spec: bool = True, wait_endpoint: bool = True) -> None:
        """Start `sluice up`; unless told not to (a standby prints its endpoint only once
        it leads), wait until it prints its endpoint (`sluice controller`: its control URL)."""
        cmd = [sys.executable, "-m", "sluice", self.command, "--log-level", "warning"]
        if self.command == "up":
            cmd += ["--port", str(self.port)]
        if with_spec:
            cmd += ["-f", str(self.spec)]
        cmd += self.extra_args
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=self.env()
        )
        self.output = []
        ready = threading.Event()

        def pump() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                self.output.append(line)
                if line.startswith("endpoint: "):
                    self.endpoint = line.split(" ", 1)[1].strip()
                    ready.set()
                elif line.startswith("control: ") and self.command == "controller":
                    ready.set()

        self._pump = threading.Thread(target=pump, daemon=True)
        self._pump.start()
        if wait_endpoint and not ready.wait(60):
            self.kill()
            raise AssertionError("sluice up did not print its endpoint:\n" + "".join(self.output))

    def stop(self, timeout: float = 60) -> int:
        """Ctrl-C: stop it and every instance (SIGINT; a SIGTERM only hands over)."""
        return self._signal(signal.SIGINT, timeout)

    def hand_over(self, timeout: float = 60) -> int:
        """SIGTERM, as Kubernetes sends: it releases the lease and leaves its instances
        running for the next leader."""
        return self._signal(signal.SIGTERM, timeout)

    def _signal(self, sig: signal.Signals, timeout: float) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout)
        self._close()
        return code

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._close()

    def _close(self) -> None:
        for client in self._clients:
            client.close()
        self._clients.clear()
        if self.proc is not None and self.proc.stdout is not None:
            if self._pump is not None:
                self._pump.join(10)
            self.proc.stdout.close()

    def cli(self, *args: str, check: bool = True) -> Any:
        return json.loads(self._run(*args, "--json", check=check))

    def show(self, *args: str) -> str:
        """A command's output as a person sees it (no --json), wide enough not to wrap."""
        return self._run(*args, check=True, COLUMNS="200")

    def _run(self, *args: str, check: bool, **env: str) -> str:
        r = subprocess.run(
            [sys.executable, "-m", "sluice", *args],
            capture_output=True,
            text=True,
            env={**self.env(), **env},
            timeout=60,
        )
        if check and r.returncode != 0:
            raise AssertionError(f"sluice {' '.join(args)} -> {r.returncode}: {r.stdout}{r.stderr}")
        return r.stdout

    def instances(self, group: str | None = None) -> list[dict[str, Any]]:
        return self.cli("get", "instances", *(["--group", group] if group else []))

    def wait_for(self, what: str, pred: Callable[[], bool], timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred():
                return
            time.sleep(0.25)
        raise AssertionError(f"timed out waiting for {what}; instances: {self.instances()}")

    def wait_routing(self, timeout: float = 60) -> None:
        """Until the gateway of `sluice up` has its first routes: before, it answers 503 to
        every request. Read from the control API (`GET /v1/dataplane`: the local gateway's
        snapshot version, 1 and up once routed), not by a probe to the gateway, whose
        access log would count it as a request."""

        def routed() -> bool:
            try:
                r = httpx.get(
                    self.control_url + "/v1/dataplane",
                    headers=self.control_headers(),
                    trust_env=False,
                    timeout=10,
                    verify=False,  # a readiness read on loopback: the TLS tests verify
                )
                return r.status_code == 200 and (r.json()["gateways"].get("local") or 0) >= 1
            except (httpx.HTTPError, OSError, ValueError):
                return False

        self.wait_for("the gateway's first routes", routed, timeout=timeout)

    def ready(self, group: str) -> list[dict[str, Any]]:
        return [i for i in self.instances(group) if i["state"] == "ready"]

    def client(self, key: str = "sk-e2e-f78ed04e82bcf081") -> openai.OpenAI:
        # max_retries=0: a lost request must show up as an error, not be retried away
        client = openai.OpenAI(
            base_url=self.endpoint + "/v1", api_key=key, max_retries=0, timeout=30
        )
        self._clients.append(client)
        return client


class Stream:
    """A steady, bounded request stream from a few threads; records every outcome."""

    def __init__(self, sluice: Sluice, model: str, threads: int = 3, pause_s: float = 0.02):
        self._client = sluice.client()
        self._model = model
        self._pause = pause_s
        self._stop = threading.Event()
        self.ok = 0
        self.errors: list[str] = []
        self.fingerprints: list[str] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(threads)]

    def __enter__(self) -> Stream:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)

    def _loop(self) -> None:
        deadline = time.monotonic() + 300  # bounded even if the test forgets to stop it
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                r = self._client.chat.completions.create(
                    model=self._model, max_tokens=4, messages=[{"role": "user", "content": "hello"}]
                )
                with self._lock:
                    self.ok += 1
                    self.fingerprints.append(r.system_fingerprint or "")
            except Exception as exc:
                with self._lock:
                    self.errors.append(repr(exc))
            time.sleep(self._pause)


SPEC = """
gateway: {{host: 127.0.0.1, port: 0}}
pools:
  - {{name: local, count: 8, memory_gb: 16}}
groups:
  - name: chat
    owner: alice@example.com
    business: search
    alert_channel: "#search"
    models:
      e2e-sim:
        runtime: sim
        version: {version}
        sim: {{startup_s: 0.5, service_time: {{kind: fixed, seconds: 0.05}}, memory_gb: 1}}
    resources: {{pool: local, accelerators: 1, memory_gb: 2}}
    max_concurrency: 8
    replicas: 1
    warmup: {{requests: 1}}
    health: {{interval_s: 0.5, failure_threshold: 2, timeout_s: 1}}
    drain_timeout_s: 20
{embed}
tenants:
  - name: e2e
    api_keys: [sk-e2e-f78ed04e82bcf081]
  - name: outsider
    api_keys: [sk-outsider-8091a51d2118c7ee]
    models: [e2e-sim]
routes:
  - tag: chat-main
    match: {{models: [e2e-sim]}}
    to: chat
"""

EMBED = """
  - name: embed
    owner: bob@example.com
    business: risk
    alert_channel: "#risk"
    models:
      e2e-embed: {runtime: embedding, version: minilm}
    resources: {pool: local, accelerators: 1, memory_gb: 2}
    max_concurrency: 4
    replicas: 1
    health: {startup_timeout_s: 240}
"""


def write_spec(path: Path, version: str, embed: bool) -> None:
    path.write_text(SPEC.format(version=version, embed=EMBED if embed else ""))


@pytest.fixture(scope="module")
def sluice(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sluice]:
    home = tmp_path_factory.mktemp("home")
    spec = home / "platform.yaml"
    write_spec(spec, "v1", embed=True)
    s = Sluice(home, spec)
    s.start()
    try:
        s.wait_routing()
        yield s
    finally:
        s.kill()
        kill_workers_of(home)


def kill_workers_of(home: Path) -> None:
    """Whatever the tests did, leave no worker of this state directory running."""
    ids = [p.stem for p in (home / "instances").glob("*.log")]
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and any(pid_runs_instance(int(proc.name), i) for i in ids):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(proc.name), signal.SIGKILL)


class OpenLoop:
    """Sends requests on a fixed schedule (rate per phase) from a thread pool, and keeps
    every answer: a lost request shows up as a non-200 or an exception."""

    def __init__(
        self, endpoint: str, model: str = "m-chat", key: str = "sk-search-b095adcc724f4f8a"
    ) -> None:
        self.model = model
        self.auth = f"Bearer {key}"
        self.client = httpx.Client(
            base_url=endpoint,
            trust_env=False,
            timeout=60,
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
        )
        self.pool = ThreadPoolExecutor(max_workers=48)
        self.futures: list[Future[tuple[int, float]]] = []

    def _one(self) -> tuple[int, float]:
        start = time.monotonic()
        r = self.client.post(
            "/v1/chat/completions",
            headers={"Authorization": self.auth},
            json={
                "model": self.model,
                "max_tokens": 1,
                "messages": [{"role": "user", "content": "x"}],
            },
        )
        return r.status_code, time.monotonic() - start

    def run(self, rate: float, seconds: float) -> None:
        start = time.monotonic()
        n = int(rate * seconds)
        for k in range(n):
            delay = start + k / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            self.futures.append(self.pool.submit(self._one))

    def results(self) -> list[tuple[int, float]]:
        out = [f.result(timeout=120) for f in self.futures]
        self.close()
        return out

    def close(self) -> None:
        """Wait for what was sent and close every connection (a test that reads no results
        still calls this, or its sockets outlive it)."""
        self.pool.shutdown()
        self.client.close()


@contextlib.contextmanager
def running(
    home: Path,
    spec_text: str,
    what: str,
    ready: Callable[[Sluice], bool],
    timeout: float = 90,
    environ: dict[str, str] | None = None,
    command: str = "up",
) -> Iterator[Sluice]:
    """`sluice up` (or `command`) on `spec_text` in `home` until `ready(s)` holds; killed
    (with every worker it started) on the way out, whatever happened. `environ`: see
    `Sluice.environ`."""
    spec = home / "platform.yaml"
    spec.write_text(spec_text)
    s = Sluice(home, spec, environ=dict(environ or {}), command=command)
    s.start()
    try:
        s.wait_for(what, lambda: ready(s), timeout=timeout)
        if command == "up":
            s.wait_routing()
        yield s
    finally:
        s.kill()
        kill_workers_of(home)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RemoteGateway:
    """`sluice gateway` as a process, with its output kept. `gateway_id`: its `--id` (None:
    the default, `<token name>-<host name>-<port>`); worker i adds `-w<i>`."""

    def __init__(
        self,
        controls: list[str],
        token: str,
        workers: int,
        home: Path,
        metrics_port: int | None = None,
        gateway_id: str | None = None,
    ) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "sluice", "gateway", "--port", str(self.port)]
        cmd += ["--workers", str(workers), "--log-level", "warning"]
        if gateway_id is not None:
            cmd += ["--id", gateway_id]
        if metrics_port is not None:
            cmd += ["--metrics-port", str(metrics_port)]
        for c in controls:
            cmd += ["--control", c]
        env = {**os.environ, "SLUICE_GATEWAY_TOKEN": token, "SLUICE_HOME": str(home)}
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        self.output: list[str] = []
        self._pump = threading.Thread(target=self._read, daemon=True)
        self._pump.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)

    def wait_routing(self, workers: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sum(": routing v" in line for line in self.output) >= workers:
                return
            time.sleep(0.2)
        raise AssertionError("the gateway got no routes:\n" + "".join(self.output))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._pump.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def free_ports(n: int) -> int:
    """The first of `n` consecutive free ports."""
    for _ in range(50):
        first = free_port()
        try:
            for k in range(1, n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", first + k))
        except OSError:
            continue
        return first
    raise AssertionError(f"no {n} consecutive free ports")


@contextlib.contextmanager
def remote_gateway(
    controls: list[str],
    token: str,
    workers: int,
    home: Path,
    metrics_port: int | None = None,
    gateway_id: str | None = None,
) -> Iterator[RemoteGateway]:
    gw = RemoteGateway(controls, token, workers, home, metrics_port, gateway_id)
    try:
        gw.wait_routing(workers)
        yield gw
    finally:
        gw.stop()


def shared_secrets_key(directory: Path) -> dict[str, str]:
    """The environment that gives controllers on one database one secrets key (what seals
    the stored specs' secrets): a key file written once in `directory`."""
    path = directory / "secrets.key"
    if not path.exists():
        path.write_text(secrets.token_hex(64) + "\n")
        path.chmod(0o600)
    return {"SLUICE_SECRETS_KEY_FILE": str(path)}


def leads(s: Sluice) -> bool:
    """`sluice up` printed that it took the leader lease."""
    return any(line.startswith("leader:") for line in s.output)


@pytest.fixture(params=BACKENDS)
def shared_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of one empty database several control planes share (SQLite, PostgreSQL)."""
    with database_for(request.param, tmp_path / "db") as db:
        yield db.url
