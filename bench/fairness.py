"""Fair shares between tenants in a busy group's queue (issue 35): a light tenant beside a heavy
one, and two tenants of weights 2:1, through a real `sluice.gateway.Gateway` and in the fleet
simulator.

    python bench/fairness.py                 # a table; progress on stderr
    python bench/fairness.py --json          # one JSON document on stdout
    python bench/fairness.py --seconds 5     # shorter
    python bench/fairness.py --sim-only      # the simulator's phases only (a few seconds)

Everything runs in this process, on 127.0.0.1, for about 42 s: a gateway (its snapshot
built from a `PlatformSpec` by `build_routing_snapshot`, so tenant weights come the way they
do in production) over one group of 2 instances x 4 slots (`max_concurrency: 4`), each
instance a small HTTP server that answers after `--unit-ms` (0.2) ms per unit of the
request's size in `sluice.policy.admission.request_cost` units (body bytes / 4 + 2 x
`max_tokens`), times a seeded uniform(0.5, 1.5) (`--jitter` 0.5; without it the slots of a
closed loop finish in lockstep): a light request (400-byte body, `max_tokens` 50) takes 40 ms
on average, a heavy one (`--heavy-scale` (2) times both) 80 ms. All tenants have the default
priority.

Four phases, each `--warmup` (2) s unmeasured and then `--seconds` (8) s measured:

- `alone`: the light tenant only, open loop (Poisson, `--light-rps` 16, seeded);
- `fair`: the same light arrivals plus a heavy tenant keeping 24 requests in flight (closed
  loop): 8 run and 16 wait at all times, so the group is saturated; the heavy one sends
  about 10x the light one's tokens (`heavy_token_ratio`);
- `fifo`: the same, with both API keys belonging to one tenant: the queue is plain FIFO, as
  before this change (the peer the `fair` numbers are read against);
- `weights`: tenants of weight 2 (light requests) and 1 (heavy requests), each keeping 16 in
  flight, so both stay backlogged.

Queue waits come from the gateway's access log (`queue_ms`, by path: light requests go to
`/v1/chat/completions`, heavy ones to `/v1/completions`); service from its
`sluice_gateway_tenant_service` counter (cost dispatched, over the measured window) and, as a
check, from the time the instances spent on each tenant's requests.

Output (`--json`): `light_p95_wait_ms` (`alone`, `fair`, `fifo`); `light_p95_wait_ratio`:
the light tenant's p95 of queue wait plus its mean service (40 ms), with the heavy tenant over
alone (alone it hardly ever waits, so bare waits would divide by zero; target <= 2) and
`light_p95_wait_ratio_fifo` the same under FIFO; `weighted_share_error`: |(service of the
weight-2 tenant / service of the weight-1 one) / 2 - 1| from the counter (target <= 0.10),
`weighted_share_error_backend` from instance time; `ok`. Exit status 1 when a target is
missed or a request got another answer than 200.

The simulator (`SimBench`, also with `--sim-only`): the same four phases through
`sluice.sim.fleet.run_fleet`, which offers each queued request to the group's own
`GroupAdmission` with its tenant, its cost (`answer_cost` of its tokens) and its tenant's
weight from the same spec (`platform_spec`): 2 instances x 4 slots ready at 0, a fixed
count, no autoscaling. A request of `size` has body bytes / 4 prompt and `max_tokens`
completion tokens and holds a slot `--unit-ms` per cost unit times the same kind of seeded
jitter (the k-th request of a stream draws the k-th number of its own seeded generator). The
light tenant's arrivals are the very Poisson draws of the gateway phases (seed 35). A closed
loop is not a trace, so it is solved as one: its clients' first requests at 0, then one
arrival at each of its answers before the phase ends; the simulator runs again on those
arrivals until they no longer change (the fixed point: the simulation is causal, so each run
settles at least one more service time of the prefix; `sim_closed_loop_iterations` says how
many runs each phase took, about 40-90). No HTTP, so a resent request arrives at the instant
of its answer. The window is the same: waits of the requests answered in it (`queue_ms` is
logged at the answer), service of those dispatched in it, summed as `answer_cost` per tenant
(what the gateway's `sluice_gateway_tenant_service` counts; the bench's requests' estimates
equal their real costs) and, as a check, as instance seconds. Output: `sim_light_p95_wait_ms`,
`sim_light_p95_wait_ratio` (target <= 2), `sim_light_p95_wait_ratio_fifo`,
`sim_weighted_share_error` (by cost, target <= 0.10), `sim_weighted_share_error_instance_s`,
`sim_phases`, `sim_wall_s`; their targets count in `ok`.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import io
import json
import random
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sluice.gateway import Gateway  # noqa: E402
from sluice.policy.admission import answer_cost, request_cost  # noqa: E402
from sluice.policy.routing import Endpoint, RoutingSnapshot  # noqa: E402
from sluice.policy.snapshot import build_routing_snapshot  # noqa: E402
from sluice.sim import InstanceModel, Workload, trace_from_rows  # noqa: E402
from sluice.sim.fleet import run_fleet  # noqa: E402
from sluice.spec.models import PlatformSpec  # noqa: E402

MODEL = "m-chat"
GROUP = "chat"
INSTANCES = 2
SLOTS_PER_INSTANCE = 4
LIGHT = (400, 50)  # body bytes, max_tokens
LIGHT_PATH = "/v1/chat/completions"
HEAVY_PATH = "/v1/completions"
HEAVY_IN_FLIGHT = 24
WEIGHTED_IN_FLIGHT = 16
TENANTS = {  # name: (weight, API keys); "shared" holds two keys: both its callers are one
    "light": (1.0, ["light"]),
    "heavy": (1.0, ["heavy"]),
    "shared": (1.0, ["shared-light", "shared-heavy"]),
    "gold": (2.0, ["gold"]),
    "bronze": (1.0, ["bronze"]),
}


def log(msg: str) -> None:
    print(f"[fairness {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def api_key(name: str) -> str:
    return f"sk-fair-{name}-{hashlib.sha256(name.encode()).hexdigest()[:16]}"


def body(size: tuple[int, int], user: str) -> bytes:
    """A request body of exactly `size[0]` bytes asking for `size[1]` tokens; `user` (the
    OpenAI field) tells the instance whose it is, for its busy-time count."""
    nbytes, max_tokens = size
    doc = {"model": MODEL, "max_tokens": max_tokens, "user": user, "prompt": ""}
    pad = nbytes - len(json.dumps(doc, separators=(",", ":")))
    doc["prompt"] = "x" * max(pad, 0)
    return json.dumps(doc, separators=(",", ":")).encode()


# -- the instances ------------------------------------------------------------------------------


class Instance:
    """An HTTP/1.1 keep-alive server answering after `unit_s` per unit of request cost; it
    adds each request's time to its `user`'s busy seconds."""

    def __init__(
        self, unit_s: float, jitter: float, rng: random.Random, busy: dict[str, float]
    ) -> None:
        self.unit_s = unit_s
        self.jitter = jitter
        self.rng = rng
        self.busy = busy
        self.server: asyncio.Server | None = None
        self.port = 0
        self.writers: set[asyncio.StreamWriter] = set()
        self.handlers: set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, backlog=256)
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Close the listener and every connection (the gateway keeps idle ones open)."""
        if self.server is not None:
            self.server.close()
        for writer in self.writers:
            writer.close()
        await asyncio.gather(*self.handlers, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.handlers.add(task)
        self.writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                data = await reader.readexactly(length)
                payload = json.loads(data)
                spread = 1.0 + self.jitter * (2.0 * self.rng.random() - 1.0)
                seconds = self.unit_s * request_cost(len(data), payload) * spread
                await asyncio.sleep(seconds)
                self.busy[str(payload.get("user"))] += seconds
                answer = b'{"choices":[{"index":0,"text":"ok","finish_reason":"stop"}]}'
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(answer), answer)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            self.writers.discard(writer)
            self.handlers.discard(task)


