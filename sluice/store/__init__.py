"""Durable state (spec revisions, audit, events, instances, overrides) behind one `Store`."""

from sluice.store.records import (
    AuditEntry,
    Event,
    InstanceRecord,
    Loan,
    Proposal,
    Revision,
    RolloutRecord,
    ScalingDecision,
    TokenRecord,
)
from sluice.store.store import Store

__all__ = [
    "AuditEntry",
    "Event",
    "InstanceRecord",
    "Loan",
    "Proposal",
    "Revision",
    "RolloutRecord",
    "ScalingDecision",
    "Store",
    "TokenRecord",
]
