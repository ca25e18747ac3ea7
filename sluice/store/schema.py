"""Table definitions: the one source the migrations must match (a test checks parity).

Only portable types (Integer, String, Float, Text) so the same schema runs on SQLite and
PostgreSQL; JSON is stored as text. Changing anything here needs a new Alembic revision.
PostgreSQL enforces a String's length (SQLite does not): every value that goes in one is
bounded where it comes in (names by the spec's and the API's patterns), and ids the
database assigns are `RowId`s, 64-bit on both.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Float, Index, Integer, MetaData, String, Table, Text

__all__ = [
    "RowId",
    "alert_deliveries",
    "audit_log",
    "capacity_runs",
    "drill_fires",
    "events",
    "failovers",
    "instances",
    "leases",
    "metadata",
    "metric_rollups",
    "proposals",
    "quota_loans",
    "replica_overrides",
    "replica_pins",
    "revisions",
]

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

RowId = BigInteger().with_variant(Integer(), "sqlite")
"""An id the database assigns: SQLite's INTEGER PRIMARY KEY (its rowid, 64-bit) or, on
PostgreSQL, a BIGSERIAL (migration 0015)."""

# The primary key on `number` is what makes revision numbers unique under concurrent writers.
revisions = Table(
    "spec_revisions",
    metadata,
    Column("number", Integer, primary_key=True, autoincrement=False),
    Column("created_at", Float, nullable=False),
    Column("author", String(255), nullable=False),
    Column("reason", Text, nullable=False),
    Column("yaml_text", Text, nullable=False),
    Column("diff", Text, nullable=False),
    Column("epoch", Integer, nullable=True),
)

audit_log = Table(
    "audit_log",
    metadata,
    Column("id", RowId, primary_key=True),
    Column("at", Float, nullable=False),
    Column("actor", String(255), nullable=False),
    Column("action", String(255), nullable=False),
    Column("target", String(255), nullable=False),
    Column("reason", Text, nullable=False),
    Column("detail", Text, nullable=False),
    Column("epoch", Integer, nullable=True),
    Index(None, "target", "id"),
)

events = Table(
    "events",
    metadata,
    Column("id", RowId, primary_key=True),
    Column("at", Float, nullable=False),
    Column("group_name", String(255), nullable=False),
    Column("instance", String(255), nullable=True),
    Column("kind", String(255), nullable=False),
    Column("message", Text, nullable=False),
    Column("detail", Text, nullable=False),
    Column("epoch", Integer, nullable=True),
    Index(None, "group_name", "id"),
)

instances = Table(
    "instances",
    metadata,
    Column("id", String(255), primary_key=True),
    Column("group_name", String(255), nullable=False),
    Column("template", String(255), nullable=False),
    Column("state", String(32), nullable=False),
    Column("pid", Integer, nullable=True),
    Column("host", String(255), nullable=True),
    Column("port", Integer, nullable=True),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Column("reason", Text, nullable=False),
    Column("devices", Text, nullable=False, server_default=""),
    Column("epoch", Integer, nullable=True),
)

replica_overrides = Table(
    "replica_overrides",
    metadata,
    Column("group_name", String(255), primary_key=True),
    Column("replicas", Integer, nullable=False),
    Column("actor", String(255), nullable=False),
    Column("reason", Text, nullable=False),
    Column("set_at", Float, nullable=False),
    Column("epoch", Integer, nullable=True),
)

replica_pins = Table(
    "replica_pins",
    metadata,
    Column("group_name", String(255), primary_key=True),
    Column("replicas", Integer, nullable=False),
    Column("actor", String(255), nullable=False),
    Column("reason", Text, nullable=False),
    Column("set_at", Float, nullable=False),
    Column("until", Float, nullable=False),
)
"""A group held at a count whatever its autoscaler says (`sluice loadtest` pins one
instance), until `until`: a pin whose holder died runs out by itself."""

# The escape hatch (`sluice route failover GROUP --to BACKUP`): in force until restored.
failovers = Table(
    "failovers",
    metadata,
    Column("group_name", String(255), primary_key=True),
    Column("backup", String(255), nullable=False),
    Column("actor", String(255), nullable=False),
    Column("reason", Text, nullable=False),
    Column("set_at", Float, nullable=False),
    Column("epoch", Integer, nullable=True),
)

scaling_decisions = Table(
    "scaling_decisions",
    metadata,
    Column("id", RowId, primary_key=True),
    Column("at", Float, nullable=False),
    Column("group_name", String(255), nullable=False),
    Column("policy", String(64), nullable=False),
    Column("current", Integer, nullable=False),
    Column("desired", Integer, nullable=False),
    Column("winner", String(255), nullable=True),
    Column("reason", Text, nullable=False),
    Column("detail", Text, nullable=False),
    Index(None, "group_name", "id"),
)
"""The autoscaler's journal (S11): signals, proposals, the winning signal, clipping guards."""

