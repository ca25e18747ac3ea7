"""Loans: who lends each borrowed unit, and the ledger rows to open or close for a round.

A group borrows the units it holds above its (effective) guarantee. They are attributed to
last round's loans first, so a ledger row lives as long as the loan does, then to the pool's
unassigned units (count - guarantees; lender None), then to idle guarantees, most idle first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from sluice.core.frozen import fast_init
from sluice.policy.quota.model import Loan

__all__ = [
    "Holding",
    "LedgerChanges",
    "OpenLoan",
    "attribute_loans",
    "ledger_changes",
    "reclaim_loan_ids",
]


@fast_init
@dataclass(frozen=True, slots=True)
class Holding:
    """Units a group holds in a pool (running + draining) against its effective guarantee."""

    group: str
    guaranteed: int
    held: int


def attribute_loans(
    pool: str, count: int, holdings: Sequence[Holding], previous: Sequence[Loan]
) -> list[Loan]:
    """Loans in one pool, sorted by (borrower, lender); units sum to the borrowed units.

    pre: `previous` holds only loans of this pool."""
    need = {h.group: h.held - h.guaranteed for h in holdings if h.held > h.guaranteed}
    if not need:
        return []
    supply: dict[str | None, int] = {None: max(0, count - sum(h.guaranteed for h in holdings))}
    for h in holdings:
        if h.guaranteed > h.held:
            supply[h.group] = h.guaranteed - h.held
    got: dict[tuple[str | None, str], int] = {}

    def give(lender: str | None, borrower: str, units: int) -> None:
        n = min(units, need.get(borrower, 0), supply.get(lender, 0))
        if n > 0:
            need[borrower] -= n
            supply[lender] -= n
            got[(lender, borrower)] = got.get((lender, borrower), 0) + n

    for loan in previous:  # `give`, inline: last round's loans are most of a round's
        lender, borrower = loan.lender, loan.borrower
        n = min(loan.units, need.get(borrower, 0), supply.get(lender, 0))
        if n > 0:
            need[borrower] -= n
            supply[lender] -= n
            got[(lender, borrower)] = got.get((lender, borrower), 0) + n
    lenders = sorted(supply, key=lambda k: (k is not None, -supply[k], k or ""))
    at = 0
    for borrower in sorted(need):
        while need[borrower] > 0 and at < len(lenders):
            give(lenders[at], borrower, need[borrower])
            if supply[lenders[at]] <= 0:
                at += 1
        if need[borrower] > 0:  # only while the pool holds more than it has (it shrank)
            got[(None, borrower)] = got.get((None, borrower), 0) + need[borrower]
    items = sorted(got.items(), key=lambda kv: (kv[0][1], kv[0][0] or ""))
    return [Loan(lender, borrower, pool, units) for (lender, borrower), units in items]


class OpenLoan(Protocol):
    """A ledger row still open (`sluice.store.Loan` fits)."""

    @property
    def id(self) -> int: ...
    @property
    def lender(self) -> str | None: ...
    @property
    def borrower(self) -> str: ...
    @property
    def pool(self) -> str: ...
    @property
    def units(self) -> int: ...


@dataclass(frozen=True, slots=True)
class LedgerChanges:
    """Rows to close (ids, newest first) and loans to open so the ledger matches a round."""

    close: tuple[int, ...]
    open: tuple[Loan, ...]


def ledger_changes(open_loans: Sequence[OpenLoan], loans: Sequence[Loan]) -> LedgerChanges:
    """Diff the open ledger rows against this round's `Allocation.loans`.

    Per (lender, borrower, pool): more units than the open rows -> open one row for the
    difference; fewer -> close rows newest first, and open one row for any remainder (a
    3-unit row that shrinks to 1 closes and reopens as 1), so each row's units never change.
    """
    wanted: dict[tuple[str | None, str, str], int] = {}
    for loan in loans:
        key = (loan.lender, loan.borrower, loan.pool)
        wanted[key] = wanted.get(key, 0) + loan.units
    rows: dict[tuple[str | None, str, str], list[OpenLoan]] = {}
    for row in open_loans:
        rows.setdefault((row.lender, row.borrower, row.pool), []).append(row)
    close: list[int] = []
    opened: list[Loan] = []
    for key in sorted(set(wanted) | set(rows), key=lambda k: (k[2], k[1], k[0] or "")):
        have = sorted(rows.get(key, []), key=lambda r: r.id)
        held = sum(r.units for r in have)
        want = wanted.get(key, 0)
        while have and held > want:
            row = have.pop()
            close.append(row.id)
            held -= row.units
        if want > held:
            opened.append(Loan(key[0], key[1], key[2], want - held))
    return LedgerChanges(tuple(close), tuple(opened))


def reclaim_loan_ids(
    open_loans: Sequence[OpenLoan], borrower: str, lender: str | None, units: int
) -> tuple[int, ...]:
    """The ledger rows a `Reclaim` concerns (to mark with `request_reclaim`): the borrower's
    open loans from `lender` first, then its other loans, newest first, until `units` are
    covered. Attribution is per pool, so the lender asking may not be the one on the rows."""
    mine = [r for r in open_loans if r.borrower == borrower]
    mine.sort(key=lambda r: (r.lender != lender, -r.id))
    out: list[int] = []
    for row in mine:
        if units <= 0:
            break
        out.append(row.id)
        units -= row.units
    return tuple(out)
