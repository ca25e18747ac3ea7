"""The store's narrow interfaces: each part of the control plane is handed the records it
uses, not the whole `Store` (70 methods), so what a module may read and write is in its
signature and a test can hand it a small fake. `Store` has every one of them (mypy checks
it where a `Store` is passed for one)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, Protocol

from sluice.store.capacity import DrillFire, Pin
from sluice.store.fencing import Fence
from sluice.store.history import AlertDelivery, RollupRow
from sluice.store.leases import LeaseRecord
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
from sluice.store.retention import Pruned

__all__ = [
    "AuditRecords",
    "DecisionRecords",
    "DeliveryRecords",
    "DrillRecords",
    "EventRecords",
    "InstanceRecords",
    "LeaseRecords",
    "LoanRecords",
    "PinRecords",
    "ProposalRecords",
    "RetentionRecords",
    "RolloutRecords",
    "RollupRecords",
    "SessionRecords",
    "StateRecords",
    "TokenRecords",
]


class PinRecords(Protocol):
    def set_pin(self, pin: Pin) -> None: ...
    def clear_pin(self, group: str) -> None: ...
    def pins(self) -> list[Pin]: ...


class TokenRecords(Protocol):
    """Tokens as `sluice token` manages them (with `AuditRecords` for who did it)."""

    def add_token(
        self,
        *,
        name: str,
        role: str,
        groups: list[str] | None,
        digest: str,
        created_by: str,
        expires_at: float | None,
        now: float,
        person: str | None = None,
    ) -> TokenRecord: ...
    def get_token(self, name: str) -> TokenRecord: ...
    def list_tokens(self) -> list[TokenRecord]: ...
    def revoke_token(self, name: str, *, by: str, now: float) -> TokenRecord: ...
    def delete_token(self, name: str) -> TokenRecord | None: ...


class AuditRecords(Protocol):
    def append_audit(
        self,
        *,
        actor: str,
        action: str,
        target: str,
        reason: str,
        detail: dict[str, Any],
        now: float,
    ) -> AuditEntry: ...


class LeaseRecords(Protocol):
    def acquire_lease(
        self, name: str, holder: str, now: float, ttl_s: float, *, dead_holder: str | None = None
    ) -> LeaseRecord | None: ...
    def renew_lease(self, name: str, holder: str, epoch: int, now: float, ttl_s: float) -> bool: ...
    def release_lease(self, name: str, holder: str, epoch: int, now: float) -> None: ...
    def get_lease(self, name: str) -> LeaseRecord | None: ...
    def fence(self, fence: Fence | None) -> None: ...


class RollupRecords(Protocol):
    def write_rollups(self, rows: Sequence[RollupRow]) -> None: ...
    def read_rollups(
        self, step_s: int, since: float, until: float, groups: Sequence[str] | None = None
    ) -> list[RollupRow]: ...
    def latest_rollup(self, step_s: int) -> float | None: ...


class RetentionRecords(Protocol):
    def prune(
        self,
        *,
        events_before: float,
        decisions_before: float,
        loans_ended_before: float,
        audit_before: float,
    ) -> Pruned: ...
    def prune_deliveries(self, before: float) -> int: ...
    def prune_rollups(self, step_s: int, before: float) -> int: ...
    def prune_sessions(self, *, before: float) -> int: ...
    def prune_drill_fires(self, before: float) -> int: ...
    def prune_capacity_runs(self, before: float, *, keep_loadtests: int) -> int: ...
    def prune_proposals(self, before: float) -> int: ...
    def prune_rollouts(self, before: float) -> int: ...
    def prune_tokens(self, ended_before: float) -> int: ...


class SessionRecords(Protocol):
    @property
    def location(self) -> str: ...

    def add_session(
        self, *, digest: str, token_name: str, now: float, expires_at: float
    ) -> None: ...
    def end_session(self, digest: str, *, now: float) -> None: ...
    def session_by_digest(self, digest: str) -> tuple[SessionRecord, TokenRecord | None] | None: ...
    def token_by_digest(self, digest: str) -> TokenRecord | None: ...


class ProposalRecords(Protocol):
    def latest_revision(self) -> Revision | None: ...
    def get_token(self, name: str) -> TokenRecord: ...
    def list_tokens(self) -> list[TokenRecord]: ...

    def add_proposal(
        self,
        *,
        author: str,
        reason: str,
        base_revision: int,
        yaml_text: str,
        diff: str,
        preview: dict[str, Any],
        now: float,
        author_person: str | None = None,
    ) -> Proposal: ...
    def get_proposal(self, proposal_id: int) -> Proposal: ...
    def list_proposals(
        self, *, state: str | None = "pending", limit: int = 50
    ) -> list[Proposal]: ...
    def review_proposal(
        self,
        proposal_id: int,
        *,
        state: str,
        reviewer: str,
        reason: str,
        now: float,
        revision: int | None = None,
        reviewer_person: str | None = None,
    ) -> Proposal: ...


class DrillRecords(Protocol):
    def add_drill_fire(
        self,
        *,
        schedule: str,
        group: str,
        trigger: str,
        actor: str,
        due_at: float,
        status: str,
        now: float,
        detail: dict[str, Any],
        token: str | None = None,
    ) -> int: ...
    def finish_drill_fire(
        self, fire_id: int, *, status: str, run_id: int | None, detail: dict[str, Any], now: float
    ) -> None: ...
    def get_drill_fire(self, fire_id: int) -> DrillFire: ...
    def list_drill_fires(
        self,
        *,
        schedule: str | None = None,
        status: str | None = None,
        limit: int = 20,
        groups: Collection[str] | None = None,
    ) -> list[DrillFire]: ...
    def last_cron_firings(self) -> dict[str, float]: ...


class InstanceRecords(Protocol):
    @property
    def write_fence(self) -> Fence | None: ...

    def upsert_instance(self, rec: InstanceRecord) -> None: ...
    def list_instances(self, *, include_stopped: bool = False) -> list[InstanceRecord]: ...
    def delete_instance(self, instance_id: str) -> None: ...


class LoanRecords(Protocol):
    def open_loan(
        self, *, lender: str | None, borrower: str, pool: str, units: int, reason: str, now: float
    ) -> int: ...
    def close_loan(self, loan_id: int, now: float, end_reason: str) -> Loan: ...
    def list_loans(
        self, *, open_only: bool = False, group: str | None = None, limit: int = 100
    ) -> list[Loan]: ...
    def request_reclaim(self, loan_id: int, now: float) -> None: ...


class StateRecords(Protocol):
    def put_state(self, key: str, value: dict[str, Any], now: float) -> None: ...
    def get_state(self, key: str) -> dict[str, Any] | None: ...


class RolloutRecords(Protocol):
    def add_rollout(
        self,
        *,
        name: str,
        baseline: str,
        canary: str,
        phase: str,
        started_by: str,
        spec: dict[str, Any],
        state: dict[str, Any],
        now: float,
    ) -> int: ...
    def list_rollouts(
        self, *, name: str | None = None, active_only: bool = False, limit: int = 50
    ) -> list[RolloutRecord]: ...
    def update_rollout(
        self,
        rollout_id: int,
        *,
        phase: str,
        state: dict[str, Any],
        now: float,
        ended: bool = False,
        conclusion: str | None = None,
        compare: dict[str, Any] | None = None,
    ) -> None: ...


class DecisionRecords(Protocol):
    def append_decision(
        self,
        *,
        group: str,
        policy: str,
        current: int,
        desired: int,
        winner: str | None,
        reason: str,
        detail: dict[str, Any],
        now: float,
    ) -> ScalingDecision: ...


class DeliveryRecords(Protocol):
    def add_delivery(
        self, *, group: str, rule: str, state: str, payload: dict[str, Any], now: float
    ) -> int: ...
    def due_deliveries(self, now: float, limit: int = 100) -> list[AlertDelivery]: ...
    def list_deliveries(
        self, group: str | None = None, undelivered: bool = False, limit: int = 100
    ) -> list[AlertDelivery]: ...
    def record_attempt(
        self,
        delivery_id: int,
        *,
        now: float,
        delivered: bool,
        error: str = "",
        retry_at: float | None = None,
    ) -> None: ...


class EventRecords(Protocol):
    def append_event(
        self,
        *,
        group: str,
        instance: str | None,
        kind: str,
        message: str,
        detail: dict[str, Any],
        now: float,
    ) -> Event: ...
