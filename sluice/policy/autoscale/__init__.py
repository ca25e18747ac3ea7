"""Autoscaling policies (pure): one configuration object per group, and a frozen memory
value it steps every tick (`ScalingPolicy.step`); `Stateful` keeps the memory for callers
that want one object per group (`Autoscaler.decide`)."""

from sluice.policy.autoscale.base import (
    Autoscaler,
    Decision,
    GroupLoad,
    ScalingPolicy,
    Stateful,
    TokenLoad,
)
from sluice.policy.autoscale.factory import POLICY_NAMES, build_autoscaler, build_policy
from sluice.policy.autoscale.fixed import FixedPolicy, NoMemory
from sluice.policy.autoscale.hpa import HpaMemory, HpaPolicy
from sluice.policy.autoscale.kpa import KpaMemory, KpaPolicy
from sluice.policy.autoscale.schedule import ScheduleFloors, resolve_schedules
from sluice.policy.autoscale.sluice import SluiceMemory, SluicePolicy

__all__ = [
    "POLICY_NAMES",
    "Autoscaler",
    "Decision",
    "FixedPolicy",
    "GroupLoad",
    "HpaMemory",
    "HpaPolicy",
    "KpaMemory",
    "KpaPolicy",
    "NoMemory",
    "ScalingPolicy",
    "ScheduleFloors",
    "SluiceMemory",
    "SluicePolicy",
    "Stateful",
    "TokenLoad",
    "build_autoscaler",
    "build_policy",
    "resolve_schedules",
]
