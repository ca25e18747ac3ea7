"""The tick's whole decision step at platform scale: the kernel's `sluice.policy.kernel.step`
for 1,000 groups and 10,000 instances over 10 pools.

    python bench/decide.py [--json] [--groups 1000] [--per-group 10] [--pools 10] [--ticks 100]
                           [--digest] [--tree build/native]

Half the groups autoscale (the spec's default policy, due every tick at the default 1 s
interval, with a short memory for scale-downs: 15 s) on the load a gateway reports:
Poisson arrivals at a rate of its own per group (30-70 % of its starting fleet's slots),
each request served in 0.05-0.5 s (the group's mean, with the served seconds the gateway
counts), each group crowding at 5x for 5 s in every 50, so groups grow at their crowd and
shrink after it: launches and drains every tick (`actions_per_tick`). Every group has a
guarantee and may borrow, so the allocator lends, refuses and reclaims. Each tick's input
is built outside the timer (as the live controller builds it from the supervisor and the
gateway); the timer covers `step` alone (due groups, autoscalers on their memory values,
quota, plan, tiers, the next memory). The collector is settled first, as the controller
settles it once it is up (`sluice.core.collector`; `--default-gc`: CPython's defaults).
Prints the median and the max over `--ticks` ticks, and the target: both <= 50 ms.

`--digest` also prints sha256 digests over every tick's decision (warm-up ticks included)
and every next memory, serialized field by field (`canonical`), so an optimization shows
that it changed no decision, floats to the last bit: the digests must stay the same.
Serializing costs seconds, outside the timer.

`--tree build/native` times the kernel compiled with mypyc (`make native`, setup.py: the
modules `[tool.sluice] compiled` of pyproject.toml names); its digests must be the pure
Python's (tests/integration/test_compiled_build.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import hashlib
import json
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def _tree() -> Path:
    """`--tree DIR`: the `sluice` under DIR is timed (read here, before the imports below),
    e.g. `make native`'s compiled build in build/native."""
    if "--tree" in sys.argv[1:-1]:
        return Path(sys.argv[sys.argv.index("--tree") + 1]).resolve()
    return ROOT


sys.path.insert(0, str(_tree()))

import sluice.policy.kernel  # noqa: E402
from sluice.core import InstanceState, InstanceStatus, collector  # noqa: E402
from sluice.policy.autoscale import GroupLoad  # noqa: E402
from sluice.policy.kernel import Memory, World, compile_spec, step  # noqa: E402
from sluice.policy.plan import Action, Drain, Launch, Remove  # noqa: E402
from sluice.spec import PlatformSpec, load_spec_text  # noqa: E402

COMPILED = not sluice.policy.kernel.__file__.endswith(".py")  # type: ignore[union-attr]
"""whether the kernel timed is `make native`'s (a mypyc extension module)"""
T0 = 1_795_996_800.0
TARGET_MS = 50.0


