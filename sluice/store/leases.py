"""Leases in the store: who leads (`controller`), with a fencing epoch, taken and renewed by
compare-and-swap so two processes on one database never both hold it (`policy.lease` has
the timing rules). These writes are the lease moving, so they are never fenced themselves
(`sluice.store.fencing`); every other write of a leader is."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import Connection, select, update

from sluice.store import schema
from sluice.store.base import StoreBase

__all__ = ["LeaseRecord", "LeaseStore"]


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    name: str
    holder: str
    epoch: int
    """grows by one at each change of holder: the fencing token of a leadership"""
    acquired_at: float
    renewed_at: float
    expires_at: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class LeaseStore(StoreBase):
    def acquire_lease(
        self, name: str, holder: str, now: float, ttl_s: float, *, dead_holder: str | None = None
    ) -> LeaseRecord | None:
        """Take lease `name` for `holder` if nobody holds it, it expired, or its holder is
        `dead_holder` (the caller knows that process is gone): a new epoch; or renew it if
        `holder` holds it already. None while another holder's lease runs."""
        t = schema.leases

        def work(conn: Connection) -> bool:
            row = conn.execute(select(t).where(t.c.name == name)).first()
            if row is None:
                values = {
                    "name": name,
                    "holder": holder,
                    "epoch": 1,
                    "acquired_at": now,
                    "renewed_at": now,
                    "expires_at": now + ttl_s,
                }
                conn.execute(t.insert().values(values))  # a racing insert: IntegrityError
                return True
            if row.holder == holder and row.expires_at >= now:
                values = {"renewed_at": now, "expires_at": now + ttl_s}
            elif row.expires_at < now or row.holder == dead_holder:
                values = {
                    "holder": holder,
                    "epoch": row.epoch + 1,
                    "acquired_at": now,
                    "renewed_at": now,
                    "expires_at": now + ttl_s,
                }
            else:
                return False
            # compare-and-swap on the epoch: of two takers of one expired lease, one wins
            swapped = conn.execute(
                update(t).where(t.c.name == name, t.c.epoch == row.epoch).values(values)
            )
            fence = self._fence
            if (
                swapped.rowcount == 1
                and "epoch" in values
                and fence is not None
                and (fence.lease, fence.holder) == (name, holder)
            ):
                # its own lapsed lease retaken (nobody in between if the fence was at the
                # old epoch): the fence follows in this transaction, under the write lock,
                # so no write of this holder is refused for a moment in between
                fence.moved(row.epoch, row.epoch + 1)
            return swapped.rowcount == 1

        if not self._write(work, fenced=False):
            return None
        lease = self.get_lease(name)
        return lease if lease is not None and lease.holder == holder else None

    def renew_lease(self, name: str, holder: str, epoch: int, now: float, ttl_s: float) -> bool:
        """Extend `holder`'s lease of this `epoch`; False if it was lost (expired and taken,
        or expired: a lapsed lease is not renewed, it must be acquired again)."""
        t = schema.leases
        query = (
            update(t)
            .where(
                t.c.name == name,
                t.c.holder == holder,
                t.c.epoch == epoch,
                t.c.expires_at >= now,
            )
            .values(renewed_at=now, expires_at=now + ttl_s)
        )
        return bool(self._write(lambda conn: conn.execute(query).rowcount == 1, fenced=False))

    def release_lease(self, name: str, holder: str, epoch: int, now: float) -> None:
        """End `holder`'s lease now (a clean stop), so a standby takes over at once."""
        t = schema.leases
        query = (
            update(t)
            .where(t.c.name == name, t.c.holder == holder, t.c.epoch == epoch)
            .values(expires_at=now - 0.001)
        )
        self._write(lambda conn: conn.execute(query), fenced=False)

    def get_lease(self, name: str) -> LeaseRecord | None:
        t = schema.leases
        with self._engine.connect() as conn:
            row = conn.execute(select(t).where(t.c.name == name)).first()
        if row is None:
            return None
        return LeaseRecord(
            row.name, row.holder, row.epoch, row.acquired_at, row.renewed_at, row.expires_at
        )
