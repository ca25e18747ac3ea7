"""The gateway's call that wakes a sleeping standby instance (`GroupTraffic.wake`): rare, so a
plain client per call, off the request path's own connection pool."""

from __future__ import annotations

import httpx

from sluice.policy.routing import Endpoint, WakeCall

__all__ = ["wake_instance"]


async def wake_instance(ep: Endpoint, call: WakeCall) -> str | None:
    """POST the wake path on `ep`; None once it answered 2xx (awake), else why not."""
    try:
        async with httpx.AsyncClient(timeout=call.timeout_s, trust_env=False) as client:
            r = await client.post(f"http://{ep.host}:{ep.port}{call.path}")
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"[:300]
    return None if r.is_success else f"HTTP {r.status_code}: {r.text[:200]}"
