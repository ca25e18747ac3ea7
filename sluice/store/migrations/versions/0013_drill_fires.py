"""Firings of scheduled drills.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "drill_fires",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("schedule", sa.String(255), nullable=False),
        sa.Column("group_name", sa.String(255), nullable=False),
        sa.Column("trigger", sa.String(32), nullable=False),
        sa.Column("actor", sa.String(255), nullable=False),
        sa.Column("due_at", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("token", sa.String(255), nullable=True),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_drill_fires"),
    )
    op.create_index("ix_drill_fires_schedule_id", "drill_fires", ["schedule", "id"])


def downgrade() -> None:
    op.drop_index("ix_drill_fires_schedule_id", table_name="drill_fires")
    op.drop_table("drill_fires")
