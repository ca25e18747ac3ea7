"""What a fleet simulation (`sluice.sim.fleet`) records and shows: the loan ledger kept as
the live controller keeps it, the reclaims with their latency, per-group outcomes, the
`--json` summary and the `--report DIR` page (index.html + PNG plots)."""

from __future__ import annotations

import dataclasses
import html
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from sluice.policy.quota import Allocation, Loan, ledger_changes, reclaim_loan_ids
from sluice.sim.model import describe_instances
from sluice.sim.result import SimResult
from sluice.spec import PlatformSpec

__all__ = [
    "FLEET_COLUMNS",
    "FleetGroup",
    "FleetResult",
    "Ledger",
    "LedgerRow",
    "ReclaimRecord",
    "write_fleet_report",
]

FLEET_COLUMNS = (*SimResult.TIMELINE_COLUMNS, "stable", "burst", "borrowed", "lent", "held")
"""One timeline row per tick and group: a one-group result's columns (`desired`: the
count in force after the tick), then the tiers of the running instances after the tick's
actions, units borrowed and lent, and units held after the quota round."""


@dataclass(slots=True)
class LedgerRow:
    """One row of the simulated borrow ledger: the fields `ledger_changes` reads and the
    store's times (`sluice.store.Loan`), in virtual seconds."""

    id: int
    lender: str | None
    borrower: str
    pool: str
    units: int
    started_at: float
    ended_at: float | None = None
    reclaim_requested_at: float | None = None

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        asked, ended = self.reclaim_requested_at, self.ended_at
        d["reclaim_latency_s"] = None if asked is None or ended is None else ended - asked
        return d


@dataclass(slots=True)
class ReclaimRecord:
    """One reclaim: `asked_at` when the lender's unmet claim began (the allocator's
    `claims_since`; for a pool shrink or a budget cut, when the drain was asked),
    `drained_at` when the borrower's instances were told to drain, `released_at` when the
    last of them stopped (its units free)."""

    borrower: str
    lender: str | None
    pool: str
    units: int
    instances: tuple[str, ...]
    asked_at: float
    drained_at: float
    released_at: float | None = None
    waiting: int = 0
    """instances not stopped yet"""

    @property
    def latency_s(self) -> float | None:
        return None if self.released_at is None else self.released_at - self.asked_at

    def released(self, now: float) -> None:
        """One of its instances stopped."""
        self.waiting -= 1
        if self.waiting == 0:
            self.released_at = now

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        del d["waiting"]
        d["instances"] = list(self.instances)
        d["latency_s"] = self.latency_s
        return d


class Ledger:
    """The loan ledger and the reclaims of a run, kept round by round as
    `LiveQuota._sync_ledger` keeps the store's (`ledger_changes`, `reclaim_loan_ids`)."""

    def __init__(self, epoch: float) -> None:
        self.epoch = epoch
        self.rows: list[LedgerRow] = []
        self.open: list[LedgerRow] = []
        self.reclaims: list[ReclaimRecord] = []
        self._seen: set[str] = set()

    def keep(
        self, alloc: Allocation, previous: tuple[Loan, ...], now: float
    ) -> list[ReclaimRecord]:
        """Bring the ledger in step with `alloc` (`previous`: last round's loans) at virtual
        second `now`; returns the reclaims new this round."""
        if alloc.loans != previous or alloc.reclaims:
            changes = ledger_changes(self.open, alloc.loans)
            closing = set(changes.close)
            for row in self.open:
                if row.id in closing:
                    row.ended_at = now
            self.open = [row for row in self.open if row.id not in closing]
            for loan in changes.open:
                row = LedgerRow(
                    len(self.rows) + 1, loan.lender, loan.borrower, loan.pool, loan.units, now
                )
                self.rows.append(row)
                self.open.append(row)
            by_id = {row.id: row for row in self.open}
            for r in alloc.reclaims:
                for loan_id in reclaim_loan_ids(self.open, r.borrower, r.lender, r.units):
                    if by_id[loan_id].reclaim_requested_at is None:
                        by_id[loan_id].reclaim_requested_at = now
        fresh_reclaims = []
        for r in alloc.reclaims:  # a drain asked again while its instance runs is the same
            fresh = tuple(i for i in r.instance_ids if i not in self._seen)
            if not fresh:
                continue
            self._seen.update(fresh)
            since = alloc.state.claims_since.get(r.lender) if r.lender else None
            asked = now if since is None else since - self.epoch
            rec = ReclaimRecord(r.borrower, r.lender, r.pool, r.units, fresh, asked, now)
            rec.waiting = len(fresh)
            self.reclaims.append(rec)
            fresh_reclaims.append(rec)
        return fresh_reclaims