def platform_spec(max_wait_s: float) -> PlatformSpec:
    """The bench's spec: one group of `INSTANCES` x `SLOTS_PER_INSTANCE`, `TENANTS`."""
    return PlatformSpec.model_validate(
        {
            "gateway": {"host": "127.0.0.1", "port": 0},
            "pools": [{"name": "bench", "accelerator": "virtual", "count": 4, "memory_gb": 16}],
            "groups": [
                {
                    "name": GROUP,
                    "owner": "bench@example.com",
                    "business": "bench",
                    "alert_channel": "#bench",
                    "models": {MODEL: {"runtime": "sim", "sim": {"memory_gb": 1}}},
                    "resources": {"pool": "bench", "accelerators": 1, "memory_gb": 4},
                    "max_concurrency": SLOTS_PER_INSTANCE,
                    "replicas": INSTANCES,
                    "queue": {"max_length": 1000, "max_wait_s": max_wait_s},
                }
            ],
            "tenants": [
                {"name": n, "weight": w, "api_keys": [api_key(k) for k in keys]}
                for n, (w, keys) in TENANTS.items()
            ],
            "routes": [{"tag": "chat", "match": {"models": [MODEL]}, "to": GROUP}],
        }
    )


def snapshot(ports: list[int], max_wait_s: float) -> RoutingSnapshot:
    spec = platform_spec(max_wait_s)
    ready = {
        GROUP: [
            Endpoint(f"{GROUP}-{i}", "127.0.0.1", port, SLOTS_PER_INSTANCE)
            for i, port in enumerate(ports)
        ]
    }
    return build_routing_snapshot(spec, ready, 1)


