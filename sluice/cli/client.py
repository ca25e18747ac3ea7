"""The CLI's HTTP client for the control API of a running `sluice up`.

Whatever the control API answers, or if it does not answer at all, the command ends with a
`SluiceError` (one line, the error's exit code), never a traceback: 503 `store_unavailable`
exits 7, a control API that cannot be reached or does not answer in time exits 6.
"""

from __future__ import annotations

import json
import os
import ssl
from typing import Any

import httpx

from sluice.config import Settings
from sluice.core import (
    Conflict,
    Forbidden,
    NotFound,
    SluiceError,
    SpecError,
    StoreUnavailable,
    Unauthorized,
    Unavailable,
    UpstreamError,
)

__all__ = ["TIMEOUT_S", "ControlClient"]

TIMEOUT_S = 30.0
"""How long a call may wait for the control API's answer."""

_EXIT_BY_CODE = {
    kind.code: kind.exit_code
    for kind in (
        SpecError,
        Conflict,
        NotFound,
        Unauthorized,
        Forbidden,
        Unavailable,
        StoreUnavailable,
        UpstreamError,
    )
}
"""An answer's `error.code` -> the exit code of the error it names (errors.py's tree)."""
_EXIT_BY_STATUS = {401: 5, 403: 5, 404: 4, 409: 3, 422: 2, 502: 6, 503: 6, 504: 6}


class _RemoteError(SluiceError):
    """An error the control API reported; keeps its HTTP status and code for the exit code."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        err = body.get("error", {})
        err = err if isinstance(err, dict) else {"message": str(err)}
        detail = body.get("detail")
        message = err.get("message") or (json.dumps(detail) if detail else f"HTTP {status}")
        super().__init__(str(message), **{k: v for k, v in err.items() if k != "message"})
        self.status = status

    @property
    def exit_code(self) -> int:  # type: ignore[override]
        found = _EXIT_BY_CODE.get(str(self.detail.get("code")))
        return found if found is not None else _EXIT_BY_STATUS.get(self.status, 1)


class ControlClient:
    def __init__(self, settings: Settings) -> None:
        self._url = settings.control_url or self._discover(settings)
        token = settings.api_token()
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        # A control API behind TLS with a private CA: point $SLUICE_CA_FILE at its bundle.
        ca_file = os.environ.get("SLUICE_CA_FILE")
        self._verify: ssl.SSLContext | bool = (
            ssl.create_default_context(cafile=ca_file) if ca_file else True
        )

    @staticmethod
    def _discover(settings: Settings) -> str:
        try:
            info = json.loads(settings.control_file.read_text())
        except (OSError, ValueError):
            raise Unavailable(
                f"sluice is not running for state directory {settings.home} "
                "(no control.json): start it with `sluice up -f SPEC`, or pass --control URL"
            ) from None
        return str(info["control_url"])

    def get(self, path: str, **params: Any) -> Any:
        return self._call("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, body: dict[str, Any]) -> Any:
        return self._call("POST", path, json=body)

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            r = httpx.request(
                method,
                self._url + path,
                headers=self._headers,
                timeout=TIMEOUT_S,
                trust_env=False,
                verify=self._verify,
                **kw,
            )
        except httpx.TimeoutException:
            raise Unavailable(
                f"the control API at {self._url} did not answer within {TIMEOUT_S:g} s; "
                "is its process stopped or overloaded?",
                url=self._url,
            ) from None
        except httpx.HTTPError as exc:
            why = " ".join(str(exc).split()) or type(exc).__name__
            raise Unavailable(
                f"cannot reach the control API at {self._url}: {why}; is `sluice up` (or "
                "`sluice controller`) running there?",
                url=self._url,
            ) from None
        try:
            body = r.json() if r.content else None
        except ValueError:  # not JSON: a proxy's page, or a crash's "Internal Server Error"
            text = " ".join(r.text.split())[:200]
            message = f"the control API at {self._url} answered HTTP {r.status_code}: {text}"
            raise _RemoteError(r.status_code, {"error": {"message": message}}) from None
        if r.status_code >= 400:
            raise _RemoteError(r.status_code, body if isinstance(body, dict) else {})
        return body
