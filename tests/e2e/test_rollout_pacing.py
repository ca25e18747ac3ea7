"""End to end: per-tenant canary pacing (C4) through `sluice up` with real `sim` instances.

Three tenants call the same model while `chat` is rolled out to `chat-v2` in steps of 20, 50
and 100 percent: `early-co` is paced early (4x the step), `late-co` late (nothing before
50 %), `plain-co` is unlisted (the step itself). The rollout is paused on each of the first
two steps, so the split holds still while each tenant's share of the canary is measured from
the `x-sluice-group` header of its own answers; between the pauses a bounded, mixed load
gives the analysis the samples it needs to move on. Once promoted, everyone is on the
canary. The access log must agree: the late tenant reached the canary only after the
rollout reached 50 %.

Shares are binomial: 300 requests at a true share of 20 %, 50 % or 80 % stay within +-0.12
of it except with probability below 1e-6 (at least 5 standard deviations); shares of 0 %
and 100 % are exact.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Sluice, running

EARLY, PLAIN, LATE = (
    "sk-early-0b5eeaca04d4b900",
    "sk-plain-433e1caaaa5f94cf",
    "sk-late-c2f51d30c8f85f98",
)
KEYS = (EARLY, PLAIN, LATE)
N = 300  # requests per tenant per measured step
TOL = 0.12  # >= 5 binomial standard deviations at N for any true share
MIN_SAMPLES = 40
HOLD_S = 3

SIM = "{startup_s: 0.2, service_time: {kind: fixed, seconds: 0.01}, seed: 5, memory_gb: 1}"
GROUP = """
  - name: {name}
    owner: ops@example.com
    business: search
    alert_channel: "#ops"
    models:
      m-chat: {{runtime: sim, sim: {sim}}}
    resources: {{pool: local, memory_gb: 1}}
    max_concurrency: 32
    slow_start_s: 0
"""
# Timing and resource gates are off: this test is about who reaches the canary when, and a
# busy 2-core machine may slow one worker process more than the other. What is left (errors,
# output length, ...) must pass for the rollout to step on.
SPEC = (
    """
gateway: {host: 127.0.0.1, port: 0}
pools:
  - {name: local, count: 4, memory_gb: 16}
groups:
"""
    + GROUP.format(name="chat", sim=SIM)
    + GROUP.format(name="chat-v2", sim=SIM)
    + f"""
tenants:
  - {{name: early-co, api_keys: [{EARLY}]}}
  - {{name: plain-co, api_keys: [{PLAIN}]}}
  - {{name: late-co, api_keys: [{LATE}]}}
routes:
  - {{tag: chat-main, match: {{models: [m-chat]}}, to: chat}}
rollouts:
  - name: chat-v2
    baseline: chat
    canary: chat-v2
    steps: [20, 50, 100]
    hold_s: {HOLD_S}
    pacing:
      early: [early-co]
      early_factor: 4
      late: [late-co]
      late_from_percent: 50
    analysis:
      min_samples: {MIN_SAMPLES}
      disable: [latency_p50, latency_p95, ttft_p95, tpot_p50, cpu_per_request, memory]
"""
)


@pytest.fixture
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sluice]:
    home = tmp_path_factory.mktemp("pacing")
    with running(
        home,
        SPEC,
        "both groups ready",
        lambda s: (
            {i["group"] for i in s.instances() if i["state"] == "ready"} >= {"chat", "chat-v2"}
        ),
        timeout=90,
    ) as s:
        yield s


class Caller:
    """Bounded, concurrent requests from the three tenants; every answer must be a 200."""

    def __init__(self, endpoint: str) -> None:
        self.client = httpx.Client(
            base_url=endpoint,
            trust_env=False,
            timeout=30,
            limits=httpx.Limits(max_connections=8, max_keepalive_connections=8),
        )
        self.pool = ThreadPoolExecutor(max_workers=8)
        self.sent = 0

    def close(self) -> None:
        self.pool.shutdown()
        self.client.close()

    def _one(self, key: str) -> tuple[str, int, str]:
        r = self.client.post(
            "/v1/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            json={
                "model": "m-chat",
                "max_tokens": 1,
                "messages": [{"role": "user", "content": "x"}],
            },
        )
        return key, r.status_code, r.headers.get("x-sluice-group", "")

    def send(self, keys: list[str]) -> list[tuple[str, str]]:
        """(key, group) for each key, in parallel; raises on any non-200."""
        self.sent += len(keys)
        assert self.sent < 20_000, "load is bounded"
        answers = list(self.pool.map(self._one, keys))
        bad = [a for a in answers if a[1] != 200]
        assert not bad, bad[:5]
        return [(k, g) for k, _, g in answers]

    def shares(self, n: int) -> dict[str, float]:
        """Each tenant's share of its `n` answers served by the canary group."""
        answers = self.send([k for k in KEYS for _ in range(n)])
        groups: dict[str, Counter[str]] = {k: Counter() for k in KEYS}
        for key, group in answers:
            groups[key][group] += 1
        for key, seen in groups.items():  # nothing goes anywhere but the two groups
            assert set(seen) <= {"chat", "chat-v2"}, (key, seen)
        return {k: groups[k]["chat-v2"] / n for k in KEYS}


