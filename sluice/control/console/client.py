"""The console's way to the control API: an in-process HTTP client of the same app, sending
the operator's own session cookie (and, for changes, its CSRF token).

Going through the API, rather than calling the controller beside it, means the console can
do exactly what the API lets this person do: the same roles and group scopes, validation,
audit actor and error messages, with no second copy of any of them to drift. A call costs
about a millisecond in process."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
from fastapi import FastAPI

from sluice.control.auth import CSRF_HEADER, SESSION_COOKIE, csrf_token

__all__ = ["ApiClient", "ApiRefused"]


class ApiRefused(Exception):
    """The API said no: its HTTP status and its error message, shown to the operator."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class ApiClient:
    def __init__(self, app: FastAPI) -> None:
        self._http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://console.internal"
        )

    async def get(self, host: str, session: str, path: str, **params: Any) -> Any:
        query = {k: v for k, v in params.items() if v is not None}
        answer = await self._http.get(path, params=query, headers=_headers(host, session))
        return _json(answer)

    async def post(self, host: str, session: str, path: str, body: dict[str, Any]) -> Any:
        headers = {**_headers(host, session), CSRF_HEADER: csrf_token(session)}
        answer = await self._http.post(path, json=body, headers=headers)
        return _json(answer)


def _headers(host: str, session: str) -> dict[str, str]:
    # Host: the one this request came in on (the API checked it is one it serves).
    return {"host": host, "cookie": f"{SESSION_COOKIE}={session}"}


def _json(answer: httpx.Response) -> Any:
    body = orjson.loads(answer.content) if answer.content else None
    if answer.status_code >= 400:
        error = body.get("error", {}) if isinstance(body, dict) else {}
        raise ApiRefused(answer.status_code, str(error.get("message", answer.reason_phrase)))
    return body
