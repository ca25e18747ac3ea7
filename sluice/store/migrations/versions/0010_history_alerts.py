"""Metrics history (per-group minute and hour rollups) and the alert outbox.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "metric_rollups",
        sa.Column("group_name", sa.String(255), nullable=False),
        sa.Column("step_s", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("start", sa.Float(), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("group_name", "step_s", "start", name="pk_metric_rollups"),
    )
    op.create_index("ix_metric_rollups_step_s_start", "metric_rollups", ["step_s", "start"])
    op.create_table(
        "alert_deliveries",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("group_name", sa.String(255), nullable=False),
        sa.Column("rule", sa.String(255), nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_at", sa.Float(), nullable=True),
        sa.Column("delivered_at", sa.Float(), nullable=True),
        sa.Column("dead_at", sa.Float(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_alert_deliveries"),
    )
    op.create_index("ix_alert_deliveries_next_at", "alert_deliveries", ["next_at"])
    op.create_index("ix_alert_deliveries_group_name_id", "alert_deliveries", ["group_name", "id"])


def downgrade() -> None:
    op.drop_table("alert_deliveries")
    op.drop_table("metric_rollups")
