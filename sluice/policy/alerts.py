"""Alerts (O2): which rules watch which group, each (group, rule)'s state machine over the
series values (inactive -> pending -> firing -> resolved), and the same rules written as
Prometheus alerting rules for a fleet that already runs Prometheus and Alertmanager.

Pure: the values and `now` come in as arguments; the edge (`sluice.control.alerts`)
persists the states, emits the events and delivers the messages.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from sluice.core.urls import channel_kind
from sluice.spec.models import GroupSpec, PlatformSpec
from sluice.spec.observability import AlertRule, AlertsSpec

__all__ = [
    "DEFAULT_RULES",
    "AlertState",
    "Key",
    "Transition",
    "channel_kind",
    "evaluate",
    "prometheus_rules",
    "rules_for",
    "states_from_json",
    "states_to_json",
]

DEFAULT_RULES: tuple[AlertRule, ...] = (
    AlertRule(
        name="slo-burn",
        series="slo_burn",
        threshold=2.0,
        for_s=300,
        severity="page",
        description="misses of the latency SLO run at over twice the rate the target allows "
        "(only groups with slo.latency_ms have this series)",
    ),
    AlertRule(
        name="queue-wait",
        series="queue_wait_p95_ms",
        threshold=1000.0,
        for_s=120,
        severity="warning",
        description="requests wait over a second for a slot (p95)",
    ),
    AlertRule(
        name="error-rate",
        series="error_rate",
        threshold=0.05,
        for_s=120,
        severity="page",
        description="over 5% of answers are 5xx or 429",
    ),
    AlertRule(
        name="no-ready-instance",
        series="no_ready_instance",
        threshold=0.5,
        for_s=30,
        severity="page",
        description="the group should serve but has no ready instance",
    ),
    AlertRule(
        name="quota-refused",
        series="quota_refused",
        threshold=0.5,
        for_s=300,
        severity="warning",
        description="quota keeps refusing the group an instance it wants",
    ),
    AlertRule(
        name="budget-near-cap",
        series="budget_used",
        threshold=0.9,
        for_s=60,
        severity="warning",
        description="over 90% of the tightest budget cap in force is spent",
    ),
    AlertRule(
        name="memory-over-estimate",
        series="instances_over_estimate",
        threshold=0.5,
        for_s=120,
        severity="warning",
        description="an instance holds over 1.5x its memory estimate (sluice estimate, else "
        "resources.memory_gb) and over 1 GiB more (pools with devices, read by NVML)",
    ),
)
"""What a platform team wants on every group unless `observability.alerts.defaults` is off;
a spec rule with the same name (for the group or for '*') replaces one."""

Key = tuple[str, str]
"""(group, rule name)"""


def rules_for(alerts: AlertsSpec, groups: Iterable[str]) -> dict[str, list[AlertRule]]:
    """Each group's rules, by precedence per name: the group's own rule, else a '*' rule,
    else a default. Order: the defaults first, then the spec's in the order written."""
    base: dict[str, AlertRule] = {r.name: r for r in DEFAULT_RULES} if alerts.defaults else {}
    for r in alerts.rules:
        if r.group == "*":
            base[r.name] = r
    out: dict[str, list[AlertRule]] = {}
    for g in groups:
        mine = dict(base)
        for r in alerts.rules:
            if r.group == g:
                mine[r.name] = r
        out[g] = list(mine.values())
    return out


