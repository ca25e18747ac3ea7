"""Persons: every token belongs to a person, and a proposal records its author's and its
reviewer's person, so that two-person review compares people, not token names (issue 31).

A token already issued becomes its own person (named like the token, lower-case), and an
existing proposal's author and reviewer the persons of their tokens: what review meant
before, one token one person.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # NOT NULL with a server default: SQLite adds such a column without rebuilding the table.
    op.add_column("tokens", sa.Column("person", sa.String(255), nullable=False, server_default=""))
    op.execute("UPDATE tokens SET person = lower(name)")
    op.add_column(
        "proposals",
        sa.Column("author_person", sa.String(255), nullable=False, server_default=""),
    )
    op.add_column("proposals", sa.Column("reviewer_person", sa.String(255), nullable=True))
    op.execute(
        "UPDATE proposals SET author_person = lower(author), reviewer_person = lower(reviewer)"
    )


def downgrade() -> None:
    with op.batch_alter_table("proposals") as batch:
        batch.drop_column("reviewer_person")
        batch.drop_column("author_person")
    with op.batch_alter_table("tokens") as batch:
        batch.drop_column("person")
