"""PostgreSQL: 64-bit row ids, as SQLite's INTEGER PRIMARY KEY always is. An append-only
table at 100 rows a second passes 2**31 ids in eight months (pruning never reuses one), and
the control API takes ids up to 2**63 - 1. Nothing changes on SQLite.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = (
    "audit_log",
    "events",
    "scaling_decisions",
    "quota_loans",
    "rollouts",
    "proposals",
    "tokens",
    "console_sessions",
    "alert_deliveries",
    "capacity_runs",
    "drill_fires",
)
"""Every table whose `id` the database assigns (a SERIAL column on PostgreSQL)."""


def _retype(new: sa.types.TypeEngine[int], old: sa.types.TypeEngine[int], seq_as: str) -> None:
    if op.get_context().dialect.name != "postgresql":
        return
    for table in TABLES:
        op.alter_column(table, "id", type_=new, existing_type=old, existing_nullable=False)
        op.execute(f"ALTER SEQUENCE {table}_id_seq AS {seq_as}")
    op.alter_column("drill_fires", "run_id", type_=new, existing_type=old, existing_nullable=True)


def upgrade() -> None:
    _retype(sa.BigInteger(), sa.Integer(), "bigint")


def downgrade() -> None:
    _retype(sa.Integer(), sa.BigInteger(), "integer")