@dataclass(frozen=True, slots=True)
class AlertState:
    """One (group, rule) that is pending or firing; an inactive one has no state. Holds what
    a resolution must say even once the rule left the spec. `value` (the last reading) is
    left out of equality, so a state that only read a new value is no change to store."""

    group: str
    rule: str
    phase: Literal["pending", "firing"]
    since: float
    """when the condition became true"""
    severity: str
    series: str
    op: str
    threshold: float
    fired_at: float | None = None
    value: float | None = field(default=None, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "rule": self.rule,
            "phase": self.phase,
            "since": self.since,
            "severity": self.severity,
            "series": self.series,
            "op": self.op,
            "threshold": self.threshold,
            "fired_at": self.fired_at,
            "value": self.value,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> AlertState:
        phase = doc["phase"]
        if phase not in ("pending", "firing"):
            raise ValueError(f"alert phase {phase!r}: expected pending or firing")
        fired = doc.get("fired_at")
        value = doc.get("value")
        return cls(
            group=str(doc["group"]),
            rule=str(doc["rule"]),
            phase=phase,
            since=float(doc["since"]),
            severity=str(doc["severity"]),
            series=str(doc["series"]),
            op=str(doc["op"]),
            threshold=float(doc["threshold"]),
            fired_at=None if fired is None else float(fired),
            value=None if value is None else float(value),
        )


def states_to_json(states: Mapping[Key, AlertState]) -> dict[str, Any]:
    """The document the edge stores (`controller_state` 'alerts')."""
    return {"version": 1, "alerts": [s.to_json() for _, s in sorted(states.items())]}


def states_from_json(doc: Mapping[str, Any] | None) -> dict[Key, AlertState]:
    """The states of a stored document; an entry that does not read is dropped (a firing
    alert then fires anew: a repeated page beats a silently lost one)."""
    out: dict[Key, AlertState] = {}
    for item in (doc or {}).get("alerts", ()):
        try:
            s = AlertState.from_json(item)
        except (KeyError, TypeError, ValueError):
            continue
        out[s.group, s.rule] = s
    return out


@dataclass(frozen=True, slots=True)
class Transition:
    """An alert that began firing or resolved: what its message says. `since`: when the
    condition became true; `at`: when this happened."""

    group: str
    rule: str
    state: Literal["firing", "resolved"]
    value: float | None
    threshold: float
    op: str
    series: str
    since: float
    at: float
    severity: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "rule": self.rule,
            "state": self.state,
            "value": self.value,
            "threshold": self.threshold,
            "op": self.op,
            "series": self.series,
            "since": self.since,
            "at": self.at,
            "severity": self.severity,
            "reason": self.reason,
        }


def _holds(rule: AlertRule, value: float | None) -> bool:
    if value is None or math.isnan(value):
        return False
    return value > rule.threshold if rule.op == ">" else value < rule.threshold


def _fmt(v: float | None) -> str:
    return "no data" if v is None else f"{v:.4g}"


def evaluate(
    rules_by_group: Mapping[str, Sequence[AlertRule]],
    states: Mapping[Key, AlertState],
    values_by_group: Mapping[str, Mapping[str, float | None]],
    now: float,
) -> tuple[dict[Key, AlertState], list[Transition]]:
    """One evaluation of every rule at `now`: the new states and what fired or resolved.

    Prometheus' semantics: a condition true since T is pending, and fires once it held
    `for_s`; a pending one whose condition fails goes back to inactive without a word; a
    firing one resolves. A None value (no data: no request finished, no SLO set) counts as
    the condition being false, as a missing series does in Prometheus: the p95 of no
    requests is not above a threshold, and an alert must not fire on nothing.

    A group missing from `values_by_group` was not read this time (the observer has no
    window for it yet, e.g. just after a restart): its states hold as they are, so an
    alert firing before a restart is still firing after and is not fired twice. A rule or
    group no longer in `rules_by_group` resolves its firing alert (the on-call person
    hears it is over, and why) and drops a pending one."""
    new: dict[Key, AlertState] = {}
    out: list[Transition] = []
    for group, rules in rules_by_group.items():
        values = values_by_group.get(group)
        for rule in rules:
            key = (group, rule.name)
            old = states.get(key)
            if values is None:
                if old is not None:
                    new[key] = old
                continue
            value = values.get(rule.series)
            if not _holds(rule, value):
                if old is not None and old.phase == "firing":
                    why = "no data" if value is None else f"{rule.series} = {_fmt(value)}"
                    out.append(_transition(old, rule, "resolved", value, now, why))
                continue
            if old is None:
                old = AlertState(
                    group=group,
                    rule=rule.name,
                    phase="pending",
                    since=now,
                    severity=rule.severity,
                    series=rule.series,
                    op=rule.op,
                    threshold=rule.threshold,
                )
            state = replace(
                old,
                severity=rule.severity,
                series=rule.series,
                op=rule.op,
                threshold=rule.threshold,
                value=value,
            )
            if state.phase == "pending" and now - state.since >= rule.for_s:
                state = replace(state, phase="firing", fired_at=now)
                why = (
                    f"{rule.series} = {_fmt(value)} {rule.op} {rule.threshold:g} "
                    f"for {now - state.since:.0f}s (rule: for {rule.for_s:g}s)"
                )
                out.append(_transition(state, rule, "firing", value, now, why))
            new[key] = state
    for key, old in states.items():
        if key in new or old.phase != "firing":
            continue
        group, name = key
        if group not in rules_by_group:
            why = f"group {group!r} is no longer in the spec"
        elif any(r.name == name for r in rules_by_group[group]):
            continue  # resolved above
        else:
            why = f"rule {name!r} no longer applies to group {group!r}"
        out.append(_transition(old, None, "resolved", None, now, why))
    return new, out


