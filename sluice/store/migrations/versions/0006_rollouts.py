"""Rollouts: the archive of every canary rollout (C6).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "rollouts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("baseline", sa.String(255), nullable=False),
        sa.Column("canary", sa.String(255), nullable=False),
        sa.Column("phase", sa.String(32), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.Column("started_by", sa.String(255), nullable=False),
        sa.Column("spec", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("compare", sa.Text(), nullable=True),
        sa.Column("conclusion", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_rollouts"),
    )
    op.create_index("ix_rollouts_name_id", "rollouts", ["name", "id"])


def downgrade() -> None:
    op.drop_index("ix_rollouts_name_id", "rollouts")
    op.drop_table("rollouts")
