"""The data plane's front door: listen, swap routing snapshots, drain on stop.

Unready until the first snapshot (`readiness`): `/readyz` 503 and every request 503 with
`Retry-After`, never 401; `/healthz` (liveness) 200 while it runs, and both say whether the
routes are stale (no sync a controller answered lately).

The per-connection work lives in `ClientProtocol`; this owns what all connections share.
`metrics_text()` (Prometheus) and `status()` (for the control API's `GET /v1/dataplane`)
show admission, ejection and traffic per group. Neither is served on the public port: they
are for the control API (the operators' side) to serve.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TextIO

from sluice.gateway.accesslog import AccessLog
from sluice.gateway.client import ClientProtocol
from sluice.gateway.limits import Limits
from sluice.gateway.metrics import CONTENT_TYPE
from sluice.gateway.readiness import Readiness
from sluice.gateway.state import GatewayState
from sluice.gateway.upstream import UpstreamPool
from sluice.policy.autoscale.base import TrafficSample
from sluice.policy.rate_shares import RateShare
from sluice.policy.routing import GroupTraffic, RoutingSnapshot
from sluice.spec.models import GatewayLimits

__all__ = ["Gateway", "StaleRouting"]


class StaleRouting(ValueError):
    """A routing snapshot (or sync answer) of an older leader epoch than the one served."""


class Gateway:
    """The data plane: one HTTP endpoint in front of every group's ready instances."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        rng: random.Random,
        access_log: TextIO | None = None,
        upstream_timeout_s: float = 300.0,
        limits: GatewayLimits | None = None,
        controls: Sequence[str] = (),
    ) -> None:
        """`limits`: what one client may cost (`gateway.limits` in the spec; its defaults
        when None) until a snapshot brings others (`update`). `controls`: the control URLs
        whose syncs feed it (`sluice gateway`, for what `/readyz` says); empty: a controller
        in its process feeds it (`sluice up`)."""
        self.host = host
        self.port = port
        self._limits = Limits(limits)
        self._pool = UpstreamPool()
        self.readiness = Readiness(controls)
        """Unready until the first `update`; a sync (`remote.ControlSync`) reports to it."""
        self._state = GatewayState(
            rng=rng,
            pool=self._pool,
            access_log=AccessLog(access_log) if access_log is not None else None,
            limits=self._limits,
            default_traffic=GroupTraffic(timeout_s=upstream_timeout_s),
            readiness=self.readiness,
        )
        self._conns: set[ClientProtocol] = set()
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._drained: asyncio.Event | None = None

    @property
    def ready(self) -> bool:
        """Whether it has routes to serve (`/readyz` 200): from the first `update` on."""
        return self.readiness.routed

    @property
    def snapshot_version(self) -> int:
        return self._state.snapshot.version

    @property
    def snapshot_epoch(self) -> int:
        """The leader epoch of the routes served (0 before any)."""
        return self._state.snapshot.epoch

    def update(self, snapshot: RoutingSnapshot) -> None:
        """Serve `snapshot` from the next request on; close idle connections to gone instances.
        Its `limits` (when set) are enforced from each connection's next check or request,
        open connections included (see `Limits.configure`).

        Groups that stay keep their queues, slots in use and ejections; slots follow the new
        instances at once (waiters are admitted if they grew); waiters of a group that is
        gone get 503. `upstream_timeout_s` applies to groups without a `traffic` entry.

        A snapshot of an older leader epoch than the one served is refused (`StaleRouting`,
        nothing changes): a deposed controller's routes never come back (issue 31).
        """
        serving = self._state.snapshot.epoch
        if snapshot.epoch < serving:
            raise StaleRouting(
                f"routing snapshot v{snapshot.version} is of leader epoch {snapshot.epoch}, "
                f"older than epoch {serving} served: a deposed controller's, refused"
            )
        self._state.set_snapshot(snapshot)
        self._pool.retire({(ep.host, ep.port) for eps in snapshot.endpoints.values() for ep in eps})

    def set_rate_shares(self, shares: Mapping[str, RateShare], count: int) -> None:
        """Enforce this gateway's share of each limited tenant's rate, one of `count`
        gateways (a tenant not in `shares` gets its limit / `count`): a tenant's limit holds
        across the fleet, not in each gateway (`sluice.policy.rate_shares`). Until it is
        first called a gateway enforces every limit in full, as the only one."""
        self._state.set_rate_shares(shares, count)

    def tenant_arrivals(self) -> dict[str, int]:
        """Per tenant with a rate limit: its requests that reached the limit, refused ones
        too, since this process started (what the controller splits the rate by)."""
        return dict(self._state.arrivals)

    def swap_access_log(self, stream: TextIO) -> TextIO | None:
        """Log to `stream` from the next request on (rotation); returns the old stream,
        flushed (None if this gateway keeps no access log)."""
        log = self._state.access_log
        return None if log is None else log.swap(stream)

    def outstanding(self) -> dict[str, int]:
        """Requests in flight per instance id (mirrored copies included)."""
        return dict(self._state.outstanding)

    def sample_groups(self, groups: Iterable[str]) -> None:
        """Record a row per answer of exactly `groups` from now on (the groups under canary
        analysis whose instances keep no samples); a group that stays keeps its rows."""
        self._state.sample_groups(groups)

    def samples(self, instance: str, after: int, limit: int) -> tuple[list[dict[str, Any]], int]:
        """What the gateway recorded of `instance`'s answers after cursor `after` (at most
        `limit`, oldest first) as `/sluice/samples` rows without the text (`status`,
        `latency_s`, `ttft_s`: time to the first body byte of a streamed answer, `at`,
        `output_bytes`), and the cursor for the next read."""
        return self._state.sampling.read(instance, after, limit)

    def sampled_instances(self) -> list[str]:
        """The instances whose answers are being recorded (see `samples`)."""
        return self._state.sampling.instances()

    def status(self) -> dict[str, Any]:
        """The data plane now, JSON-able: `{"version": n, "groups": {name: {"slots",
        "in_use", "queued": {"high", "normal", "low"}, "instances", "ejected": [{"instance",
        "until_s" (seconds left), "times", "reason"}]}}, "served": {instance: n},
        "in_flight": {instance: n > 0}, "routes": {rule tag: {group: requests answered}}}`."""
        return self._state.status()

    def traffic(self) -> dict[str, TrafficSample]:
        """Per group: what the autoscaler reads each tick (in-flight, queue, counters)."""
        now = time.time()
        return {name: g.traffic_sample(now) for name, g in self._state.groups.items()}

    def metrics_text(self) -> tuple[bytes, str]:
        """The Prometheus exposition and its content type (text format 0.0.4), for the control
        API to serve behind authentication; the public port has no `/metrics`."""
        return self._state.metrics.render(), CONTENT_TYPE

    async def start(self, *, reuse_port: bool = False) -> None:
        """Listen. `reuse_port`: SO_REUSEPORT, so several gateway processes (`sluice gateway
        --workers N`) share the port and the kernel spreads connections across them."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: ClientProtocol(self._state, self._conns, self._connection_lost),
            self.host,
            self.port,
            backlog=1024,
            reuse_port=reuse_port or None,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._sweeper = loop.create_task(self._sweep_clients())

    async def stop(self, timeout: float = 30.0) -> None:
        """Stop accepting, let requests in flight finish for up to `timeout`, then cut the rest."""
        if self._server is None:
            return
        self._server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        self._drained = asyncio.Event()
        for conn in list(self._conns):
            conn.shutdown()
        if self._conns:
            try:
                async with asyncio.timeout(timeout):
                    await self._drained.wait()
            except TimeoutError:
                for conn in list(self._conns):
                    conn.terminate()
                await asyncio.sleep(0)  # let connection_lost run, so every request is logged
        self._state.close()
        self._pool.close()
        await self._server.wait_closed()
        self._server = None
        if self._state.access_log is not None:
            self._state.access_log.flush()

    def _connection_lost(self) -> None:
        if self._drained is not None and not self._conns:
            self._drained.set()

    async def _sweep_clients(self) -> None:
        """Client-side deadlines (head, body, keep-alive idle): one timer for every
        connection, not one per request (see `ClientProtocol.check_deadlines`); its period
        follows the limits in force."""
        while True:
            await asyncio.sleep(self._limits.sweep_interval())
            now = time.perf_counter()
            for conn in list(self._conns):
                conn.check_deadlines(now)