def _transition(
    s: AlertState,
    rule: AlertRule | None,
    state: Literal["firing", "resolved"],
    value: float | None,
    now: float,
    reason: str,
) -> Transition:
    return Transition(
        group=s.group,
        rule=s.rule,
        state=state,
        value=value,
        threshold=rule.threshold if rule else s.threshold,
        op=rule.op if rule else s.op,
        series=rule.series if rule else s.series,
        since=s.since,
        at=now,
        severity=rule.severity if rule else s.severity,
        reason=reason,
    )


# --- the same rules for Prometheus ---------------------------------------------------------

_SKIPPED = {
    "requests_per_s": "the gateway exports answers (sluice_gateway_requests), not arrivals",
    "shed_rate": "its denominator, arrivals, is not exported (sluice_gateway_requests counts "
    "answers)",
}
"""Series with no faithful PromQL: left out rather than approximated."""

_HIST = {
    "p50_ms": ("sluice_gateway_request_duration_seconds", 0.50),
    "p95_ms": ("sluice_gateway_request_duration_seconds", 0.95),
    "p99_ms": ("sluice_gateway_request_duration_seconds", 0.99),
    "ttft_p95_ms": ("sluice_gateway_time_to_first_byte_seconds", 0.95),
    "tpot_p95_ms": ("sluice_gateway_time_per_output_token_seconds", 0.95),
    "queue_wait_p95_ms": ("sluice_gateway_queue_wait_seconds", 0.95),
}

_GAUGES = {
    "queue_length": ("sluice_gateway_queue_length", ""),
    "in_flight": ("sluice_gateway_inflight", ""),
    "ready_instances": ("sluice_group_instances", ',state="ready"'),
    "held_units": ("sluice_group_quota_units", ',kind="held"'),
    "borrowed_units": ("sluice_group_quota_units", ',kind="borrowed"'),
    "lent_units": ("sluice_group_quota_units", ',kind="lent"'),
    "spend_per_hour": ("sluice_group_spend_per_hour", ""),
    "budget_used": ("sluice_group_budget_used", ""),
    "quota_refused": ("sluice_group_quota_refused", ""),
    "accelerator_utilization": ("sluice_group_accelerator_utilization_percent", ""),
    "instances_over_estimate": ("sluice_group_accelerator_over_estimate_instances", ""),
}
"""Gauges the history averages over the window: avg_over_time, summed over the other
labels (priorities, pools, gateways)."""


def _duration(seconds: float) -> str:
    """A Prometheus duration: whole seconds, else milliseconds."""
    return f"{int(seconds)}s" if seconds == int(seconds) else f"{round(seconds * 1000)}ms"


