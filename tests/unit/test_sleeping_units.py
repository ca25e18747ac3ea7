"""A sleeping standby's accelerator units in quota (issue 36): a sleeper on its group's
lendable guarantee is fenced when another group of its pool waits for units, lent once
fenced, woken only when quota grants its units back (a reclaim), and metered at its host
memory meanwhile. Sleepers above the guarantee keep their units. On a pool that pins
devices the reclaim drains the borrower on the sleeper's own device, and a sleeper whose
device no reclaim frees is replaced."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from sluice.core import InstanceState, InstanceStatus
from sluice.policy import Drain, Launch
from sluice.policy.autoscale import FixedPolicy, GroupLoad
from sluice.policy.quota import QuotaState
from sluice.policy.quota.metering import Meter
from sluice.policy.standby import sleeping_units
from sluice.policy.tick import TickDecision, TickInput, decide
from sluice.spec import PlatformSpec, load_spec_text

T0 = 1_795_996_800.0

SPEC = """
pools:
  - {name: gpu, count: 4, memory_gb: 16, price_per_hour: 2.0, host_memory_price_per_gb_hour: 0.01}
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
    autoscaling: {min: 1, max: 3, sleeping_standby: 1}
    quota: {guaranteed: 2, reclaim_grace_s: 5, QUOTA}
  - name: batch
    owner: o
    business: ads
    alert_channel: c
    models: {m-b: {runtime: sim}}
    resources: {pool: gpu, memory_gb: 1}
    replicas: 3
