"""Alembic entry point for the store's migrations.

`Store.open` passes its own connection (already inside a write transaction) through
`config.attributes["connection"]`, so upgrades share the store's engine, pragmas and locking.
Without one, `sqlalchemy.url` from the Alembic config is used, e.g. for `alembic revision
--autogenerate` during development or `alembic upgrade head --sql` for a PostgreSQL DBA.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine

from sluice.store.schema import metadata

config = context.config


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=metadata)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=metadata,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()
elif (shared := config.attributes.get("connection")) is not None:
    _run(shared)
else:
    engine = create_engine(config.get_main_option("sqlalchemy.url", ""))
    try:
        with engine.connect() as own:
            _run(own)
    finally:
        engine.dispose()
