"""A sleeping standby's fence outlives its controller (issue 36): a controller that starts
while a sleeper's units are lent (a restart, a standby's takeover) reads the fence back
from the store, so its first snapshot leaves the sleeper out of the wakeable standby, its
first tick keeps the unit lent (the borrower is not drained as over a shrunk pool) and
`units-lent` is not said again; when the count needs the sleeper, the borrower is
reclaimed and then the sleeper woken, `units-back` said once.

A real controller on a real SQLite store; the instances are statuses (a launch is ready at
once) and the servers' sleep endpoints answer through an in-process transport."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from sluice.control import Controller, EventLog
from sluice.control.sleepers import FENCES_KEY
from sluice.core import InstanceState, InstanceStatus, ManualClock
from sluice.policy import Endpoint, RoutingSnapshot
from sluice.spec import GroupSpec, LoadedSpec, Sealer, load_spec_text
from sluice.store import Store

SEALER = Sealer(bytes(range(64)))

SPEC = """
pools:
  - {name: gpu, count: 3, memory_gb: 16}
groups:
  - name: chat
    owner: o
    business: search
    alert_channel: c
    models:
      m-chat:
        runtime: command
        command:
          argv: [server, "{port}"]
          sleep: {host_memory_gb: 16}
    resources: {pool: gpu, accelerators: 1, memory_gb: 1}
    autoscaling: {min: MIN, max: 3, sleeping_standby: 1}
    quota: {guaranteed: 2, reclaim_grace_s: 5}
  - name: batch
    owner: o
    business: ads
    alert_channel: c
    models: {m-b: {runtime: sim}}
    resources: {pool: gpu, accelerators: 1, memory_gb: 1}
    replicas: 2
