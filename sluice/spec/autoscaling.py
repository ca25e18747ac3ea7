"""How a group scales by itself (S4-S9), and the latency objective it is judged by.

One `autoscaling:` block per group picks a policy (`sluice`, or faithful emulations of
Kubernetes HPA v2 and Knative KPA so users can compare and migrate) and its knobs. The
defaults are the ones the simulator benchmark (`bench/autoscale.py`) was tuned with.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sluice.spec.names import Name

__all__ = [
    "AutoscalingSpec",
    "HpaBehaviorRule",
    "HpaPolicy",
    "HpaSpec",
    "KpaSpec",
    "PanicSpec",
    "ScaleDownSpec",
    "ScaleUpSpec",
    "ScheduleEntry",
    "SloSpec",
    "TargetsSpec",
]

TemplateName = Name


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class SloSpec(_Strict):
    """Per-request objective: a fixed latency bound, a slowdown bound (`slowdown` x the
    request's own service time + `slack_s`), and for generative groups the caller's terms:
    time to first token (`ttft_ms`, the gateway's queue included) and time per output token
    after the first (`tpot_ms`). A request is in SLO when every bound given holds (a
    one-token answer has no TPOT: that bound does not apply to it); `target` is the share of
    requests that must be, so each bound is a `target`-quantile (p99 by default). TTFT and
    TPOT may replace the latency bounds for a generative group."""

    latency_ms: float | None = Field(default=None, gt=0)
    slowdown: float | None = Field(default=None, ge=1)
    slack_s: float = Field(default=0.0, ge=0)
    ttft_ms: float | None = Field(
        default=None, gt=0, description="time to first token, arrival at the gateway to it"
    )
    tpot_ms: float | None = Field(
        default=None, gt=0, description="mean time per output token after the first"
    )
    target: float = Field(default=0.99, gt=0, le=1, description="share of requests in SLO")

    @model_validator(mode="after")
    def _one_bound(self) -> SloSpec:
        if (self.latency_ms, self.slowdown, self.ttft_ms, self.tpot_ms) == (None,) * 4:
            raise ValueError(
                "give 'latency_ms', 'slowdown' (with 'slack_s'), or for a generative group "
                "'ttft_ms' and/or 'tpot_ms'; several may be given (all must hold)"
            )
        return self

    @property
    def has_latency_bound(self) -> bool:
        """A bound on the whole answer's latency (`latency_ms` or `slowdown`) is given."""
        return self.latency_ms is not None or self.slowdown is not None

    @property
    def has_token_bound(self) -> bool:
        """A bound in the caller's token terms (`ttft_ms` or `tpot_ms`) is given."""
        return self.ttft_ms is not None or self.tpot_ms is not None


class ScheduleEntry(_Strict):
    """A recurring floor (S8): from each `cron` firing, keep at least `min` instances for
    `duration_s`. Cron uses 5 fields in `timezone`."""

    cron: str = Field(min_length=9, description="e.g. '0 9 * * 1-5'")
    min: int = Field(ge=0, le=100_000)
    duration_s: float = Field(gt=0, le=31 * 86_400)
    timezone: str = "UTC"

    @field_validator("cron")
    @classmethod
    def _five_fields(cls, value: str) -> str:
        if len(value.split()) != 5:
            raise ValueError("cron needs 5 fields: minute hour day-of-month month day-of-week")
        return value


class TargetsSpec(_Strict):
    """What the Sluice policy sizes for and how it reads the traffic (S4). The count comes
    from the queueing model of the group's `slo` (`policy/autoscale/queueing.py`); when a
    latency target is set, a scale-up also needs latency at risk (or a queue)."""

    utilization: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="busy share of max_concurrency slots the concurrency signal allows "
        "(1: what is busy is a floor; below 1 it targets that utilization, HPA style)",
    )
    queue_per_instance: float = Field(default=0.5, ge=0, description="waiting requests")
    latency_p95_ms: float | None = Field(
        default=None, gt=0, description="None: the group's `slo.latency_ms` when set"
    )
    ttft_p95_ms: float | None = Field(
        default=None,
        gt=0,
        description="time to first token of streamed answers, p95, as the gateway measures it",
    )
    tpot_p95_ms: float | None = Field(
        default=None, gt=0, description="time per output token of streamed answers, p95"
    )
    kv_cache_usage: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="the servers' KV-cache use (vLLM, SGLang, llama.cpp) to keep under: a "
        "leading signal, read before queues and TTFT grow",
    )
    window_s: float = Field(
        default=30.0, ge=1, le=3600, description="averaging window of concurrency and rate"
    )
    trend_window_s: float = Field(
        default=60.0, ge=10, le=3600, description="least-squares window of the arrival trend"
    )
    tolerance: float = Field(
        default=0.05, ge=0, lt=1, description="deadband around the target, both directions"
    )
    service_completions: int = Field(
        default=1000,
        ge=40,
        le=100_000,
        description="the service time's mean and variability span this many completions",
    )
    rate_arrivals: int = Field(
        default=1600,
        ge=1,
        le=100_000,
        description="the steady rate spans at least this many arrivals (within the memory)",
    )
    slo_budget_share: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="share of the SLO's error budget the steady sizing may spend on queueing",
    )


class ScaleUpSpec(_Strict):
    stabilization_s: float = Field(default=0.0, ge=0, le=3600)
    max_step: int = Field(default=0, ge=0, description="instances per period; 0 = no limit")
    max_percent: float = Field(default=0.0, ge=0, description="% per period; 0 = no limit")
    period_s: float = Field(default=15.0, gt=0, le=1800)


