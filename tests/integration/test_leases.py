"""The leader lease on a real store (SQLite, then PostgreSQL): one holder at a time, a new
epoch at each change of holder, a lapsed leader fenced, a clean stop handing over at once."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time

import pytest

from sluice.control.events import StoreHealth
from sluice.control.leadership import Fenced, FencedRuntime, Leadership
from sluice.policy.lease import LeaseTiming, may_act, takeover_bound_s
from sluice.runtime.base import InstanceHandle, LaunchRequest
from tests.databases import Database

TTL = 15.0


def test_one_holder_at_a_time_and_a_new_epoch_at_each_takeover(database: Database) -> None:
    store = database.open()
    try:
        a = store.acquire_lease("controller", "a", now=100.0, ttl_s=TTL)
        assert a is not None and (a.holder, a.epoch, a.expires_at) == ("a", 1, 115.0)
        assert store.acquire_lease("controller", "b", now=110.0, ttl_s=TTL) is None
        assert store.renew_lease("controller", "a", 1, now=112.0, ttl_s=TTL)  # to 127
        assert store.acquire_lease("controller", "b", now=126.0, ttl_s=TTL) is None
        b = store.acquire_lease("controller", "b", now=127.5, ttl_s=TTL)  # a lapsed
        assert b is not None and (b.holder, b.epoch) == ("b", 2)
        assert not store.renew_lease("controller", "a", 1, now=128.0, ttl_s=TTL)  # deposed
        again = store.acquire_lease("controller", "b", now=130.0, ttl_s=TTL)  # renews
        assert again is not None and again.epoch == 2 and again.expires_at == 145.0
        store.release_lease("controller", "b", 2, now=131.0)
        c = store.acquire_lease("controller", "c", now=131.0, ttl_s=TTL)  # at once
        assert c is not None and c.epoch == 3
    finally:
        store.close()


def test_of_many_takers_of_an_expired_lease_exactly_one_wins(database: Database) -> None:
    first = database.open()
    assert first.acquire_lease("controller", "old", now=0.0, ttl_s=TTL) is not None
    stores = [database.open() for _ in range(6)]
    won: list[str] = []
    start = threading.Barrier(len(stores))

    def take(i: int) -> None:
        start.wait()
        if stores[i].acquire_lease("controller", f"t{i}", now=100.0, ttl_s=TTL) is not None:
            won.append(f"t{i}")

    threads = [threading.Thread(target=take, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert len(won) == 1, won
        lease = first.get_lease("controller")
        assert lease is not None and lease.holder == won[0] and lease.epoch == 2
    finally:
        for s in [first, *stores]:
            s.close()


def test_timing_stops_a_leader_before_its_lease_can_be_taken() -> None:
    t = LeaseTiming()
    assert may_act(100.0, 109.9, t) and not may_act(100.0, 110.0, t)
    assert takeover_bound_s(t) == 17.0
    with pytest.raises(ValueError, match="must stop acting before"):
        LeaseTiming(lease_duration_s=5, renew_deadline_s=10)


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class _Runtime:
    launched: list[str] = []

    async def launch(self, req: LaunchRequest) -> InstanceHandle:
        self.launched.append(req.instance_id)
        return InstanceHandle(req.instance_id, "127.0.0.1", 1, None)

    async def stop(self, handle: InstanceHandle, grace_s: float) -> int | None:
        return 0

    def exit_code(self, handle: InstanceHandle) -> int | None:
        return None

    def adopt(self, handle: InstanceHandle) -> bool:
        return True

    def log_path(self, instance_id: str) -> str | None:
        return None


def test_a_deposed_leader_is_fenced_from_the_runtime(database: Database) -> None:
    store = database.open()
    wall, mono = _Clock(), _Clock()
    timing = LeaseTiming(lease_duration_s=3.0, renew_deadline_s=2.0, retry_period_s=0.05)
    leader = Leadership(store, timing, "a", wall=wall, monotonic=mono)
    runtime = FencedRuntime(_Runtime(), leader)
    req = LaunchRequest("i-1", "g", {}, {})

    async def scenario() -> None:
        assert not leader.may_act()
        with pytest.raises(Fenced):
            await runtime.launch(req)  # not the leader yet
        await leader.acquire(lambda _: None)
        assert (await runtime.launch(req)).instance_id == "i-1"
        # another controller takes the lease (say this one was paused past its expiry)
        wall.t += 10.0
        assert store.acquire_lease("controller", "b", now=wall.t, ttl_s=3.0) is not None
        await asyncio.wait_for(leader.keep(), timeout=5)  # the renewal fails: deposed
        assert not leader.may_act()
        with pytest.raises(Fenced, match="not the leader"):
            await runtime.launch(req)

    try:
        asyncio.run(scenario())
    finally:
        store.close()


def test_a_database_outage_pauses_the_leader_without_deposing_it(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nobody can take the lease while the database is away: the leader stops acting past
    its renew deadline, then renews (or retakes the lapsed lease, epoch + 1) and acts. The
    refused renewals are the store's health: the ticks they fence write nothing that could
    fail and say so."""
    store = database.open()
    wall, mono = _Clock(), _Clock()
    timing = LeaseTiming(lease_duration_s=3.0, renew_deadline_s=2.0, retry_period_s=0.02)
    health = StoreHealth()
    leader = Leadership(store, timing, "a", wall=wall, monotonic=mono, health=health)
    real_renew = store.renew_lease
    away = True

    def renew(*args: object, **kw: object) -> bool:
        if away:
            raise sqlite3.OperationalError("database is locked")
        return real_renew(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "renew_lease", renew)

    async def scenario() -> None:
        nonlocal away
        await leader.acquire(lambda _: None)
        keeping = asyncio.create_task(leader.keep())
        await asyncio.sleep(0.1)
        mono.t += 2.5
        wall.t += 5.0  # past the lease too
        await asyncio.sleep(0.1)
        assert not leader.may_act() and not keeping.done()  # paused, not deposed
        assert health.problem == "store locked" and health.refused >= 1
        assert health.error == "database is locked"
        away = False
        for _ in range(100):
            if leader.may_act():
                break
            await asyncio.sleep(0.02)
        assert leader.may_act() and not keeping.done()
        assert leader.lease is not None and leader.lease.epoch == 2  # retaken, unheld
        keeping.cancel()

    try:
        asyncio.run(scenario())
    finally:
        store.close()


