"""What one client may cost the gateway (`gateway.limits` in the spec), and how each refusal
reads.

The spec's `GatewayLimits` is copied into a plain slotted object, because connections read
it on every request; a live `apply` re-configures that one object (see `Limits.configure`).
Every refusal is a `SluiceError` whose message names the limit and its value, and is counted
in `sluice_gateway_refused_total{reason}` (see `metrics`).
"""

from __future__ import annotations

from sluice.core.errors import SluiceError
from sluice.gateway.errors import (
    HeaderTooLarge,
    JsonTooDeep,
    PayloadTooLarge,
    RequestTimeout,
    TooManyConnections,
    UriTooLong,
    WriteStalled,
)
from sluice.gateway.metrics import REFUSAL_REASONS
from sluice.gateway.responses import json_body, json_response
from sluice.spec.models import GatewayLimits

__all__ = ["Limits"]

_REFUSALS: dict[str, tuple[type[SluiceError], str, str]] = {
    "header_bytes": (HeaderTooLarge, "max_header_bytes", "request head over {} bytes"),
    "header_count": (HeaderTooLarge, "max_headers", "more than {} request header lines"),
    "request_line": (UriTooLong, "max_request_line_bytes", "request URL over {} bytes"),
    "body_bytes": (PayloadTooLarge, "max_body_bytes", "request body over {} bytes"),
    "header_timeout": (
        RequestTimeout,
        "header_timeout_s",
        "the request head did not arrive within {} s",
    ),
    "body_timeout": (
        RequestTimeout,
        "body_timeout_s",
        "the request body did not arrive within {} s of its head",
    ),
    "connections": (
        TooManyConnections,
        "max_connections",
        "the gateway has {} client connections open; retry later",
    ),
    "connections_per_ip": (
        TooManyConnections,
        "max_connections_per_ip",
        "this client address has {} connections open already; retry later",
    ),
    "json_depth": (JsonTooDeep, "max_json_depth", "request body JSON nests deeper than {} levels"),
    "write_stall": (
        WriteStalled,
        "write_stall_s",
        "the client read nothing of its answer for {} s: cut off",
    ),
}
"""Reason (the metric's label) -> the error, the limit it enforces, what the message says."""
assert set(_REFUSALS) == set(REFUSAL_REASONS)


class Limits:
    """The gateway's limits, read on the hot path (see `GatewayLimits` for what each means)."""

    __slots__ = (
        "_connection_refusals",
        "body_timeout_s",
        "header_timeout_s",
        "keepalive_timeout_s",
        "max_body_bytes",
        "max_connections",
        "max_connections_per_ip",
        "max_header_bytes",
        "max_headers",
        "max_json_depth",
        "max_request_bytes",
        "max_request_line_bytes",
        "spec",
        "write_stall_s",
    )

    def __init__(self, spec: GatewayLimits | None = None) -> None:
        self._connection_refusals: dict[str, bytes] = {}
        self._apply(spec or GatewayLimits())

    def configure(self, spec: GatewayLimits) -> None:
        """Enforce `spec` from now on (a live `apply`; a no-op when it is what is enforced).

        In place, because every open connection holds this object: a change reaches every
        connection, open ones included, from its next check (the timeouts, at the next sweep;
        header count and size, at its next read; body size, at its next body) or its next
        request (byte allowances: a request already being read keeps the allowance it
        started with); the connection caps apply from the next connection accepted, and
        connections already open over a lowered cap stay open.
        """
        if spec != self.spec:
            self._apply(spec)

    def _apply(self, spec: GatewayLimits) -> None:
        self.spec = spec
        self.max_header_bytes = spec.max_header_bytes
        self.max_headers = spec.max_headers
        self.max_request_line_bytes = spec.max_request_line_bytes
        self.max_body_bytes = spec.max_body_bytes
        self.header_timeout_s = spec.header_timeout_s
        self.body_timeout_s = spec.body_timeout_s
        self.keepalive_timeout_s = spec.keepalive_timeout_s
        self.max_connections = spec.max_connections
        self.max_connections_per_ip = spec.max_connections_per_ip
        self.max_json_depth = spec.max_json_depth
        self.write_stall_s = spec.write_stall_s
        self.max_request_bytes = spec.max_body_bytes + spec.max_header_bytes
        """What may follow a head as sent (body, chunk framing, trailers): a backstop."""
        self._connection_refusals.clear()  # they name the old values

    def error(self, reason: str) -> SluiceError:
        """The refusal for `reason` (one of `REFUSAL_REASONS`), naming the limit and value."""
        kind, field, text = _REFUSALS[reason]
        value = getattr(self.spec, field)
        message = f"{text.format(value)} (gateway.limits.{field} is {value})"
        return kind(message, limit=f"gateway.limits.{field}", limit_value=value)

    def connection_refusal(self, reason: str) -> bytes:
        """The whole response a connection over a cap gets (rendered once per reason)."""
        wire = self._connection_refusals.get(reason)
        if wire is None:
            err = self.error(reason)
            # None (the tree's default: no header): a 503 or 429 still says 1 s
            retry_after = err.retry_after_s or 1
            body = json_body(err.to_json())
            wire = json_response(err.http_status, body, b"", False, retry_after)
            self._connection_refusals[reason] = wire
        return wire

    def sweep_interval(self) -> float:
        """How often connections' deadlines are checked: a tenth of the shortest timeout,
        20 ms to 1 s (a deadline is enforced that much late at most)."""
        shortest = min(
            self.header_timeout_s,
            self.body_timeout_s,
            self.keepalive_timeout_s,
            self.write_stall_s,
        )
        return min(1.0, max(0.02, shortest / 10))