# -- the load -----------------------------------------------------------------------------------


class Load:
    """Clients of one gateway; every request's status is kept (0: no HTTP answer)."""

    def __init__(self, base_url: str) -> None:
        self.client = httpx.AsyncClient(
            base_url=base_url,
            trust_env=False,
            timeout=60,
            limits=httpx.Limits(max_connections=200, max_keepalive_connections=200),
        )
        self.statuses: dict[int, int] = defaultdict(int)
        self.tasks: set[asyncio.Task[None]] = set()

    async def one(self, key: str, path: str, data: bytes) -> None:
        headers = {"authorization": f"Bearer {api_key(key)}", "content-type": "application/json"}
        try:
            r = await self.client.post(path, content=data, headers=headers)
            self.statuses[r.status_code] += 1
        except httpx.HTTPError:
            self.statuses[0] += 1

    async def open_loop(
        self, key: str, path: str, data: bytes, rps: float, until: float, rng: random.Random
    ) -> None:
        """Poisson arrivals at `rps` until `until` (loop time); bounded: about rps x time."""
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            due += rng.expovariate(rps)
            if due >= until:
                break
            await asyncio.sleep(max(0.0, due - loop.time()))
            task = asyncio.create_task(self.one(key, path, data))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def closed_loop(self, key: str, path: str, data: bytes, n: int, until: float) -> None:
        """`n` requests in flight, each sent again as soon as answered, until `until`."""
        loop = asyncio.get_running_loop()

        async def worker() -> None:
            while loop.time() < until:
                await self.one(key, path, data)

        await asyncio.gather(*(worker() for _ in range(n)))

    async def drain(self) -> None:
        while self.tasks:
            await asyncio.gather(*list(self.tasks))

    async def close(self) -> None:
        await self.drain()
        await self.client.aclose()


