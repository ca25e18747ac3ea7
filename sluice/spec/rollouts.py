"""How a new version reaches traffic (C1-C6): steps, hold, pacing by tenant, analysis gates.

A rollout names two existing groups: `baseline` (the running version, kept scaled for its
full traffic the whole time so a rollback is one route-table swap) and `canary` (the new
version in its own group). The state machine is `sluice.policy.rollouts`; the statistics are
`sluice.policy.analysis`. Defaults are argued in the field descriptions.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sluice.spec.names import Name

__all__ = [
    "CRITERIA",
    "DEFAULT_STEPS",
    "AnalysisSpec",
    "CompareSpec",
    "CriterionName",
    "PacingSpec",
    "RolloutSpec",
]


DEFAULT_STEPS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 50, 70, 85, 95, 100)
"""Doubling while the canary is small (a bad version hurts few requests, so move fast),
then +20/+15/+10/+5 near the end, where each step moves many requests (C2)."""

CriterionName = Literal[
    "error_rate",
    "latency_p50",
    "latency_p95",
    "ttft_p95",
    "tpot_p50",
    "output_length",
    "empty_rate",
    "truncated_rate",
    "cpu_per_request",
    "memory",
    "style_drift",
]
CRITERIA: tuple[CriterionName, ...] = get_args(CriterionName)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class AnalysisSpec(_Strict):
    """Canary-vs-baseline gates (C3), as an error budget and the regressions worth catching.

    Two knobs set the statistics (`sluice.policy.canary_plan` says how): `false_rollback_rate`
    is the chance that a good version (one no worse than the baseline) is rolled back, over
    the whole rollout, every step, criterion and look counted; the `*_max_increase`,
    `*_max_ratio` and `*_max_ks` fields are the smallest regression of each criterion worth
    catching, which `power` says how surely to catch before the canary passes
    `catch_by_percent` of the traffic. From them follow the samples each step needs
    (`min_samples` overrides that number). A regression smaller than half of its smallest
    worth catching never rolls back, however significant."""

    false_rollback_rate: float = Field(
        default=0.01,
        gt=0,
        le=0.2,
        description="chance a good version is rolled back, per rollout; 1% is one needless "
        "rollback in a hundred releases",
    )
    power: float = Field(
        default=0.95,
        ge=0.5,
        lt=1,
        description="chance that a regression of exactly the smallest size worth catching is "
        "caught before the canary passes catch_by_percent",
    )
    catch_by_percent: float = Field(
        default=8.0,
        gt=0,
        le=100,
        description="the canary share by which regressions should be caught: with the default "
        "steps, four steps (1, 2, 4, 8%) gather the evidence",
    )
    min_samples: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="answers a step needs on its smaller side before it may pass; default "
        "(None): what the regressions worth catching need (`sluice rollout plan` shows it)",
    )
    gross_error_rate: float = Field(
        default=0.2,
        gt=0,
        lt=1,
        description="a canary failing this share of its answers, where the baseline fails "
        "under a quarter of it, is rolled back as soon as the evidence holds, between looks",
    )
    error_rate_max_increase: float = Field(
        default=0.02, gt=0, le=1, description="canary - baseline share of 5xx answers"
    )
    latency_p50_max_ratio: float = Field(default=1.2, gt=1, le=100)
    latency_p95_max_ratio: float = Field(
        default=1.3, gt=1, le=100, description="looser than p50: tails are noisier"
    )
    ttft_p95_max_ratio: float = Field(default=1.3, gt=1, le=100, description="streaming only")
    tpot_p50_max_ratio: float = Field(default=1.2, gt=1, le=100, description="streaming only")
    latency_min_delta_s: float = Field(
        default=0.005,
        ge=0,
        description="latency/TTFT growth below this never fails (timer and scheduling noise)",
    )
    tpot_min_delta_s: float = Field(default=0.0005, ge=0, description="per output token")
    output_length_max_ks: float = Field(
        default=0.15, gt=0, le=1, description="two-sample KS statistic D of output tokens"
    )
    empty_rate_max_increase: float = Field(default=0.02, gt=0, le=1)
    truncated_rate_max_increase: float = Field(
        default=0.04, gt=0, le=1, description="finish_reason == 'length'"
    )
    cpu_per_request_max_ratio: float = Field(
        default=1.25,
        ge=1,
        le=100,
        description="a measured ratio, not a test: outside the false-rollback budget",
    )
    cpu_min_delta_s: float = Field(default=0.001, ge=0, description="CPU seconds per request")
    memory_max_ratio: float = Field(
        default=1.15, ge=1, le=100, description="accelerator memory of one instance (measured)"
    )
    memory_min_delta_gb: float = Field(default=0.25, ge=0)
    style_drift_max_ks: float = Field(
        default=0.2,
        gt=0,
        le=1,
        description="KS statistic of words per sentence, type/token ratio or markup density",
    )
    refusal_rate_max_increase: float = Field(
        default=0.03,
        gt=0,
        le=1,
        description="rise in the share of answers with a refusal phrase (part of style_drift)",
    )
    disable: list[CriterionName] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _no_alpha(cls, data: object) -> object:
        if isinstance(data, dict) and "alpha" in data:
            raise ValueError(
                f"alpha = {data['alpha']!r} is no longer a setting: every test's level now "
                "follows from false_rollback_rate (default 0.01), the chance of rolling back "
                "a good version over the whole rollout"
            )
        return data


class PacingSpec(_Strict):
    """Who sees the canary when (C4). At a step of `p` percent, of the requests routed to
    the baseline group, the canary gets: from `early` tenants min(100, p x `early_factor`);
    from unlisted tenants p once p >= `normal_from_percent`, else none; from `late` tenants
    p once p >= `late_from_percent`, else none."""

    early: list[Name] = Field(default_factory=list)
    early_factor: float = Field(
        default=4.0,
        ge=1,
        le=100,
        description="early tenants' share multiplier: 1% -> 4%, full canary from 25%",
    )
    normal_from_percent: float = Field(default=0.0, ge=0, le=100)
    late: list[Name] = Field(default_factory=list)
    late_from_percent: float = Field(default=50.0, ge=0, le=100)

    @model_validator(mode="after")
    def _consistent(self) -> PacingSpec:
        both = sorted(set(self.early) & set(self.late))
        if both:
            raise ValueError(f"tenant(s) {', '.join(both)} are both early and late")
        if self.late_from_percent < self.normal_from_percent:
            raise ValueError(
                f"late_from_percent = {self.late_from_percent:g} must be >= "
                f"normal_from_percent = {self.normal_from_percent:g}"
            )
        return self


class CompareSpec(_Strict):
    """The fixed comparison suite (C5): the same JSONL requests sent to both versions."""

    suite: str = Field(min_length=1, description="path of a JSONL file, one request a line")
    timeout_s: float = Field(default=300.0, gt=0, le=86_400, description="whole suite")


class RolloutSpec(_Strict):
    """One rollout: `baseline` keeps full capacity; `canary` gets `steps` percent of the
    baseline's traffic, each held at least `hold_s` and passing `analysis` before the next."""

    name: Name
    baseline: Name
    canary: Name
    description: str = ""
    steps: list[float] = Field(default_factory=lambda: list(DEFAULT_STEPS))
    hold_s: float = Field(
        default=60.0, ge=0, le=86_400, description="minimum time on each step, seconds"
    )
    max_wait_s: float | None = Field(
        default=1800.0,
        gt=0,
        le=7 * 86_400,
        description="a step whose smaller side got no new answer for this long (the canary "
        "gets no traffic?) triggers `on_no_data`; slow traffic that still flows is waited "
        "for (`sluice rollout plan` says how long); None waits forever",
    )
    on_no_data: Literal["pause", "rollback"] = Field(
        default="pause",
        description="lack of data is no evidence against the canary, so by default an "
        "operator decides (resume, promote or abort)",
    )
    pacing: PacingSpec = PacingSpec()
    analysis: AnalysisSpec = AnalysisSpec()
    compare: CompareSpec | None = None

    @field_validator("steps")
    @classmethod
    def _steps_climb_to_100(cls, steps: list[float]) -> list[float]:
        if not steps:
            raise ValueError("steps needs at least one percent; the last must be 100")
        for i, p in enumerate(steps):
            if not 0 < p <= 100:
                raise ValueError(f"steps[{i}] = {p:g}, must be > 0 and <= 100")
            if i and p <= steps[i - 1]:
                raise ValueError(
                    f"steps[{i}] = {p:g} must be greater than steps[{i - 1}] = {steps[i - 1]:g}"
                )
        if steps[-1] != 100:
            raise ValueError(f"the last step is {steps[-1]:g}; it must be 100")
        return steps

    @model_validator(mode="after")
    def _groups_and_wait(self) -> RolloutSpec:
        if self.baseline == self.canary:
            raise ValueError(f"baseline and canary are both {self.baseline!r}; they must differ")
        if self.max_wait_s is not None and self.max_wait_s < self.hold_s:
            raise ValueError(
                f"max_wait_s = {self.max_wait_s:g} must be >= hold_s = {self.hold_s:g}"
            )
        return self
