"""Quota loans: the borrow ledger, one row per loan from start to return (Q4).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "quota_loans",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("lender", sa.String(255), nullable=True),
        sa.Column("borrower", sa.String(255), nullable=False),
        sa.Column("pool", sa.String(255), nullable=False),
        sa.Column("units", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("reclaim_requested_at", sa.Float(), nullable=True),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("end_reason", sa.Text(), nullable=False),
        sa.Column("reclaim_latency_s", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_quota_loans"),
    )
    op.create_index("ix_quota_loans_ended_at_id", "quota_loans", ["ended_at", "id"])
    op.create_index("ix_quota_loans_borrower_id", "quota_loans", ["borrower", "id"])
    op.create_index("ix_quota_loans_lender_id", "quota_loans", ["lender", "id"])


def downgrade() -> None:
    op.drop_index("ix_quota_loans_lender_id", "quota_loans")
    op.drop_index("ix_quota_loans_borrower_id", "quota_loans")
    op.drop_index("ix_quota_loans_ended_at_id", "quota_loans")
    op.drop_table("quota_loans")
