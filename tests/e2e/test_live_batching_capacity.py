"""A live batching group sized on its capacity at the SLO through a real `sluice up` (issue 36):
once a load test's fit is stored under the group's model version, its autoscaler sizes it on
the fitted server's capacity at the mean lengths of the answers the gateway counted (their
usage), not on `max_concurrency` slots, and `sluice explain` says so.

The server is `openai_stub.py` timing its answers as a batching server (a decode step of
20 ms + 5 ms a stream, 2,000 prompt tokens prefilled a second). The fit is posted as a load
test's report would be (`sluice loadtest --fit` measures it in test_loadtest_fit.py; here
the test is about what the controller does with it). Prompts of 400 words: a 0.2 s prefill,
against a 1 s TTFT bound at 99 % the fitted server serves about 0.7 request/s an instance
(`batching_capacity`), so 2 request/s need 3 instances, where 8 slots an instance would hold
them on one. Everything goes to 127.0.0.1; the load is 2 request/s for at most 60 s.
"""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from sluice.policy.autoscale.batching import ServerModel, batching_capacity
from tests.e2e.conftest import Sluice, running
from tests.faults.conftest import Api, wait_until
from tests.integration.gateway_fakes import metric_values

pytestmark = pytest.mark.serial  # it measures time: run alone (Makefile)

STEP_BASE_S, STEP_PER_SEQ_S, PREFILL_TPS = 0.02, 0.005, 2000.0
PROMPT_WORDS, MAX_TOKENS, RATE = 400, 8, 2.0
STUB = str(Path(__file__).with_name("openai_stub.py"))
ARGV = [
    sys.executable, STUB, "--host", "{host}", "--port", "{port}", "--model", "{model}",
    "--step-base-s", str(STEP_BASE_S), "--step-per-seq-s", str(STEP_PER_SEQ_S),
    "--prefill-tps", str(PREFILL_TPS),
]  # fmt: skip
KEY = "sk-chat-6c1f0e93b2d84a57"
SPEC = f"""
gateway: {{host: 127.0.0.1, port: 0}}
pools:
  - {{name: gpu, accelerator: fake-gpu, count: 4, memory_gb: 16}}
groups:
  - name: llm
    owner: ops@example.com
    business: search
    alert_channel: "#ops"
    models:
      m-llm:
        runtime: command
        version: v7
        command:
          argv: [{", ".join(f'"{a}"' for a in ARGV)}]
          stop_grace_s: 1
    resources: {{pool: gpu, accelerators: 1, memory_gb: 1}}
    max_concurrency: 8
    replicas: 1
    slow_start_s: 0
    warmup: {{requests: 1}}
    health: {{interval_s: 0.5, failure_threshold: 2, timeout_s: 1, startup_timeout_s: 20}}
    autoscaling: {{policy: sluice, min: 1, max: 4}}
    slo: {{ttft_ms: 1000, tpot_ms: 200, target: 0.99}}
tenants:
  - {{name: chat, api_keys: [{KEY}]}}
routes:
  - {{tag: llm, match: {{models: [m-llm]}}, to: llm}}
"""
FIT = {
    "step_base_s": STEP_BASE_S,
    "step_per_seq_s": STEP_PER_SEQ_S,
    "step_per_kv_token_s": 0.0,
    "prefill_tps": PREFILL_TPS,
}


class Load:
    """Non-streamed answers of PROMPT_WORDS-word prompts at RATE a second until stopped
    (60 s at most), each kept as its status code."""

    def __init__(self, s: Sluice, rate: float = RATE, words: int = PROMPT_WORDS) -> None:
        self.rate, self.words = rate, words
        self.client = httpx.Client(base_url=s.endpoint, trust_env=False, timeout=30)
        self.pool = ThreadPoolExecutor(16)
        self.codes: list[int] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _one(self) -> None:
        r = self.client.post(
            "/v1/chat/completions",
            headers={"authorization": f"Bearer {KEY}"},
            json={
                "model": "m-llm",
                "max_tokens": MAX_TOKENS,
                "messages": [{"role": "user", "content": " ".join(["word"] * self.words)}],
            },
        )
        self.codes.append(r.status_code)

    def _run(self) -> None:
        start = time.monotonic()
        k = 0
        while not self.stop.is_set() and k < 60 * self.rate:
            delay = start + k / self.rate - time.monotonic()
            if delay > 0:
                self.stop.wait(delay)
            self.pool.submit(self._one)
            k += 1

    def __enter__(self) -> Load:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop sending, wait for what was sent, and close every connection: a client left
        to the garbage collector warns of its keep-alive sockets in whichever later test
        collects it (the serial tier runs every module in one process)."""
        self.stop.set()
        self.thread.join()
        self.pool.shutdown()
        self.client.close()
        self.pool.shutdown()
        self.client.close()


def sized(s: Sluice) -> list[dict[str, Any]]:
    """`sluice explain llm`'s decisions that sized on the batching capacity."""
    decisions = s.cli("explain", "llm", "--limit", "50")["decisions"]
    return [d for d in decisions if "capacity_rps" in d["detail"]["signals"]]


