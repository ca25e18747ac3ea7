"""Quota (Q1-Q6), pure: grants per group each tick, loans, reclaims, and the under-use report."""

from sluice.policy.quota.advisory import AdvisedAllocation, allocate_advised
from sluice.policy.quota.allocate import allocate
from sluice.policy.quota.loans import (
    Holding,
    LedgerChanges,
    OpenLoan,
    attribute_loans,
    ledger_changes,
    reclaim_loan_ids,
)
from sluice.policy.quota.model import (
    Allocation,
    Grant,
    GroupClaim,
    Loan,
    PendingReclaim,
    PoolState,
    Purpose,
    QuotaState,
    Reclaim,
    Running,
    RunningInstance,
    hours_left_in_month,
)
from sluice.policy.quota.underuse import Underuse, UsageSample, underused_groups

__all__ = [
    "AdvisedAllocation",
    "Allocation",
    "Grant",
    "GroupClaim",
    "Holding",
    "LedgerChanges",
    "Loan",
    "OpenLoan",
    "PendingReclaim",
    "PoolState",
    "Purpose",
    "QuotaState",
    "Reclaim",
    "Running",
    "RunningInstance",
    "Underuse",
    "UsageSample",
    "allocate",
    "allocate_advised",
    "attribute_loans",
    "hours_left_in_month",
    "ledger_changes",
    "reclaim_loan_ids",
    "underused_groups",
]
