"""The data plane: one stable HTTP endpoint that authenticates, routes and proxies requests.

Built on `asyncio.Protocol` + `httptools` with pooled upstream connections, for throughput.
It never imports `sluice.control`; the controller feeds it `RoutingSnapshot`s via `update()`.
"""

from sluice.gateway.server import Gateway

__all__ = ["Gateway"]
