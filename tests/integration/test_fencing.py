"""Fencing on every write (issue 31), on a real store (SQLite, then PostgreSQL): once another
holder has the lease, every write of a store fenced at the old epoch is refused in its own
transaction and leaves nothing behind; a takeover and the old leader's writes serialize
(each of its writes committed before the takeover, or refused); its own retake of a
lapsed lease moves the fence; a refused write makes `Leadership.keep` return at once;
routing publications carry the epoch and are refused once deposed."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine, select, text
from sqlalchemy.pool import NullPool

from sluice.control.leadership import Leadership
from sluice.control.routing_publisher import RoutingPublisher
from sluice.policy import RoutingSnapshot
from sluice.policy.lease import LeaseTiming
from sluice.spec import load_spec_text
from sluice.store import Fence, Fenced, InstanceRecord, Pin, Store, schema
from tests.databases import Database

TTL = 15.0
LEASE = "controller"


def _dump(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, in a stable order: what "nothing changed" compares."""
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return {
                name: sorted(
                    (tuple(r) for r in conn.execute(select(table))),
                    key=repr,
                )
                for name, table in schema.metadata.tables.items()
            }
    finally:
        engine.dispose()


def _epochs(url: str, table: str, order: str = "id") -> list[int | None]:
    """The `epoch` of each row of `table`, in `order`: which leadership wrote it."""
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            query = text(f"SELECT epoch FROM {table} ORDER BY {order}")
            return list(conn.execute(query).scalars())
    finally:
        engine.dispose()


@pytest.fixture
def two(database: Database) -> Iterator[tuple[Store, Store]]:
    """The old leader's store and the new leader's, on one database."""
    old, new = database.open(), database.open()
    try:
        yield old, new
    finally:
        old.close()
        new.close()


def _writes(store: Store, now: float) -> dict[str, Callable[[], object]]:
    """One call of each kind of write a controller makes, across every part of the store."""
    rec = InstanceRecord("chat-1", "chat", "default", "ready", 1, "127.0.0.1", 9, now, now)
    return {
        "audit": lambda: store.append_audit(
            actor="ops", action="scale", target="group/chat", reason="r", detail={}, now=now
        ),
        "event": lambda: store.append_event(
            group="chat", instance=None, kind="scale", message="m", detail={}, now=now
        ),
        "revision": lambda: store.add_revision(
            yaml_text="groups: []\n", author="ops", reason="r", diff="", now=now
        ),
        "override": lambda: store.set_replicas_override(
            group="chat", replicas=3, actor="ops", reason="r", now=now
        ),
        "clear override": lambda: store.clear_replicas_override("chat"),
        "failover": lambda: store.set_failover(
            group="chat", backup="spare", actor="ops", reason="r", now=now
        ),
        "restore": lambda: store.clear_failover("chat"),
        "instance": lambda: store.upsert_instance(rec),
        "forget instance": lambda: store.delete_instance("chat-1"),
        "state": lambda: store.put_state("k", {"at": now}, now),
        "decision": lambda: store.append_decision(
            group="chat",
            policy="p",
            current=1,
            desired=2,
            winner=None,
            reason="r",
            detail={},
            now=now,
        ),
        "loan": lambda: store.open_loan(
            lender=None, borrower="chat", pool="local", units=1, reason="r", now=now
        ),
        "pin": lambda: store.set_pin(Pin("chat", 1, "ops", "r", now, now + 60)),
        "token": lambda: store.add_token(
            name=f"t{now}",
            role="viewer",
            groups=None,
            digest=f"d{now}",
            created_by="ops",
            expires_at=None,
            now=now,
        ),
        "prune": lambda: store.prune(
            events_before=now + 1e6,
            decisions_before=now + 1e6,
            loans_ended_before=now + 1e6,
            audit_before=now + 1e6,
        ),
    }


def test_a_write_under_a_stale_epoch_is_refused_and_changes_nothing(
    database: Database, two: tuple[Store, Store]
) -> None:
    old, new = two
    lease = old.acquire_lease(LEASE, "a", now=100.0, ttl_s=TTL)
    assert lease is not None and lease.epoch == 1
    deposed: list[bool] = []
    fence = Fence(LEASE, "a", 1, on_deposed=lambda: deposed.append(True))
    old.fence(fence)
    for write in _writes(old, 101.0).values():  # the leader writes; each row says its epoch
        write()
    assert old.append_audit(actor="a", action="x", target="t", reason="", detail={}, now=102)
    assert set(_epochs(database.url, "audit_log")) == {1}  # (pruned ones gone)
    assert set(_epochs(database.url, "spec_revisions", "number")) == {1}

    taken = new.acquire_lease(LEASE, "b", now=100.0 + TTL + 1, ttl_s=TTL)  # a lapsed
    assert taken is not None and taken.epoch == 2
    before = _dump(database.url)
    for what, write in _writes(old, 200.0).items():
        with pytest.raises(Fenced, match="not the leader any more") as refused:
            write()
        assert refused.value.detail == {"epoch": 1, "lease_epoch": 2}, what
        assert _dump(database.url) == before, f"a refused {what} left something behind"
    assert deposed == [True] and fence.deposed  # told once, for good
    with pytest.raises(Fenced, match="refusing to publish routing"):
        fence.require("publish routing")
    # the lease's own moves are not fenced: b renews, a store with no fence writes (a CLI)
    assert new.renew_lease(LEASE, "b", 2, now=120.0, ttl_s=TTL)
    new.append_audit(actor="cli", action="x", target="t", reason="", detail={}, now=201.0)
    assert _epochs(database.url, "audit_log")[-1] is None


