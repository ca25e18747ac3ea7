"""One error tree for the platform; edges (HTTP, CLI) translate it, nothing else does.

SluiceError                    500 / exit 1
├── SpecError                  422 / exit 2   bad spec: file, line, field, fix
├── NotFound                   404 / exit 4   unknown group, model, instance
├── Unauthorized               401 / exit 5   no or unknown API key
├── Forbidden                  403 / exit 5   tenant outside its allowance
├── Conflict                   409 / exit 3   request clashes with state (capacity, ...)
├── Unavailable                503 / exit 6   nothing ready to serve right now; the control
│   │                                         API does not answer
│   └── StoreUnavailable       503 / exit 7   the state store does not answer or take writes
│                                             (PostgreSQL away, a full disk, a read-only state
│                                             directory); the data plane serves on
└── UpstreamError              502 / exit 6   an instance failed mid-request

An error with `retry_after_s` set is answered with that `Retry-After` (seconds) over HTTP.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "Conflict",
    "Forbidden",
    "NotFound",
    "SluiceError",
    "SpecError",
    "SpecIssue",
    "StoreUnavailable",
    "Unauthorized",
    "Unavailable",
    "UpstreamError",
]


class SluiceError(Exception):
    """Base of every error the platform reports to a person or a caller."""

    http_status: ClassVar[int] = 500
    exit_code: ClassVar[int] = 1
    code: ClassVar[str] = "internal_error"
    retry_after_s: ClassVar[int | None] = None
    """Sent as `Retry-After` by an HTTP edge: when asking again may work (None: no header)."""

    def __init__(self, message: str, **detail: Any) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail

    def __reduce__(self) -> tuple[Any, ...]:
        """Picklable as raised (an error crosses from the spec worker process)."""
        return _rebuilt, (type(self), self.message, self.detail)

    def to_json(self) -> dict[str, Any]:
        """The JSON body an HTTP edge returns: `{"error": {"code", "message", ...}}`."""
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        body.update(self.detail)
        return {"error": body}


class SpecIssue:
    """One problem in a spec, located: `file:line: field: message`."""

    __slots__ = ("field", "file", "line", "message")

    def __init__(self, field: str, message: str, file: str = "<spec>", line: int | None = None):
        self.field = field
        self.message = message
        self.file = file
        self.line = line

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        return f"{where}: {self.field or '(top level)'}: {self.message}"

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "field": self.field, "message": self.message}


class SpecError(SluiceError):
    http_status = 422
    exit_code = 2
    code = "invalid_spec"

    def __init__(self, issues: list[SpecIssue]) -> None:
        super().__init__("\n".join(str(i) for i in issues), issues=[i.to_json() for i in issues])
        self.issues = issues

    def __reduce__(self) -> tuple[Any, ...]:
        issues = [(i.field, i.message, i.file, i.line) for i in self.issues]
        return _spec_error, (issues,)


def _rebuilt(kind: type[SluiceError], message: str, detail: dict[str, Any]) -> SluiceError:
    return kind(message, **detail)


def _spec_error(issues: list[tuple[str, str, str, int | None]]) -> SpecError:
    return SpecError([SpecIssue(*i) for i in issues])


class NotFound(SluiceError):
    http_status = 404
    exit_code = 4
    code = "not_found"


class Unauthorized(SluiceError):
    http_status = 401
    exit_code = 5
    code = "unauthorized"


class Forbidden(SluiceError):
    http_status = 403
    exit_code = 5
    code = "forbidden"


class Conflict(SluiceError):
    http_status = 409
    exit_code = 3
    code = "conflict"


class Unavailable(SluiceError):
    http_status = 503
    exit_code = 6
    code = "unavailable"


class StoreUnavailable(Unavailable):
    """The state store cannot be reached or written: the control plane cannot record or read
    what it needs, while the gateways keep serving their last routes. Say which store (its
    URL without the password, or the state directory) and why, on one line."""

    exit_code = 7
    code = "store_unavailable"
    retry_after_s = 5


class UpstreamError(SluiceError):
    http_status = 502
    exit_code = 6
    code = "upstream_error"
