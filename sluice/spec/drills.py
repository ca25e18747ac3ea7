"""Scheduled peak drills (O5): `drills:` in the spec rehearses a group's peak on a cron.

Each entry is the `sluice drill` command it runs, written down: the group, the peak, its
shape and the criteria, plus when (`cron`, `timezone`) and the tenant key the load is sent
with (`api_key_env` or `api_key_file`, read on the controller's machine when the drill
fires: the spec names where the key is, never the key). The control plane runs each fire as
its own `sluice drill` process with a short-lived token scoped to the group
(`sluice.control.drills`); `sluice.policy.drills` decides when one is due.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sluice.spec.keys import EnvVarName, KeyFilePath
from sluice.spec.names import Name

if TYPE_CHECKING:
    from sluice.spec.models import GroupSpec

__all__ = ["DrillCriteriaSpec", "DrillSchedule", "drill_refusal"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class DrillCriteriaSpec(_Strict):
    """The pass/fail criteria, stated up front (the `sluice drill` options' defaults)."""

    max_time_to_scale_s: float = Field(default=30.0, gt=0, le=3600)
    max_time_to_recover_s: float = Field(default=120.0, gt=0, le=86_400)
    min_slo_attainment: float = Field(default=0.9, ge=0, le=1)
    max_shed_rate: float = Field(default=0.05, ge=0, le=1)


class DrillSchedule(_Strict):
    """One recurring drill: `sluice drill GROUP --peak PEAK ...` at each `cron` firing."""

    name: Name
    group: Name
    cron: str = Field(max_length=200, description="5 fields in `timezone`, e.g. '0 3 * * 2'")
    timezone: str = "UTC"
    enabled: bool = True
    api_key_env: EnvVarName | None = Field(
        default=None, description="environment variable of the controller holding the key"
    )
    api_key_file: KeyFilePath | None = Field(
        default=None, description="file on the controller's machine holding the key"
    )
    peak: str = Field(
        default="5x", pattern=r"^\s*[0-9]*\.?[0-9]+\s*(x|rps)?\s*$", description="5x or 40rps"
    )
    base_rps: float | None = Field(
        default=None, gt=0, description="None: the group's mean rate of the last 10 minutes"
    )
    shape: Literal["step", "ramp"] = "ramp"
    warm_s: float = Field(default=10.0, gt=0, le=3600)
    ramp_s: float = Field(default=60.0, gt=0, le=3600)
    hold_s: float = Field(default=300.0, gt=0, le=4 * 3600)
    cool_s: float = Field(default=30.0, gt=0, le=3600)
    criteria: DrillCriteriaSpec = DrillCriteriaSpec()
    starting_deadline_s: float = Field(
        default=300.0,
        gt=0,
        le=86_400,
        description="a firing not started this long after its time (the controller was "
        "down) is recorded as missed, not run late into other traffic",
    )

    @field_validator("cron")
    @classmethod
    def _five_fields(cls, value: str) -> str:
        from croniter import croniter

        if len(value.split()) != 5 or not croniter.is_valid(value):
            raise ValueError(
                f"{value!r} is not a 5-field cron (minute hour day-of-month month day-of-week)"
            )
        return value

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"unknown time zone {value!r} (an IANA name, e.g. Europe/Paris)"
            ) from None
        return value

    @model_validator(mode="after")
    def _one_key_source(self) -> DrillSchedule:
        if (self.api_key_env is None) == (self.api_key_file is None):
            raise ValueError(
                "give exactly one of api_key_env or api_key_file: where the controller reads "
                "the tenant key the drill's load is sent with"
            )
        return self

    @property
    def duration_s(self) -> float:
        """How long the load runs (the drill's process also plans and reads afterwards)."""
        ramp = self.ramp_s if self.shape == "ramp" else 0.0
        return self.warm_s + ramp + self.hold_s + self.cool_s

    def drill_args(self) -> list[str]:
        """The `sluice drill` arguments this entry stands for."""
        c = self.criteria
        args = [self.group, "--peak", self.peak.strip(), "--shape", self.shape]
        if self.base_rps is not None:
            args += ["--base", f"{self.base_rps:g}"]
        for option, seconds in (
            ("--warm", self.warm_s),
            ("--ramp", self.ramp_s),
            ("--hold", self.hold_s),
            ("--cool", self.cool_s),
            ("--max-time-to-scale", c.max_time_to_scale_s),
            ("--max-time-to-recover", c.max_time_to_recover_s),
        ):
            args += [option, f"{seconds:g}s"]
        args += ["--min-slo", f"{c.min_slo_attainment:g}", "--max-shed", f"{c.max_shed_rate:g}"]
        return args


def drill_refusal(g: GroupSpec) -> tuple[str, str] | None:
    """Why a group cannot be drilled, as (its field, the message with the fix); None: it can.
    A drill checks that autoscaling reacts to a peak and judges SLO attainment."""
    auto = g.autoscaling
    if auto is None:
        return "autoscaling", (
            f"group {g.name!r} has autoscaling off: a drill checks that autoscaling reacts "
            "to a peak; add an autoscaling block (min, max) first, or load-test its fixed "
            "fleet with `sluice loadtest`"
        )
    if auto.mode == "advisory":
        return "autoscaling.mode", (
            f"group {g.name!r} autoscales in advisory mode: its decisions are advice, nothing "
            "acts on a peak; drill it once autoscaling.mode is active"
        )
    if g.slo is None or not g.slo.latency_ms:
        return "slo", "a drill judges SLO attainment: give slo.latency_ms"
    return None