@dataclass
class FleetGroup:
    """One group's outcome: its requests as a one-group `SimResult` (the same summary
    fields), its fleet timeline (`FLEET_COLUMNS`) and what quota did for and to it."""

    name: str
    sim: SimResult
    timeline: npt.NDArray[np.float64]
    pool: str
    price_per_unit_hour: float
    unit_hours: float
    """accelerator-hours held (the allocator's `Grant.units_held`, tick by tick)"""
    borrowed_unit_hours: float
    lent_unit_hours: float
    refusals: list[str]
    """distinct refusal texts (the first few)"""
    refusal_count: int
    """refusals seen, each counted once while it lasts (as the live `quota` events)"""
    unfinished: int = 0
    """requests still queued or running when the run stopped (`FleetOptions.end_s`)"""
    stops: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """instances drained or removed (the first 1000): t, instance, action, tier, reason"""

    def column(self, name: str) -> npt.NDArray[np.float64]:
        return self.timeline[:, FLEET_COLUMNS.index(name)]

    @property
    def in_slo(self) -> int:
        return int(np.count_nonzero(self.sim.in_slo_mask()))


@dataclass
class FleetResult:
    spec: PlatformSpec
    """the spec run (pool counts overridden)"""
    groups: dict[str, FleetGroup]
    ledger: list[LedgerRow]
    reclaims: list[ReclaimRecord]
    ticks: int
    end_s: float

    def summary(self) -> dict[str, Any]:
        """The `--json` document of a fleet simulation: a row per group, totals, the pools,
        the reclaims and the loan ledger."""
        rows = [self.row(g) for g in self.groups.values()]
        n = sum(r["requests"] for r in rows)

        def total(key: str) -> Any:
            return sum(r[key] for r in rows)

        return {
            "mode": "fleet",
            "groups": rows,
            "totals": {
                "requests": n,
                "completed": total("completed"),
                "rejected": total("rejected"),
                "failed": total("failed"),
                "slo_attainment": total("in_slo") / n if n else 1.0,
                "instance_seconds": total("instance_seconds"),
                "unit_hours": total("unit_hours"),
                "cost": total("cost"),
                "borrowed_unit_hours": total("borrowed_unit_hours"),
                "reclaims": len(self.reclaims),
            },
            "pools": [
                {"name": p.name, "count": p.count, "price_per_hour": p.price_per_hour}
                for p in self.spec.pools
            ],
            "reclaims": [r.to_json() for r in self.reclaims],
            "ledger": [row.to_json() for row in self.ledger],
            "ticks": self.ticks,
            "duration_s": self.end_s,
        }

    def row(self, g: FleetGroup) -> dict[str, Any]:
        """One group's row: the one-group summary's fields, with cost as unit-hours x the
        pool's price, and what quota did."""
        s = g.sim.summary()
        spec = self.spec.group(g.name)
        assert spec is not None
        for k in ("policy", "trace", "duration_s", "cost", "work_floor_instance_seconds"):
            s.pop(k, None)
        mine = [r.latency_s for r in self.reclaims if r.lender == g.name]
        waits = [x for x in mine if x is not None]
        trace = g.sim.workload.trace
        model = g.sim.workload.model
        return {
            "group": g.name,
            "instances": describe_instances(model.batching, model.slots),
            "pool": g.pool,
            "trace": trace.name if len(trace) else None,
            "policy": g.sim.policy,
            "guaranteed": spec.quota.guaranteed,
            **s,
            "in_slo": g.in_slo,
            "unfinished": g.unfinished,
            "unit_hours": g.unit_hours,
            "cost": g.unit_hours * g.price_per_unit_hour,
            "borrowed_unit_hours": g.borrowed_unit_hours,
            "lent_unit_hours": g.lent_unit_hours,
            "reclaims": len(mine),
            "reclaim_max_latency_s": max(waits) if waits else None,
            "reclaimed_from": sum(1 for r in self.reclaims if r.borrower == g.name),
            "refusals": g.refusal_count,
            "refusal_reasons": g.refusals,
            "peak_burst": int(g.column("burst").max()) if len(g.timeline) else 0,
        }


