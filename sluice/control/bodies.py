"""Request bodies read within a size bound, for the routes that take large JSON documents
(capacity reports, gateway syncs): a body over the bound is refused with 413 as it arrives,
never buffered whole."""

from __future__ import annotations

from typing import Any, TypeVar

import orjson
from fastapi import HTTPException, Request
from pydantic import BaseModel, ValidationError

from sluice.core import SpecError, SpecIssue

__all__ = ["json_body", "model_body"]

M = TypeVar("M", bound=BaseModel)


async def json_body(request: Request, max_bytes: int, what: str) -> Any:
    """The body as JSON, read up to `max_bytes`; `what` names it in the 413's message."""
    size, chunks = 0, []
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise HTTPException(413, f"{what} is at most {max_bytes} bytes")
        chunks.append(chunk)
    try:
        return orjson.loads(b"".join(chunks))
    except orjson.JSONDecodeError as exc:
        raise SpecError([SpecIssue("body", f"not JSON: {exc}")]) from None


async def model_body(request: Request, model: type[M], max_bytes: int, what: str) -> M:
    """The body as `model`; each field that does not fit is a located issue (422)."""
    try:
        return model.model_validate(await json_body(request, max_bytes, what))
    except ValidationError as exc:
        issues = [
            SpecIssue(".".join(str(p) for p in e["loc"]) or "body", e["msg"]) for e in exc.errors()
        ]
        raise SpecError(issues) from None
