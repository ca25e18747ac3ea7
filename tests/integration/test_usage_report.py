"""`sluice report usage` on a month of history written by the live writer itself: a real
SQLite store, the `Observer` stepped every 10 minutes of virtual time for 30 days on a known
weekly pattern (group `search` busy on weekday office hours, peaking Tue 14:00 UTC, borrowing
above its guarantee; group `batch` flat and low, holding 3 of its 4 guaranteed units while
~0.5 units are busy). The report must name the busy hours, list `batch` as under-using with
the units it could return, and write its page, PNGs and JSON."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from sluice.control.events import EventLog
from sluice.control.observer import Observation, Observer
from sluice.core import InstanceState, InstanceStatus, ManualClock
from sluice.policy.autoscale.base import TrafficSample
from sluice.policy.quota.metering import Meter
from sluice.policy.quota.model import Allocation, Grant, Loan, QuotaState
from sluice.spec import load_spec_text
from sluice.store import Store

ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 3, 2, tzinfo=UTC).timestamp()  # a Monday, 00:00 UTC
DAYS = 30
STEP_S = 600
"""10-minute readings (4,320 steps; the live observer reads every second): 5-minute ones
cost twice the wall time for the same assertions."""
SPAN = (T0, T0 + DAYS * 86_400)

SPEC = """
pools:
  - {name: p, accelerator: virtual, count: 12, memory_gb: 80, price_per_hour: 1.0}
groups:
  - name: search
    owner: search-team@example.com
    business: web search
    alert_channel: "#search-oncall"
    models: {s: {runtime: sim}}
    resources: {pool: p, accelerators: 1, memory_gb: 10}
    max_concurrency: 4
    quota: {guaranteed: 2, limit: 6}
  - name: batch
    owner: batch-team
    business: nightly batch
    alert_channel: "https://hooks.example.com/T0K3N"
    models: {b: {runtime: sim}}
    resources: {pool: p, accelerators: 1, memory_gb: 10}
    max_concurrency: 4
    replicas: 3
    quota: {guaranteed: 4}
    budget: {per_month: 3000}
"""

BOUNDS = (0.1, 0.25, 0.5, 1.0, 2.5)
SHARES = (0.2, 0.4, 0.25, 0.1, 0.04, 0.01)
"""Latency shares per bucket: p95 falls on the 1.0 s bound."""
BATCH_IN_FLIGHT = (1, 2, 3, 2)
"""batch's requests in flight, step by step: busy units 0.25 .. 0.75, mean 0.5."""


def search_rate(at: float) -> float:
    """search's requests/s: 0.2 off hours, office hours (09-17 UTC, Mon-Fri) rising to 5 at
    14:00, Tuesdays 1.6 x that (Tue 14:00 the week's peak: 8/s)."""
    t = datetime.fromtimestamp(at, tz=UTC)
    if t.weekday() >= 5 or not 9 <= t.hour < 17:
        return 0.2
    rate = 2.0 + 3.0 * (1.0 - abs(t.hour - 14) / 5.0)
    return rate * (1.6 if t.weekday() == 1 else 1.0)


