"""HTTP-only failures of the data plane that the platform error tree has no class for.

They subclass `SluiceError`, so every gateway error still renders through `to_json()`.
`retry_after_s` is what the `Retry-After` header says (429 and 503 always carry one).
"""

from __future__ import annotations

from typing import Any, ClassVar

from sluice.core.errors import SluiceError, Unavailable, UpstreamError

__all__ = [
    "BadRequest",
    "HeaderTooLarge",
    "JsonTooDeep",
    "MethodNotAllowed",
    "NotReady",
    "Overloaded",
    "PayloadTooLarge",
    "QueueTimeout",
    "RateLimited",
    "RequestTimeout",
    "TooManyConnections",
    "UpstreamTimeout",
    "UriTooLong",
    "WriteStalled",
]


class BadRequest(SluiceError):
    http_status = 400
    code = "invalid_request"


class MethodNotAllowed(SluiceError):
    http_status = 405
    code = "method_not_allowed"


class PayloadTooLarge(SluiceError):
    http_status = 413
    code = "request_too_large"


class HeaderTooLarge(SluiceError):
    """The request head is over `max_header_bytes`, or has more than `max_headers` lines."""

    http_status = 431
    code = "request_header_too_large"


class UriTooLong(SluiceError):
    http_status = 414
    code = "request_uri_too_long"


class RequestTimeout(SluiceError):
    """The client took longer than `header_timeout_s` / `body_timeout_s` to send its request."""

    http_status = 408
    code = "request_timeout"


class WriteStalled(RequestTimeout):
    """The client read nothing of its answer for `write_stall_s`. Never sent (the connection
    is cut); its code is what the access log and the refusal count say."""

    code = "write_stall"


class JsonTooDeep(BadRequest):
    code = "json_too_deep"


class TooManyConnections(Unavailable):
    """Over `max_connections` or `max_connections_per_ip`: answered before reading anything."""

    code = "too_many_connections"
    retry_after_s: ClassVar[int] = 1


class NotReady(Unavailable):
    """The gateway has no routes yet (it never synced with a controller): it cannot tell a
    valid API key from an unknown one, so it answers 503, not 401 (see `readiness`)."""

    code = "not_ready"
    retry_after_s: ClassVar[int] = 1
    """a gateway syncs every second: by then it may have its routes"""


class UpstreamTimeout(UpstreamError):
    http_status = 504
    code = "upstream_timeout"


class Overloaded(SluiceError):
    """The group's slots and queue are full (shed on arrival, or evicted by a higher priority)."""

    http_status = 429
    code = "overloaded"
    retry_after_s: ClassVar[int] = 1


class QueueTimeout(Unavailable):
    """Waited the group's `max_wait_s` in its queue without getting a slot."""

    code = "queue_timeout"
    retry_after_s: ClassVar[int] = 1


class RateLimited(SluiceError):
    """The tenant's token bucket is empty."""

    http_status = 429
    code = "rate_limited"

    def __init__(self, message: str, retry_after_s: int, **detail: Any) -> None:
        super().__init__(message, **detail)
        # per refusal (the bucket's wait), not per class as the tree's other errors
        self.retry_after_s = retry_after_s  # type: ignore[misc]