def test_a_stored_fit_sizes_a_live_group_on_its_capacity(tmp_path: Path) -> None:
    with (
        running(tmp_path, SPEC, "llm ready", lambda s: len(s.ready("llm")) == 1) as s,
        Api(s) as api,
    ):
        stored = api.post(
            "/v1/groups/llm/capacity",
            {"kind": "loadtest", "mode": "live", "verdict": "fitted",
             "report": {"group": "llm", "fit": {"params": FIT}}},
        )  # fmt: skip
        with Load(s) as load:
            wait_until("a decision sized on the capacity", lambda: bool(sized(s)), 50, 1.0)
            wait_until("the group scaled up", lambda: len(s.ready("llm")) >= 2, 30, 1.0)
        assert load.codes and all(c == 200 for c in load.codes), load.codes
        d = sized(s)[0]  # the newest
        signals = d["detail"]["signals"]
        expected = batching_capacity(
            ServerModel.from_fit(FIT, 8),  # type: ignore[arg-type]
            PROMPT_WORDS,
            MAX_TOKENS,
            1.0,
            0.2,
            0.99,
        )
        print("decision:", d["reason"], signals)
        assert signals["capacity_rps"] == pytest.approx(expected.rps, rel=0.02), signals
        assert signals["slots_per_instance"] < 8, signals
        assert f"server from load test #{stored['id']} (v7)" in d["reason"], d
        assert "batching capacity" in d["reason"] and "ttft bound" in d["reason"], d
        # the decision that scaled it up names the signal that decided, sized on capacity
        ups = [x for x in sized(s) if x["desired"] > x["current"]]
        assert ups and all(x["winner"] for x in ups), ups
        assert max(x["desired"] for x in ups) >= 2


def test_a_batching_groups_warm_standby_joins_once_in_flight_passes_its_capacity(
    tmp_path: Path,
) -> None:
    """The fast tier of a batching group: the controller publishes the capacity at the SLO
    per instance (as a concurrency: 100-word prompts, about 9 request/s x 0.25 s = 2.3 in
    flight) in the routing snapshot, and the gateway puts the warm standby in rotation once
    the requests in flight pass it, though its 8 slots would hold them all (no request
    waits at the gateway: the queue trigger alone never fires here). 2 request/s first,
    which one instance serves within the SLO, until the level is published; then 4 at
    once."""
    spec = SPEC.replace("max: 4}", "max: 4, warm_standby: 1}")
    with (
        running(tmp_path, spec, "llm ready", lambda s: len(s.ready("llm")) == 2) as s,
        Api(s) as api,
    ):
        api.post(
            "/v1/groups/llm/capacity",
            {"kind": "loadtest", "mode": "live", "verdict": "fitted",
             "report": {"group": "llm", "fit": {"params": FIT}}},
        )  # fmt: skip

        def metric(name: str) -> float:
            text = httpx.get(
                s.control_url + "/metrics", headers=s.control_headers(), timeout=10,
                trust_env=False,
            ).text  # fmt: skip
            return metric_values(text)(name, group="llm")

        with Load(s, rate=2.0, words=100) as load:

            def level() -> float | None:
                return api.get("/v1/dataplane")["groups"]["llm"]["standby_at"]  # type: ignore[no-any-return]

            wait_until("the capacity published as the standby level", level, 50, 1.0)
            assert 1.0 < (level() or 0) < 8, level()
            with ThreadPoolExecutor(6) as burst:  # past the level on however many serve
                for _ in range(6):
                    burst.submit(load._one)
            assert metric("sluice_gateway_standby_promotions_total") >= 1
        assert load.codes and all(c == 200 for c in load.codes), load.codes
        decisions = s.cli("explain", "llm", "--limit", "50")["decisions"]
        assert any("promoted the warm standby" in d["reason"] for d in decisions), [
            d["reason"] for d in decisions[:5]
        ]
        # nothing waited at the gateway: the level took the standby in, not a queue
        assert metric("sluice_gateway_queue_wait_seconds_count") == 0
