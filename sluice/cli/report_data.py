"""What `sluice report usage` (with its reclaim verdicts) and `sluice groups doc` read from
the store: imported only when one of them runs (it brings the policy code and its numeric
libraries, which every other command would otherwise pay for at start-up)."""

from __future__ import annotations

from typing import Any

from sluice.cli.common import state_store
from sluice.config import Settings
from sluice.control.observer import stored_rollups
from sluice.control.reclaim import PROPOSALS_READ, verdicts
from sluice.core import NotFound
from sluice.policy.history import HOUR_S, MINUTE_S, merge
from sluice.policy.usage import usage_report
from sluice.spec import PlatformSpec, load_spec_text
from sluice.store import Store
from sluice.tools.groups_doc import groups_directory

__all__ = ["groups_document", "open_store", "usage_document"]

ALERT_KINDS = ("alert_firing", "alert_resolved")
ALERT_EVENTS_READ = 10_000
"""At most this many alert events are read for the 24 h counts (newest first)."""


def open_store(home: str | None) -> Store:
    """The state directory's store (or $SLUICE_DATABASE_URL's); NotFound (exit 4) when the
    directory has none: a report must not create an empty state directory."""
    settings = Settings.from_env(home)
    db = settings.home / "state.db"
    if settings.database_url is None and not db.is_file():
        raise NotFound(
            f"no state database at {db}: run `sluice up` first, or point --home / "
            "$SLUICE_HOME at a state directory",
            home=str(settings.home),
        )
    return state_store(settings)


def latest_spec(store: Store) -> tuple[PlatformSpec | None, int | None]:
    rev = store.latest_revision()
    if rev is None:
        return None, None
    return load_spec_text(rev.yaml_text, f"revision {rev.number}").spec, rev.number


def usage_document(store: Store, since: float, until: float) -> dict[str, Any]:
    """The usage report over [since, until) from the stored hour rows (plus the minutes of
    the hours not merged yet), against the latest revision's spec."""
    spec, number = latest_spec(store)
    hours = stored_rollups(store, None, since, until, HOUR_S)
    doc = usage_report(spec, hours, since, until)
    reclaim = []
    if spec is not None:  # what `--propose` would file, and why not for the others
        filed = store.list_proposals(state=None, limit=PROPOSALS_READ)
        found = verdicts(spec, hours, filed, number or 0, since, until)
        reclaim = [{**v.to_json(), "proposal": None} for v in found]
    return {"revision": number, **doc, "reclaim": reclaim}


def groups_document(store: Store, now: float) -> dict[str, Any]:
    """The groups directory as the store knows it at `now`."""
    spec, number = latest_spec(store)
    if spec is None:
        raise NotFound("no spec revision in the store yet: `sluice up -f SPEC` first")
    instances: dict[str, dict[str, int]] = {}
    for rec in store.list_instances():
        states = instances.setdefault(rec.group, {})
        states[rec.state] = states.get(rec.state, 0) + 1
    minutes = stored_rollups(store, None, now - HOUR_S, now, MINUTE_S)
    recent = {g: m for g, rs in minutes.items() if (m := merge(rs)) is not None}
    alerts: dict[str, dict[str, int]] = {}
    for e in store.list_events(kinds=ALERT_KINDS, limit=ALERT_EVENTS_READ):
        if e.at >= now - 86_400:
            counts = alerts.setdefault(e.group, {})
            counts[e.kind] = counts.get(e.kind, 0) + 1
    return groups_directory(spec, number, instances, recent, alerts, now)