def fleet_spec(groups: int, per_group: int, pools: int) -> PlatformSpec:
    """`groups` groups spread over `pools` pools, each pool sized for its groups' fleets."""
    per_pool = -(-groups // pools)
    lines = ["pools:"]
    for p in range(pools):
        lines.append(f"  - {{name: p{p}, count: {per_pool * per_group}, memory_gb: 80}}")
    lines.append("groups:")
    for g in range(groups):
        scaled = g % 2 == 0
        lines += [
            f"  - name: g{g:04d}",
            "    owner: bench@example.com",
            f"    business: b{g % 37}",
            "    alert_channel: '#bench'",
            f"    models: {{m{g}: {{runtime: sim}}}}",
            f"    resources: {{pool: p{g % pools}, memory_gb: 1}}",
            f"    replicas: {per_group}",
            f"    quota: {{guaranteed: {per_group - 2}, priority: {g % 5}}}",
        ]
        if scaled:
            # a short memory for scale-downs, so groups shrink after each crowd and grow
            # at the next: launches and drains every tick, as on a busy fleet
            lines.append(
                f"    autoscaling: {{min: 1, max: {per_group + 4}, interval_s: 1,"
                " down: {stabilization_s: 15, cooldown_s: 10, period_s: 5}}"
            )
    return load_spec_text("\n".join(lines) + "\n").spec


def applied(
    observed: list[InstanceStatus], actions: Sequence[Action], now: float
) -> list[InstanceStatus]:
    """The fleet after the supervisor carried out `actions` (at once: a launch is ready by
    the next tick, a drain or removal is gone), so the next tick sees what this one did."""
    gone = {a.instance_id for a in actions if isinstance(a, (Drain, Remove))}
    out = [i for i in observed if i.id not in gone] if gone else list(observed)
    for n, a in enumerate(a for a in actions if isinstance(a, Launch)):
        iid = f"{a.group}-{now:.0f}-{n}"
        out.append(InstanceStatus(iid, a.group, a.template, InstanceState.READY, now))
    return out


def canonical(x: Any) -> Any:
    """`x` as nested lists of plain values, the same for equal decisions whatever their
    object identities: dataclasses field by field, mappings sorted by key, floats exact
    (`repr` round-trips), a spec model (an input, not a decision) by its name."""
    if x is None or type(x) in (bool, int, str):
        return x
    if type(x) is float:
        return repr(x)
    names = _FIELDS.get(type(x))
    if names is None and dataclasses.is_dataclass(x) and not isinstance(x, type):
        names = _FIELDS[type(x)] = tuple(f.name for f in dataclasses.fields(x))
    if names is not None:
        return [type(x).__name__, *[canonical(getattr(x, n)) for n in names]]
    if isinstance(x, enum.Enum):
        return x.value
    if isinstance(x, Mapping):
        return sorted([str(k), canonical(v)] for k, v in x.items())
    if isinstance(x, (list, tuple)):
        return [canonical(v) for v in x]
    if isinstance(x, (bytes, bytearray, memoryview)):
        return hashlib.sha256(x).hexdigest()
    if isinstance(x, (set, frozenset)):
        return sorted(canonical(v) for v in x)
    name = getattr(x, "name", None)
    if isinstance(name, str):  # a spec model (GroupSpec, QuotaSpec, ...): an input
        return [type(x).__name__, name]
    return type(x).__name__


_FIELDS: dict[type, tuple[str, ...]] = {}


def bench(args: argparse.Namespace) -> dict[str, Any]:
    spec = fleet_spec(args.groups, args.per_group, args.pools)
    rng = random.Random(1)
    templates = {g.name: g.template() for g in spec.groups}
    observed = [
        InstanceStatus(
            f"{g.name}-{k}", g.name, templates[g.name], InstanceState.READY, T0 - 600 + k
        )
        for g in spec.groups
        for k in range(args.per_group)
    ]
    scaled = [g for g in spec.groups if g.autoscaling is not None]
    compiled = compile_spec(spec)
    counts = {g.name: args.per_group for g in spec.groups}
    arrivals = dict.fromkeys(counts, 0)
    served = dict.fromkeys(counts, 0.0)
    service = {g.name: rng.uniform(0.05, 0.5) for g in scaled}
    # each group busy at 30-70 % of its starting fleet's slots; a crowd needs more than max
    rate = {
        g.name: rng.uniform(0.3, 0.7) * args.per_group * g.max_concurrency / service[g.name]
        for g in scaled
    }
    np_rng = np.random.default_rng(1)
    # every group starts at --per-group (an operator's count where not autoscaled)
    memory = Memory(counts={g.name: args.per_group for g in scaled})
    overrides = {g.name: args.per_group for g in spec.groups if g.autoscaling is None}
    if not args.default_gc:
        collector.settle()  # as the controller does once it is up (sluice.core.collector)
    times: list[float] = []
    actions = 0
    decisions, memories = hashlib.sha256(), hashlib.sha256()
    for tick in range(args.warmup + args.ticks):
        now = T0 + tick
        loads = {}
        ready = Counter(i.group for i in observed)
        for k, g in enumerate(scaled):
            crowd = 5.0 if (k + tick) % 50 < 5 else 1.0  # each group peaks 5 s in 50
            n = int(np_rng.poisson(rate[g.name] * crowd))
            arrivals[g.name] += n
            served[g.name] += n * service[g.name]
            busy = int(np_rng.poisson(rate[g.name] * crowd * service[g.name]))
            slots = ready[g.name] * g.max_concurrency
            loads[g.name] = GroupLoad(
                at=now,
                current=counts[g.name],
                ready=ready[g.name],
                slots_per_instance=g.max_concurrency,
                in_flight=min(busy, slots),
                queued=max(0, busy - slots),
                arrivals=arrivals[g.name],
                completions=arrivals[g.name],
                served_s=served[g.name],
                served_sq_s=served[g.name] * service[g.name],
            )
        world = World(compiled, observed, loads, overrides=overrides)
        t1 = time.perf_counter()
        decision, memory = step(memory, world, now)
        if tick >= args.warmup:
            times.append(time.perf_counter() - t1)
        if args.digest:
            decisions.update(repr(canonical(decision)).encode())
            memories.update(repr(canonical(memory)).encode())
        counts.update(decision.counts)
        actions += len(decision.actions) if tick >= args.warmup else 0
        observed = applied(observed, decision.actions, now)
    median_ms = statistics.median(times) * 1000
    max_ms = max(times) * 1000
    out = {
        "groups": args.groups,
        "instances": args.groups * args.per_group,
        "instances_at_end": len(observed),
        "pools": args.pools,
        "ticks": args.ticks,
        "warmup_ticks": args.warmup,
        "collector": "default" if args.default_gc else "settled",
        "median_ms": round(median_ms, 2),
        "max_ms": round(max_ms, 2),
        "target_ms": TARGET_MS,
        "meets_target": median_ms <= TARGET_MS and max_ms <= TARGET_MS,
        "actions_per_tick": round(actions / args.ticks, 1),
        "compiled": COMPILED,
        "tree": str(_tree()),
    }
    if args.digest:
        out["decisions_sha256"] = decisions.hexdigest()
        out["memories_sha256"] = memories.hexdigest()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--groups", type=int, default=1000)
    ap.add_argument("--per-group", type=int, default=10)
    ap.add_argument("--pools", type=int, default=10)
    ap.add_argument("--ticks", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=300, help="untimed ticks first (windows fill up)")
    ap.add_argument(
        "--default-gc",
        action="store_true",
        help="keep CPython's collector settings (the controller settles them once it is up)",
    )
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--tree",
        type=Path,
        default=ROOT,
        help="time the sluice under this directory (make native: build/native, compiled)",
    )
    ap.add_argument(
        "--digest",
        action="store_true",
        help="print sha256 digests of every tick's decision and memory (to check that a change "
        "decides the same)",
    )
    args = ap.parse_args()
    result = bench(args)
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"decide: {result['groups']} groups, {result['instances']} instances, "
        f"{result['pools']} pools: median {result['median_ms']} ms, max {result['max_ms']} ms "
        f"over {result['ticks']} ticks (target <= {TARGET_MS:g} ms: "
        f"{'met' if result['meets_target'] else 'NOT met'}); "
        f"{result['actions_per_tick']} actions per tick"
        f"{' (compiled kernel)' if COMPILED else ''}"
    )
    if args.digest:
        print(f"decisions sha256 {result['decisions_sha256']}")
        print(f"memories sha256 {result['memories_sha256']}")


if __name__ == "__main__":
    main()
