"""Request bodies: text that every store backend can keep (`TextBody`: no NUL, which
PostgreSQL's `text` cannot hold, and no unpaired surrogate, which no encoder can write), and
for the routes that take large JSON documents (capacity reports, gateway syncs) a read within
a size bound: a body over the bound is refused with 413 as it arrives, never buffered whole."""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

import orjson
from fastapi import HTTPException, Request
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from sluice.core import SpecError, SpecIssue

__all__ = ["TextBody", "json_body", "model_body"]

M = TypeVar("M", bound=BaseModel)


class TextBody(BaseModel):
    """A request body whose text can be stored and echoed on any backend. Every `str` gets
    a (generous) length bound, which also makes pydantic refuse text that is not Unicode (an
    unpaired surrogate, "\\ud800" in the JSON); NUL ("\\u0000") is refused anywhere in
    the body, keys and nested documents included (a 422 naming where), as SQLite would
    store it and PostgreSQL would fail the write with a 500."""

    model_config = ConfigDict(str_max_length=1 << 24)
    nul_read_by_its_parser: ClassVar[frozenset[str]] = frozenset()
    """fields whose own parser refuses NUL with a better error (a spec's YAML: file:line)"""

    @model_validator(mode="before")
    @classmethod
    def _no_nul(cls, data: Any) -> Any:
        if isinstance(data, dict) and cls.nul_read_by_its_parser:
            data_checked = {k: v for k, v in data.items() if k not in cls.nul_read_by_its_parser}
        else:
            data_checked = data
        where = _nul_in(data_checked, "")
        if where is not None:
            raise ValueError(f"{where or 'body'}: NUL (\\u0000) is not allowed in text")
        return data


def _nul_in(value: Any, path: str) -> str | None:
    """Where the first NUL in a JSON value is (a dotted path), or None."""
    if isinstance(value, str):
        return path if "\x00" in value else None
    if isinstance(value, dict):
        for k, v in value.items():
            inner = f"{path}.{k}" if path else str(k)
            if "\x00" in str(k):
                return path or "body"
            found = _nul_in(v, inner)
            if found is not None:
                return found
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            found = _nul_in(v, f"{path}[{i}]")
            if found is not None:
                return found
    return None


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
