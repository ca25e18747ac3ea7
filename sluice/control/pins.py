"""Replica pins: a group held at a count for a bounded time, whatever its autoscaler says.

`sluice loadtest` pins its group to one instance while it measures; like KEDA's
`paused-replicas`, a pinned group's autoscaler does not decide, and its count in force is
the pin's. Unlike it, every pin ends by itself (`until`), so a load test that died cannot
leave a group held at one instance; the end and the lifting are both audited events.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from sluice.control.events import EventLog
from sluice.store import Pin
from sluice.store.ports import PinRecords

__all__ = ["MAX_PIN_S", "Pins"]

MAX_PIN_S = 6 * 3600.0
"""The longest pin: a capacity test takes minutes; a group held for longer is an outage."""

Audit = Callable[[str, str, str, str, dict[str, Any]], Awaitable[None]]


class Pins:
    """The pins in force, kept in the store (a restarted control plane keeps them)."""

    def __init__(
        self, store: PinRecords, events: EventLog, audit: Audit, wake: Callable[[], None]
    ) -> None:
        """`wake`: the controller's next tick comes at once (a pin changes a count)."""
        self._store = store
        self._events = events
        self._audit = audit
        self._wake = wake
        self._pins: dict[str, Pin] = {}

    async def load(self) -> None:
        self._pins = {p.group: p for p in await asyncio.to_thread(self._store.pins)}

    def counts(self, now: float) -> dict[str, int]:
        """Every pinned count in force at `now`, by group."""
        return {g: p.replicas for g, p in self._pins.items() if now < p.until}

    def get(self, group: str) -> Pin | None:
        return self._pins.get(group)

    async def hold(
        self, group: str, replicas: int, for_s: float, actor: str, reason: str, now: float
    ) -> Pin:
        """Pin `group` at `replicas` from `now` for `for_s` seconds (at most `MAX_PIN_S`)."""
        pin = Pin(group, replicas, actor, reason, now, now + min(for_s, MAX_PIN_S))
        await self.set(pin)
        return pin

    async def set(self, pin: Pin) -> None:
        await asyncio.to_thread(self._store.set_pin, pin)
        self._pins[pin.group] = pin
        detail = {"replicas": pin.replicas, "until": pin.until}
        await self._audit(pin.actor, "pin", f"group/{pin.group}", pin.reason, detail)
        for_s = pin.until - pin.set_at
        await self._events.emit(
            pin.group,
            None,
            "pin",
            f"held at {pin.replicas} for up to {for_s:.0f} s by {pin.actor}: {pin.reason}",
            **detail,
        )
        self._wake()

    async def lift(self, group: str, actor: str, reason: str) -> Pin | None:
        """End `group`'s pin (None: there was none); its autoscaler decides again."""
        pin = self._pins.pop(group, None)
        if pin is None:
            return None
        await asyncio.to_thread(self._store.clear_pin, group)
        await self._audit(actor, "unpin", f"group/{group}", reason, {"replicas": pin.replicas})
        await self._events.emit(group, None, "unpin", f"pin at {pin.replicas} lifted: {reason}")
        self._wake()
        return pin

    async def expire(self, now: float, groups: Collection[str]) -> None:
        """Lift the pins that ran out, and those of groups that left the spec."""
        for pin in [p for p in self._pins.values() if now >= p.until or p.group not in groups]:
            why = "it ran out" if now >= pin.until else "the group left the spec"
            await self.lift(pin.group, "sluice", why)
