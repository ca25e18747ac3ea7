"""HTTP-only failures of the data plane that the platform error tree has no class for.

They subclass `SluiceError`, so every gateway error still renders through `to_json()`.
`retry_after_s` is what the `Retry-After` header says (429 and 503 always carry one).
"""

from __future__ import annotations

from typing import Any, ClassVar

from sluice.core.errors import SluiceError, Unavailable, UpstreamError

__all__ = [
    "BadRequest",
    "MethodNotAllowed",
    "Overloaded",
    "PayloadTooLarge",
    "QueueTimeout",
    "RateLimited",
    "UpstreamTimeout",
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
        self.retry_after_s = retry_after_s
