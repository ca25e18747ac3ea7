"""What watching the fleet costs the control process: one `Observer.step` (read the
gateway's counters, gauge every group, gather minutes, store the ended ones, evaluate every
alert rule, follow scaling changes up) for many groups, on a real SQLite store.

    python bench/observer.py [--json] [--groups 200] [--minutes 5]

A step runs once a second beside the controller's tick, so its share of one core is
(step time / 1 s); the peer in the same run is the controller's decision step for the same
spec (`sluice.policy.tick.decide`, no autoscaled group), the other per-second work there.
Prints the median and max step, the steps that closed a minute (they write the store), and
the ratio to `decide`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sluice.control.alerts import Alerting  # noqa: E402
from sluice.control.events import EventLog  # noqa: E402
from sluice.control.observer import Observation, Observer  # noqa: E402
from sluice.core import ManualClock  # noqa: E402
from sluice.policy.autoscale.base import TrafficSample  # noqa: E402
from sluice.policy.quota.metering import Meter  # noqa: E402
from sluice.policy.tick import TickInput, decide  # noqa: E402
from sluice.spec import PlatformSpec, load_spec_text  # noqa: E402
from sluice.store import Store  # noqa: E402

BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
T0 = 1_796_000_400.0


def spec(groups: int) -> PlatformSpec:
    body = "".join(
        f"""
  - name: g{k}
    owner: team{k}@example.com
    business: b{k % 7}
    alert_channel: "#team{k}"
    models: {{m{k}: {{runtime: sim}}}}
    resources: {{pool: gpu, memory_gb: 1}}
    replicas: 2
    slo: {{latency_ms: 500}}
"""
        for k in range(groups)
    )
    return load_spec_text(
        f"pools:\n  - {{name: gpu, count: {4 * groups}, memory_gb: 16}}\ngroups:{body}"
    ).spec


class Traffic:
    def __init__(self, clock: ManualClock, groups: int) -> None:
        self.clock, self.groups, self.n = clock, groups, 0

    def __call__(self) -> dict[str, TrafficSample]:
        self.n += 1
        now, n = self.clock.now(), self.n
        return {
            f"g{k}": TrafficSample(
                at=now,
                in_flight=k % 9,
                queued=k % 3,
                arrivals=n * (k + 5),
                completions=n * (k + 5),
                latency_bounds=BOUNDS,
                latency_counts=tuple(n * ((k + i) % 4) for i in range(len(BOUNDS) + 1)),
                served_s=n * 0.1,
                server_errors=n // 50,
                queue_wait_bounds=BOUNDS,
                queue_wait_counts=tuple(n * (i % 2) for i in range(len(BOUNDS) + 1)),
            )
            for k in range(self.groups)
        }


async def measure(groups: int, minutes: int) -> dict[str, Any]:
    s = spec(groups)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store.for_home(Path(tmp))
        clock = ManualClock(T0)
        events = EventLog(store, clock)
        alerting = Alerting(store, events, lambda g: f"sluice explain {g}")
        counts = {g.name: 2 for g in s.groups}

        def observe() -> Observation:
            return Observation(s, [], None, Meter(), counts, {})

        observer = Observer(
            store, events, clock, Traffic(clock, groups), observe, alerting, lambda: 0.1
        )
        await observer.load()
        steps: list[float] = []
        closing: list[float] = []
        for i in range(minutes * 60):
            clock.advance(1.0)
            t = time.perf_counter()
            await observer.step()
            took = time.perf_counter() - t
            (closing if (T0 + i + 1) % 60 == 0 else steps).append(took)
        ticks = []
        for _ in range(50):
            t = time.perf_counter()
            decide(TickInput(s, [], counts, T0))
            ticks.append(time.perf_counter() - t)
        store.close()
    step_ms = statistics.median(steps) * 1000
    decide_ms = statistics.median(ticks) * 1000
    return {
        "groups": groups,
        "step_median_ms": round(step_ms, 2),
        "step_max_ms": round(max(steps) * 1000, 2),
        "minute_step_median_ms": round(statistics.median(closing) * 1000, 2),
        "core_share": round((step_ms * 59 + statistics.median(closing) * 1000) / 60 / 1000, 4),
        "decide_median_ms": round(decide_ms, 2),
        "step_vs_decide": round(step_ms / decide_ms, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=200)
    parser.add_argument("--minutes", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(measure(args.groups, args.minutes))
    print(json.dumps(result) if args.json else json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
