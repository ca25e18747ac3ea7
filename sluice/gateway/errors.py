"""HTTP-only failures of the data plane that the platform error tree has no class for.

They subclass `SluiceError`, so every gateway error still renders through `to_json()`.
"""

from __future__ import annotations

from sluice.core.errors import SluiceError, UpstreamError

__all__ = ["BadRequest", "MethodNotAllowed", "PayloadTooLarge", "UpstreamTimeout"]


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
