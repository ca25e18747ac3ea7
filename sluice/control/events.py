"""Every controller action becomes an event with its reason: in the log and in the store."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from sluice.core import Clock
from sluice.store import Store

__all__ = ["EventLog"]

log = logging.getLogger("sluice.events")


class EventLog:
    def __init__(self, store: Store, clock: Clock) -> None:
        self._store = store
        self._clock = clock

    async def emit(
        self, group: str, instance: str | None, kind: str, message: str, **detail: Any
    ) -> None:
        log.info("%s %s %s: %s", group, instance or "-", kind, message)
        await asyncio.to_thread(
            self._store.append_event,
            group=group,
            instance=instance,
            kind=kind,
            message=message,
            detail=detail,
            now=self._clock.now(),
        )