def p95(values: list[float]) -> float | None:
    """The 95th percentile (nearest rank), rounded to 0.01; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 2)


def tenant_service(gateway: Gateway) -> dict[str, float]:
    text = gateway.metrics_text()[0].decode()
    for family in text_string_to_metric_families(text):
        if family.name == "sluice_gateway_tenant_service":
            return {s.labels["tenant"]: s.value for s in family.samples}
    return {}


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.heavy = (round(LIGHT[0] * args.heavy_scale), round(LIGHT[1] * args.heavy_scale))
        """A heavy request: body bytes and max_tokens, `--heavy-scale` times a light one's."""
        self.busy: dict[str, float] = defaultdict(float)
        self.instances = [
            Instance(args.unit_ms / 1000.0, args.jitter, random.Random(i), self.busy)
            for i in range(INSTANCES)
        ]
        self.access = io.StringIO()
        self.gateway = Gateway("127.0.0.1", 0, rng=random.Random(1), access_log=self.access)
        self.load: Load | None = None

    async def run(self) -> dict[str, Any]:
        for inst in self.instances:
            await inst.start()
        self.gateway.update(snapshot([i.port for i in self.instances], 4 * self.args.seconds))
        await self.gateway.start()
        self.load = Load(f"http://127.0.0.1:{self.gateway.port}")
        try:
            phases = {}
            for name, start in [
                ("alone", self._alone),
                ("fair", lambda until: self._pair("light", "heavy", until)),
                ("fifo", lambda until: self._pair("shared-light", "shared-heavy", until)),
                ("weights", self._weights),
            ]:
                phases[name] = await self._phase(name, start)
        finally:
            await self.load.close()
            await self.gateway.stop(timeout=5.0)
            for inst in self.instances:
                await inst.stop()
        return self._report(phases)

    async def _phase(self, name: str, start: Callable[[float], Any]) -> dict[str, Any]:
        """Run one phase's load; what the measured window saw."""
        assert self.load is not None
        loop = asyncio.get_running_loop()
        args = self.args
        log(f"{name}: {args.warmup:g} s warm-up, {args.seconds:g} s measured")
        t0 = loop.time()
        measured_from = t0 + args.warmup
        until = measured_from + args.seconds
        runner = asyncio.create_task(start(until))
        await asyncio.sleep(max(0.0, measured_from - loop.time()))
        self.access.seek(0)
        self.access.truncate()
        service0 = tenant_service(self.gateway)
        busy0 = dict(self.busy)
        await asyncio.sleep(max(0.0, until - loop.time()))
        service1 = tenant_service(self.gateway)
        busy1 = dict(self.busy)
        lines = self.access.getvalue().splitlines()
        await runner
        await self.load.drain()
        records = [json.loads(line) for line in lines]
        light = [r for r in records if r["path"] == LIGHT_PATH]
        heavy = [r for r in records if r["path"] == HEAVY_PATH]
        light_s = args.unit_ms * request_cost(LIGHT[0], {"max_tokens": LIGHT[1]}) / 1000.0
        out = {
            "light_requests": len(light),
            "heavy_requests": len(heavy),
            "light_p95_wait_ms": p95([r["queue_ms"] for r in light]),
            "light_p95_wait_plus_service_ms": p95(
                [r["queue_ms"] + 1000.0 * light_s for r in light]
            ),
            "heavy_p95_wait_ms": p95([r["queue_ms"] for r in heavy]),
            "service": {t: service1.get(t, 0.0) - service0.get(t, 0.0) for t in service1},
            "busy_s": {t: round(busy1.get(t, 0.0) - busy0.get(t, 0.0), 3) for t in busy1},
            "tokens": {
                "light": len(light) * sum(token_counts(LIGHT)),
                "heavy": len(heavy) * sum(token_counts(self.heavy)),
            },
        }
        log(
            f"  {name}: {out['light_requests']} light, {out['heavy_requests']} heavy, light p95 "
            f"wait {out['light_p95_wait_ms']} ms, heavy p95 wait {out['heavy_p95_wait_ms']} ms"
        )
        return out

    async def _alone(self, until: float) -> None:
        assert self.load is not None
        rng = random.Random(35)
        await self.load.open_loop(
            "light", LIGHT_PATH, body(LIGHT, "light"), self.args.light_rps, until, rng
        )

    async def _pair(self, light_key: str, heavy_key: str, until: float) -> None:
        assert self.load is not None
        rng = random.Random(35)  # the same arrivals as alone
        await asyncio.gather(
            self.load.open_loop(
                light_key, LIGHT_PATH, body(LIGHT, "light"), self.args.light_rps, until, rng
            ),
            self.load.closed_loop(
                heavy_key, HEAVY_PATH, body(self.heavy, "heavy"), HEAVY_IN_FLIGHT, until
            ),
        )

    async def _weights(self, until: float) -> None:
        assert self.load is not None
        await asyncio.gather(
            self.load.closed_loop(
                "gold", LIGHT_PATH, body(LIGHT, "gold"), WEIGHTED_IN_FLIGHT, until
            ),
            self.load.closed_loop(
                "bronze", HEAVY_PATH, body(self.heavy, "bronze"), WEIGHTED_IN_FLIGHT, until
            ),
        )

    def _report(self, phases: dict[str, dict[str, Any]]) -> dict[str, Any]:
        assert self.load is not None
        alone, fair, fifo, weights = (phases[k] for k in ("alone", "fair", "fifo", "weights"))
        base = alone["light_p95_wait_plus_service_ms"]
        service = weights["service"]
        busy = weights["busy_s"]
        share = service.get("gold", 0.0) / max(service.get("bronze", 0.0), 1e-9)
        share_backend = busy.get("gold", 0.0) / max(busy.get("bronze", 0.0), 1e-9)
        tokens = fair["tokens"]
        result = {
            "light_p95_wait_ms": {
                k: phases[k]["light_p95_wait_ms"] for k in ("alone", "fair", "fifo")
            },
            "light_p95_wait_ratio": round(fair["light_p95_wait_plus_service_ms"] / base, 3),
            "light_p95_wait_ratio_fifo": round(fifo["light_p95_wait_plus_service_ms"] / base, 3),
            "heavy_p95_wait_ms": {k: phases[k]["heavy_p95_wait_ms"] for k in ("fair", "fifo")},
            "heavy_token_ratio": round(tokens["heavy"] / max(tokens["light"], 1), 2),
            "weighted_service_ratio": round(share, 3),
            "weighted_share_error": round(abs(share / 2.0 - 1.0), 4),
            "weighted_share_error_backend": round(abs(share_backend / 2.0 - 1.0), 4),
            "statuses": {str(k): v for k, v in sorted(self.load.statuses.items())},
            "phases": phases,
            "seconds": self.args.seconds,
            "warmup_s": self.args.warmup,
        }
        result["ok"] = (
            result["light_p95_wait_ratio"] <= 2.0
            and result["weighted_share_error"] <= 0.10
            and set(self.load.statuses) == {200}
        )
        return result


