"""What a control-plane process says about itself to an orchestrator, and the explicit
stop of a fleet (issue 33): stopping a controller is not stopping the fleet.

- `health_app`: liveness and readiness over plain HTTP (`--health-port`), answered before
  the lease is sought, so a standby is alive but not ready and a load balancer or a
  Kubernetes Service sends control traffic only to the leader.
- `stop_route`: `POST /v1/control/stop` (`sluice down`), an admin's audited act that stops
  every instance and the process; a SIGTERM (what Kubernetes sends on every rollout) only
  hands over.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter
from pydantic import ConfigDict, Field
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from sluice.control.api_deps import Me
from sluice.control.auth import Role
from sluice.control.bodies import TextBody
from sluice.core import Forbidden

__all__ = ["StopRequest", "health_app", "stop_route"]


def health_app(role: Callable[[], str], ready: Callable[[], bool]) -> Starlette:
    """`GET /livez`: 200 while the process runs, with its `role` (standby, starting,
    leader, stopping); `GET /readyz`: 200 only while `ready()` (it leads and its control
    API listens), else 503 with the role and a `Retry-After`."""

    async def livez(_request: Request) -> JSONResponse:
        return JSONResponse({"alive": True, "role": role()})

    async def readyz(_request: Request) -> JSONResponse:
        now = role()
        if ready():
            return JSONResponse({"ready": True, "role": now})
        why = {
            "standby": "a standby: another controller holds the leader lease",
            "starting": "leading, the control API is not listening yet",
            "stopping": "stopping",
        }.get(now, now)
        return JSONResponse(
            {"ready": False, "role": now, "reason": why},
            status_code=503,
            headers={"Retry-After": "1"},
        )

    return Starlette(routes=[Route("/livez", livez), Route("/readyz", readyz)])


class StopRequest(TextBody):
    model_config = ConfigDict(str_max_length=4096)
    reason: str = Field(min_length=1)


def stop_route(
    api: APIRouter, stop: Callable[[bool, str, str], None], instances: Callable[[], int]
) -> None:
    """Add `POST /v1/control/stop` to `api`: stop every instance and this process
    (`stop(True, why, actor)`; the process audits it as it stops)."""

    @api.post("/v1/control/stop")
    async def stop_fleet(body: StopRequest, me: Me) -> dict[str, Any]:
        """Stop every instance, then this controller (`sluice down`). A standby on the
        same store takes over afterwards and starts the fleet again: stop standbys first."""
        me.require(Role.ADMIN, "stopping the fleet")
        if me.groups:
            raise Forbidden(
                f"stopping the fleet stops every group; token {me.name!r} is scoped to "
                f"{', '.join(sorted(me.groups))}: scale those groups to 0 instead"
            )
        running = instances()
        stop(True, f"sluice down: {body.reason}", me.name)
        return {"stopping": True, "instances": running}
