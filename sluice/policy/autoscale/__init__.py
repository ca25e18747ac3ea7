"""Autoscaling policies (pure): one object per group, fed a `GroupLoad` every tick."""

from sluice.policy.autoscale.base import Autoscaler, Decision, GroupLoad

__all__ = ["Autoscaler", "Decision", "GroupLoad"]
