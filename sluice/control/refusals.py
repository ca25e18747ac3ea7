"""Refused attempts go on record (issue 31): a token's request refused for its role or scope
(403), a body over its cap or too slow (413, 408), a gateway token syncing an id that is not
its own: each is an audit row `request-refused` naming the token, its person, the request
and why, so the audit shows who tried what and not only what was done.

Bounded, because a refused client may retry in a loop: per (token, status, request) at most
one row every `PERIOD_S`; the refusals in between are counted and the next row says how many
(`detail.suppressed`). An unauthenticated request (401) is no one's: it is not audited, only
answered. A failure to write the row never changes the answer.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from sluice.control.auth import Principal
from sluice.core import Clock

__all__ = ["PERIOD_S", "RefusalAudit"]

log = logging.getLogger(__name__)

PERIOD_S = 60.0
"""One row per token, status and request a minute at most: enough to see an attempt and
its persistence, too few to let a loop fill the audit log."""
MAX_KEYS = 4096
"""Distinct (token, status, request) kept for throttling; the oldest are forgotten beyond."""

Append = Callable[[str, str, str, str, dict[str, Any]], Awaitable[None]]
"""(actor, action, target, reason, detail): `Controller.audit`."""


class RefusalAudit:
    def __init__(self, append: Append, clock: Clock) -> None:
        self._append = append
        self._clock = clock
        self._last: dict[tuple[str, int, str], float] = {}
        self._suppressed: dict[tuple[str, int, str], int] = {}

    async def record(self, who: Principal, request: str, status: int, why: str) -> None:
        """Audit that `who`'s `request` ("POST /v1/groups/chat/scale") got `status`; never
        raises (the refusal is answered whatever happens here)."""
        try:
            await self._record(who, request, status, why)
        except Exception:  # the store is down, the clock unreadable: the refusal stands
            log.warning("could not audit a refused request of %r (%s)", who.name, request)

    async def _record(self, who: Principal, request: str, status: int, why: str) -> None:
        key = (who.name, status, request)
        now = self._clock.now()
        last = self._last.get(key)
        if last is not None and now - last < PERIOD_S:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return
        self._last.pop(key, None)
        self._last[key] = now
        if len(self._last) > MAX_KEYS:
            oldest = next(iter(self._last))
            self._last.pop(oldest)
            self._suppressed.pop(oldest, None)
        detail = {
            "person": who.person,
            "status": status,
            "request": request,
            "suppressed": self._suppressed.pop(key, 0),
        }
        await self._append(who.name, "request-refused", request, why[:500], detail)
