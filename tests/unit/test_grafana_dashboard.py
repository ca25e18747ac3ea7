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

from sluice.control.fleet_metrics import FleetView, fleet_metrics
from sluice.gateway.groups import GroupRuntime
from sluice.gateway.metrics import GatewayMetrics
from sluice.policy.quota.metering import Meter
from sluice.policy.routing import Endpoint, GroupTraffic
from sluice.spec import load_spec_text

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana" / "sluice.json"
PROMQL_WORDS = {
    # functions and aggregations the dashboard may use; anything else must be a metric
    *("sum", "avg", "max", "min", "count", "topk", "bottomk", "rate", "irate", "increase"),
    *("histogram_quantile", "clamp_min", "clamp_max", "abs", "vector", "time"),
    *("by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless"),
    "bool",
}


def exported() -> dict[str, set[str]]:
    """Every sample name on the control API's /metrics (gateway and fleet parts) -> the
    label names it carries."""
    runtimes: dict[str, GroupRuntime] = {}
    gateway = GatewayMetrics(lambda: runtimes, lambda: 1)
    rt = runtimes["chat"] = GroupRuntime("chat", gateway.group("chat"))
    rt.configure(GroupTraffic(), (Endpoint("i1", "127.0.0.1", 1, 4),), time.monotonic())
    gateway.request_done("chat", "r", 200, 0.01, 0.01, "i1", 200)
    spec = load_spec_text((ROOT / "examples" / "quickstart.yaml").read_text()).spec
    rollouts = {"r1": (spec.groups[0].name, "running", 10.0)}
    fleet = fleet_metrics(FleetView(spec, (), {}, None, Meter(), rollouts))
    names: dict[str, set[str]] = {}
    for text in (gateway.render(), fleet):
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


def test_every_query_names_only_what_sluice_exports() -> None:
    names = exported()
    d = json.loads(DASHBOARD.read_text())
    used: set[str] = set()
    for p in panels(d["panels"]):
        for target in p.get("targets", []):
            expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', target["expr"])  # no string contents
            seen = set()
            for name, body in re.findall(r"([A-Za-z_:][\w:]*)\s*\{([^}]*)\}", expr):
                matchers = set(re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)", body))
                assert name in names, f"{p['title']}: {name} is not exported"
                assert matchers <= names[name], (
                    f"{p['title']}: {name} has no {matchers - names[name]}"
                )
            bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", expr)
            grouped = re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", bare)
            bare = re.sub(r"\b(?:by|without)\s*\([^)]*\)", "", bare)
            for word in re.findall(r"(?<![\w$.])[A-Za-z_:][\w:]*", bare):
                if word not in PROMQL_WORDS:
                    assert word in names, f"{p['title']}: {word} is not exported"
                    seen.add(word)
            assert seen, f"{p['title']}: no metric in {target['expr']}"
            labels = set().union(*(names[n] for n in seen))
            for group_by in grouped:
                wanted = {lb.strip() for lb in group_by.split(",") if lb.strip()}
                assert wanted <= labels, f"{p['title']}: no {wanted - labels} on {seen}"
            used |= seen
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
    } <= used
