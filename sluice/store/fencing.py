"""Fencing (issue 31): every write of a leader carries the lease epoch it acts under and is
checked in the write's own transaction, so a leader that was deposed without knowing it
(paused by SIGSTOP, a long GC or a stalled VM past its lease) cannot write once another
holds the lease.

Only the database knows for sure who leads at the moment of a write, so that is where the
check is: with a `Fence` installed (`Store.fence`, done by the controller's leadership as it
takes the lease), each write transaction first reads the lease row, under the lock a
takeover needs too (SQLite's write lock, BEGIN IMMEDIATE; on PostgreSQL the store's
advisory write lock, and the row itself FOR SHARE), and raises `Fenced` unless the row
still names this holder at this epoch. A takeover therefore commits either before the
check (the write is refused and its transaction rolled back: nothing of it is stored) or
after the write committed (the write was the leader's of that time): no window between
check and act. The lease's own compare-and-swaps are not fenced: they are how the lease
moves.

Acts that are not store writes (a routing publication, a launch) call `Fence.require`:
refused once the fence saw another holder, or while its leader's renewals are older than
the renew deadline (`policy.lease.may_act`), which after a pause is at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from sluice.core import SluiceError

__all__ = ["Fence", "Fenced"]


class Fenced(SluiceError):
    """This control plane lost the leader lease: it must not act on the fleet (nor write)."""

    http_status = 503
    exit_code = 3
    code = "fenced"


class Fence:
    """The leadership a process's writes act under: lease `lease` held by `holder` at
    `epoch`. Shared between the event loop and the store's worker threads.

    `acting()`: whether the leader still may act by its own clock (its renewals are
    recent); `on_deposed()`: called once, from whichever thread saw it first, when a check
    finds another holder in the lease (the leader then steps down)."""

    def __init__(
        self,
        lease: str,
        holder: str,
        epoch: int,
        *,
        acting: Callable[[], bool] | None = None,
        on_deposed: Callable[[], None] | None = None,
    ) -> None:
        self.lease = lease
        self.holder = holder
        self._epoch = epoch
        self._acting = acting
        self._on_deposed = on_deposed
        self._lock = threading.Lock()
        self._deposed: str | None = None
        """why, once another holder was seen (or the leadership said so): for good"""

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def deposed(self) -> bool:
        return self._deposed is not None

    def check(self, holder: str | None, epoch: int | None) -> None:
        """Raise `Fenced` unless the lease row (`holder`, `epoch`; None: no row) is this
        fence's. Another holder deposes this leader for good (`on_deposed`); its own newer
        epoch (a retake of its lapsed lease, the fence not moved yet) only refuses."""
        with self._lock:
            mine = self._epoch
            if self._deposed is None and holder == self.holder and epoch == mine:
                return
            first = self._deposed is None and holder != self.holder
            if first:
                self._deposed = f"{holder or 'nobody'} holds the {self.lease} lease, epoch {epoch}"
            why = self._deposed or f"the {self.lease} lease moved to epoch {epoch}"
        if first and self._on_deposed is not None:
            self._on_deposed()
        raise Fenced(
            f"not the leader any more ({why}; this controller acts under epoch {mine}): "
            "the write is refused",
            epoch=mine,
            lease_epoch=epoch,
        )

    def require(self, what: str) -> None:
        """Raise `Fenced` unless this leader may still act: `what` names the act refused."""
        if self._deposed is not None or (self._acting is not None and not self._acting()):
            why = self._deposed or "its lease is not renewed in time"
            raise Fenced(
                f"not the leader any more ({why}): refusing to {what} (epoch {self._epoch})",
                epoch=self._epoch,
            )

    def depose(self, why: str) -> None:
        """Mark the leadership gone (its renewal found another holder): every later write
        and act is refused without asking the database."""
        with self._lock:
            if self._deposed is None:
                self._deposed = why

    def moved(self, old: int, new: int) -> bool:
        """The holder retook its own lapsed lease (nobody held it in between): epoch `old`
        becomes `new`. Called by the store inside the retake's transaction, so no write
        sees the new row with the old fence. False if the fence was not at `old`."""
        with self._lock:
            if self._deposed is not None or self._epoch != old:
                return False
            self._epoch = new
            return True
