"""A real Prometheus scrapes a real `sluice up` (issue 18): the control API's /metrics with a
viewer token from the CLI, as docs/grafana/README.md says to, and its query API then has the
per-group series of both halves (the controller's `sluice_group_instances`, the gateway's
`sluice_gateway_requests_total`) and the per-instance series with the instance's id as its
`instance` label; and the LLM-aware ones (issue 35): tokens by tenant, the tenants' service
in a busy group's queue, and the expected prefix-cache hits.

Prometheus is the Debian package's `/usr/bin/prometheus` (`.ci/run` installs it); this test
starts its own, on 127.0.0.1 with a temporary TSDB, never the system service. Without it the
test skips, except under CI, where a missing Prometheus is a failure.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.e2e.conftest import Sluice, running

SPEC = """
gateway: {host: 127.0.0.1, port: 0}
pools:
  - {name: local, count: 2, memory_gb: 16}
groups:
  - name: chat
    owner: alice@example.com
    business: search
    alert_channel: "#search"
    models:
      e2e-sim:
        runtime: sim
        version: v1
        sim: {startup_s: 0.2, service_time: {kind: fixed, seconds: 0.01}, memory_gb: 1}
    resources: {pool: local, accelerators: 1, memory_gb: 2}
    max_concurrency: 4
    replicas: 1
    prefix_routing: {block_bytes: 64}
    health: {interval_s: 0.5, failure_threshold: 2, timeout_s: 1}
    drain_timeout_s: 5
tenants:
  - {name: e2e, api_keys: [sk-e2e-f78ed04e82bcf081]}
routes:
  - {tag: chat-main, match: {models: [e2e-sim]}, to: chat}
