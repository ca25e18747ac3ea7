"""Helpers of the fault suite: a timestamped open-loop load through the real gateway, a thin
client of the control API (cheaper to poll than the CLI) and the one-line fault report.

Every test starts its own `sluice up` (`tests.e2e.conftest.running`) on its own state
directory, so each passes alone and in any order; `running` kills every worker on the way out.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.e2e.conftest import OpenLoop, Sluice

__all__ = [
    "Api",
    "Load",
    "Outcome",
    "PinnedSluice",
    "free_port",
    "group_spec",
    "in_flight",
    "lines",
    "p99",
    "platform_spec",
    "ready_counts",
    "report",
    "wait_until",
    "worker_pids",
]

SIM_FAST = "{startup_s: 0.2, service_time: {kind: fixed, seconds: 0.02}, memory_gb: 1}"

GROUP = """
  - name: {name}
    owner: ops@example.com
    business: search
    alert_channel: "#ops"
    models:
      {model}: {{runtime: sim, version: {version}, sim: {sim}}}
    resources: {{pool: local, accelerators: 1, memory_gb: 1}}
    max_concurrency: {max_concurrency}
    replicas: {replicas}
    slow_start_s: 0
    warmup: {{requests: 1}}
    health: {{interval_s: 0.5, failure_threshold: 2, timeout_s: {probe_timeout_s}, \
startup_timeout_s: {startup_timeout_s}}}
    drain_timeout_s: 15
{extra}"""


def group_spec(
    name: str,
    model: str = "m-chat",
    *,
    replicas: int = 1,
    sim: str = SIM_FAST,
    version: str = "v1",
    max_concurrency: int = 8,
    probe_timeout_s: float = 1.0,
    startup_timeout_s: float = 60.0,
    extra: str = "",
) -> str:
    """One sim group of the spec, YAML under `groups:`."""
    return GROUP.format(
        name=name,
        model=model,
        replicas=replicas,
        sim=sim,
        version=version,
        max_concurrency=max_concurrency,
        probe_timeout_s=probe_timeout_s,
        startup_timeout_s=startup_timeout_s,
        extra=extra,
    )


def platform_spec(groups: str, routes: str, rollouts: str = "") -> str:
    """A whole spec: one pool of 12 units, tenant `search` (key sk-search-b095adcc724f4f8a),
    `routes:` rules."""
    return (
        "gateway: {host: 127.0.0.1, port: 0}\n"
        "pools:\n  - {name: local, count: 12, memory_gb: 32}\n"
        "groups:"
        + groups
        + "tenants:\n  - {name: search, api_keys: [sk-search-b095adcc724f4f8a]}\n"
        + "routes:\n"
        + routes
        + (f"rollouts:\n{rollouts}" if rollouts else "")
    )


class Api:
    """The control API with the admin token `sluice up` wrote: JSON in, JSON out."""

    def __init__(self, s: Sluice) -> None:
        self._client = httpx.Client(
            base_url=s.control_url, headers=s.control_headers(), trust_env=False, timeout=20
        )

    def get(self, path: str, **params: Any) -> Any:
        r = self._client.get(path, params={k: v for k, v in params.items() if v is not None})
        r.raise_for_status()
        return r.json()

    def post(self, path: str, body: dict[str, Any]) -> Any:
        r = self._client.post(path, json=body)
        if r.status_code >= 400:
            raise AssertionError(f"POST {path} {body} -> {r.status_code}: {r.text}")
        return r.json()

    def instances(self, group: str | None = None) -> list[dict[str, Any]]:
        return list(self.get("/v1/instances", group=group))

    def ready(self, group: str) -> list[dict[str, Any]]:
        return [i for i in self.instances(group) if i["state"] == "ready"]

    def events(self, group: str | None = None, limit: int = 500) -> list[dict[str, Any]]:
        return list(self.get("/v1/events", group=group, limit=limit))

    def status(self) -> dict[str, Any]:
        return dict(self.get("/v1/status"))

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Api:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def ready_counts(s: Sluice) -> dict[str, int]:
    """Ready instances per group (for `running`'s ready predicate)."""
    with Api(s) as api:
        counts: dict[str, int] = {}
        for i in api.instances():
            if i["state"] == "ready":
                counts[i["group"]] = counts.get(i["group"], 0) + 1
        return counts


def free_port() -> int:
    """A port free on 127.0.0.1 now (the kernel's pick; nothing else here takes fixed ports)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class PinnedSluice(Sluice):
    """`Sluice` whose gateway listens on the same port across restarts."""

    port: int = field(default_factory=free_port)


def wait_until(what: str, pred: Callable[[], bool], timeout: float, poll_s: float = 0.1) -> float:
    """Poll `pred` until it holds; returns the monotonic time it first held."""
    deadline = time.monotonic() + timeout
    while True:
        now = time.monotonic()
        if pred():
            return now
        if now > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(poll_s)


@dataclass(frozen=True, slots=True)
class Outcome:
    """One request of the load: when it was due, when it was sent and answered (monotonic
    seconds), the HTTP status (0: no answer at all) and where the gateway sent it."""

    due: float
    sent: float
    done: float
    status: int
    group: str
    instance: str
    error: str

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def latency(self) -> float:
        """From the scheduled send time (no coordinated omission)."""
        return self.done - self.due


class Load(OpenLoop):
    """`OpenLoop` in the background, keeping per request the times and the answering
    group and instance; a refused or reset connection is an outcome (status 0), not a crash.
    Bounded: at most `max_s` seconds, and `rate` requests a second."""

    def __init__(self, endpoint: str, model: str = "m-chat", rate: float = 30.0) -> None:
        super().__init__(endpoint, model=model)
        self.rate = rate
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._done: list[Outcome] = []
        self.started = 0.0

    def _one_at(self, due: float) -> Outcome:
        sent = time.monotonic()
        try:
            r = self.client.post(
                "/v1/chat/completions",
                headers={"Authorization": self.auth},
                json={
                    "model": self.model,
                    "max_tokens": 1,
                    "messages": [{"role": "user", "content": "x"}],
                },
            )
            out = Outcome(
                due,
                sent,
                time.monotonic(),
                r.status_code,
                r.headers.get("x-sluice-group", ""),
                r.headers.get("x-sluice-instance", ""),
                "" if r.status_code == 200 else r.text[:300],
            )
        except httpx.HTTPError as exc:
            out = Outcome(due, sent, time.monotonic(), 0, "", "", repr(exc)[:300])
        with self._lock:
            self._done.append(out)
        return out

    def _schedule(self, max_s: float) -> None:
        start = self.started
        k = 0
        while not self._stop.is_set():
            due = start + k / self.rate
            if due - start > max_s:
                break
            delay = due - time.monotonic()
            if delay > 0 and self._stop.wait(delay):
                break
            self.futures.append(self.pool.submit(self._one_at, due))  # type: ignore[arg-type]
            k += 1

    def start(self, max_s: float = 120.0) -> Load:
        self.started = time.monotonic()
        self._thread = threading.Thread(target=self._schedule, args=(max_s,), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[Outcome]:
        """Stop sending; every request sent gets its answer (or error); sorted by due time."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self.results()  # waits for every future, closes the pool and the client
        return sorted(self._done, key=lambda o: o.due)


def in_flight(outcomes: list[Outcome], at: float) -> int:
    """Requests sent by `at` and not answered by then (client side: an upper bound on what
    any one instance held at `at`)."""
    return sum(1 for o in outcomes if o.sent <= at < o.done)


def p99(outcomes: list[Outcome]) -> float:
    return quantile(outcomes, 0.99)


def quantile(outcomes: list[Outcome], q: float) -> float:
    """The latency below which a fraction `q` of `outcomes` lie (nan for none)."""
    lat = sorted(o.latency for o in outcomes)
    if not lat:
        return float("nan")
    return lat[min(len(lat) - 1, int(q * len(lat)))]


def report(
    name: str, sent: int, failed: int, expected: int, recovery_s: float, **more: Any
) -> None:
    """The one line a closing note tabulates (`pytest -s` shows it); with
    $SLUICE_FAULT_LOG set it is also appended there as JSON."""
    extra = "".join(f" {k}={v}" for k, v in more.items())
    print(
        f"\nFAULT {name}: sent={sent} failed={failed} expected={expected} "
        f"recovery_s={recovery_s:.2f}{extra}",
        flush=True,
    )
    log = os.environ.get("SLUICE_FAULT_LOG")
    if log:
        row = {
            "fault": name,
            "sent": sent,
            "failed": failed,
            "expected": expected,
            "recovery_s": round(recovery_s, 2),
            **more,
        }
        with open(log, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")


def worker_pids(home: Path) -> dict[str, list[int]]:
    """Every live worker process of `home`'s instances (by /proc cmdline): id -> pids."""
    ids = [p.stem for p in (home / "instances").glob("*.log")]
    found: dict[str, list[int]] = {}
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
                found.setdefault(iid, []).append(int(proc.name))
    return found


def lines(outcomes: list[Outcome]) -> Iterator[str]:
    """Failed requests, for an assertion message."""
    for o in outcomes:
        if not o.ok:
            yield f"t={o.due:.2f} status={o.status} group={o.group} {o.error[:160]}"