def _num(x: float) -> str:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return repr(float(x))


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _value_expr(
    series: str, g: GroupSpec, window: str, bounds: Sequence[float]
) -> tuple[str | None, str]:
    """PromQL for one group's `series` over `window`, or (None, why not)."""
    sel = f'group="{_label(g.name)}"'
    if series in _SKIPPED:
        return None, _SKIPPED[series]
    answers = f"sum(rate(sluice_gateway_request_duration_seconds_count{{{sel}}}[{window}]))"
    if series in ("prompt_tokens_per_s", "completion_tokens_per_s"):
        kind = series.removesuffix("_tokens_per_s")
        return f"sum(rate(sluice_gateway_{kind}_tokens_total{{{sel}}}[{window}]))", ""
    if series == "error_rate":
        errors = f'sum(rate(sluice_gateway_requests_total{{{sel},status=~"5..|429"}}[{window}]))'
        return f"({errors} or vector(0)) / {answers}", ""
    if series in _HIST:
        metric, q = _HIST[series]
        buckets = f"sum by (le) (rate({metric}_bucket{{{sel}}}[{window}]))"
        return f"histogram_quantile({q}, {buckets}) * 1000", ""
    if series == "accelerator_memory_used_gb":
        metric = "sluice_group_accelerator_memory_bytes"
        return f"sum(avg_over_time({metric}{{{sel}}}[{window}])) / {2**30}", ""
    if series in _GAUGES:
        metric, extra = _GAUGES[series]
        return f"sum(avg_over_time({metric}{{{sel}{extra}}}[{window}]))", ""
    if series == "no_ready_instance":
        ready = f'sum(sluice_group_instances{{{sel},state="ready"}})'
        wanted = f"sum(sluice_group_desired_instances{{{sel}}})"
        return f"avg_over_time((({ready} == bool 0) * ({wanted} > bool 0))[{window}:])", ""
    if series in ("slo_attainment", "slo_burn"):
        slo = g.slo
        if slo is None or slo.latency_ms is None:
            return None, "the group has no slo.latency_ms (the series has no value)"
        bound = slo.latency_ms / 1000.0
        le = next((b for b in bounds if math.isclose(bound, b, rel_tol=1e-9)), None)
        if le is None:
            return None, (
                f"slo.latency_ms = {slo.latency_ms:g} is not a bucket bound of "
                "sluice_gateway_request_duration_seconds: the share within it would be "
                "interpolated differently"
            )
        within = (
            f'sum(rate(sluice_gateway_request_duration_seconds_bucket{{{sel},le="{_num(le)}"}}'
            f"[{window}])) / {answers}"
        )
        if series == "slo_attainment":
            return within, ""
        if slo.target >= 1.0:
            return None, "slo.target = 1 allows no misses: the burn rate has no value"
        return f"(1 - {within}) / {_num(1.0 - slo.target)}", ""
    return None, f"series {series!r} has no PromQL mapping"


def _alert_name(rule: str) -> str:
    return "sluice_" + re.sub(r"[^A-Za-z0-9_]", "_", rule)


def prometheus_rules(
    spec: PlatformSpec, latency_bounds: Sequence[float] = ()
) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """The spec's alert rules as a Prometheus rules document (`groups:`, one rule per
    group and rule) over the metrics Sluice exports, and the (group, rule) pairs left out
    with why: a series without a faithful expression is skipped, never approximated.
    `latency_bounds`: the gateway's request-duration buckets (an SLO rule needs its bound
    to be one). A rule's `rule` label keeps its spec name (the alert name is that name
    made a valid Prometheus name)."""
    alerts = spec.observability.alerts
    window = _duration(alerts.window_s)
    by_group = rules_for(alerts, [g.name for g in spec.groups])
    out: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    for g in spec.groups:
        for rule in by_group[g.name]:
            expr, why = _value_expr(rule.series, g, window, latency_bounds)
            if expr is None:
                skipped.append(
                    {"group": g.name, "rule": rule.name, "series": rule.series, "why": why}
                )
                continue
            channel = channel_kind(g.alert_channel)
            summary = (
                f"{rule.name} on group {g.name} (owner {g.owner}, {g.business}; "
                f"{channel} channel): {rule.series} {rule.op} {rule.threshold:g} "
                f"for {rule.for_s:g}s"
            )
            annotations = {"summary": summary}
            if rule.description:
                annotations["description"] = rule.description
            out.append(
                {
                    "alert": _alert_name(rule.name),
                    "expr": f"({expr}) {rule.op} {_num(rule.threshold)}",
                    "for": _duration(rule.for_s),
                    "labels": {
                        "severity": rule.severity,
                        "group": g.name,
                        "owner": g.owner,
                        "rule": rule.name,
                    },
                    "annotations": annotations,
                }
            )
    return {"groups": [{"name": "sluice", "rules": out}]}, skipped
