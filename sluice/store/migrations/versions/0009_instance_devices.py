"""Instances remember the devices they are pinned to, so a restart that adopts one does not
hand its devices to a new instance.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-10
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("instances", sa.Column("devices", sa.Text(), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("instances") as batch:
        batch.drop_column("devices")
