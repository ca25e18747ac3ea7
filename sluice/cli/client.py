"""The CLI's HTTP client for the control API of a running `sluice up`."""

from __future__ import annotations

import json
import os
import ssl
from typing import Any

import httpx

from sluice.config import Settings
from sluice.core import SluiceError, Unavailable

__all__ = ["ControlClient"]


class _RemoteError(SluiceError):
    """An error the control API reported; keeps its HTTP status for the exit code."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        err = body.get("error", {})
        detail = body.get("detail")
        message = err.get("message") or (json.dumps(detail) if detail else f"HTTP {status}")
        super().__init__(message, **{k: v for k, v in err.items() if k != "message"})
        self.status = status

    @property
    def exit_code(self) -> int:  # type: ignore[override]
        return {401: 5, 403: 5, 404: 4, 409: 3, 422: 2}.get(self.status, 1)


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
                timeout=30.0,
                trust_env=False,
                verify=self._verify,
                **kw,
            )
        except httpx.HTTPError as exc:
            raise Unavailable(f"cannot reach the control API at {self._url}: {exc}") from None
        body = r.json() if r.content else None
        if r.status_code >= 400:
            raise _RemoteError(r.status_code, body if isinstance(body, dict) else {})
        return body