class Fleet:
    """The gateway's cumulative counters and the controller's view, moved step by step."""

    def __init__(self) -> None:
        self.spec = load_spec_text(SPEC, "usage.yaml").spec
        self.now = T0
        self.step = 0
        self.totals: dict[str, dict[str, Any]] = {
            g: {"arrivals": 0, "errors": 0, "buckets": [0] * len(SHARES)}
            for g in ("search", "batch")
        }
        self.in_flight = {"search": 0, "batch": 0}
        self.borrowed_unit_h = 0.0
        self.lent_unit_h = 0.0

    def advance(self, to: float) -> None:
        """Arrivals over (now, to] at each group's rate at the interval's middle."""
        mid = (self.now + to) / 2
        rates = {"search": search_rate(mid), "batch": 0.5}
        for g, rate in rates.items():
            n = round(rate * (to - self.now))
            tot = self.totals[g]
            tot["arrivals"] += n
            tot["errors"] += n // 100
            adds = [math.floor(n * s) for s in SHARES]
            adds[1] += n - sum(adds)
            tot["buckets"] = [a + b for a, b in zip(tot["buckets"], adds, strict=True)]
        self.in_flight["search"] = round(search_rate(to) * 2.0)  # 2 s each (Little's law)
        self.in_flight["batch"] = BATCH_IN_FLIGHT[self.step % len(BATCH_IN_FLIGHT)]
        self.now = to
        self.step += 1

    def traffic(self) -> dict[str, TrafficSample]:
        out = {}
        for g, tot in self.totals.items():
            out[g] = TrafficSample(
                at=self.now,
                in_flight=self.in_flight[g],
                queued=0,
                arrivals=tot["arrivals"],
                completions=tot["arrivals"],
                latency_bounds=BOUNDS,
                latency_counts=tuple(tot["buckets"]),
                server_errors=tot["errors"],
            )
        return out

    def search_instances(self) -> int:
        return max(1, math.ceil(self.in_flight["search"] / 4))

    def observe(self) -> Observation:
        n = {"search": self.search_instances(), "batch": 3}
        borrowed = max(0, n["search"] - 2)
        loans = []
        if borrowed:  # batch's one idle guaranteed unit first, then the pool's own
            loans.append(Loan(lender="batch", borrower="search", pool="p", units=1))
            if borrowed > 1:
                loans.append(Loan(lender=None, borrower="search", pool="p", units=borrowed - 1))
        grants = {
            g: Grant(
                group=g,
                instances=k,
                own_units=k - (borrowed if g == "search" else 0),
                borrowed_units=borrowed if g == "search" else 0,
                reason="",
                spend_per_hour=float(k),
                units_held=k,
            )
            for g, k in n.items()
        }
        alloc = Allocation(
            grants=grants,
            loans=tuple(loans),
            reclaims=(),
            refusals={},
            state=QuotaState(),
            spend_per_hour=float(sum(n.values())),
            wake_at=None,
            units_held=sum(n.values()),
        )
        instances = [
            InstanceStatus(f"{g}-{i}", g, "t", InstanceState.READY, T0)
            for g, k in n.items()
            for i in range(k)
        ]
        return Observation(self.spec, instances, alloc, Meter(), n, {})


@pytest.fixture(scope="module")
def month(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Fleet, float]]:
    """A state directory holding 30 days of history from the observer; and how long the
    steps took (wall seconds)."""
    home = tmp_path_factory.mktemp("usage-home")
    fleet = Fleet()
    store = Store.for_home(home)
    store.add_revision(yaml_text=SPEC, author="test", reason="", diff="", now=T0)
    clock = ManualClock(T0)
    observer = Observer(store, EventLog(store, clock), clock, fleet.traffic, fleet.observe)

    async def drive() -> float:
        await observer.load()
        began = time.perf_counter()
        await observer.step()  # the baseline reading at T0
        for _ in range(DAYS * 86_400 // STEP_S):
            clock.advance(STEP_S)
            fleet.advance(clock.now())
            await observer.step()
        await observer.close()
        return time.perf_counter() - began

    took = asyncio.run(drive())
    print(f"\n30 days at {STEP_S} s steps through the Observer: {took:.1f} s wall")
    store.close()
    yield home, fleet, took


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).isoformat()


def sluice(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SLUICE_HOME": str(home), "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "sluice", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=ROOT,
    )


@pytest.fixture(scope="module")
def report(month: tuple[Path, Fleet, float], tmp_path_factory: pytest.TempPathFactory) -> Any:
    """`sluice report usage --json --html DIR` over the month, through the real CLI."""
    home = month[0]
    html_dir = tmp_path_factory.mktemp("usage-html")
    done = sluice(
        home, "report", "usage", "--from", iso(SPAN[0]), "--to", iso(SPAN[1]), "--json",
        "--html", str(html_dir),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), html_dir  # one JSON document, nothing else