"""
REQUESTS = 5
DEADLINE_S = 60.0


def prometheus_binary() -> str:
    found = shutil.which("prometheus") or (
        "/usr/bin/prometheus" if os.access("/usr/bin/prometheus", os.X_OK) else None
    )
    if found is None:
        why = (
            "Prometheus is not installed: apt-get install -y prometheus (the Debian package "
            "provides /usr/bin/prometheus; .ci/run installs it)"
        )
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return found


def scrape_config(target: str, token_file: Path) -> str:
    """The job docs/grafana/README.md shows, every second."""
    return f"""
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: sluice
    honor_labels: true
    scheme: http
    metrics_path: /metrics
    authorization:
      type: Bearer
      credentials_file: {token_file}
    static_configs:
      - targets: ["{target}"]
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prometheus:
    """One Prometheus process on 127.0.0.1 and its query API."""

    def __init__(self, binary: str, config: Path, data: Path, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self._out = log.open("w")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={data}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1h",
            ],
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )
        self.http = httpx.Client(base_url=self.url, trust_env=False, timeout=5)

    def stop(self) -> None:
        self.http.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._out.close()

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector `expr` evaluates to now ([] while Prometheus is starting)."""
        try:
            r = self.http.get("/api/v1/query", params={"query": expr})
        except httpx.TransportError:
            return []
        if r.status_code != 200:
            return []
        body = r.json()
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def diagnosis(self) -> str:
        """What to look at when a series never came: the targets' state and the log's end."""
        try:
            targets = self.http.get("/api/v1/targets").json()["data"]["activeTargets"]
            state = [(t["scrapeUrl"], t["health"], t["lastError"]) for t in targets]
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            state = [("?", "?", repr(exc))]
        return f"targets: {state}\nprometheus log:\n{self.log.read_text()[-3000:]}"


@pytest.fixture
def prometheus_bin() -> str:
    return prometheus_binary()


@pytest.fixture
def sluice(tmp_path: Path) -> Iterator[Sluice]:
    home = tmp_path / "home"
    home.mkdir()
    with running(home, SPEC, "chat ready", lambda s: len(s.ready("chat")) == 1) as s:
        yield s


def values(result: list[dict[str, Any]]) -> list[float]:
    return [float(r["value"][1]) for r in result]


def test_prometheus_scrapes_group_and_instance_series(
    sluice: Sluice, prometheus_bin: str, tmp_path: Path
) -> None:
    s = sluice
    prom_dir = tmp_path / "prometheus"
    (prom_dir / "data").mkdir(parents=True)
    token_file = prom_dir / "sluice.token"
    token_file.write_text(s.token("prometheus", role="viewer") + "\n")
    token_file.chmod(0o600)
    control = urlsplit(s.control_url)
    assert control.scheme == "http" and control.hostname == "127.0.0.1"
    config = prom_dir / "prometheus.yml"
    config.write_text(scrape_config(f"127.0.0.1:{control.port}", token_file))
    promtool = shutil.which("promtool")
    if promtool is not None:
        check = subprocess.run(
            [promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=30
        )
        assert check.returncode == 0, check.stdout + check.stderr

    [ready] = s.ready("chat")
    client = s.client()
    prompt = [{"role": "user", "content": "the same long question, " * 8}]  # 3 blocks of 64

    def ask() -> None:
        r = client.chat.completions.create(model="e2e-sim", max_tokens=2, messages=prompt)
        assert r.choices

    for _ in range(REQUESTS):  # bounded, to 127.0.0.1
        ask()
    with ThreadPoolExecutor(max_workers=12) as pool:  # 12 at once on 4 slots: some queue
        list(pool.map(lambda _: ask(), range(12)))

    prom = Prometheus(prometheus_bin, config, prom_dir / "data", prom_dir / "prometheus.log")
    try:
        queries = {
            "up": 'up{job="sluice"}',
            "ready": 'sluice_group_instances{group="chat",state="ready"}',
            "requests": 'sum by (group) (sluice_gateway_requests_total{group="chat"})',
            "per_instance": 'sluice_gateway_instance_requests_total{group="chat",code_class="2xx"}',
            "latency": (
                "histogram_quantile(0.95, sum by (instance, le) "
                '(sluice_gateway_instance_request_duration_seconds_bucket{group="chat"}))'
            ),
            "completion_tokens": 'sluice_gateway_completion_tokens_total{group="chat"}',
            "service": 'sluice_gateway_tenant_service_total{group="chat"}',
            "gap": 'sluice_gateway_fairness_gap{group="chat"}',
            "prefix": (
                'sluice_gateway_prefix_cached_blocks_total{group="chat"}'
                ' / sluice_gateway_prefix_blocks_total{group="chat"}'
            ),
        }
        got: dict[str, list[dict[str, Any]]] = {}

        def complete() -> bool:
            got.update({name: prom.query(expr) for name, expr in queries.items()})
            return (
                values(got["up"]) == [1.0]
                and values(got["ready"]) == [1.0]
                and sum(values(got["requests"])) >= REQUESTS
                and sum(values(got["per_instance"])) >= REQUESTS
                and bool(got["latency"])
                and sum(values(got["completion_tokens"])) >= 2 * (REQUESTS + 12)
                and bool(got["service"])
                and bool(got["gap"])
                and bool(got["prefix"])
            )

        deadline = time.monotonic() + DEADLINE_S
        while not complete():
            assert prom.proc.poll() is None, "prometheus exited\n" + prom.diagnosis()
            assert time.monotonic() < deadline, f"series missing: {got}\n{prom.diagnosis()}"
            time.sleep(0.5)

        [per_instance] = got["per_instance"]
        labels = per_instance["metric"]
        assert labels["instance"] == ready["id"]  # Sluice's instance id, kept by honor_labels
        assert labels["job"] == "sluice" and labels["group"] == "chat"
        assert got["requests"][0]["metric"] == {"group": "chat"}
        [latency] = got["latency"]
        assert latency["metric"]["instance"] == ready["id"]
        assert 0.0 < float(latency["value"][1]) <= 10.0
        [tokens] = got["completion_tokens"]
        assert tokens["metric"]["tenant"] == "e2e"  # per tenant, from the answers' usage
        assert got["service"][0]["metric"]["tenant"] == "e2e" and values(got["service"])[0] > 0
        # one instance: every prompt after the first finds its blocks where it sent them
        assert values(got["prefix"]) and values(got["prefix"])[0] > 0.8, got["prefix"]
    finally:
        prom.stop()
