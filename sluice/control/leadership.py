"""Leader election through the database: one `sluice up` acts on a fleet at a time.

Every control plane on one database competes for the `controller` lease
(`store.leases`, timing rules in `policy.lease`). The one holding it leads; the others wait
as standbys and take over once it lapses (a leader that stops cleanly releases it, so the
takeover is then immediate). A leader that cannot renew within the renew deadline is
deposed: `FencedRuntime` refuses every launch and stop from then on, and `keep` returns so
the process exits without touching the instances, which the new leader adopts from the
store. The lease's epoch, which grows at each change of holder, is recorded with the
takeover in the audit log.

Fencing on every write (issue 31): as it takes the lease, the leadership installs a
`Fence` of its epoch on the store (`Store.fence`), so every store write of this process
checks the lease row in its own transaction and is refused (`Fenced`) once another holder
has it, whatever this process believes; a refused write deposes it at once (`keep`
returns: the process steps down without touching the instances). Routing publications
and launches `require` the fence (they are not store writes): refused once deposed, and
while the last renewal is older than the renew deadline, which a paused-then-resumed
leader finds at once on its own monotonic clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable

from sluice.control.events import StoreHealth
from sluice.policy.lease import LeaseTiming, may_act
from sluice.runtime.base import InstanceHandle, LaunchRequest, Runtime
from sluice.store import Fence, Fenced, LeaseRecord
from sluice.store.ports import LeaseRecords

__all__ = ["CONTROLLER_LEASE", "Fenced", "FencedRuntime", "Leadership", "new_holder"]

log = logging.getLogger(__name__)

CONTROLLER_LEASE = "controller"


def new_holder() -> str:
    """This process's identity in the lease: host, pid and a nonce (a restart is new)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Leadership:
    def __init__(
        self,
        store: LeaseRecords,
        timing: LeaseTiming,
        holder: str,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        health: StoreHealth | None = None,
    ) -> None:
        """`wall`: the clock the lease's expiry is written in (shared by every controller,
        so skew between hosts must stay under lease_duration - renew_deadline);
        `monotonic`: this process's own clock for the renew deadline; `health`: told when
        the store refuses a renewal, so the platform reads degraded while the ticks it
        fences write nothing that could fail (CI saw a locked store go unreported)."""
        self._store = store
        self._health = health
        self.timing = timing
        self.holder = holder
        self._wall = wall
        self._monotonic = monotonic
        self.lease: LeaseRecord | None = None
        self.fence: Fence | None = None
        """what the store checks each write against, from the moment the lease is taken"""
        self._renewed_at = float("-inf")
        self._deposed = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    async def acquire(self, waiting: Callable[[LeaseRecord | None], None]) -> LeaseRecord:
        """Wait until this process holds the lease (`waiting` is told who holds it, once
        per change of holder), then return it."""
        told: tuple[str, int] | None = None
        dead: str | None = None
        while True:
            started = self._monotonic()
            try:
                lease = await asyncio.to_thread(
                    self._store.acquire_lease,
                    CONTROLLER_LEASE,
                    self.holder,
                    self._wall(),
                    self.timing.lease_duration_s,
                    dead_holder=dead,
                )
                current = (
                    None
                    if lease
                    else await asyncio.to_thread(self._store.get_lease, CONTROLLER_LEASE)
                )
            except Exception as exc:  # the database is away: a standby keeps trying
                log.warning("taking the leader lease failed: %s", exc)
                await asyncio.sleep(self.timing.retry_period_s)
                continue
            if lease is not None:
                self.lease, self._renewed_at = lease, started
                self._fence_writes(lease)
                return lease
            if current is not None and _gone_from_this_host(current.holder):
                dead = current.holder  # a crashed run here: no need to wait out its lease
                continue
            key = (current.holder, current.epoch) if current is not None else None
            if key != told:
                waiting(current)
                told = key
            await asyncio.sleep(self.timing.retry_period_s)

    def _fence_writes(self, lease: LeaseRecord) -> None:
        """From now on every store write of this process carries `lease`'s epoch and is
        refused once another holder has the lease (`sluice.store.fencing`)."""
        self._loop = asyncio.get_running_loop()
        self._deposed = asyncio.Event()
        self.fence = Fence(
            CONTROLLER_LEASE,
            self.holder,
            lease.epoch,
            acting=self._renewed_in_time,
            on_deposed=self._refused,
        )
        self._store.fence(self.fence)

    def _refused(self) -> None:
        """A write found another holder in the lease (any thread): stop leading now,
        without waiting for the next renewal."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._deposed.set)

    def _renewed_in_time(self) -> bool:
        return may_act(self._renewed_at, self._monotonic(), self.timing)

    def may_act(self) -> bool:
        """Whether this process leads now (its last renewal is within the renew deadline,
        and no write found another holder in the lease)."""
        fence = self.fence
        return (
            self.lease is not None
            and fence is not None
            and not fence.deposed
            and self._renewed_in_time()
        )

    def require(self, what: str) -> None:
        if self.fence is not None:
            self.fence.require(what)
        if not self.may_act():
            raise Fenced(f"not the leader any more: refusing to {what}")

    async def keep(self) -> None:
        """Renew every retry period; return once another control plane holds the lease
        (the caller then exits). While the database does not answer, this one stops
        acting after the renew deadline (`may_act`) but does not give up: nobody else can
        take the lease meanwhile, and the gateway serves on. Once the database answers it
        renews, or takes the lapsed lease back if nobody held it in between (the epoch then
        grew by exactly one), and acts again."""
        assert self.lease is not None and self.fence is not None, "acquire first"
        lease = self.lease
        away = False
        while True:
            # a refused write ends the wait at once
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.timing.retry_period_s):
                    await self._deposed.wait()
            if self.fence.deposed:
                log.warning("a write found the leader lease taken: stepping down")
                self.lease = None
                return
            started = self._monotonic()
            try:
                async with asyncio.timeout(self.timing.renew_deadline_s):
                    kept = await asyncio.to_thread(self._renew_or_retake, lease, self._wall())
            except Exception as exc:  # the database does not answer: retry
                if self._health is not None:
                    self._health.saw(exc, self._wall())
                if not away:
                    log.warning("cannot renew the leader lease: %s", exc)
                away = True
                continue
            if kept is None:
                self.fence.depose("another controller took the lease")
                self.lease = None
                return
            if away:
                log.warning("the leader lease is renewed again (epoch %d)", kept.epoch)
            away = False
            lease = self.lease = kept
            self._renewed_at = started

    def _renew_or_retake(self, lease: LeaseRecord, now: float) -> LeaseRecord | None:
        """The lease kept (renewed, or retaken with the next epoch if it lapsed unheld);
        None if another holder has had it."""
        ttl = self.timing.lease_duration_s
        if self._store.renew_lease(CONTROLLER_LEASE, self.holder, lease.epoch, now, ttl):
            return lease
        again = self._store.acquire_lease(CONTROLLER_LEASE, self.holder, now, ttl)
        if again is not None and again.epoch != lease.epoch + 1:  # another led in between
            self._store.release_lease(CONTROLLER_LEASE, self.holder, again.epoch, now)
            return None
        return again

    async def release(self) -> None:
        """Hand the lease back (a clean stop): a standby takes over at its next try."""
        lease, self.lease = self.lease, None
        if lease is not None:
            await asyncio.to_thread(
                self._store.release_lease, CONTROLLER_LEASE, self.holder, lease.epoch, self._wall()
            )


def _gone_from_this_host(holder: str) -> bool:
    """Whether `holder` (see `new_holder`) was a process of this host that no longer runs."""
    host, _, rest = holder.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # runs, as another user
        return False
    return False


class FencedRuntime:
    """A runtime that launches and stops instances only while `leadership` leads: a deposed
    controller that has not exited yet cannot start an instance twice or stop one the new
    leader serves with. The check and the runtime's spawn are one step of the event loop
    (no await between them: the local and Ray runtimes start the process before their
    first await), and the supervisor records the launch with a fenced write before it
    asks (`InstanceSupervisor`), so no takeover slips between the check and the start."""

    def __init__(self, inner: Runtime, leadership: Leadership) -> None:
        self._inner = inner
        self._leadership = leadership

    async def launch(self, req: LaunchRequest) -> InstanceHandle:
        self._leadership.require(f"launch {req.instance_id}")
        return await self._inner.launch(req)

    async def stop(self, handle: InstanceHandle, grace_s: float) -> int | None:
        self._leadership.require(f"stop {handle.instance_id}")
        return await self._inner.stop(handle, grace_s)

    def exit_code(self, handle: InstanceHandle) -> int | None:
        return self._inner.exit_code(handle)

    def adopt(self, handle: InstanceHandle) -> bool:
        return self._leadership.may_act() and self._inner.adopt(handle)

    def log_path(self, instance_id: str) -> str | None:
        return self._inner.log_path(instance_id)
