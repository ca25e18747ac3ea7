"""Whether a gateway can serve, and how fresh its routes are (issue 33): `/readyz`, the
`ready`/`stale` fields of `/healthz`, and the readiness gauges of `/metrics`.

A gateway is **unready** until it has routes: the first routing snapshot its controller
publishes (`sluice up`, fed in process) or the first one a sync brings (`sluice gateway`).
Until then it knows no API key, so a request is answered 503 with `Retry-After`
(`NotReady`), never 401: the key may well be valid, the gateway has not heard of it yet.
Once ready it stays ready: the instances it routes to outlive the controller, so it serves
its last good routes while no controller answers, and says so:

| routes | last sync that a controller answered        | ready | stale |
|--------|---------------------------------------------|-------|-------|
| none   | any                                         | no    | no    |
| some   | fed in process (no sync)                    | yes   | no    |
| some   | at most `stale_after_s` ago                 | yes   | no    |
| some   | more than `stale_after_s` ago (or never)    | yes   | yes   |

Times are `time.monotonic()` seconds, passed in by the caller.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sluice.gateway.errors import NotReady

__all__ = ["STALE_AFTER_S", "Readiness"]

STALE_AFTER_S = 3.0
"""Seconds without a sync a controller answered after which the routes count as stale: a
gateway syncs every second (`remote.SYNC_PERIOD_S`) and gives up on a controller after 2 s
(`remote.SYNC_TIMEOUT_S`), so three seconds is one sync lost for sure, not one still on
its way."""


class Readiness:
    """The readiness of one gateway process. `controls`: the control URLs whose syncs feed
    it (`sluice gateway`); empty: fed in process by its controller (`sluice up`), never
    stale. `ControlSync` reports each sync (`synced`, `failed`); `GatewayState` says when
    the first routes are in (`routed`)."""

    __slots__ = ("_controls", "_failing", "_last_ok", "routed", "stale_after_s")

    def __init__(self, controls: Sequence[str] = (), stale_after_s: float = STALE_AFTER_S) -> None:
        self._controls = tuple(controls)
        self.stale_after_s = stale_after_s
        self.routed = False
        """the first routes are in: set once, by `GatewayState.set_snapshot`"""
        self._last_ok: float | None = None
        """when a controller last answered a sync"""
        self._failing: str | None = None
        """why the last sync round got no answer; None: it got one (or none was tried)"""

    # -- reports ----------------------------------------------------------------------------

    def synced(self, now: float) -> None:
        """A controller answered a sync at `now`."""
        self._last_ok = now
        self._failing = None

    def failed(self, why: str) -> None:
        """No controller answered the last sync round (`why`: each one's problem). The age
        still counts from the last answer, not from the first failure."""
        self._failing = why or "no answer"

    # -- what it says -----------------------------------------------------------------------

    @property
    def syncs(self) -> bool:
        """Whether a sync feeds this gateway (not a controller in its process)."""
        return bool(self._controls) or self._last_ok is not None or self._failing is not None

    def age(self, now: float) -> float | None:
        """Seconds since a controller last answered a sync; None: never (or no sync)."""
        return None if self._last_ok is None else max(0.0, now - self._last_ok)

    def stale(self, now: float) -> bool:
        """Serving routes no controller confirmed in the last `stale_after_s`."""
        if not self.routed or not self.syncs:
            return False
        age = self.age(now)
        return age is None or age > self.stale_after_s

    def reason(self, now: float) -> str | None:
        """Why it is unready or stale, in a line; None: neither."""
        source = self._source()
        if not self.routed:
            if not self.syncs:
                return "no routes yet: the controller has published none yet"
            if self._last_ok is None:
                said = f"no routes yet: never synced with {source}"
            else:
                said = f"no routes yet: {source} has published none yet"
            return said if self._failing is None else f"{said} ({self._failing})"
        if not self.stale(now):
            return None
        age = self.age(now)
        since = "ever" if age is None else f"for {age:.0f} s"
        said = f"serving the last good routes: no sync with {source} {since}"
        return said if self._failing is None else f"{said} ({self._failing})"

    def report(self, now: float) -> dict[str, Any]:
        """`{"ready", "stale"}`, plus `last_sync_age_s` once a controller answered a sync and
        `reason` while unready or stale (JSON-able)."""
        out: dict[str, Any] = {"ready": self.routed, "stale": self.stale(now)}
        age = self.age(now)
        if age is not None:
            out["last_sync_age_s"] = round(age, 3)
        why = self.reason(now)
        if why is not None:
            out["reason"] = why
        return out

    def error(self, now: float) -> NotReady:
        """What a request gets while unready: 503, `Retry-After`, the reason."""
        return NotReady(self.reason(now) or "no routes yet")

    def _source(self) -> str:
        controls = self._controls
        if not controls:
            return "the controller"
        if len(controls) == 1:
            return f"the controller at {controls[0]}"
        return "the controllers at " + ", ".join(controls)