# -- the simulator ------------------------------------------------------------------------------

Stream = tuple[str, tuple[int, int], list[float] | int]
"""(tenant, request size (body bytes, max_tokens), open-loop arrival times or closed-loop
clients)"""


class SimBench:
    """The same four phases in the fleet simulator (`sluice.sim.fleet.run_fleet`, the queue's
    own `GroupAdmission`), on the same spec: instances ready at 0, fixed count (module
    docstring)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.heavy = (round(LIGHT[0] * args.heavy_scale), round(LIGHT[1] * args.heavy_scale))
        self.until = args.warmup + args.seconds
        self.spec = platform_spec(4 * args.seconds)
        group = self.spec.group(GROUP)
        assert group is not None
        self.model = InstanceModel.from_spec(self.spec, group, slo_ms=60_000.0)
        self.iterations: dict[str, int] = {}

    def run(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        light = self._poisson()
        phases = {
            "alone": self._phase("alone", [("light", LIGHT, light)]),
            "fair": self._phase(
                "fair", [("light", LIGHT, light), ("heavy", self.heavy, HEAVY_IN_FLIGHT)]
            ),
            "fifo": self._phase(
                "fifo", [("shared", LIGHT, light), ("shared", self.heavy, HEAVY_IN_FLIGHT)]
            ),
            "weights": self._phase(
                "weights",
                [("gold", LIGHT, WEIGHTED_IN_FLIGHT), ("bronze", self.heavy, WEIGHTED_IN_FLIGHT)],
            ),
        }
        base = phases["alone"]["light_p95_wait_plus_service_ms"]
        service = phases["weights"]["service"]
        busy = phases["weights"]["busy_s"]
        share = service.get("gold", 0.0) / max(service.get("bronze", 0.0), 1e-9)
        share_busy = busy.get("gold", 0.0) / max(busy.get("bronze", 0.0), 1e-9)
        return {
            "sim_light_p95_wait_ms": {
                k: phases[k]["light_p95_wait_ms"] for k in ("alone", "fair", "fifo")
            },
            "sim_light_p95_wait_ratio": round(
                phases["fair"]["light_p95_wait_plus_service_ms"] / base, 3
            ),
            "sim_light_p95_wait_ratio_fifo": round(
                phases["fifo"]["light_p95_wait_plus_service_ms"] / base, 3
            ),
            "sim_weighted_service_ratio": round(share, 3),
            "sim_weighted_share_error": round(abs(share / 2.0 - 1.0), 4),
            "sim_weighted_share_error_instance_s": round(abs(share_busy / 2.0 - 1.0), 4),
            "sim_closed_loop_iterations": self.iterations,
            "sim_phases": phases,
            "sim_wall_s": round(time.perf_counter() - t0, 3),
        }

    def _poisson(self) -> list[float]:
        """The light tenant's arrivals: the very draws `Load.open_loop` makes (seed 35)."""
        rng = random.Random(35)
        out: list[float] = []
        due = 0.0
        while True:
            due += rng.expovariate(self.args.light_rps)
            if due >= self.until:
                return out
            out.append(due)

    def _phase(self, name: str, streams: list[Stream]) -> dict[str, Any]:
        """Run `streams` to their closed loops' fixed point; what the measured window saw."""
        arrivals = [list(x) if isinstance(x, list) else [0.0] * x for _, _, x in streams]
        for k in range(1, 10_000):
            done = self._once(streams, arrivals)
            again = [
                xs if isinstance(x, list) else self._resent(x, d)
                for (_, _, x), xs, d in zip(streams, arrivals, done, strict=True)
            ]
            if again == arrivals:
                self.iterations[name] = k
                break
            arrivals = again
        else:
            raise RuntimeError(f"{name}: the closed loops did not settle")
        return self._measure(name, streams, arrivals, done)

    def _resent(self, clients: int, done: list[tuple[float, float]]) -> list[float]:
        """A closed loop's arrivals: `clients` at 0, then one at each answer before the end."""
        ends = sorted(t for t, _ in done if t < self.until)
        return [0.0] * clients + ends

    def _once(
        self, streams: list[Stream], arrivals: list[list[float]]
    ) -> list[list[tuple[float, float]]]:
        """One run of the fleet simulator: per stream, per request (in its own order), when
        it was done and how long it held a slot."""
        rows: list[tuple[float, int, int, str, str]] = []
        service: list[float] = []
        unit_s = self.args.unit_ms / 1000.0
        for j, ((tenant, size, _), times) in enumerate(zip(streams, arrivals, strict=True)):
            prompt, completion = (round(x) for x in token_counts(size))
            cost = answer_cost(prompt, completion)
            spread = random.Random(1000 + j)  # the k-th request of a stream: the same draw
            for t in times:
                rows.append((t, prompt, completion, MODEL, tenant))
                jitter = 1.0 + self.args.jitter * (2.0 * spread.random() - 1.0)
                service.append(unit_s * cost * jitter)
        order = np.argsort(np.asarray([r[0] for r in rows]), kind="stable")
        trace = trace_from_rows(rows, "fairness")  # (sorted stably by time: `order`)
        svc = np.asarray(service, dtype=np.float64)[order]
        work = Workload(self.model, trace, svc, self.model.slo_limits(svc))
        result = run_fleet(self.spec, {GROUP: work})
        done = np.empty(len(rows))
        done[order] = result.groups[GROUP].sim.done
        if np.any(done < 0):
            raise RuntimeError("a simulated request was not answered")
        out: list[list[tuple[float, float]]] = []
        at = 0
        for times in arrivals:
            n = len(times)
            out.append(list(zip(done[at : at + n].tolist(), service[at : at + n], strict=True)))
            at += n
        return out

    def _measure(
        self,
        name: str,
        streams: list[Stream],
        arrivals: list[list[float]],
        done: list[list[tuple[float, float]]],
    ) -> dict[str, Any]:
        """Waits of the requests answered in the window (the access log's), service of those
        dispatched in it: cost (`answer_cost`, the gateway's counter) and instance seconds."""
        lo, hi = self.args.warmup, self.until
        light_s = self.args.unit_ms * request_cost(LIGHT[0], {"max_tokens": LIGHT[1]}) / 1000.0
        waits: dict[str, list[float]] = {"light": [], "heavy": []}
        service: dict[str, float] = defaultdict(float)
        busy: dict[str, float] = defaultdict(float)
        for j, ((tenant, size, _), times, answers) in enumerate(
            zip(streams, arrivals, done, strict=True)
        ):
            kind = "heavy" if j else "light"  # (the first stream sends light requests)
            cost = answer_cost(*(round(x) for x in token_counts(size)))
            for t, (end, held) in zip(times, answers, strict=True):
                if lo <= end < hi:
                    waits[kind].append(1000.0 * max(0.0, end - held - t))
                if lo <= end - held < hi:
                    service[tenant] += cost
                    busy[tenant] += held
        out = {
            "light_requests": len(waits["light"]),
            "heavy_requests": len(waits["heavy"]),
            "light_p95_wait_ms": p95(waits["light"]),
            "light_p95_wait_plus_service_ms": p95([w + 1000.0 * light_s for w in waits["light"]]),
            "heavy_p95_wait_ms": p95(waits["heavy"]),
            "service": dict(service),
            "busy_s": {k: round(v, 3) for k, v in busy.items()},
        }
        log(
            f"  sim {name}: {out['light_requests']} light, {out['heavy_requests']} heavy, light "
            f"p95 wait {out['light_p95_wait_ms']} ms, heavy p95 wait {out['heavy_p95_wait_ms']} "
            f"ms ({self.iterations[name]} runs)"
        )
        return out