@pytest.mark.parametrize("steps", range(6))
def test_a_stop_that_lands_as_a_renewal_completes_ends_the_keeping(
    database: Database, monkeypatch: pytest.MonkeyPatch, steps: int
) -> None:
    """`sluice up` cancels `keep` on its way out. A cancel that lands while the renewal's
    answer is on its way back to `keep` must end `keep` (3.11's `asyncio.wait_for`, once
    its inner task was done, returned the answer and swallowed the cancel: `keep` renewed
    on, and the process never exited). The cancel comes `steps` turns of the loop after the
    renewal's thread returned, so one of them lands in that window."""
    store = database.open()
    timing = LeaseTiming(lease_duration_s=3.0, renew_deadline_s=2.0, retry_period_s=0.01)
    leader = Leadership(store, timing, "a", wall=_Clock(), monotonic=_Clock())
    real_renew = store.renew_lease
    entered, release, returned = threading.Event(), threading.Event(), threading.Event()

    def renew(*args: object, **kw: object) -> bool:
        entered.set()
        release.wait(5)
        try:
            return real_renew(*args, **kw)  # type: ignore[arg-type]
        finally:
            returned.set()

    monkeypatch.setattr(store, "renew_lease", renew)

    async def scenario() -> None:
        await leader.acquire(lambda _: None)
        keeping = asyncio.create_task(leader.keep())
        while not entered.is_set():
            await asyncio.sleep(0.005)
        release.set()
        assert returned.wait(5)
        time.sleep(0.05)  # the loop held: the thread's answer is queued, not yet taken
        for _ in range(steps):
            await asyncio.sleep(0)
        keeping.cancel()
        done, _ = await asyncio.wait([keeping], timeout=2)
        assert done, "keep() went on renewing after it was cancelled"
        assert keeping.cancelled()

    try:
        asyncio.run(scenario())
    finally:
        store.close()