def write_fleet_report(result: FleetResult, out_dir: str | Path, summary: dict[str, Any]) -> Path:
    """index.html in `out_dir` (created): per group, instances split stable/burst, units
    borrowed and lent, the queue; per pool, the units each group holds against its count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figs: list[tuple[str, str]] = []

    def save(fig: Any, name: str, title: str) -> None:
        fig.tight_layout()
        fig.savefig(out / name, dpi=80)
        plt.close(fig)
        figs.append((name, title))

    for pool in result.spec.pools:
        mine = [g for g in result.groups.values() if g.pool == pool.name and len(g.timeline)]
        if not mine:
            continue
        fig, ax = plt.subplots(figsize=(10, 3))
        t = mine[0].column("t") / 60.0
        ax.stackplot(
            t, *[g.column("held") for g in mine], labels=[g.name for g in mine], step="post"
        )
        ax.axhline(pool.count, color="k", lw=1, ls="--", label=f"pool count {pool.count}")
        ax.set_xlabel("minutes")
        ax.set_ylabel("units held")
        ax.legend(loc="upper right", fontsize=7, ncol=2)
        save(fig, f"pool-{pool.name}.png", f"Pool {pool.name}: units held per group")

    for g in result.groups.values():
        if not len(g.timeline):
            continue
        t = g.column("t") / 60.0
        batching = g.sim.ttft_s is not None
        fig, axes = plt.subplots(
            4 if batching else 3, 1, figsize=(10, 8.5 if batching else 6.5), sharex=True
        )
        axes[0].stackplot(
            t, g.column("stable"), g.column("burst"), labels=["stable", "burst"], step="post"
        )
        axes[0].step(t, g.column("desired"), where="post", lw=1, color="k", label="desired")
        axes[0].set_ylabel("instances")
        axes[1].step(t, g.column("borrowed"), where="post", lw=1, label="borrowed units")
        axes[1].step(t, g.column("lent"), where="post", lw=1, label="lent units")
        axes[1].set_ylabel("units")
        axes[2].plot(t, g.column("queued"), lw=0.8, label="queued")
        axes[2].plot(t, g.column("in_flight"), lw=0.8, label="in flight")
        axes[2].set_ylabel("requests")
        if batching:
            axes[2].plot(t, g.column("server_waiting"), lw=0.8, label="waiting in servers")
            axes[3].plot(t, g.column("kv_cache_usage"), lw=0.8, label="KV-cache use (mean)")
            axes[3].set_ylim(0, 1.05)
            axes[3].set_ylabel("KV-cache use")
        axes[-1].set_xlabel("minutes")
        for ax in axes:
            ax.legend(loc="upper right", fontsize=7)
        save(fig, f"group-{g.name}.png", f"Group {g.name}")

    head = (
        *("group", "requests", "slo_attainment", "slo_target", "p99_ms", "instance_seconds"),
        *("cost", "borrowed_unit_hours", "lent_unit_hours", "reclaims", "peak_instances"),
    )
    table = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_fmt(r.get(k)))}</td>" for k in head) + "</tr>"
        for r in summary["groups"]
    )
    images = "\n".join(
        f'<h2>{html.escape(title)}</h2><img src="{name}" alt="{html.escape(title)}">'
        for name, title in figs
    )
    batched = [r for r in summary["groups"] if "ttft_p50_ms" in r]
    callers = ""
    if batched:
        keys = (
            *(f"ttft_p{q}_ms" for q in (50, 95, 99)),
            *(f"tpot_p{q}_ms" for q in (50, 95, 99)),
            *("kv_cache_usage_mean", "kv_cache_usage_max", "preemptions"),
        )
        rows = "".join(
            f"<tr><td>{html.escape(r['group'])}</td>"
            + "".join(f"<td>{html.escape(_fmt(r.get(k)))}</td>" for k in keys)
            + "</tr>"
            for r in batched
        )
        callers = (
            "<h2>Batching groups: what callers feel (TTFT, TPOT in ms) and the KV cache</h2>"
            f"<table><tr><th>group</th>{''.join(f'<th>{k}</th>' for k in keys)}</tr>{rows}"
            "</table>"
        )
    models = "".join(
        f"<li>{html.escape(r['group'])}: {html.escape(r['instances']['text'])}</li>"
        for r in summary["groups"]
        if "instances" in r
    )
    ledger = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_fmt(v))}</td>" for v in row.values()) + "</tr>"
        for row in summary["ledger"]
    )
    ledger_head = "".join(f"<th>{k}</th>" for k in summary["ledger"][0]) if ledger else ""
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Sluice fleet simulation</title>
<style>body{{font-family:sans-serif;margin:1.5em}} table{{border-collapse:collapse;font-size:12px}}
td,th{{border:1px solid #ccc;padding:2px 6px}} img{{max-width:100%}}</style></head><body>
<h1>Fleet simulation: {len(result.groups)} groups, {summary["duration_s"]:.0f} s</h1>
<table><tr>{"".join(f"<th>{k}</th>" for k in head)}</tr>{table}</table>
<pre>{html.escape(json.dumps(summary["totals"], indent=2))}</pre>
<h2>Instance models</h2><ul>{models}</ul>
{callers}
{images}
<h2>Loan ledger</h2><table><tr>{ledger_head}</tr>{ledger}</table>
</body></html>
"""
    path = out / "index.html"
    path.write_text(page, encoding="utf-8")
    return path


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)
