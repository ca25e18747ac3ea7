"""A URL fit to print: only where it points, never what it carries (a webhook's token sits
in its path or query, credentials before its host)."""

from __future__ import annotations

from urllib.parse import urlsplit

__all__ = ["redact_url"]


def redact_url(url: str, mark_rest: bool = False) -> str:
    """`scheme://host[:port]` of `url`; with `mark_rest`, `/…` after it when the URL had a
    path, query or fragment (so a reader sees something was left out)."""
    try:
        parts = urlsplit(url.strip())
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<unreadable URL>"
    rest = parts.path not in ("", "/") or parts.query or parts.fragment
    return f"{parts.scheme}://{host}{port}{'/…' if mark_rest and rest else ''}"
