"""The gateway's per-instance counters: answers by class and latency per (group, instance),
exported with an `instance` label, and dropped once an instance has been out of its group's
routing for `INSTANCE_RETENTION_S` (so instance churn cannot grow them without bound)."""

from __future__ import annotations

import time

from prometheus_client.parser import text_string_to_metric_families

from sluice.gateway.groups import GroupRuntime
from sluice.gateway.metrics import INSTANCE_RETENTION_S, GatewayMetrics
from sluice.policy.routing import Endpoint, GroupTraffic


def scrape(metrics: GatewayMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the exposition: (name, sorted labels) -> value."""
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            out[s.name, tuple(sorted(s.labels.items()))] = s.value
    return out


def fleet(*instances: str) -> tuple[GatewayMetrics, GroupRuntime]:
    """Metrics over one group `g` routing to `instances`."""
    runtimes: dict[str, GroupRuntime] = {}
    metrics = GatewayMetrics(lambda: runtimes, lambda: 1)
    rt = runtimes["g"] = GroupRuntime("g", metrics.group("g"))
    route(rt, *instances)
    return metrics, rt


def route(rt: GroupRuntime, *instances: str) -> None:
    endpoints = tuple(Endpoint(i, "127.0.0.1", 1, 4) for i in instances)
    rt.configure(GroupTraffic(), endpoints, time.monotonic())


def test_answers_are_counted_by_class_and_latency_per_instance() -> None:
    metrics, _ = fleet("i1", "i2")
    for status in (200, 200, 201, 404, 503, 0):
        metrics.request_done("g", "r", status, 0.02, 0.015, "i1", status)
    metrics.request_done("g", "r", 200, 2.0, 1.5, "i2", 200)
    metrics.request_done("g", "r", 599, 0.1, 0.1, "i2", 999)  # odd statuses count as 5xx
    metrics.request_done("", "", 404, 0.001)  # no instance: not per instance
    got = scrape(metrics)

    def requests(instance: str, code_class: str) -> float:
        labels = (("code_class", code_class), ("group", "g"), ("instance", instance))
        return got["sluice_gateway_instance_requests_total", labels]

    assert [requests("i1", c) for c in ("0", "2xx", "3xx", "4xx", "5xx")] == [1, 3, 0, 1, 1]
    assert [requests("i2", c) for c in ("0", "2xx", "5xx")] == [0, 1, 1]
    assert not any(dict(labels).get("code_class") == "1xx" for _, labels in got)  # none seen
    duration = "sluice_gateway_instance_request_duration_seconds"
    i2 = (("group", "g"), ("instance", "i2"))
    assert got[duration + "_count", i2] == 2
    assert got[duration + "_sum", i2] == 1.6  # served seconds: latency less the queue wait
    assert got[duration + "_bucket", (*i2, ("le", "1.0"))] == 1
    assert got[duration + "_bucket", (*i2, ("le", "+Inf"))] == 2
    assert not any(dict(labels).get("instance") == "" for _, labels in got)


def test_an_instance_out_of_routing_is_dropped_after_the_retention() -> None:
    metrics, rt = fleet("i1", "i2")
    for iid in ("i1", "i2"):
        metrics.request_done("g", "r", 200, 0.01, 0.01, iid, 200)
    gm = metrics.groups["g"]
    route(rt, "i1")  # i2 leaves the group's routing
    assert set(gm.instances) == {"i1", "i2"}  # kept: Prometheus still has to scrape it
    assert gm.instances["i2"].unrouted_since > 0.0 and gm.instances["i1"].unrouted_since == 0.0
    labels = {dict(lb).get("instance") for _, lb in scrape(metrics)}
    assert {"i1", "i2"} <= labels

    gm.instances["i2"].unrouted_since -= INSTANCE_RETENTION_S + 1  # as if long ago
    labels = {dict(lb).get("instance") for _, lb in scrape(metrics)}  # a scrape prunes
    assert "i2" not in labels and "i1" in labels
    assert set(gm.instances) == {"i1"}


def test_prune_on_snapshot_changes_without_scrapes() -> None:
    metrics, _ = fleet("i1")
    gm = metrics.groups["g"]
    # the stray's clock is monotonic: a fixed t fails on a fresh boot; a whole second, so
    # t + RETENTION - t is exactly RETENTION (the boundary is what is tested)
    t = float(int(time.monotonic()))
    metrics.request_done("g", "r", 200, 0.01, 0.01, "late", 200)  # never routed (a stray)
    gm.prune({"i1"}, t)  # seen unrouted: its clock starts (it started at its first answer)
    gm.instances["late"].unrouted_since = t
    gm.prune({"i1"}, t + INSTANCE_RETENTION_S)
    assert "late" in gm.instances
    gm.prune({"late"}, t + INSTANCE_RETENTION_S + 0.5)  # back in routing: clock cleared
    assert gm.instances["late"].unrouted_since == 0.0
    gm.prune(set(), t + 2 * INSTANCE_RETENTION_S)
    gm.prune(set(), t + 3 * INSTANCE_RETENTION_S + 1)
    assert gm.instances == {}


def test_a_removed_group_loses_its_instances_at_scrape_time() -> None:
    runtimes: dict[str, GroupRuntime] = {}
    metrics = GatewayMetrics(lambda: runtimes, lambda: 1)
    metrics.request_done("gone", "r", 200, 0.01, 0.01, "i9", 200)
    metrics.groups["gone"].instances["i9"].unrouted_since -= INSTANCE_RETENTION_S + 1
    got = scrape(metrics)
    assert not any(dict(lb).get("instance") == "i9" for _, lb in got)
    counted = (("group", "gone"), ("route", "r"), ("status", "200"))
    assert got["sluice_gateway_requests_total", counted] == 1  # the group's counters stay
