"""The operator's words for watching a fleet (O2, O3, S12): how long metrics history is
kept, the alert rules, and how long after a scaling change its effect is judged."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field, model_validator

from sluice.spec.autoscaling import _Strict

__all__ = [
    "SERIES",
    "AlertRule",
    "AlertsSpec",
    "FollowupSpec",
    "HistorySpec",
    "ObservabilitySpec",
    "Series",
    "Severity",
]

Series = Literal[
    "requests_per_s",
    "error_rate",
    "shed_rate",
    "p50_ms",
    "p95_ms",
    "p99_ms",
    "ttft_p95_ms",
    "tpot_p95_ms",
    "prompt_tokens_per_s",
    "completion_tokens_per_s",
    "queue_length",
    "queue_wait_p95_ms",
    "in_flight",
    "ready_instances",
    "no_ready_instance",
    "slo_attainment",
    "slo_burn",
    "held_units",
    "borrowed_units",
    "lent_units",
    "spend_per_hour",
    "budget_used",
    "quota_refused",
    "accelerator_memory_used_gb",
    "accelerator_utilization",
    "instances_over_estimate",
]
"""What a group's history keeps and an alert rule may watch (`sluice.policy.history`):
rates and shares over the window; latency quantiles merged from histograms; gauges
averaged. `error_rate`: 5xx answers (shed included) per finished request; `shed_rate`:
the part refused by admission; `no_ready_instance`: 1 while the group should serve but no
instance is ready, past its start-up grace (a first start, or one from zero, reads 0 until
the spec's start-up and warm-up timeouts ran out: `sluice.policy.startup`);
`slo_attainment`: the share within the group's `slo.latency_ms`;
`slo_burn`: its misses over the misses the SLO allows (1 - target); `budget_used`: the
share of the tightest budget cap in force (group or platform); `quota_refused`: 1 while
quota refuses the group a start; where a pool lists devices (NVML),
`accelerator_memory_used_gb`, `accelerator_utilization` (percent) and
`instances_over_estimate` (instances holding over 1.5x their memory estimate and over
1 GiB more: `sluice.policy.accelerators`)."""
SERIES: tuple[str, ...] = get_args(Series)

Severity = Literal["page", "warning", "info"]


class HistorySpec(_Strict):
    """Per-group rollups kept in the store: one-minute rows for `minute_days`, one-hour rows
    (merged from them) for `hour_days`; older rows go with the retention pass."""

    minute_days: float = Field(default=14.0, gt=0, le=366)
    hour_days: float = Field(default=730.0, gt=0, le=3660)

    @model_validator(mode="after")
    def _hours_outlive_minutes(self) -> HistorySpec:
        if self.hour_days < self.minute_days:
            raise ValueError(
                f"hour_days = {self.hour_days:g} must be >= minute_days = "
                f"{self.minute_days:g}: hour rows are merged from minute rows"
            )
        return self


class AlertRule(_Strict):
    """Fires when `series` of a group, over the alerts' window, stays `op` `threshold` for
    `for_s`; resolves once it no longer does."""

    name: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    group: str = Field(default="*", description="a group's name, or '*' for every group")
    series: Series
    op: Literal[">", "<"] = ">"
    threshold: float
    for_s: float = Field(default=60.0, ge=0, le=86_400)
    severity: Severity = "warning"
    description: str = ""


class AlertsSpec(_Strict):
    """Alert rules; with `defaults` on, the built-in rules (`sluice.policy.alerts.DEFAULT_RULES`)
    apply to every group besides these. A rule here with a default's name replaces it."""

    defaults: bool = True
    window_s: float = Field(
        default=60.0, ge=1, le=3600, description="series are taken over the last window_s"
    )
    rules: list[AlertRule] = Field(default_factory=list)
    webhook_timeout_s: float = Field(default=5.0, gt=0, le=60)
    webhook_attempts: int = Field(
        default=5, ge=1, le=20, description="then the message is kept as dead-lettered"
    )


class FollowupSpec(_Strict):
    """ "Did it help?" (S12): a scaling change or failover is judged `settle_s` after it,
    comparing `window_s` before it with `window_s` after the settle time."""

    settle_s: float = Field(default=120.0, ge=1, le=3600)
    window_s: float = Field(default=60.0, ge=1, le=3600)
    hold_s: float = Field(
        default=1800.0,
        ge=0,
        le=86_400,
        description="a no-gain verdict stops scale-up this long at most (0: never stops it)",
    )


class ObservabilitySpec(_Strict):
    history: HistorySpec = HistorySpec()
    alerts: AlertsSpec = AlertsSpec()
    followup: FollowupSpec = FollowupSpec()