"""


def spec(quota: str = "priority: 0") -> PlatformSpec:
    return load_spec_text(SPEC.replace("QUOTA", quota)).spec


def inst(s: PlatformSpec, group: str, k: int, at: float = 0.0) -> InstanceStatus:
    g = s.group(group)
    assert g is not None
    t = T0 - 100 + at + k
    return InstanceStatus(f"{group}-{k}", group, g.template(), InstanceState.READY, t, ready_at=t)


def tick(
    s: PlatformSpec,
    observed: list[InstanceStatus],
    count: int = 1,
    *,
    asleep: frozenset[str] = frozenset(),
    fenced: frozenset[str] = frozenset(),
    quota: QuotaState | None = None,
    now: float = T0,
) -> TickDecision:
    load = GroupLoad(
        at=now, current=count, ready=count, slots_per_instance=1, in_flight=0, queued=0, arrivals=0
    )
    return decide(
        TickInput(
            spec=s,
            observed=observed,
            counts={"chat": count},
            now=now,
            loads={"chat": load},
            scalers={"chat": FixedPolicy(count)},
            quota=quota or QuotaState(),
            meter=Meter(),
            asleep=asleep,
            fenced=fenced,
        )
    )


def test_a_sleeper_on_the_lendable_guarantee_is_fenced_when_another_group_waits() -> None:
    s = spec()
    observed = [inst(s, "chat", 0), inst(s, "chat", 1, 10), inst(s, "batch", 0, 20)]
    observed += [inst(s, "batch", 1, 20)]
    d = tick(s, observed, asleep=frozenset({"chat-1"}))
    # not fenced yet: it holds its unit; batch (3 wanted, 2 running) finds the pool full
    assert d.allocation.enforced.grants["batch"].instances == 2
    assert d.fence == {"chat-1"}
    assert d.held["chat"] == 2
    assert d.allocation.enforced.grants["chat"].spend_per_hour == 2 * 2.0
    # nobody waits (batch wants 2): nothing is fenced, a gateway may wake it in seconds
    fits = load_spec_text(
        SPEC.replace("QUOTA", "priority: 0").replace("replicas: 3", "replicas: 2")
    )
    assert tick(fits.spec, observed, asleep=frozenset({"chat-1"})).fence == frozenset()


def test_a_group_held_by_its_own_limit_does_not_fence_a_sleeper() -> None:
    capped = "    replicas: 3\n    budget: {max_accelerators: 1}"
    s = load_spec_text(SPEC.replace("QUOTA", "").replace("    replicas: 3", capped)).spec
    observed = [inst(s, "chat", 0), inst(s, "chat", 1, 10), inst(s, "batch", 0, 20)]
    d = tick(s, observed, asleep=frozenset({"chat-1"}))
    assert d.allocation.enforced.refusals["batch"].startswith("budget")
    assert d.fence == frozenset()


def test_a_fenced_sleeper_is_lent_kept_and_metered_at_its_host_memory() -> None:
    s = spec()
    observed = [inst(s, "chat", 0), inst(s, "chat", 1, 10), inst(s, "batch", 0, 20)]
    observed += [inst(s, "batch", 1, 20)]
    d = tick(s, observed, asleep=frozenset({"chat-1"}), fenced=frozenset({"chat-1"}))
    grants = d.allocation.enforced.grants
    assert grants["batch"].instances == 3  # the sleeper's unit, lent
    assert [a.group for a in d.actions if isinstance(a, Launch)] == ["batch"]
    assert not [a for a in d.actions if isinstance(a, Drain)]  # the sleeper is kept
    assert d.held["chat"] == 1
    assert d.fence == {"chat-1"}  # still lent: still fenced
    # one unit at 2.0/h, and the sleeper's 16 GiB of host memory at 0.01/GiB-h
    assert d.allocation.enforced.grants["chat"].spend_per_hour == 2.0 + 16 * 0.01
    assert not d.scaled[0].guards  # the count is not clipped by its sleeper's place


def test_a_fenced_sleeper_the_count_needs_waits_for_a_reclaim_then_wakes() -> None:
    s = spec()
    chat = [inst(s, "chat", 0), inst(s, "chat", 1, 10)]
    batch = [inst(s, "batch", k, 20) for k in range(3)]  # one on the sleeper's unit
    asleep = fenced = frozenset({"chat-1"})
    d = tick(s, chat + batch, count=2, asleep=asleep, fenced=fenced)
    assert d.unwoken == {"chat-1"} and "chat-1" in d.fence  # its unit is lent
    assert not [a for a in d.actions if isinstance(a, Launch)]  # no new instance either
    assert not [a for a in d.actions if isinstance(a, Drain)]  # grace: 5 s
    memory = d.allocation.enforced.state
    later = tick(s, chat + batch, 2, asleep=asleep, fenced=fenced, quota=memory, now=T0 + 6)
    drains = [a for a in later.actions if isinstance(a, Drain)]
    assert [a.instance_id for a in drains] == ["batch-2"]  # reclaimed: the newest borrower
    assert later.unwoken == {"chat-1"}
    gone = chat + batch[:2]  # the borrower drained and left: the unit is back
    memory = later.allocation.enforced.state
    after = tick(s, gone, 2, asleep=asleep, fenced=fenced, quota=memory, now=T0 + 8)
    assert after.unwoken == frozenset() and "chat-1" not in after.fence  # wake it now
    assert not [a for a in after.actions if isinstance(a, (Launch, Drain))]


def test_sleepers_above_the_guarantee_or_beyond_lendable_keep_their_units() -> None:
    for quota in ("guaranteed: 2, lendable: 0", "guaranteed: 1"):
        s = load_spec_text(SPEC.replace("guaranteed: 2, reclaim_grace_s: 5, QUOTA", quota)).spec
        observed = [inst(s, "chat", 0), inst(s, "chat", 1, 10), inst(s, "batch", 0, 20)]
        d = tick(s, observed, asleep=frozenset({"chat-1"}))
        assert d.fence == frozenset() and d.held["chat"] == 2, quota


PINNED = SPEC.replace("price_per_hour: 2.0,", 'price_per_hour: 2.0, devices: ["0", "1", "2", "3"],')


def on(
    i: InstanceStatus, device: str, state: InstanceState = InstanceState.READY
) -> InstanceStatus:
    return replace(i, labels={"devices": device}, state=state)


def test_a_sleeper_on_a_pool_that_pins_devices_lends_its_device_and_gets_that_one_back() -> None:
    s = load_spec_text(PINNED.replace("QUOTA", "priority: 0")).spec
    chat = [on(inst(s, "chat", 0), "0"), on(inst(s, "chat", 1, 10), "1")]
    asleep = fenced = frozenset({"chat-1"})
    d = tick(s, [*chat, on(inst(s, "batch", 0, 20), "2")], asleep=asleep, fenced=fenced)
    assert d.held["chat"] == 1 and d.allocation.enforced.grants["batch"].instances == 3
    # batch-0 was placed on the sleeper's device (the supervisor puts borrowers there last)
    batch = [on(inst(s, "batch", 0, 20), "1"), on(inst(s, "batch", 1, 30), "2")]
    batch += [on(inst(s, "batch", 2, 40), "3")]
    d = tick(s, chat + batch, count=2, asleep=asleep, fenced=fenced)
    assert d.unwoken == {"chat-1"} and d.claims[0].reclaim_first == {"batch-0"}
    memory = d.allocation.enforced.state
    later = tick(s, chat + batch, 2, asleep=asleep, fenced=fenced, quota=memory, now=T0 + 6)
    drains = [a.instance_id for a in later.actions if isinstance(a, Drain)]
    assert drains == ["batch-0"]  # the one on its device, not the newest borrower (batch-2)
    assert later.unwoken == {"chat-1"} and "chat-1" in later.fence
    memory = later.allocation.enforced.state
    after = tick(s, chat + batch[1:], 2, asleep=asleep, fenced=fenced, quota=memory, now=T0 + 8)
    assert after.unwoken == frozenset() and "chat-1" not in after.fence  # its device is free
    assert not [a for a in after.actions if isinstance(a, (Launch, Drain))]


def test_a_borrower_on_the_sleepers_device_drains_when_units_came_free_elsewhere() -> None:
    s = load_spec_text(
        PINNED.replace("QUOTA", "priority: 0").replace("replicas: 3", "replicas: 2")
    ).spec
    chat = [on(inst(s, "chat", 0), "0"), on(inst(s, "chat", 1, 10), "1")]
    batch = [on(inst(s, "batch", 0, 20), "1"), on(inst(s, "batch", 1, 30), "2")]  # 3 is free
    asleep = fenced = frozenset({"chat-1"})
    d = tick(s, chat + batch, count=2, asleep=asleep, fenced=fenced)
    assert not d.allocation.enforced.reclaims  # a unit is free: quota grants chat at once
    drains = [a for a in d.actions if isinstance(a, Drain)]
    assert [(a.group, a.instance_id) for a in drains] == [("batch", "batch-0")], drains
    assert "chat-1" in drains[0].reason and "borrowed" in drains[0].reason
    assert "chat-1" in d.unwoken and "chat-1" in d.fence  # until batch-0 is gone
    assert not [a for a in d.actions if isinstance(a, Launch) and a.group == "chat"]


def test_a_sleeper_whose_device_no_reclaim_frees_is_replaced_by_a_fresh_instance() -> None:
    text = PINNED.replace("    replicas: 3", "    replicas: 2\n    quota: {guaranteed: 2}")
    s = load_spec_text(text.replace("QUOTA", "priority: 0")).spec
    chat = [on(inst(s, "chat", 0), "0"), on(inst(s, "chat", 1, 10), "1")]
    # batch-1 runs on the sleeper's device within batch's own guarantee; device 3 is free
    batch = [on(inst(s, "batch", 0, 20), "2"), on(inst(s, "batch", 1, 30), "1")]
    asleep = fenced = frozenset({"chat-1"})
    d = tick(s, chat + batch, count=2, asleep=asleep, fenced=fenced)
    assert not d.allocation.enforced.reclaims  # nobody borrows: nothing to reclaim
    drains = [a for a in d.actions if isinstance(a, Drain)]
    assert [a.instance_id for a in drains] == ["chat-1"] and "batch-1" in drains[0].reason
    assert [a.group for a in d.actions if isinstance(a, Launch)] == ["chat"]
    assert "chat-1" in d.unwoken  # never woken onto a device another instance holds


@given(
    ages=st.lists(st.integers(0, 50), min_size=1, max_size=6, unique=True),
    awake=st.integers(0, 4),
    serving=st.integers(0, 4),
    warm=st.integers(0, 2),
    guaranteed=st.integers(0, 8),
    lendable=st.none() | st.integers(0, 8),
    fenced_mask=st.integers(0, 63),
)
def test_sleeping_units_never_lends_a_needed_sleeper_or_more_than_the_guarantee(
    ages: list[int],
    awake: int,
    serving: int,
    warm: int,
    guaranteed: int,
    lendable: int | None,
    fenced_mask: int,
) -> None:
    asleep = [(float(a), f"i{a:02d}") for a in ages]
    fenced = {iid for n, (_, iid) in enumerate(asleep) if fenced_mask >> n & 1}
    u = sleeping_units(asleep, awake, serving, warm, 1, guaranteed, lendable, fenced)
    needed = min(len(asleep), max(0, serving + warm - awake))
    oldest = [iid for _, iid in sorted(asleep)][:needed]
    assert not set(u.lendable) & set(oldest)  # the places awake ones fill wake the oldest
    assert set(u.to_wake) <= set(oldest) and set(u.to_wake) <= fenced
    assert u.released == fenced & {iid for _, iid in asleep}
    assert u.placed == len(u.released) - len(u.to_wake)
    cap = guaranteed if lendable is None else min(lendable, guaranteed)
    assert len(u.lendable) <= max(0, min(cap, guaranteed - serving - warm))
