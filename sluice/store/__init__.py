"""Durable state (spec revisions, audit, events, instances, overrides) behind one `Store`."""

from sluice.store.capacity import CapacityRun, DrillFire, Pin
from sluice.store.fencing import Fence, Fenced
from sluice.store.history import AlertDelivery, RollupRow
from sluice.store.leases import LeaseRecord
from sluice.store.outage import outage_reason, store_unavailable
from sluice.store.records import (
    AuditEntry,
    Event,
    InstanceRecord,
    Loan,
    Proposal,
    Revision,
    RolloutRecord,
    ScalingDecision,
    SessionRecord,
    TokenRecord,
)
from sluice.store.store import Store, redacted

__all__ = [
    "AlertDelivery",
    "AuditEntry",
    "CapacityRun",
    "DrillFire",
    "Event",
    "Fence",
    "Fenced",
    "InstanceRecord",
    "LeaseRecord",
    "Loan",
    "Pin",
    "Proposal",
    "Revision",
    "RolloutRecord",
    "RollupRow",
    "ScalingDecision",
    "SessionRecord",
    "Store",
    "TokenRecord",
    "outage_reason",
    "redacted",
    "store_unavailable",
]