quota_loans = Table(
    "quota_loans",
    metadata,
    Column("id", RowId, primary_key=True),
    Column("lender", String(255), nullable=True),
    Column("borrower", String(255), nullable=False),
    Column("pool", String(255), nullable=False),
    Column("units", Integer, nullable=False),
    Column("started_at", Float, nullable=False),
    Column("reclaim_requested_at", Float, nullable=True),
    Column("ended_at", Float, nullable=True),
    Column("reason", Text, nullable=False),
    Column("end_reason", Text, nullable=False),
    Column("reclaim_latency_s", Float, nullable=True),
    Index(None, "ended_at", "id"),
    Index(None, "borrower", "id"),
    Index(None, "lender", "id"),
)
"""The borrow ledger (Q4): every loan of units above a guarantee, from start to return.
`lender` NULL: the pool's unassigned units. `ended_at` NULL: the loan is open."""

controller_state = Table(
    "controller_state",
    metadata,
    Column("key", String(255), primary_key=True),
    Column("value", Text, nullable=False),
    Column("updated_at", Float, nullable=False),
)
"""Small JSON documents the controller keeps across restarts (e.g. the quota allocator's
grace timers and the month-to-date spend)."""

rollouts = Table(
    "rollouts",
    metadata,
    Column("id", RowId, primary_key=True),
    Column("name", String(255), nullable=False),
    Column("baseline", String(255), nullable=False),
    Column("canary", String(255), nullable=False),
    Column("phase", String(32), nullable=False),
    Column("started_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Column("ended_at", Float, nullable=True),
    Column("started_by", String(255), nullable=False),
    Column("spec", Text, nullable=False),
    Column("state", Text, nullable=False),
    Column("compare", Text, nullable=True),
    Column("conclusion", Text, nullable=False),
    Index(None, "name", "id"),
)
"""The rollout archive (C6): each run's spec, its state machine (timeline and every step's
analysis), the compare report and the conclusion."""

proposals = Table(
    "proposals",
    metadata,
    Column("id", RowId, primary_key=True),
    Column("created_at", Float, nullable=False),
    Column("author", String(255), nullable=False),
    Column("reason", Text, nullable=False),
    Column("base_revision", Integer, nullable=False),
    Column("yaml_text", Text, nullable=False),
    Column("diff", Text, nullable=False),
    Column("preview", Text, nullable=False),
    Column("state", String(32), nullable=False),
    Column("reviewer", String(255), nullable=True),
    Column("reviewed_at", Float, nullable=True),
    Column("review_reason", Text, nullable=True),
    Column("revision", Integer, nullable=True),
    Column("author_person", String(255), nullable=False, server_default=""),
    Column("reviewer_person", String(255), nullable=True),
    Index(None, "state", "id"),
)
"""Reviewed spec changes (R5): proposed by one person, approved (then applied as `revision`)
or rejected by another; `preview` is the impact preview's JSON. `author`/`reviewer` are
token names, `author_person`/`reviewer_person` the persons holding them (migration 0016):
approval compares persons."""

tokens = Table(
    "tokens",
    metadata,
    Column("id", RowId, primary_key=True),
    Column("name", String(255), nullable=False, unique=True),
    Column("role", String(32), nullable=False),
    Column("groups", Text, nullable=True),
    Column("digest", String(64), nullable=False, unique=True),
    Column("created_at", Float, nullable=False),
    Column("created_by", String(255), nullable=False),
    Column("expires_at", Float, nullable=True),
    Column("revoked_at", Float, nullable=True),
    Column("revoked_by", String(255), nullable=True),
    Column("person", String(255), nullable=False, server_default=""),
)
"""API tokens (who may drive the control API): only the sha256 of each token is kept, the
token itself is shown once, at creation; `groups` (JSON list) scopes an operator; `person`
(lower-case) is who holds it (see `sluice.control.tokens`; migration 0016)."""

console_sessions = Table(
    "console_sessions",
    metadata,
    Column("id", RowId, primary_key=True),
    Column("digest", String(64), nullable=False, unique=True),
    Column("token_name", String(255), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("ended_at", Float, nullable=True),
)
"""Console log-ins: the sha256 of each session cookie (never the cookie), the token it was
made from (whose role and revocation it follows), and when it ends."""

metric_rollups = Table(
    "metric_rollups",
    metadata,
    Column("group_name", String(255), primary_key=True),
    Column("step_s", Integer, primary_key=True, autoincrement=False),
    Column("start", Float, primary_key=True),
    Column("data", Text, nullable=False),
    Index(None, "step_s", "start"),
)
"""Metrics history (O3): one row per group per minute (`step_s` 60) or hour (3600), the
`sluice.policy.history.Rollup` of that span as JSON (counters, histogram buckets, gauges)."""

alert_deliveries = Table(
    "alert_deliveries",
    metadata,
    Column("id", RowId, primary_key=True),
    Column("created_at", Float, nullable=False),
    Column("group_name", String(255), nullable=False),
    Column("rule", String(255), nullable=False),
    Column("state", String(32), nullable=False),
    Column("payload", Text, nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("next_at", Float, nullable=True),
    Column("delivered_at", Float, nullable=True),
    Column("dead_at", Float, nullable=True),
    Column("last_error", Text, nullable=False),
    Index(None, "next_at"),
    Index(None, "group_name", "id"),
)
"""The alert outbox (O2): each firing or resolved message, until its group's
`alert_channel` took it (`delivered_at`) or every attempt failed (`dead_at`: the
dead-letter record). `next_at` NULL: nothing more to try. The channel itself is read from
the spec at delivery time, so a webhook URL (which may carry a token) is never copied."""

capacity_runs = Table(
    "capacity_runs",
    metadata,
    Column("id", RowId, primary_key=True),
    Column("kind", String(32), nullable=False),
    Column("group_name", String(255), nullable=False),
    Column("version", String(255), nullable=False),
    Column("mode", String(32), nullable=False),
    Column("verdict", String(32), nullable=False),
    Column("actor", String(255), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("report", Text, nullable=False),
    Index(None, "group_name", "kind", "id"),
)
"""Capacity tests (O4, `kind` "loadtest") and peak drills (O5, "drill"), each the JSON
report the CLI printed: a group's history per model `version`, so a new version's knee can
be set beside the old one's. `mode`: "live" or "simulated"; `verdict`: the drill's
pass/fail, or the load test's "measured"/"inconclusive"."""

drill_fires = Table(
    "drill_fires",
    metadata,
    Column("id", RowId, primary_key=True),
    Column("schedule", String(255), nullable=False),
    Column("group_name", String(255), nullable=False),
    Column("trigger", String(32), nullable=False),
    Column("actor", String(255), nullable=False),
    Column("due_at", Float, nullable=False),
    Column("started_at", Float, nullable=False),
    Column("finished_at", Float, nullable=True),
    Column("status", String(32), nullable=False),
    Column("token", String(255), nullable=True),
    Column("run_id", RowId, nullable=True),
    Column("detail", Text, nullable=False),
    Index(None, "schedule", "id"),
)
"""Each firing of a scheduled drill (`drills:` in the spec): `trigger` "cron" or "manual",
`status` running, then passed/failed (the drill's verdict), error, missed (found past its
starting deadline) or skipped (a drill on the group was still running). `token`: the
short-lived token the drill ran with (revoked when it ended); `run_id`: its capacity run."""


leases = Table(
    "leases",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("holder", String(255), nullable=False),
    Column("epoch", Integer, nullable=False),
    Column("acquired_at", Float, nullable=False),
    Column("renewed_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
)
"""Leader leases (`controller`): one row each, changed only by compare-and-swap on `epoch`
(`store.leases`), which grows at each change of holder and fences a deposed leader: every
write of a leader checks it in its own transaction (`store.fencing`), and the `epoch`
column of the revisions, audit, events, instances, overrides and failovers says which
leadership wrote each row (NULL: a write of no leader, such as a CLI's)."""
