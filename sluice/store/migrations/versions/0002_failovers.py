"""Failovers: the escape hatch that sends a group's traffic to its backup until restored.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "failovers",
        sa.Column("group_name", sa.String(255), nullable=False),
        sa.Column("backup", sa.String(255), nullable=False),
        sa.Column("actor", sa.String(255), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("set_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("group_name", name="pk_failovers"),
    )


def downgrade() -> None:
    op.drop_table("failovers")
