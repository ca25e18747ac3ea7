"""Alert rules and states (O2): pending before firing, resolution, no data never fires,
defaults and overrides, states that survive a restart, and the Prometheus rules file."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import yaml

from sluice.policy.alerts import (
    DEFAULT_RULES,
    channel_kind,
    evaluate,
    prometheus_rules,
    rules_for,
    states_from_json,
    states_to_json,
)
from sluice.spec import PlatformSpec, load_spec_text
from sluice.spec.observability import AlertRule, AlertsSpec

SPEC = """
pools:
  - {name: p, accelerator: virtual, count: 8, memory_gb: 80, price_per_hour: 1.0}
groups:
  - name: chat
    owner: chat-team@example.com
    business: assistant
    alert_channel: https://hooks.example.com/hooks/T0K3N
    models: {m: {runtime: sim}}
    resources: {pool: p, accelerators: 1, memory_gb: 10}
    slo: {latency_ms: 500, target: 0.99}
  - name: search
    owner: search-team
    business: search
    alert_channel: "#search-oncall"
    models: {s: {runtime: sim}}
    resources: {pool: p, accelerators: 1, memory_gb: 10}
observability:
  alerts:
    rules:
      - {name: error-rate, group: search, series: error_rate, threshold: 0.2, for_s: 10}
      - {name: slow, series: p95_ms, threshold: 800, for_s: 0, severity: info}