class ScaleDownSpec(_Strict):
    cooldown_s: float = Field(default=120.0, ge=0, le=86_400, description="after any scale-up")
    stabilization_s: float = Field(default=300.0, ge=0, le=3600, description="rolling max")
    max_step: int = Field(default=1, ge=0, description="instances per period; 0 = no limit")
    max_percent: float = Field(default=25.0, ge=0, description="% per period; 0 = no limit")
    period_s: float = Field(default=30.0, gt=0, le=1800)
    to_zero_delay_s: float = Field(default=300.0, ge=0, le=86_400, description="last 1 -> 0")


class PanicSpec(_Strict):
    """Burst mode: a short window over `threshold` x capacity scales up at once and forbids
    any scale-down until the stable window is calm again."""

    enabled: bool = True
    window_s: float = Field(default=6.0, gt=0, le=600)
    threshold: float = Field(default=2.0, gt=1, le=10)


class HpaPolicy(_Strict):
    type: Literal["Pods", "Percent"]
    value: int = Field(gt=0)
    period_s: float = Field(gt=0, le=1800)


class HpaBehaviorRule(_Strict):
    stabilization_s: float = Field(ge=0, le=3600)
    policies: list[HpaPolicy]
    select_policy: Literal["Max", "Min", "Disabled"] = "Max"


class HpaSpec(_Strict):
    """Kubernetes HPA v2 knobs (defaults as upstream)."""

    target_per_instance: float = Field(default=0.7, gt=0, description="x max_concurrency")
    sync_period_s: float = Field(default=15.0, gt=0)
    tolerance: float = Field(default=0.1, ge=0, lt=1)
    scale_up: HpaBehaviorRule = HpaBehaviorRule(
        stabilization_s=0,
        policies=[
            HpaPolicy(type="Percent", value=100, period_s=15),
            HpaPolicy(type="Pods", value=4, period_s=15),
        ],
    )
    scale_down: HpaBehaviorRule = HpaBehaviorRule(
        stabilization_s=300, policies=[HpaPolicy(type="Percent", value=100, period_s=15)]
    )


class KpaSpec(_Strict):
    """Knative Pod Autoscaler knobs (defaults as upstream `config-autoscaler`)."""

    target_utilization: float = Field(default=0.7, gt=0, le=1, description="x max_concurrency")
    stable_window_s: float = Field(default=60.0, ge=6, le=3600)
    panic_window_percent: float = Field(default=10.0, ge=1, le=100)
    panic_threshold_percent: float = Field(default=200.0, ge=110, le=1000)
    max_scale_up_rate: float = Field(default=1000.0, gt=1)
    max_scale_down_rate: float = Field(default=2.0, gt=1)
    scale_down_delay_s: float = Field(default=0.0, ge=0, le=3600)
    tick_s: float = Field(default=2.0, gt=0)
    scale_to_zero_grace_s: float = Field(default=30.0, ge=0)


class AutoscalingSpec(_Strict):
    """A group's scaler. `max` is mandatory (S5); `min: 0` allows scale to zero."""

    policy: Literal["sluice", "hpa", "kpa"] = "sluice"
    mode: Literal["active", "advisory"] = Field(
        default="active",
        description="advisory: decide and journal every tick, but run `replicas` (or a "
        "`sluice scale` override) instead of the decision, to watch before it drives",
    )
    min: int = Field(default=1, ge=0, le=100_000)
    max: int = Field(ge=1, le=100_000)
    stable: int = Field(default=0, ge=0, description="stable pool: never scaled below (S9)")
    warm_standby: int = Field(default=0, ge=0, description="loaded, out of rotation")
    sleeping_standby: int = Field(
        default=0,
        ge=0,
        description="loaded and put to sleep (command servers with `sleep`, sim workers): "
        "woken, as many at once as they need, when requests still wait once the warm "
        "standby is in rotation",
    )
    sleep_held_after_s: float = Field(
        default=60.0,
        ge=0,
        le=86_400,
        description="a group with sleeping standby keeps asleep the capacity the scale-down "
        "stabilization holds beyond what the last this-many seconds asked for (woken by the "
        "gateways when a burst returns, as sleeping standby is); 0: all of it stays awake. "
        "Left unset, it holds only where its servers' wake (`sim.wake_s`, "
        "`command.sleep.wake_s`) is at most half the first-token bound (`slo.ttft_ms`, else "
        "`slo.latency_ms`, else the TTFT or latency p95 target): a slower wake serves a "
        "returning burst late",
    )
    interval_s: float = Field(default=1.0, gt=0, le=60, description="decision tick")
    lead_time_s: float | None = Field(
        default=None, ge=0, description="start-up time to plan for; None = measured"
    )
    metrics_max_age_s: float = Field(default=10.0, gt=0, description="older = missing")
    targets: TargetsSpec = TargetsSpec()
    up: ScaleUpSpec = ScaleUpSpec()
    down: ScaleDownSpec = ScaleDownSpec()
    panic: PanicSpec = PanicSpec()
    schedules: list[ScheduleEntry | TemplateName] = Field(
        default_factory=list, description="entries, or names of `schedule_templates`"
    )
    hpa: HpaSpec = HpaSpec()
    kpa: KpaSpec = KpaSpec()

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingSpec:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is above max ({self.max})")
        if self.stable > self.max:
            raise ValueError(f"stable ({self.stable}) is above max ({self.max})")
        if self.stable + self.warm_standby + self.sleeping_standby > self.max:
            raise ValueError("stable + warm_standby + sleeping_standby must not exceed max")
        return self