def test_a_takeover_and_the_old_leaders_writes_serialize(
    database: Database, two: tuple[Store, Store]
) -> None:
    """Writers of the old leader hammer the store while another takes the lease: each of
    their rows was committed before the takeover (ids below the new leader's first row),
    and every write after it is refused."""
    old, new = two
    assert old.acquire_lease(LEASE, "a", now=100.0, ttl_s=TTL) is not None
    old.fence(Fence(LEASE, "a", 1))
    stop = threading.Event()
    refused = [0] * 4
    written = [0] * 4

    def hammer(i: int) -> None:
        while not stop.is_set():
            try:
                old.append_audit(actor=f"a{i}", action="x", target="t", reason="", detail={}, now=1)
                written[i] += 1
            except Fenced:
                refused[i] += 1

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.3)
        taken = new.acquire_lease(LEASE, "b", now=100.0 + TTL + 1, ttl_s=TTL)
        assert taken is not None and taken.epoch == 2
        new.fence(Fence(LEASE, "b", 2))
        first = new.append_audit(actor="b", action="lead", target="t", reason="", detail={}, now=2)
        time.sleep(0.3)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert sum(written) > 0 and sum(refused) > 0, (written, refused)
    engine = create_engine(database.url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT id, epoch FROM audit_log")).all()
    finally:
        engine.dispose()
    olds = [row_id for row_id, epoch in rows if epoch == 1]
    assert len(olds) == sum(written)
    assert max(olds) < first.id, "a write of the old leader landed after the takeover"


def test_its_own_retake_of_a_lapsed_lease_moves_the_fence(two: tuple[Store, Store]) -> None:
    old, new = two
    assert old.acquire_lease(LEASE, "a", now=100.0, ttl_s=TTL) is not None
    fence = Fence(LEASE, "a", 1)
    old.fence(fence)
    again = old.acquire_lease(LEASE, "a", now=100.0 + TTL + 1, ttl_s=TTL)  # nobody took it
    assert again is not None and again.epoch == 2 and fence.epoch == 2
    old.append_audit(actor="a", action="x", target="t", reason="", detail={}, now=1)
    # b leads in between, then a retakes: the fence stays behind, a's writes are refused
    t = 100.0 + 3 * TTL
    assert new.acquire_lease(LEASE, "b", now=t, ttl_s=TTL) is not None
    assert old.acquire_lease(LEASE, "a", now=t + TTL + 1, ttl_s=TTL) is not None  # epoch 4
    assert fence.epoch == 2
    with pytest.raises(Fenced):
        old.append_audit(actor="a", action="x", target="t", reason="", detail={}, now=2)


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_a_refused_write_makes_the_leader_step_down_at_once(two: tuple[Store, Store]) -> None:
    """Not at its next renewal (retry period 5 s here): as soon as a write is refused."""
    old, new = two
    wall, mono = _Clock(), _Clock()
    timing = LeaseTiming(lease_duration_s=20.0, renew_deadline_s=10.0, retry_period_s=5.0)
    leader = Leadership(old, timing, "a", wall=wall, monotonic=mono)

    async def scenario() -> None:
        lease = await leader.acquire(lambda _: None)
        assert old.write_fence is leader.fence and leader.may_act()
        keeping = asyncio.create_task(leader.keep())
        await asyncio.to_thread(
            old.append_audit, actor="a", action="x", target="t", reason="", detail={}, now=1
        )
        # a pause past the lease: b takes it (the wall clock moved on, the paused one not)
        assert new.acquire_lease(LEASE, "b", now=wall.t + 21.0, ttl_s=20.0) is not None
        started = time.monotonic()
        with pytest.raises(Fenced):
            await asyncio.to_thread(
                old.append_audit, actor="a", action="x", target="t", reason="", detail={}, now=2
            )
        await asyncio.wait_for(keeping, timeout=2.0)
        assert time.monotonic() - started < 2.0
        assert leader.lease is None and not leader.may_act()
        with pytest.raises(Fenced):
            leader.require(f"launch under epoch {lease.epoch}")

    asyncio.run(scenario())


SPEC = """
pools: [{name: local, count: 2, memory_gb: 8}]
groups:
  - name: chat
    owner: ops@example.com
    business: core
    alert_channel: "#ops"
    models: {m: {runtime: sim}}
    resources: {pool: local, accelerators: 1, memory_gb: 1}
    replicas: 1
"""


def test_a_publication_carries_the_epoch_and_is_refused_once_deposed() -> None:
    spec = load_spec_text(SPEC, "test.yaml").spec
    published: list[RoutingSnapshot] = []
    acting = [True]
    fence = Fence(LEASE, "a", 7, acting=lambda: acting[0])
    publisher = RoutingPublisher(published.append, lambda: fence)
    publisher.update(spec, 1, {}, {}, (), lambda g: 1)
    assert [(s.version, s.epoch) for s in published] == [(1, 7)]
    fence.moved(7, 8)  # its own retake: the same routes again, under the new epoch
    publisher.update(spec, 1, {}, {}, (), lambda g: 1)
    assert [(s.version, s.epoch) for s in published] == [(1, 7), (2, 8)]
    acting[0] = False  # its renewals are late (a pause): no publication
    with pytest.raises(Fenced, match="publish routing"):
        publisher.update(spec, 2, {}, {}, (), lambda g: 1)
    acting[0] = True
    with pytest.raises(Fenced):
        fence.check("b", 9)  # a write found b at epoch 9
    with pytest.raises(Fenced):
        publisher.update(spec, 2, {}, {}, (), lambda g: 1)
    assert len(published) == 2
