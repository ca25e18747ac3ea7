"""The fence that keeps a sleeper whose units are lent from being woken by a gateway: a
sleeper counts fenced only once every live gateway serves a snapshot that leaves it out
(`GatewayFleet.oldest_served`, `Sleepers.fenced`); the next controller takes the fence up
from what the store kept (`Sleepers.restore`)."""

from __future__ import annotations

import asyncio

from sluice.control.gateways import GATEWAY_TTL_S, GatewayFleet
from sluice.control.sleepers import Sleepers, fences_record
from sluice.core import ManualClock


def test_the_oldest_version_a_live_gateway_serves_of_this_epoch() -> None:
    clock = ManualClock(0.0)
    fleet = GatewayFleet(clock)
    assert fleet.oldest_served(epoch=1) is None  # no remote gateway: the local one is current
    fleet.sync("gw-1", "boot", {}, {}, 7, (0, 1), have_epoch=1)
    fleet.sync("gw-2", "boot", {}, {}, 5, (0, 1), have_epoch=1)
    assert fleet.oldest_served(epoch=1) == 5
    fleet.sync("gw-3", "boot", {}, {}, 9, (0, 1), have_epoch=0)  # a deposed leader's
    assert fleet.oldest_served(epoch=1) == 0
    clock.advance(GATEWAY_TTL_S + 1)  # all fall silent
    assert fleet.oldest_served(epoch=1) is None


def test_a_sleeper_counts_fenced_once_every_gateway_serves_a_snapshot_without_it() -> None:
    async def events(*_: object) -> None:
        return None

    async def inflight(_: str) -> int:
        return 0

    sleepers = Sleepers(events, inflight, lambda _: False, lambda: None, lambda: 0.0)  # type: ignore[arg-type]
    sleepers.asleep |= {"a", "b"}
    sleepers.fence(frozenset({"a"}), frozenset())
    assert sleepers.fenced(None) == frozenset()  # not yet published without it
    sleepers.published(4)
    assert sleepers.fenced(3) == frozenset()  # a gateway still serves version 3
    assert sleepers.fenced(4) == {"a"} and sleepers.fenced(None) == {"a"}
    sleepers.fence(frozenset({"a", "b"}), frozenset())
    sleepers.published(5)  # b left out from 5 on; a kept its first version
    assert sleepers.fenced(4) == {"a"} and sleepers.fenced(5) == {"a", "b"}
    sleepers.fence(frozenset({"b"}), frozenset())  # a unfenced: a gateway may wake it
    assert sleepers.fenced(9) == {"b"}
    sleepers.asleep.discard("b")  # woken: no longer fenced
    assert sleepers.fenced(9) == frozenset()
    asyncio.run(sleepers.close())


def test_the_next_controller_takes_up_the_kept_fence() -> None:
    """`a` was lent, `b` fenced but not yet lent (a gateway may still have served a
    snapshot that offered it); `c` is not fenced, so it cannot be lent."""

    async def events(*_: object) -> None:
        return None

    async def inflight(_: str) -> int:
        return 0

    def fresh() -> Sleepers:
        return Sleepers(events, inflight, lambda _: True, lambda: None, lambda: 0.0)  # type: ignore[arg-type]

    assert fresh().restore({}) == frozenset()  # nothing kept
    sleepers = fresh()
    lent = sleepers.restore(fences_record(["a", "b"], ["a", "c"]))
    assert lent == {"a"}
    assert sleepers.asleep == {"a", "b"} and sleepers.fencing == {"a", "b"}
    # a remote gateway still on the old epoch counts 0: every snapshot it may serve, of
    # either epoch, leaves `a` out
    assert sleepers.fenced(0) == {"a"} and sleepers.fenced(None) == {"a"}
    sleepers.published(1)  # `b` is fenced anew on this epoch
    assert sleepers.fenced(0) == {"a"} and sleepers.fenced(1) == {"a", "b"}
    asyncio.run(sleepers.close())