def rollout(s: Sluice) -> dict[str, Any]:
    (r,) = [x for x in s.cli("rollout", "status") if x["name"] == "chat-v2"]
    return r


def drive_until(s: Sluice, caller: Caller, done: Any, timeout: float = 60) -> dict[str, Any]:
    """Send bursts of 45 requests (15 a tenant), checking the rollout between bursts (no load
    then), until `done(status)`. A step that just began can therefore see at most one burst
    (15 baseline samples at 50 %) before the load stops: fewer than MIN_SAMPLES, so it cannot
    pass, and stays put until it is paused."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        caller.send(list(KEYS) * 15)
        r = rollout(s)
        if done(r):
            return r
        assert r["phase"] == "stepping", s.cli("rollout", "report", "chat-v2")
    raise AssertionError(f"rollout stuck: {s.cli('rollout', 'report', 'chat-v2')}")


def test_early_tenant_reaches_the_canary_first_and_late_tenant_last(platform: Sluice) -> None:
    s = platform
    t0 = time.monotonic()
    caller = Caller(s.endpoint)
    try:
        before = caller.shares(20)
        assert before == {EARLY: 0.0, PLAIN: 0.0, LATE: 0.0}, before  # no rollout: baseline

        # the plan a person reads: the promise, the answers each step needs, the time
        shown = s.show("rollout", "plan", "chat-v2")
        assert "false rollbacks <= 1.00% per rollout" in shown and "LOOKS AT" in shown, shown
        # step 1 (20 %): no load yet, so the step cannot pass before it is paused
        started = s.cli("rollout", "start", "chat-v2", "--reason", "ship v2 early first")
        assert started["phase"] == "stepping" and started["percent"] == 20, started
        held = s.cli("rollout", "pause", "chat-v2", "--reason", "measure step 1")
        assert held["phase"] == "paused" and held["percent"] == 20, held
        step1 = caller.shares(N)
        assert abs(step1[EARLY] - 0.80) <= TOL, step1  # min(100, 20 x 4)
        assert abs(step1[PLAIN] - 0.20) <= TOL, step1  # the step itself
        assert step1[LATE] == 0.0, step1  # not before 50 %
        assert step1[EARLY] > step1[PLAIN] + 0.3, step1

        # on to step 2 (50 %) under load, then hold it still again
        s.cli("rollout", "resume", "chat-v2", "--reason", "step 1 measured")
        drive_until(s, caller, lambda r: r["percent"] >= 50)
        held = s.cli("rollout", "pause", "chat-v2", "--reason", "measure step 2")
        assert held["phase"] == "paused" and held["percent"] == 50, held
        step2 = caller.shares(N)
        assert step2[EARLY] == 1.0, step2  # min(100, 50 x 4)
        assert abs(step2[PLAIN] - 0.50) <= TOL, step2
        assert abs(step2[LATE] - 0.50) <= TOL, step2  # late tenants join at 50 %

        # the last step passes on its own: promoted, everyone on the canary
        s.cli("rollout", "resume", "chat-v2", "--reason", "step 2 measured")
        done = drive_until(s, caller, lambda r: r["phase"] != "stepping")
        assert done["phase"] == "promoted", s.cli("rollout", "report", "chat-v2")
        after = caller.shares(50)
        assert after == {EARLY: 1.0, PLAIN: 1.0, LATE: 1.0}, after
    finally:
        caller.close()

    report = s.cli("rollout", "report", "chat-v2")
    state = report["state"]
    # each pause ends a stay on its step and the resume begins a new one
    assert [x["percent"] for x in state["steps"]] == [20, 20, 50, 50, 100], state["steps"]
    assert [x["outcome"] for x in state["steps"]] == ["paused", "passed"] * 2 + ["passed"]
    last = state["transitions"][-1]
    assert last["to"] == "promoted" and last["by"] == "controller", last
    shown = s.show("rollout", "report", "chat-v2")  # the table a person reads
    assert "promoted" in shown and "(100%): passed" in shown, shown
    at_50 = min(t["at"] for t in state["transitions"] if t["percent"] == 50)

    # the access log agrees: the late tenant never reached the canary before 50 %
    time.sleep(0.3)  # the access log is flushed every 0.1 s
    lines = [json.loads(x) for x in (s.home / "access.log").read_text().splitlines()]
    late = [x for x in lines if x["tenant"] == "late-co"]
    late_early_on = [x for x in late if x["ts"] < at_50 - 0.01]
    assert len(late_early_on) >= N, len(late_early_on)  # it was there, on the baseline
    assert {x["group"] for x in late_early_on} == {"chat"}, Counter(
        x["group"] for x in late_early_on
    )
    assert any(x["group"] == "chat-v2" for x in late)
    by_tenant = Counter(x["tenant"] for x in lines if x["route"] == "chat-main")
    assert by_tenant["early-co"] == by_tenant["plain-co"] == by_tenant["late-co"], by_tenant
    print(
        f"pacing shares step1={step1} step2={step2} after={after}; "
        f"{caller.sent} requests, {time.monotonic() - t0:.1f} s"
    )
