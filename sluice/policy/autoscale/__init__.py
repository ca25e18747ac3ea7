"""Autoscaling policies (pure): one object per group, fed a `GroupLoad` every tick."""

from sluice.policy.autoscale.base import Autoscaler, Decision, GroupLoad
from sluice.policy.autoscale.factory import POLICY_NAMES, build_autoscaler
from sluice.policy.autoscale.fixed import FixedPolicy
from sluice.policy.autoscale.hpa import HpaPolicy
from sluice.policy.autoscale.kpa import KpaPolicy
from sluice.policy.autoscale.schedule import ScheduleFloors, resolve_schedules
from sluice.policy.autoscale.sluice import SluicePolicy

__all__ = [
    "POLICY_NAMES",
    "Autoscaler",
    "Decision",
    "FixedPolicy",
    "GroupLoad",
    "HpaPolicy",
    "KpaPolicy",
    "ScheduleFloors",
    "SluicePolicy",
    "build_autoscaler",
    "resolve_schedules",
]
