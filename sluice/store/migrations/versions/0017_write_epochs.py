"""Write epochs: the revisions, audit rows, events, instance records, replica overrides and
failovers keep the lease epoch of the leader that wrote them (issue 31: every write of a
controller is fenced by its epoch, `sluice.store.fencing`). NULL for rows written before,
and for writes of no leader (a CLI with store access, a test).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("spec_revisions", "audit_log", "events", "instances", "replica_overrides", "failovers")


def upgrade() -> None:
    # nullable, no default: SQLite adds such a column without rebuilding the table
    for table in TABLES:
        op.add_column(table, sa.Column("epoch", sa.Integer(), nullable=True))


def downgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_column("epoch")