def token_counts(size: tuple[int, int]) -> tuple[float, float]:
    """(prompt, completion) tokens of a request of `size`, as the estimate counts them."""
    return size[0] / 4.0, float(size[1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=8.0, help="measured seconds per phase")
    ap.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds first")
    ap.add_argument("--light-rps", type=float, default=16.0, help="the light tenant's rate")
    ap.add_argument("--unit-ms", type=float, default=0.2, help="instance ms per cost unit")
    ap.add_argument(
        "--jitter", type=float, default=0.5, help="service time x uniform(1 - j, 1 + j)"
    )
    ap.add_argument(
        "--heavy-scale", type=float, default=2.0, help="a heavy request's size over a light one's"
    )
    ap.add_argument("--json", action="store_true", help="one JSON document on stdout")
    ap.add_argument("--sim-only", action="store_true", help="the simulator's phases only (seconds)")
    args = ap.parse_args()
    if not 0 < args.seconds <= 60 or not 0 <= args.warmup <= 30:
        ap.error("--seconds in (0, 60], --warmup in [0, 30]")
    if not 0 < args.light_rps <= 100 or not 0.01 <= args.unit_ms <= 5:
        ap.error("--light-rps in (0, 100], --unit-ms in [0.01, 5]")
    if not 1 <= args.heavy_scale <= 10 or not 0 <= args.jitter < 1:
        ap.error("--heavy-scale in [1, 10], --jitter in [0, 1)")
    sim = SimBench(args).run()
    sim_ok = sim["sim_light_p95_wait_ratio"] <= 2.0 and sim["sim_weighted_share_error"] <= 0.10
    if args.sim_only:
        result = {**sim, "seconds": args.seconds, "warmup_s": args.warmup, "ok": sim_ok}
    else:
        result = asyncio.run(Bench(args).run())
        result = {**result, **sim, "ok": result["ok"] and sim_ok}
    if args.json:
        print(json.dumps(result))
        return 0 if result["ok"] else 1
    if not args.sim_only:
        w = result["light_p95_wait_ms"]
        print(f"light p95 wait, ms: alone {w['alone']}, with heavy {w['fair']}, FIFO {w['fifo']}")
        print(
            f"light_p95_wait_ratio {result['light_p95_wait_ratio']} (FIFO "
            f"{result['light_p95_wait_ratio_fifo']}); heavy sends "
            f"{result['heavy_token_ratio']}x the tokens"
        )
        print(
            f"weights 2:1: service ratio {result['weighted_service_ratio']}, "
            f"weighted_share_error {result['weighted_share_error']} (instance time "
            f"{result['weighted_share_error_backend']})"
        )
        print(f"statuses {result['statuses']}")
    w = sim["sim_light_p95_wait_ms"]
    print(
        f"simulator: light p95 wait, ms: alone {w['alone']}, with heavy {w['fair']}, FIFO "
        f"{w['fifo']}; light_p95_wait_ratio {sim['sim_light_p95_wait_ratio']} (FIFO "
        f"{sim['sim_light_p95_wait_ratio_fifo']}); weights 2:1: service ratio "
        f"{sim['sim_weighted_service_ratio']}, weighted_share_error "
        f"{sim['sim_weighted_share_error']} (instance time "
        f"{sim['sim_weighted_share_error_instance_s']})"
    )
    print("ok" if result["ok"] else "FAILED: a target was missed")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
