"""Durable state (spec revisions, audit, events, instances, overrides) behind one `Store`."""

from sluice.store.history import AlertDelivery, RollupRow
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
    "AlertDelivery",
    "AuditEntry",
    "Event",
    "InstanceRecord",
    "Loan",
    "Proposal",
    "Revision",
    "RolloutRecord",
    "RollupRow",
    "ScalingDecision",
    "Store",
    "TokenRecord",
]
