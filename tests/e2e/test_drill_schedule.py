"""Scheduled drills (O5) through the real `sluice up`: the spec's `drills:` fire on their
cron as `sluice drill` processes with a token of their own (deleted when the drill ends),
and every firing is recorded.

`nightly` autoscales `sim` instances (0.2 s on 2 slots: 10 requests a second each). The
`every-minute` drill fires at each minute's start with the key in a file; `no-key` names an
environment variable that is not set, so firing it is recorded as an error."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.conftest import Sluice, running

pytestmark = pytest.mark.serial  # it measures time or rates: run alone (Makefile)

KEY = "sk-drill-ops-543f5d805c12a500"
SPEC = """
gateway: {{host: 127.0.0.1, port: 0}}
pools:
  - {{name: local, count: 8, memory_gb: 8}}
groups:
  - name: nightly
    owner: cap@example.com
    business: search
    alert_channel: "#capacity"
    models:
      m-nightly:
        runtime: sim
        sim: {{startup_s: 0.5, service_time: {{kind: fixed, seconds: 0.2}}, memory_gb: 1}}
    resources: {{pool: local, accelerators: 1, memory_gb: 1}}
    max_concurrency: 2
    slo: {{latency_ms: 1000}}
    slow_start_s: 0
    autoscaling: {{min: 1, max: 4, interval_s: 1}}
tenants:
  - {{name: ops, api_keys: [{key}], operator: true}}
drills:
  - name: every-minute
    group: nightly
    cron: "* * * * *"
    api_key_file: {key_file}
    peak: 3x
    base_rps: 3
    shape: step
    warm_s: 2
    hold_s: 6
    cool_s: 2
  - name: no-key
    group: nightly
    cron: "0 3 1 1 *"
    api_key_env: SLUICE_TEST_DRILL_KEY_NOT_SET
"""


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sluice]:
    home = tmp_path_factory.mktemp("drills")
    key_file = home / "drill.key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    spec = SPEC.format(key=KEY, key_file=key_file)
    with running(home, spec, "nightly ready", lambda s: len(s.ready("nightly")) == 1) as s:
        yield s


def fires(platform: Sluice, schedule: str) -> list[dict[str, Any]]:
    return list(platform.cli("drills", "fires", schedule, "--limit", "50"))


def ran(platform: Sluice, schedule: str, trigger: str, timeout: float) -> dict[str, Any]:
    """The newest firing by `trigger` that ran to its end (not one skipped or missed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = [
            f
            for f in fires(platform, schedule)
            if f["trigger"] == trigger and f["status"] not in ("running", "skipped", "missed")
        ]
        if done:
            return done[0]
        time.sleep(1.0)
    raise AssertionError(f"no {trigger} firing of {schedule} ended: {fires(platform, schedule)}")


def run_now(platform: Sluice, schedule: str) -> tuple[int, dict[str, Any]]:
    """Fire `schedule` once no drill runs (a cron firing may be running: wait it out): the
    exit code of `sluice drills run` (0 started, 1 recorded as not run) and the firing."""
    for _ in range(5):
        platform.wait_for(
            "no drill running",
            lambda: all(d["running_fire"] is None for d in platform.cli("drills")),
            timeout=90,
        )
        code, doc = platform.as_user("ops-admin", "drills", "run", schedule)
        if "error" not in doc:  # a firing: started, or recorded as one that could not run
            return code, dict(doc)
        assert "still runs" in doc["error"]["message"], doc  # a cron firing won the race
    raise AssertionError(f"{schedule} never started")


def judged(fire: dict[str, Any]) -> bool:
    """The drill ran and was judged: passed or failed, or inconclusive because its load
    generator fell behind (a busy machine: the drill says so rather than pass silently)."""
    if fire["status"] in ("passed", "failed"):
        return True
    reasons = (fire.get("detail") or {}).get("reasons", [])
    return fire["status"] == "inconclusive" and "fell behind" in " ".join(reasons)


def test_a_drill_fires_on_its_cron_with_its_own_short_lived_token(platform: Sluice) -> None:
    # the first minute boundary after start, plus the drill (10 s of load) and its reading
    fire = ran(platform, "every-minute", "cron", timeout=150)
    assert judged(fire), fire
    assert fire["actor"] == "schedule/every-minute"
    assert fire["due_at"] % 60 == 0 and fire["started_at"] - fire["due_at"] < 10
    token = fire["token"]
    assert token.startswith("drill.every-minute.")

    # the report is stored like any drill's, by the token the schedule minted
    [run] = [
        r
        for r in platform.cli("capacity", "nightly", "--kind", "drill")
        if r["id"] == fire["run_id"]
    ]
    assert run["actor"] == token and run["mode"] == "live"
    assert run["verdict"] == fire["detail"]["verdict"]
    # the drill handed its group back, and the firing says so
    assert fire["detail"]["handed_back"]["done"], fire["detail"]
    assert "handed back" in platform.show("drills", "fires", "every-minute")

    # the token was scoped to the group, and is deleted now the drill is over: a drill on a
    # minute's cron leaves no token behind in `sluice token list`
    assert token not in {t["name"] for t in platform.cli("token", "list")}
    audit = platform.cli("audit", "--since", "10m", "--limit", "500")
    actions = {(a["action"], a["actor"]) for a in audit}
    assert ("drill-start", "schedule/every-minute") in actions
    assert ("token-create", "schedule/every-minute") in actions
    assert ("token-delete", "schedule/every-minute") in actions
    [created] = [
        a for a in audit if a["action"] == "token-create" and a["target"] == f"token/{token}"
    ]
    assert created["detail"]["groups"] == ["nightly"] and created["detail"]["role"] == "operator"
    assert created["detail"]["expires_at"] is not None

    listed = {d["name"]: d for d in platform.cli("drills")}
    assert listed["every-minute"]["next_at"] > time.time() - 60
    assert listed["every-minute"]["last"] is not None
    assert "every-minute" in platform.show("drills")


def test_run_now_starts_one_drill_per_group_and_records_what_could_not_run(
    platform: Sluice,
) -> None:
    code, started = run_now(platform, "every-minute")
    assert code == 0 and started["status"] == "running" and started["trigger"] == "manual"
    # a second drill on the group while one runs: refused and recorded as skipped
    code, doc = platform.as_user("ops-admin", "drills", "run", "every-minute")
    assert code != 0 and "still runs on group 'nightly'" in doc["error"]["message"], doc
    assert any(f["status"] == "skipped" for f in fires(platform, "every-minute"))

    # a missing key is an error that names where it looked, never a key
    code, failed = run_now(platform, "no-key")
    assert code == 1 and failed["status"] == "error"  # a firing that could not run exits 1
    assert "$SLUICE_TEST_DRILL_KEY_NOT_SET" in failed["detail"]["error"]
    assert failed["token"] is None  # no token was minted for a drill that could not run

    code, doc = platform.as_user("ops-admin", "drills", "run", "nope")
    assert code != 0 and "no scheduled drill named 'nope'" in doc["error"]["message"]
    platform.token("watcher", role="viewer")
    code, doc = platform.as_user("watcher", "drills", "run", "every-minute")
    assert code != 0 and "operator" in doc["error"]["message"], doc

    fire = ran(platform, "every-minute", "manual", timeout=90)
    assert fire["id"] == started["id"] and judged(fire), fire
    assert fire["actor"] == "ops-admin"
