"""docs/grafana/sluice.json against what Sluice exports: a renamed metric or label breaks the
dashboard, so it breaks this test. The names come from a real exposition of the gateway's
collector and the control plane's gauges, not from a list kept by hand."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from sluice.control.accelerators import accelerator_metrics
from sluice.control.advisory import scaling_metrics
from sluice.control.fleet_metrics import FleetView, fleet_metrics
from sluice.gateway.groups import GroupRuntime
from sluice.gateway.metrics import DURATION_BUCKETS_S, GatewayMetrics
from sluice.policy.accelerators import DeviceReading, InstanceDevices, attribute
from sluice.policy.alerts import prometheus_rules
from sluice.policy.quota.metering import Meter
from sluice.policy.routing import Endpoint, GroupTraffic
from sluice.spec import PlatformSpec, load_spec_text

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana" / "sluice.json"
PROMQL_WORDS = {
    # functions and aggregations the dashboard may use; anything else must be a metric
    *("sum", "avg", "max", "min", "count", "topk", "bottomk", "rate", "irate", "increase"),
    *("histogram_quantile", "clamp_min", "clamp_max", "abs", "vector", "time", "avg_over_time"),
    *("by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless"),
    "bool",
}


def quickstart() -> PlatformSpec:
    """The quickstart's spec under a budget (so its gauges have samples)."""
    text = (ROOT / "examples" / "quickstart.yaml").read_text()
    return load_spec_text(text + "\nbudget: {max_accelerators: 8}\n").spec


def exported() -> dict[str, set[str]]:
    """Every sample name on the control API's /metrics (gateway and fleet parts) -> the
    label names it carries."""
    runtimes: dict[str, GroupRuntime] = {}
    gateway = GatewayMetrics(lambda: runtimes, lambda: 1)
    rt = runtimes["chat"] = GroupRuntime("chat", gateway.group("chat"))
    rt.configure(GroupTraffic(), (Endpoint("i1", "127.0.0.1", 1, 4),), time.monotonic())
    gateway.request_done("chat", "r", 200, 0.01, 0.01, "i1", 200)
    spec = quickstart()
    rollouts = {"r1": (spec.groups[0].name, "running", 10.0)}
    fleet = fleet_metrics(FleetView(spec, (), {}, None, Meter(), rollouts))
    scaling = scaling_metrics(spec, lambda g: 1, {}, lambda g: None)
    gib = 2**30
    device = DeviceReading("0", "GPU-0", gib, 16 * gib, 50.0, {1: gib})
    accel = accelerator_metrics(
        attribute([device], [InstanceDevices("i1", "chat", ("0",), frozenset({1}), gib)])
    )
    names: dict[str, set[str]] = {}
    for text in (gateway.render(), fleet, scaling, accel):
        for family in text_string_to_metric_families(text.decode()):
            for s in family.samples:
                names.setdefault(s.name, set()).update(s.labels)
    return names


def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in items:
        yield p
        yield from panels(p.get("panels", []))


def test_the_dashboard_is_a_grafana_dashboard_with_its_variables() -> None:
    d = json.loads(DASHBOARD.read_text())
    assert d["schemaVersion"] >= 36 and d["title"] and d["uid"]
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    group = variables["group"]
    assert group["type"] == "query" and group["datasource"]["uid"] == "${datasource}"
    assert group["definition"] == "label_values(sluice_group_instances, group)"
    ids = [p["id"] for p in panels(d["panels"])]
    assert len(ids) == len(set(ids))
    for p in panels(d["panels"]):
        assert (
            set(p["gridPos"]) == {"h", "w", "x", "y"}
            and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        )
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}" and p["targets"], p["title"]


def metrics_of(expr: str, names: dict[str, set[str]], where: str) -> set[str]:
    """The metrics `expr` names, each checked to be exported with the labels it matches
    and groups by."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # no string contents
    seen = set()
    for name, body in re.findall(r"([A-Za-z_:][\w:]*)\s*\{([^}]*)\}", expr):
        matchers = set(re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)", body))
        assert name in names, f"{where}: {name} is not exported"
        assert matchers <= names[name], f"{where}: {name} has no {matchers - names[name]}"
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", expr)
    grouped = re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", bare)
    bare = re.sub(r"\b(?:by|without)\s*\([^)]*\)", "", bare)
    for word in re.findall(r"(?<![\w$.])[A-Za-z_:][\w:]*", bare):
        if word not in PROMQL_WORDS:
            assert word in names, f"{where}: {word} is not exported"
            seen.add(word)
    assert seen, f"{where}: no metric in {expr}"
    labels = set().union(*(names[n] for n in seen))
    for group_by in grouped:
        wanted = {lb.strip() for lb in group_by.split(",") if lb.strip()}
        assert wanted <= labels, f"{where}: no {wanted - labels} on {seen}"
    return seen


def test_every_query_names_only_what_sluice_exports() -> None:
    names = exported()
    d = json.loads(DASHBOARD.read_text())
    used: set[str] = set()
    for p in panels(d["panels"]):
        for target in p.get("targets", []):
            used |= metrics_of(target["expr"], names, p["title"])
    # what the issue asks the dashboard to show, from both halves of /metrics
    assert {
        "sluice_gateway_requests_total",
        "sluice_gateway_request_duration_seconds_bucket",
        "sluice_gateway_queue_length",
        "sluice_gateway_instance_requests_total",
        "sluice_gateway_instance_request_duration_seconds_bucket",
        "sluice_group_instances",
        "sluice_group_quota_units",
        "sluice_group_spend_per_hour",
        "sluice_rollout_canary_percent",
        "sluice_instance_accelerator_memory_bytes",
        "sluice_group_accelerator_utilization_percent",
    } <= used


def test_the_alerts_as_prometheus_rules_name_only_what_sluice_exports() -> None:
    names = exported()
    spec = quickstart()
    document, _skipped = prometheus_rules(spec, DURATION_BUCKETS_S)
    rules = [r for g in document["groups"] for r in g["rules"]]
    assert len(rules) >= 6
    for r in rules:
        metrics_of(r["expr"], names, r["alert"])