"""

BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def spec(text: str = SPEC) -> PlatformSpec:
    return load_spec_text(text, "alerts.yaml").spec


QUEUE = AlertRule(name="q", series="queue_wait_p95_ms", threshold=1000, for_s=120)


def test_pending_until_for_s_then_firing_once_then_resolved() -> None:
    rules = {"chat": [QUEUE]}
    hot = {"chat": {"queue_wait_p95_ms": 1500.0}}
    states, out = evaluate(rules, {}, hot, now=100.0)
    assert out == [] and states["chat", "q"].phase == "pending"
    states, out = evaluate(rules, states, hot, now=219.0)
    assert out == [] and states["chat", "q"].phase == "pending"
    states, out = evaluate(rules, states, hot, now=220.0)
    [fired] = out
    assert (fired.state, fired.group, fired.rule, fired.value) == ("firing", "chat", "q", 1500.0)
    assert (fired.since, fired.at, fired.threshold, fired.op) == (100.0, 220.0, 1000.0, ">")
    states, out = evaluate(rules, states, hot, now=230.0)
    assert out == [] and states["chat", "q"].phase == "firing"  # not fired twice
    states, out = evaluate(rules, states, {"chat": {"queue_wait_p95_ms": 20.0}}, now=240.0)
    [resolved] = out
    assert resolved.state == "resolved" and resolved.value == 20.0 and states == {}


def test_a_pending_alert_whose_condition_fails_goes_back_without_a_word() -> None:
    rules = {"chat": [QUEUE]}
    states, _ = evaluate(rules, {}, {"chat": {"queue_wait_p95_ms": 1500.0}}, now=0.0)
    states, out = evaluate(rules, states, {"chat": {"queue_wait_p95_ms": 10.0}}, now=60.0)
    assert out == [] and states == {}
    states, _ = evaluate(rules, states, {"chat": {"queue_wait_p95_ms": 1500.0}}, now=61.0)
    states, out = evaluate(rules, states, {"chat": {"queue_wait_p95_ms": 1500.0}}, now=150.0)
    assert out == [] and states["chat", "q"].since == 61.0  # the clock began again


def test_no_data_never_fires_and_resolves_a_firing_alert() -> None:
    below = AlertRule(name="low", series="slo_attainment", op="<", threshold=0.9, for_s=0)
    rules = {"chat": [below, QUEUE]}
    for t in range(0, 1000, 100):
        states, out = evaluate(rules, {}, {"chat": {"slo_attainment": None}}, now=float(t))
        assert out == [] and states == {}
    states, [fired] = evaluate(rules, {}, {"chat": {"slo_attainment": 0.5}}, now=0.0)
    assert fired.state == "firing"  # for_s 0: at once
    states, [resolved] = evaluate(rules, states, {"chat": {}}, now=1.0)
    assert resolved.state == "resolved" and resolved.value is None and "no data" in resolved.reason


def test_a_group_not_read_this_time_holds_its_states() -> None:
    rules = {"chat": [QUEUE]}
    states, _ = evaluate(rules, {}, {"chat": {"queue_wait_p95_ms": 1500.0}}, now=0.0)
    states, [_] = evaluate(rules, states, {"chat": {"queue_wait_p95_ms": 1500.0}}, now=120.0)
    held, out = evaluate(rules, states, {}, now=500.0)
    assert out == [] and held == states


def test_defaults_apply_to_every_group_and_a_rule_with_their_name_replaces_them() -> None:
    s = spec()
    by_group = rules_for(s.observability.alerts, ["chat", "search"])
    names = [r.name for r in DEFAULT_RULES]
    assert names == [
        "slo-burn",
        "queue-wait",
        "error-rate",
        "no-ready-instance",
        "quota-refused",
        "budget-near-cap",
        "memory-over-estimate",
    ]
    assert [r.name for r in by_group["chat"]] == [*names, "slow"]
    chat = {r.name: r for r in by_group["chat"]}
    search = {r.name: r for r in by_group["search"]}
    assert chat["error-rate"].threshold == 0.05 and chat["error-rate"].severity == "page"
    assert search["error-rate"].threshold == 0.2 and search["error-rate"].for_s == 10
    wider = AlertsSpec(
        rules=[
            AlertRule(name="error-rate", series="error_rate", threshold=0.1),
            AlertRule(name="error-rate", group="chat", series="error_rate", threshold=0.3),
        ]
    )
    by_group = rules_for(wider, ["chat", "search"])
    assert {r.name: r.threshold for r in by_group["search"]}["error-rate"] == 0.1
    assert {r.name: r.threshold for r in by_group["chat"]}["error-rate"] == 0.3
    assert rules_for(AlertsSpec(defaults=False), ["chat"]) == {"chat": []}


def test_states_round_trip_through_json_and_a_restored_alert_does_not_fire_again() -> None:
    rules = {"chat": [QUEUE]}
    hot = {"chat": {"queue_wait_p95_ms": 1500.0}}
    states, _ = evaluate(rules, {}, hot, now=0.0)
    states, [_] = evaluate(rules, states, hot, now=120.0)
    doc = json.loads(json.dumps(states_to_json(states)))
    restored = states_from_json(doc)
    assert restored == states
    again, out = evaluate(rules, restored, hot, now=130.0)
    assert out == [] and again["chat", "q"].phase == "firing"
    broken = {"alerts": [{"group": "chat"}, {**doc["alerts"][0], "phase": "odd"}]}
    assert states_from_json(broken) == {} and states_from_json(None) == {}


def test_a_removed_group_or_rule_resolves_its_firing_alerts() -> None:
    rules = {"chat": [QUEUE], "search": [QUEUE]}
    hot = {"chat": {"queue_wait_p95_ms": 1500.0}, "search": {"queue_wait_p95_ms": 1500.0}}
    states, _ = evaluate(rules, {}, hot, now=0.0)
    states, out = evaluate(rules, states, hot, now=200.0)
    assert len(out) == 2
    states, out = evaluate({"chat": []}, states, hot, now=201.0)
    assert sorted((t.group, t.state) for t in out) == [("chat", "resolved"), ("search", "resolved")]
    reasons = {t.group: t.reason for t in out}
    assert "no longer in the spec" in reasons["search"]
    assert "no longer applies" in reasons["chat"]
    assert states == {}


def test_a_changed_threshold_takes_effect_on_a_firing_alert() -> None:
    hot = {"chat": {"queue_wait_p95_ms": 1500.0}}
    states, _ = evaluate({"chat": [QUEUE]}, {}, hot, now=0.0)
    states, [_] = evaluate({"chat": [QUEUE]}, states, hot, now=120.0)
    raised = QUEUE.model_copy(update={"threshold": 2000.0})
    states, [t] = evaluate({"chat": [raised]}, states, hot, now=121.0)
    assert t.state == "resolved" and t.threshold == 2000.0


def test_channel_kinds_never_echo_the_address() -> None:
    assert channel_kind("https://hooks.example.com/T0K3N") == "webhook"
    assert channel_kind("HTTP://x") == "webhook"
    assert channel_kind("#search-oncall") == "chat"
    assert channel_kind("oncall@example.com") == "email"
    assert channel_kind("pagerduty") == "other"


def test_prometheus_rules_cover_the_faithful_series_and_name_the_rest() -> None:
    s = spec()
    document, skipped = prometheus_rules(s, BOUNDS)
    [group] = document["groups"]
    assert group["name"] == "sluice"
    by_key = {(r["labels"]["group"], r["labels"]["rule"]): r for r in group["rules"]}
    err = by_key["chat", "error-rate"]
    assert err["alert"] == "sluice_error_rate" and err["for"] == "120s"
    assert err["labels"] == {
        "severity": "page",
        "group": "chat",
        "owner": "chat-team@example.com",
        "rule": "error-rate",
    }
    assert 'status=~"5..|429"' in err["expr"] and "[60s]" in err["expr"]
    assert err["expr"].endswith(" > 0.05")
    assert "chat-team@example.com" in err["annotations"]["summary"]
    assert "T0K3N" not in json.dumps(document)  # the webhook URL stays out
    burn = by_key["chat", "slo-burn"]["expr"]
    assert 'le="0.5"' in burn and "/ 0.01" in burn  # 500 ms is a bucket bound
    assert by_key["search", "error-rate"]["expr"].endswith(" > 0.2")
    assert by_key["chat", "slow"]["for"] == "0s"
    gone = {(x["group"], x["rule"]) for x in skipped}
    assert "sluice_group_quota_refused" in by_key["chat", "quota-refused"]["expr"]
    assert "sluice_group_budget_used" in by_key["chat", "budget-near-cap"]["expr"]
    assert ("search", "slo-burn") in gone  # no SLO: no series
    assert all(x["why"] for x in skipped)
    _, without_bounds = prometheus_rules(s)
    assert ("chat", "slo-burn") in {(x["group"], x["rule"]) for x in without_bounds}


def test_promtool_accepts_the_rules(tmp_path: Path) -> None:
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    document, _ = prometheus_rules(spec(), BOUNDS)
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    assert yaml.safe_load(path.read_text()) == document
    if not Path(promtool).exists():
        return  # promtool is not installed here: the structure checks above stand
    done = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
