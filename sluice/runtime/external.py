"""Instances that already run elsewhere: existing servers Sluice fronts but never starts.

`launch` names the endpoint the request carries, `stop` leaves it running, and its process
is never seen exiting: whether it serves is for the health probes to say, and the
supervisor then takes it out of routing and puts it back (an endpoint is never replaced).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from sluice.core import SluiceError
from sluice.runtime.base import InstanceHandle, LaunchRequest

__all__ = ["ExternalRuntime"]


class ExternalRuntime:
    async def launch(self, req: LaunchRequest) -> InstanceHandle:
        if req.endpoint is None:
            raise SluiceError(f"instance {req.instance_id} names no endpoint to front")
        parts = urlsplit(req.endpoint)
        if parts.hostname is None or parts.port is None:
            raise SluiceError(f"endpoint {req.endpoint!r} of {req.instance_id} is not HOST:PORT")
        return InstanceHandle(req.instance_id, parts.hostname, parts.port, None)

    async def stop(self, handle: InstanceHandle, grace_s: float) -> int | None:
        return None  # not ours to stop

    def exit_code(self, handle: InstanceHandle) -> int | None:
        return None

    def adopt(self, handle: InstanceHandle) -> bool:
        return False  # a restart claims the endpoints afresh: that costs one probe

    def log_path(self, instance_id: str) -> str | None:
        return None
