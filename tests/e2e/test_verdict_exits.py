"""Honest verdicts through the real `sluice` command (issue 38): a drill, a load test or a
compare whose verdict fails exits 8, one that could not judge exits 9 (README, beside the
error codes), and a drill hands its group back to its autoscaler when it ends.

`bench` serves a request in 0.1 s on 4 slots (40 a second); `elastic` and `capped` (0.2 s,
2 slots: 10 a second each) autoscale with a 600 s cooldown, `capped` only up to 2, so a
peak of 30 requests a second fails there at its max. `capped-now` is `capped`'s scheduled
drill, fired by hand with `sluice drills run --wait`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluice.core import EXIT_FAILED, EXIT_INCONCLUSIVE, verdict_exit
from tests.e2e.conftest import Sluice, running

pytestmark = pytest.mark.serial  # drills and load tests send timed load: run alone (Makefile)

KEY = "sk-ops-c391959605db2757"
GROUP = """
    owner: cap@example.com
    business: search
    alert_channel: "#capacity"
    models:
      m-{name}:
        runtime: sim
        sim: {{startup_s: 0.5, service_time: {{kind: fixed, seconds: 0.2}}, memory_gb: 1}}
    resources: {{pool: local, accelerators: 1, memory_gb: 1}}
    max_concurrency: 2
    slo: {{latency_ms: 1000}}
    slow_start_s: 0
    queue: {{max_length: 500, max_wait_s: 30}}
    autoscaling:
      min: 1
      max: {max}
      interval_s: 1
      targets: {{window_s: 5}}
      down: {{cooldown_s: 600, stabilization_s: 600}}
"""
SPEC = f"""
gateway: {{host: 127.0.0.1, port: 0}}
pools:
  - {{name: local, count: 16, memory_gb: 16}}
groups:
  - name: bench
    owner: cap@example.com
    business: search
    alert_channel: "#capacity"
    models:
      m-bench:
        runtime: sim
        version: v1
        sim: {{startup_s: 0.2, service_time: {{kind: fixed, seconds: 0.1}}, memory_gb: 1}}
    resources: {{pool: local, accelerators: 1, memory_gb: 1}}
    max_concurrency: 4
    replicas: 1
    slow_start_s: 0
    queue: {{max_length: 2000, max_wait_s: 60}}
    autoscaling: {{min: 1, max: 2, mode: advisory}}
  - name: elastic{GROUP.format(name="elastic", max=8)}
  - name: capped{GROUP.format(name="capped", max=2)}
tenants:
  - {{name: ops, api_keys: [{KEY}], operator: true}}
drills:
  - name: capped-now
    group: capped
    cron: "0 3 1 1 *"
    api_key_env: SLUICE_DRILL_KEY
    peak: 30rps
    base_rps: 5
    shape: step
    warm_s: 3
    hold_s: 12
    cool_s: 2
"""


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sluice]:
    home = tmp_path_factory.mktemp("verdicts")
    with running(
        home,
        SPEC,
        "bench, elastic and capped ready",
        lambda s: all(len(s.ready(g)) == 1 for g in ("bench", "elastic", "capped")),
        environ={"SLUICE_DRILL_KEY": KEY},
    ) as s:
        yield s


def sluice(platform: Sluice, *args: str, as_json: bool = True) -> tuple[int, str]:
    """`sluice ARGS` as the operator tenant's client: (exit code, stdout)."""
    r = subprocess.run(
        [sys.executable, "-m", "sluice", *args, *(["--json"] if as_json else [])],
        capture_output=True,
        text=True,
        env={**platform.env(), "SLUICE_API_KEY": KEY, "COLUMNS": "200"},
        timeout=300,
    )
    assert r.stdout, r.stderr
    return r.returncode, r.stdout


def doc(platform: Sluice, *args: str) -> tuple[int, Any]:
    code, text = sluice(platform, *args)
    return code, json.loads(text)


def desired(platform: Sluice, group: str) -> int:
    return int(next(g for g in platform.cli("get", "groups") if g["name"] == group)["desired"])


def alive(platform: Sluice, group: str) -> int:
    states = ("pending", "starting", "warming", "ready")
    return sum(1 for i in platform.instances(group) if i["state"] in states)


