"""Retention of the tables that grow with the platform's own work (issue 37), each on a real
store (SQLite, then PostgreSQL): drill firings, capacity runs, decided proposals, ended
rollouts and tokens go after their age, and what something still reads stays whatever its
age (a running firing and each schedule's latest, a version's latest capacity run and a
group's latest load tests, a pending proposal, a running rollout and each rollout's latest
run, a live token, a person's first token, the tokens review reads for a pending proposal).
A housekeeping pass applies each `retention.*_days`."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from sluice.control.housekeeping import Housekeeper
from sluice.core import ManualClock, NotFound
from sluice.spec import RetentionSpec
from sluice.store import Store

DAY = 86_400.0


def _fire(store: Store, schedule: str, trigger: str, at: float, status: str = "passed") -> int:
    fire_id = store.add_drill_fire(
        schedule=schedule,
        group="g",
        trigger=trigger,
        actor=f"schedule/{schedule}",
        due_at=at,
        status="running",
        now=at,
        detail={},
    )
    if status != "running":
        store.finish_drill_fire(fire_id, status=status, run_id=None, detail={}, now=at + 10)
    return fire_id


def test_drill_fires_go_after_their_age_but_not_running_nor_each_schedules_latest(
    store: Store,
) -> None:
    old_cron = _fire(store, "nightly", "cron", 100.0)
    running = _fire(store, "nightly", "cron", 200.0, status="running")  # a stop left it
    last_cron = _fire(store, "nightly", "cron", 300.0, status="missed")
    manual = _fire(store, "nightly", "api", 400.0)  # newer, but another trigger
    weekly = _fire(store, "weekly", "cron", 150.0)
    recent = _fire(store, "weekly", "cron", 5000.0)
    assert store.prune_drill_fires(before=1000.0) == 2  # old_cron, and weekly's older one
    kept = {f.id for f in store.list_drill_fires(limit=100)}
    assert kept == {running, last_cron, manual, recent}
    assert old_cron not in kept and weekly not in kept
    assert store.last_cron_firings() == {"nightly": 300.0, "weekly": 5000.0}  # unchanged
    assert store.prune_drill_fires(before=1e9) == 0  # each kept one is still the latest
    newer = _fire(store, "nightly", "cron", 6000.0)
    assert store.prune_drill_fires(before=1e9) == 1  # last_cron, no longer the latest
    assert {f.id for f in store.list_drill_fires(limit=100)} == {running, manual, recent, newer}


def test_capacity_runs_go_after_their_age_but_each_versions_latest_and_recent_load_tests_stay(
    store: Store,
) -> None:
    def run(kind: str, version: str, at: float, group: str = "chat") -> int:
        return store.add_capacity_run(
            kind=kind,
            group=group,
            version=version,
            mode="live",
            verdict="measured",
            actor="ana",
            now=at,
            report={"knee": {"rate_rps": at}},
        )

    v1 = [run("loadtest", "m@v1", at) for at in (1.0, 2.0, 3.0, 4.0)]
    v2 = [run("loadtest", "m@v2", at) for at in (5.0, 6.0)]
    drills = [run("drill", "m@v1", at) for at in (7.0, 8.0)]
    fresh = run("drill", "m@v2", 5000.0)
    other = run("loadtest", "e@v1", 2.0, group="embed")
    assert store.prune_capacity_runs(before=1000.0, keep_loadtests=3) == 4
    kept = {r.id for r in store.list_capacity_runs(limit=100)}
    # chat's 3 latest load tests (v1's last, v2's two), v1's latest drill (the older one
    # goes), the fresh one, embed's only run (its version's latest)
    assert kept == {v1[3], *v2, drills[1], fresh, other}
    assert store.prune_capacity_runs(before=1e9, keep_loadtests=1) == 1  # v2[0]
    assert {r.id for r in store.list_capacity_runs(limit=100)} == {
        v1[3],
        v2[1],
        drills[1],
        fresh,
        other,
    }


def test_decided_proposals_go_after_their_age_and_pending_ones_stay(store: Store) -> None:
    def propose(at: float) -> int:
        return store.add_proposal(
            author="ana",
            reason="r",
            base_revision=1,
            yaml_text="x: 1",
            diff="",
            preview={},
            now=at,
        ).id

    approved, rejected, pending, late = propose(1.0), propose(2.0), propose(3.0), propose(4.0)
    store.review_proposal(approved, state="approved", reviewer="bo", reason="ok", now=10.0)
    store.review_proposal(rejected, state="rejected", reviewer="bo", reason="no", now=20.0)
    store.review_proposal(late, state="rejected", reviewer="bo", reason="no", now=5000.0)
    assert store.prune_proposals(before=1000.0) == 2
    assert {p.id for p in store.list_proposals(state=None)} == {pending, late}
    assert store.prune_proposals(before=1e9) == 1
    assert store.get_proposal(pending).state == "pending"  # however old
    with pytest.raises(NotFound):
        store.get_proposal(approved)


def test_ended_rollouts_go_after_their_age_but_running_ones_and_each_latest_stay(
    store: Store,
) -> None:
    def rollout(name: str, at: float, ended_at: float | None) -> int:
        kw: dict[str, Any] = {"baseline": "a", "canary": "b", "started_by": "ana", "spec": {}}
        run_id = store.add_rollout(name=name, phase="stepping", state={}, now=at, **kw)
        if ended_at is not None:
            store.update_rollout(run_id, phase="promoted", state={}, now=ended_at, ended=True)
        return run_id

    first = rollout("m-v2", 1.0, 2.0)
    promoted = rollout("m-v2", 3.0, 4.0)  # the latest: it still routes
    old = rollout("e-v2", 1.0, 5.0)
    running = rollout("e-v2", 6.0, None)  # started long ago, still stepping
    assert store.prune_rollouts(before=1000.0) == 2
    assert [r.id for r in store.list_rollouts(limit=50)] == [running, promoted]
    assert store.prune_rollouts(before=1e9) == 0
    assert first not in {r.id for r in store.list_rollouts(limit=50)} and old != running


def _token(store: Store, name: str, at: float, **kw: Any) -> None:
    store.add_token(
        name=name,
        role="operator",
        groups=None,
        digest=f"{name:0>64}"[-64:],
        created_by=kw.pop("created_by", "admin"),
        expires_at=kw.pop("expires_at", None),
        now=at,
        person=kw.pop("person", None),
    )


def test_revoked_and_expired_tokens_go_after_their_age_and_live_ones_stay(store: Store) -> None:
    _token(store, "admin", 1.0, person="admin")
    _token(store, "ana", 1.0, person="ana")  # ana's first: kept though revoked
    _token(store, "ana-2", 2.0, person="ana")
    _token(store, "ana-3", 3.0, person="ana", expires_at=50.0)
    _token(store, "ana-4", 4.0, person="ana", expires_at=5000.0)  # expired only lately
    _token(store, "ana-5", 5.0, person="ana")
    _token(store, "bo", 6.0, person="bo", expires_at=1e9)  # live
    store.revoke_token("ana", by="admin", now=10.0)
    store.revoke_token("ana-2", by="admin", now=20.0)
    store.revoke_token("ana-5", by="admin", now=4000.0)  # lately
    assert store.prune_tokens(ended_before=1000.0) == 2  # ana-2 (revoked), ana-3 (expired)
    assert [t.name for t in store.list_tokens()] == ["admin", "ana", "ana-4", "ana-5", "bo"]
    assert store.prune_tokens(ended_before=1e9) == 2  # ana-4, ana-5
    assert [t.name for t in store.list_tokens()] == ["admin", "ana", "bo"]  # live, or firsts


def test_tokens_review_reads_for_a_pending_proposal_stay(store: Store) -> None:
    """Review asks who was enrolled after a pending proposal, and by whom: a token live at
    or after the oldest pending proposal is kept however long ago it ended."""
    _token(store, "ana", 1.0, person="ana")
    _token(store, "ana-minter", 2.0, person="ana")
    _token(store, "ana-old", 3.0, person="ana")
    store.revoke_token("ana-old", by="admin", now=50.0)  # ended before the proposal
    store.add_proposal(
        author="ana", reason="r", base_revision=1, yaml_text="", diff="", preview={}, now=100.0
    )
    _token(store, "sock", 150.0, person="sock", created_by="ana-minter")
    store.revoke_token("ana-minter", by="admin", now=200.0)  # ended after the proposal
    assert store.prune_tokens(ended_before=1e9) == 1  # ana-old only
    assert {t.name for t in store.list_tokens()} == {"ana", "ana-minter", "sock"}


def test_a_finished_drills_token_goes_at_once_and_a_running_ones_stays(store: Store) -> None:
    for name in ("drill.n.1", "drill.n.2"):
        _token(store, name, 1.0, expires_at=1e9)  # live: a stop kept them from deletion
    done = store.add_drill_fire(
        schedule="n",
        group="g",
        trigger="cron",
        actor="schedule/n",
        due_at=1.0,
        status="running",
        now=1.0,
        detail={},
        token="drill.n.1",
    )
    store.add_drill_fire(
        schedule="n",
        group="g",
        trigger="cron",
        actor="schedule/n",
        due_at=2.0,
        status="running",
        now=2.0,
        detail={},
        token="drill.n.2",
    )
    store.finish_drill_fire(done, status="passed", run_id=None, detail={}, now=3.0)
    assert store.prune_tokens(ended_before=0.0) == 1
    assert [t.name for t in store.list_tokens()] == ["drill.n.2"]  # its drill still runs
    deleted = store.delete_token("drill.n.2")
    assert deleted is not None and deleted.name == "drill.n.2"
    assert store.delete_token("drill.n.2") is None and store.list_tokens() == []


def test_a_pass_applies_each_retention_setting(store: Store, tmp_path: Path) -> None:
    clock = ManualClock(1000 * DAY)
    now = clock.now()
    for age_days in (10, 3):
        at = now - age_days * DAY
        _fire(store, "nightly", "cron", at)
        for version in ("v1", "v2"):  # ... and a version's latest capacity run stays
            store.add_capacity_run(
                kind="drill",
                group="g",
                version=version,
                mode="live",
                verdict="pass",
                actor="a",
                now=at - (1 if version == "v1" else 0),
                report={},
            )
        p = store.add_proposal(
            author="ana", reason="r", base_revision=1, yaml_text="", diff="", preview={}, now=at
        )
        store.review_proposal(p.id, state="approved", reviewer="bo", reason="ok", now=at)
        kw: dict[str, Any] = {"baseline": "a", "canary": "b", "started_by": "a", "spec": {}}
        run_id = store.add_rollout(name="r", phase="stepping", state={}, now=at, **kw)
        store.update_rollout(run_id, phase="promoted", state={}, now=at, ended=True)
    _token(store, "ana", 0.0)
    for age_days in (500, 300):
        _token(store, f"ana-{age_days}", 0.0, person="ana", expires_at=now - age_days * DAY)
    keeper = Housekeeper(store, clock, tmp_path / "access.log", tmp_path, set)
    spec = RetentionSpec(
        drill_fires_days=5,
        capacity_runs_days=5,
        proposals_days=5,
        rollouts_days=5,
        audit_days=400,
    )
    done = asyncio.run(keeper.run_once(spec))["pruned"]
    assert {k: done[k] for k in ("drill_fires", "capacity_runs", "proposals", "rollouts")} == {
        "drill_fires": 1,
        "capacity_runs": 2,  # 10 days old; each version's 3-day-old run is its latest
        "proposals": 1,
        "rollouts": 1,
    }
    assert done["tokens"] == 1  # expired 500 days ago: past audit_days (tokens_days unset)
    assert [t.name for t in store.list_tokens()] == ["ana", "ana-300"]
    spec = RetentionSpec(audit_days=200, tokens_days=250)
    assert asyncio.run(keeper.run_once(spec))["pruned"]["tokens"] == 1


def test_tokens_are_kept_at_least_as_long_as_the_audit_log() -> None:
    assert RetentionSpec().tokens_kept_days == 400.0
    assert RetentionSpec(audit_days=500, tokens_days=600).tokens_kept_days == 600.0
    with pytest.raises(ValueError, match=r"tokens_days = 100 must be >= audit_days \(400\)"):
        RetentionSpec(tokens_days=100)