def by_group(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {g["group"]: g for g in doc["groups"]}


def test_the_busiest_hours_follow_the_weekly_pattern(report: Any) -> None:
    search = by_group(report[0])["search"]
    names = [b["hour"] for b in search["busiest_hours"]]
    assert names[0] == "Tue 14:00 UTC"
    assert set(names) == {f"Tue {h}:00 UTC" for h in (12, 13, 14, 15, 16)}
    heat = search["heatmap"]
    assert len(heat) == 7 and all(len(row) == 24 for row in heat)
    assert heat[1][14] == pytest.approx(8.0, rel=0.1)  # Tue 14:00
    assert heat[6][14] == pytest.approx(0.2, rel=0.05)  # Sunday: off hours all day
    assert search["coverage"] > 0.99 and search["judged"]


def test_batch_is_under_using_and_could_return_three_units(report: Any) -> None:
    doc = report[0]
    batch = by_group(doc)["batch"]
    assert batch["held_units"] == {"mean": 3.0, "peak": 3.0}
    assert batch["busy_units"]["mean"] == pytest.approx(0.5, abs=0.01)
    assert batch["busy_units"]["hourly_peak_p99"] == pytest.approx(0.75)
    # need = ceil(0.75) = 1 unit of its 4: 3 could return (held units would say only 1)
    assert batch["returnable_units"] == 3 and batch["under_using"] is True
    assert doc["under_using"] == [{"group": "batch", "returnable_units": 3}]
    search = by_group(doc)["search"]
    assert search["busy_units"]["mean"] < 1.0  # under half its guarantee on average, but
    assert search["under_using"] is False  # its weekly peak needs both guaranteed units
    assert search["busy_units"]["peak"] == pytest.approx(4.0)
    assert search["returnable_units"] == 0
    assert "ceil(p99 of the hourly peaks of busy units)" in doc["rule"]


def test_loans_spend_and_service(report: Any, month: tuple[Path, Fleet, float]) -> None:
    doc = report[0]
    search, batch = by_group(doc)["search"], by_group(doc)["batch"]
    # search borrows max(0, instances - 2) while busy; batch lent one unit each of those steps
    assert search["borrowed_unit_hours"] > 0
    assert batch["lent_unit_hours"] > 0
    assert batch["lent_unit_hours"] < search["borrowed_unit_hours"]
    hours = DAYS * 24
    assert batch["spend"] == pytest.approx(3.0 * hours, rel=0.01)
    assert batch["spend_per_hour"] == pytest.approx(3.0, rel=0.01)
    month_h = 30 * 24  # the span ends on 1 April: April's hours
    assert batch["projected_month_spend"] == pytest.approx(3.0 * month_h, rel=0.01)
    assert batch["projected_budget_share"] == pytest.approx(3.0 * month_h / 3000, rel=0.01)
    assert batch["requests"] == pytest.approx(0.5 * hours * 3600, rel=0.01)
    assert batch["error_rate"] == pytest.approx(0.01, abs=0.002)
    assert 900 <= search["p95_ms"] <= 1100


def test_the_page_pngs_and_json_are_written(report: Any) -> None:
    doc, html_dir = report
    page = (html_dir / "index.html").read_text()
    assert "Tue 14:00 UTC" in page and "under-using" in page
    for name in ("heatmap.png", "use.png", "spend.png"):
        data = (html_dir / name).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 5000, name
        assert f'src="{name}"' in page
    assert json.loads((html_dir / "usage.json").read_text()) == doc


def test_the_plain_table_and_a_missing_state_directory(
    month: tuple[Path, Fleet, float], tmp_path: Path
) -> None:
    done = sluice(month[0], "report", "usage", "--from", iso(SPAN[0]), "--to", iso(SPAN[1]))
    assert done.returncode == 0, done.stderr
    assert "Tue 14:00 UTC" in done.stdout and "under-using: batch (3)" in done.stdout
    empty = tmp_path / "nothing-here"
    missing = sluice(empty, "report", "usage", "--json")
    assert missing.returncode == 4
    assert json.loads(missing.stdout)["error"]["code"] == "not_found"
    assert not empty.exists()  # a report never creates a state directory
