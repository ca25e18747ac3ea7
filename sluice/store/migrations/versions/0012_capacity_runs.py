"""Capacity tests and drills (their reports per group and version) and replica pins.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "replica_pins",
        sa.Column("group_name", sa.String(255), nullable=False),
        sa.Column("replicas", sa.Integer(), nullable=False),
        sa.Column("actor", sa.String(255), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("set_at", sa.Float(), nullable=False),
        sa.Column("until", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("group_name", name="pk_replica_pins"),
    )
    op.create_table(
        "capacity_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("group_name", sa.String(255), nullable=False),
        sa.Column("version", sa.String(255), nullable=False),
        sa.Column("mode", sa.String(32), nullable=False),
        sa.Column("verdict", sa.String(32), nullable=False),
        sa.Column("actor", sa.String(255), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("report", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_capacity_runs"),
    )
    op.create_index(
        "ix_capacity_runs_group_name_kind_id", "capacity_runs", ["group_name", "kind", "id"]
    )


def downgrade() -> None:
    op.drop_index("ix_capacity_runs_group_name_kind_id", table_name="capacity_runs")
    op.drop_table("capacity_runs")
    op.drop_table("replica_pins")
