"""URLs read safely: fit to print (only where one points, never what it carries: a
webhook's token sits in its path or query, credentials before its host), and whether a
host is this machine's."""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

__all__ = ["channel_kind", "is_loopback_host", "redact_channel", "redact_url"]


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


def redact_channel(channel: str) -> str:
    """An alert channel fit to print: a URL as `redact_url` shows it, with `/…` where it
    had more; anything else (`#team-oncall`, an address) as written."""
    text = channel.strip()
    return redact_url(text, mark_rest=True) if "://" in text else text


def is_loopback_host(host: str) -> bool:
    """`localhost` or a loopback address (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def channel_kind(channel: str) -> str:
    """What kind of channel an `alert_channel` is, without its address: 'webhook' (an
    http(s) URL, which may carry a token), 'email', 'chat' ('#room') or 'other'."""
    c = channel.strip()
    if c.lower().startswith(("http://", "https://")):
        return "webhook"
    if c.startswith("#"):
        return "chat"
    if re.fullmatch(r"[^@\s]+@[^@\s]+", c):
        return "email"
    return "other"