def test_a_drill_hands_its_group_back_and_a_failing_one_exits_8(platform: Sluice) -> None:
    """A live drill of `elastic` scales it up, then hands it back: the autoscaler starts
    again from the one instance it found, and the extra ones drain (without, the 600 s
    cooldown would hold them). Meanwhile `capped`'s scheduled drill fails at its max:
    `sluice drills run --wait` and the `sluice drill` process it ran both exit 8."""
    before = {g: desired(platform, g) for g in ("elastic", "capped")}
    assert before == {"elastic": 1, "capped": 1}
    results: dict[str, tuple[int, Any]] = {}
    shape = ["--base", "5", "--peak", "4x", "--shape", "step"]
    shape += ["--warm", "3s", "--hold", "15s", "--cool", "3s"]

    def live() -> None:
        results["elastic"] = doc(platform, "drill", "elastic", *shape)

    def scheduled() -> None:
        results["capped"] = doc(platform, "drills", "run", "capped-now", "--wait")

    threads = [threading.Thread(target=f) for f in (live, scheduled)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    code, report = results["elastic"]
    verdict = report["judgement"]["verdict"]
    assert code == verdict_exit(verdict), (code, report["judgement"])
    scaled = [e for e in report["scale_events"] if e["after"] > e["before"]]
    assert scaled, report["judgement"]  # the peak scaled it up...
    handed = report["handed_back"]
    assert handed["done"] and handed["to"] == 1 and handed["from"] > 1, handed
    assert handed["pin"] is None
    assert desired(platform, "elastic") == 1  # ...and the drill gave the extra back
    platform.wait_for("elastic back at one instance", lambda: alive(platform, "elastic") == 1)
    events = platform.cli("events", "elastic", "--limit", "200")
    assert any(e["kind"] == "hand-back" for e in events), [e["kind"] for e in events]
    audit = platform.cli("audit", "--limit", "200")
    assert any(a["action"] == "hand-back" and a["target"] == "group/elastic" for a in audit)
    assert report["stored"]["id"]  # the report, with its hand-back, is kept

    code, fire = results["capped"]
    assert fire["status"] in ("failed", "inconclusive"), fire
    # the drill's own process exited by its verdict, and so did `drills run --wait`
    expected = EXIT_FAILED if fire["status"] == "failed" else EXIT_INCONCLUSIVE
    assert code == expected and fire["detail"]["exit_code"] == expected, (code, fire)
    if fire["status"] == "failed":
        assert any("max" in why for why in fire["detail"]["reasons"]), fire["detail"]
    assert desired(platform, "capped") == 1  # handed back too


def test_a_drill_that_fails_on_the_simulator_exits_8_as_a_person_sees_it(
    platform: Sluice,
) -> None:
    code, text = sluice(
        platform,
        *("drill", "capped", "--simulate", "--base", "5", "--peak", "30rps"),
        *("--warm", "5s", "--hold", "30s", "--instances", "1"),
        as_json=False,
    )
    assert code == EXIT_FAILED, text
    assert "verdict fail" in text, text


def test_a_load_test_under_an_slo_no_rate_holds_exits_8(platform: Sluice) -> None:
    """1 ms is below the 100 ms each request takes: no rate holds. The generator's own
    check is loosened (`--max-lag-ms 1000`) so that a busy machine cannot make it
    inconclusive instead."""
    code, report = doc(
        platform,
        *("loadtest", "bench", "--slo-ms", "1", "--step", "1s", "--max-steps", "2"),
        *("--start-rps", "4", "--max-lag-ms", "1000"),
    )
    assert code == EXIT_FAILED, report
    assert report["knee"] is None and report["inconclusive"] is None
    assert "no rate held" in report["no_knee"], report["no_knee"]


def test_a_load_test_whose_generator_fell_behind_is_inconclusive_and_proposes_nothing(
    platform: Sluice,
) -> None:
    """`--max-lag-ms 0` calls every send later than its schedule behind (each one is, by
    microseconds): the deterministic stand-in for a generator on a machine too busy to
    keep its schedule. The run files no proposal, even with --propose, prints why, and
    exits 9; the stored run is inconclusive, with no knee for a later one to compare to."""
    proposals = len(platform.cli("proposals", "--all"))
    code, text = sluice(
        platform,
        *("loadtest", "bench", "--slo-ms", "800", "--step", "1s", "--max-steps", "2"),
        *("--start-rps", "4", "--max-lag-ms", "0", "--propose"),
        as_json=False,
    )
    assert code == EXIT_INCONCLUSIVE, text
    assert "inconclusive: the load generator fell behind its schedule" in text, text
    assert "proposal" not in text and "recommended" not in text, text
    assert len(platform.cli("proposals", "--all")) == proposals
    stored = platform.cli("capacity", "bench", "--kind", "loadtest", "--limit", "1")[0]
    assert stored["verdict"] == "inconclusive"
    report = stored["report"]
    assert report["knee"] is None and report["recommendation"] is None
    assert all(s["verdict"]["criterion"] == "generator" for s in report["steps"]), report
    assert "lag" in report["steps"][0]["verdict"]["why"] or report["steps"][0]["behind"]


def test_a_compare_whose_threshold_is_not_met_exits_8(platform: Sluice, tmp_path: Path) -> None:
    suite = tmp_path / "suite.jsonl"
    asks = [{"model": "m-bench", "messages": [{"role": "user", "content": f"q {k}"}]}
            for k in range(3)]  # fmt: skip
    suite.write_text("".join(json.dumps(x) + "\n" for x in asks))
    # the group against itself: the gate is what is tested, not the difference (`bench`,
    # whose autoscaler only advises: a burst at `elastic` would leave it scaled up for its
    # 600 s cooldown, and the hand-back test, in any order, expects it at one instance)
    targets = ["--suite", str(suite), "--a", "group:bench", "--b", "group:bench"]
    code, report = doc(platform, "compare", *targets, "--max-error-rate", "0.5")
    assert code == 0 and report["gate"]["verdict"] == "pass", report
    # a chat suite has no embedding to measure: the gate fails rather than pass on nothing
    code, text = sluice(platform, "compare", *targets, "--min-cosine", "0.9", as_json=False)
    assert code == EXIT_FAILED, text
    assert "verdict: fail" in text and "no embedding item was compared" in text, text
