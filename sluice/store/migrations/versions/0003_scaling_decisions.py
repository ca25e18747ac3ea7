"""Scaling decisions: the autoscaler's journal, so every change can be explained (S11).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "scaling_decisions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("group_name", sa.String(255), nullable=False),
        sa.Column("policy", sa.String(64), nullable=False),
        sa.Column("current", sa.Integer(), nullable=False),
        sa.Column("desired", sa.Integer(), nullable=False),
        sa.Column("winner", sa.String(255), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_scaling_decisions"),
    )
    op.create_index("ix_scaling_decisions_group_name_id", "scaling_decisions", ["group_name", "id"])


def downgrade() -> None:
    op.drop_index("ix_scaling_decisions_group_name_id", "scaling_decisions")
    op.drop_table("scaling_decisions")