"""


def spec(minimum: int = 1) -> LoadedSpec:
    return load_spec_text(SPEC.replace("MIN", str(minimum)), "platform.yaml")


class Supervisor:
    """Instances that are just statuses: a launch is ready at once, a drain gone at once."""

    def __init__(self, instances: dict[str, InstanceStatus] | None = None) -> None:
        self.changed = asyncio.Event()
        self.instances = dict(instances or {})
        self.adopted = set(self.instances)
        self.drained: dict[str, str] = {}
        self.launched: list[str] = []
        self.withheld_env: frozenset[str] = frozenset()

    def statuses(self) -> list[InstanceStatus]:
        return list(self.instances.values())

    def ready_endpoints(self) -> dict[str, list[Endpoint]]:
        out: dict[str, list[Endpoint]] = {}
        for s in self.instances.values():
            port = int(s.id.rsplit("-", 1)[1])
            out.setdefault(s.group, []).append(
                Endpoint(s.id, "127.0.0.1", port, 1, ready_at=s.created_at)
            )
        return out

    def launch(self, spec: GroupSpec, template: str, reason: str, pool: object = None) -> str:
        iid = f"{spec.name}-{len(self.launched) + 100}"
        self.launched.append(iid)
        t = 1_800_000_000.0 + len(self.launched)
        self.instances[iid] = InstanceStatus(
            iid, spec.name, template, InstanceState.READY, t, ready_at=t, url="http://x:9"
        )
        return iid

    def drain(self, instance_id: str, reason: str) -> None:
        self.drained[instance_id] = reason
        self.instances.pop(instance_id, None)

    def remove(self, instance_id: str, reason: str) -> None:
        self.instances.pop(instance_id, None)

    async def inflight(self, instance_id: str) -> int:
        return 0

    def devices_free_for(self, instance_id: str) -> bool:
        return True  # statuses pinned to no device


class Servers:
    """The servers' sleep mode (vLLM's: POST /sleep, POST /wake_up, GET /is_sleeping), by
    port; every wake counted."""

    def __init__(self) -> None:
        self.asleep: dict[int, bool] = {}
        self.wakes: dict[int, int] = {}
        self.silent: set[int] = set()
        """ports whose server answers nothing but 503 (stuck loading, say)"""

    def __call__(self, request: httpx.Request) -> httpx.Response:
        port, path = request.url.port or 0, request.url.path
        if port in self.silent:
            return httpx.Response(503, json={"error": "not ready"})
        if path == "/sleep":
            self.asleep[port] = True
        elif path == "/wake_up":
            self.asleep[port] = False
            self.wakes[port] = self.wakes.get(port, 0) + 1
        elif path == "/is_sleeping":
            return httpx.Response(200, json={"is_sleeping": self.asleep.get(port, False)})
        return httpx.Response(200, json={})


def controller(
    store: Store, sup: Supervisor, clock: ManualClock, servers: Servers
) -> tuple[Controller, list[tuple[RoutingSnapshot, frozenset[str]]]]:
    """A controller, and every snapshot it publishes with the sleepers lent as it does."""
    published: list[tuple[RoutingSnapshot, frozenset[str]]] = []
    ctl = Controller(
        store,
        sup,  # type: ignore[arg-type]
        EventLog(store, clock),
        clock,
        lambda snap: published.append((snap, frozenset(filter(ctl.units_lent, sup.instances)))),
        sealer=SEALER,
    )
    ctl._sleepers._client = httpx.AsyncClient(transport=httpx.MockTransport(servers))
    return ctl, published


async def tick(ctl: Controller, clock: ManualClock, n: int = 1) -> None:
    for _ in range(n):
        clock.advance(1.0)
        await ctl.tick()
        for _ in range(20):  # the sleeps, wakes and asks it started
            await asyncio.sleep(0)


def wakeable(
    published: list[tuple[RoutingSnapshot, frozenset[str]]], lent_only: bool = True
) -> set[str]:
    """Every chat sleeper a snapshot published as wakeable (while its units were lent)."""
    return {
        e.instance_id
        for snap, lent in published
        for e in snap.sleeping.get("chat", ())
        if e.instance_id in lent or not lent_only
    }


async def applied(tmp_path: Path) -> tuple[ManualClock, Store, Servers]:
    """A store in which a first controller applied `spec()` and then died (a restart, or a
    standby's takeover, comes next)."""
    clock = ManualClock(1_800_000_000.0)
    store = Store.for_home(tmp_path)
    servers = Servers()
    ctl, _ = controller(store, Supervisor(), clock, servers)
    await ctl.load_state()
    await ctl.apply(spec(), "tester", "test")
    await ctl.close()
    return clock, store, servers


def running_since(t0: float, ready: dict[str, float]) -> dict[str, InstanceStatus]:
    """Ready instances for a new controller to adopt: id -> seconds after `t0` it was
    ready (its group is the id's first word)."""
    out = {}
    for iid, after in ready.items():
        g = spec().spec.group(iid.split("-")[0])
        assert g is not None
        t = t0 + after
        out[iid] = InstanceStatus(
            iid, g.name, g.template(), InstanceState.READY, t, ready_at=t, url="http://x:9"
        )
    return out


def kinds(store: Store, instance: str) -> list[str]:
    return [e.kind for e in reversed(store.list_events(limit=500)) if e.instance == instance]


@pytest.mark.asyncio
async def test_a_new_controller_keeps_the_fence_and_the_loan_then_reclaims_and_wakes(
    tmp_path: Path,
) -> None:
    clock = ManualClock(1_800_000_000.0)
    store = Store.for_home(tmp_path)
    servers = Servers()
    sup = Supervisor()
    ctl, _ = controller(store, sup, clock, servers)
    await ctl.load_state()
    await ctl.apply(spec(), "tester", "test")
    # chat: one serving, one sleeping standby; batch gets the third unit, then the
    # sleeper's once it is fenced from the gateways
    sleeper = ""
    for _ in range(8):
        await tick(ctl, clock)
        sleeper = next((i for i in sup.instances if ctl.asleep(i)), sleeper)
        if sleeper and ctl.units_lent(sleeper) and len(sup.launched) == 4:
            break
    assert sleeper and ctl.units_lent(sleeper), sup.instances
    borrowed = sup.launched[-1]
    assert borrowed.startswith("batch") and not sup.drained
    assert store.get_state(FENCES_KEY) == {"fencing": [sleeper], "lent": [sleeper]}
    await ctl.close()  # killed: nothing handed over (close keeps only quota's timers)

    # the next controller adopts the same instances
    sup2 = Supervisor(sup.instances)
    ctl2, published = controller(store, sup2, clock, servers)
    await ctl2.load_state()
    assert ctl2.asleep(sleeper) and ctl2.units_lent(sleeper)
    await tick(ctl2, clock, 3)
    assert published and sleeper not in wakeable(published, lent_only=False)
    assert ctl2.units_lent(sleeper) and borrowed in sup2.instances, sup2.drained
    assert not sup2.drained and len(sup2.launched) == 0
    assert kinds(store, sleeper).count("units-lent") == 1

    # the count needs the sleeper now: batch's borrowed instance is reclaimed, then it wakes
    await ctl2.apply(spec(minimum=2), "tester", "more chat")
    port = int(sleeper.rsplit("-", 1)[1])
    for _ in range(12):
        await tick(ctl2, clock)
        if not ctl2.asleep(sleeper):
            break
    for _ in range(100):  # its `woken` event is stored by a thread: wait for it (5 s at most)
        if "woken" in kinds(store, sleeper):
            break
        await asyncio.sleep(0.05)
    assert not ctl2.asleep(sleeper) and servers.wakes.get(port) == 1
    assert sleeper not in wakeable(published)  # no gateway was offered it while lent
    assert borrowed in sup2.drained and "reclaim" in sup2.drained[borrowed], sup2.drained
    assert not any("shrank" in why for why in sup2.drained.values()), sup2.drained
    said = kinds(store, sleeper)
    assert said.count("units-back") == 1 and said.count("units-lent") == 1, said
    assert said.index("units-lent") < said.index("units-back") < said.index("woken"), said
    assert store.get_state(FENCES_KEY) == {"fencing": [], "lent": []}
    await ctl2.close()
    store.close()


@pytest.mark.asyncio
async def test_without_a_kept_fence_an_adopted_sleeper_is_not_counted_lent(
    tmp_path: Path,
) -> None:
    """Nothing kept (a store from before, or the fence lifted): nothing is restored."""
    clock, store, servers = await applied(tmp_path)
    ctl2, _ = controller(store, Supervisor(), clock, servers)
    await ctl2.load_state()
    assert not ctl2.units_lent("chat-0") and not ctl2.asleep("chat-0")
    await ctl2.close()
    store.close()


@pytest.mark.asyncio
async def test_an_adopted_sleeper_older_than_the_serving_one_is_never_routed(
    tmp_path: Path,
) -> None:
    """The placement serves from the oldest awake instances: a new controller asks the
    adopted ones whether they sleep before its first snapshot, so an older sleeper (the
    newer instance took its place in the count, say) is not put in rotation for a tick."""
    clock, store, servers = await applied(tmp_path)
    old, new = "chat-9001", "chat-9002"
    servers.asleep[9001] = True
    instances = running_since(clock.now() - 600, {old: 0, new: 10})
    ctl2, published = controller(store, Supervisor(instances), clock, servers)
    await ctl2.load_state()
    await ctl2.adopted()
    assert ctl2.asleep(old) and not ctl2.asleep(new)
    await tick(ctl2, clock, 2)
    assert published
    for snap, _ in published:
        assert [e.instance_id for e in snap.endpoints.get("chat", ())] == [new], snap.endpoints
    assert servers.wakes.get(9001) is None
    await ctl2.close()
    store.close()


@pytest.mark.asyncio
async def test_an_adopted_sleeper_that_does_not_answer_lends_no_units(tmp_path: Path) -> None:
    """A new controller counts an adopted instance in a sleeping place asleep (never routed)
    until it says so or takes a sleep; one that answers neither may be awake and hold its
    accelerator memory, so its unit is not lent to batch, which waits. Once it takes the
    sleep (tried again after `RETRY_S`), the unit is lent: batch gets its second instance."""
    clock, store, servers = await applied(tmp_path)
    instances = running_since(clock.now() - 600, {"chat-9001": 0, "chat-9002": 10, "batch-9003": 0})
    servers.silent.add(9002)  # the sleeper of the placement: awake, for all we know
    sup = Supervisor(instances)
    ctl2, _ = controller(store, sup, clock, servers)
    await ctl2.load_state()
    await ctl2.adopted()
    assert ctl2.asleep("chat-9002")  # never routed
    await tick(ctl2, clock, 4)
    assert ctl2.asleep("chat-9002") and not ctl2.units_lent("chat-9002")
    assert sup.launched == [], sup.launched  # batch waits: the unit may be held

    servers.silent.clear()  # it answers now: the sleep, tried again, settles it
    for _ in range(12):
        await tick(ctl2, clock)
        if sup.launched:
            break
    assert ctl2.units_lent("chat-9002") and servers.asleep.get(9002) is True
    assert [i.split("-")[0] for i in sup.launched] == ["batch"], sup.launched
    await ctl2.close()
    store.close()
