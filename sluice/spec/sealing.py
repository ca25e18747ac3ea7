"""Secrets a spec holds are sealed before it is stored (issue 31): a tenant key's digest, an
alert webhook's URL and the values of a command server's `env` are encrypted with the
installation's secrets key, which lives outside the store (`sluice.control.secrets_key`),
so `state.db`, a backup of it and every API answer that serves a revision carry neither a
key digest, a webhook's token nor a server's credentials.

Why sealing and not a keyed digest (HMAC) for keys: the gateway keeps looking a request's
key up by its sha256 (one hash and a dict lookup per request), remote gateways never need
the installation key, and the stored form still tells an attacker with the database
nothing: guessing keys offline needs the secrets key. A slow KDF would instead cost every
request (and every made-up key an attacker sends) milliseconds of CPU.

The cipher is AES-SIV (RFC 5297, `cryptography`): deterministic, so the same spec seals to
the same text (a re-applied spec is still "unchanged"), and authenticated, so a sealed value
that was altered, or sealed by another installation's key, is refused rather than misread.
The field a value belongs to is its associated data: a sealed key cannot be moved into an
`alert_channel`, nor the reverse.

A sealed value reads as `sealed:<base64url>` (a key) or `<scheme>://<host>/… sealed:<base64url>`
(a webhook: where it points stays readable, and `channel_kind` still sees a webhook).
Pure: no I/O, no clock.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESSIV

from sluice.core.urls import redact_url

__all__ = [
    "KEY_BYTES",
    "SEALED_PREFIX",
    "SealError",
    "Sealer",
    "sealed_part",
]

KEY_BYTES = 64
"""AES-256-SIV takes a 512-bit key (two AES-256 keys: one for the MAC, one for CTR)."""

SEALED_PREFIX = "sealed:"
_MARK = " " + SEALED_PREFIX
"""What separates a sealed webhook's readable address from its sealed value."""

_API_KEY = b"sluice tenant api key sha256"
_CHANNEL = b"sluice alert channel"
_ENV = b"sluice command env"


class SealError(ValueError):
    """A sealed value that does not open with this installation's key: altered, truncated,
    or sealed by another installation (its secrets key was not given to this controller)."""


def sealed_part(value: str) -> str | None:
    """The base64url of a sealed value (`sealed:X`, or a webhook's `URL… sealed:X`), or None
    when `value` is not sealed."""
    text = value.strip()
    if text.startswith(SEALED_PREFIX):
        return text[len(SEALED_PREFIX) :]
    at = text.rfind(_MARK)
    if at > 0 and "://" in text[:at]:
        return text[at + len(_MARK) :]
    return None


@dataclass(frozen=True, slots=True)
class Sealer:
    """Seals and opens spec secrets with one installation's key (picklable: the spec worker
    process gets it with each job)."""

    key: bytes

    def __post_init__(self) -> None:
        if len(self.key) != KEY_BYTES:
            raise ValueError(f"a secrets key is {KEY_BYTES} bytes, not {len(self.key)}")

    def __repr__(self) -> str:  # the key stays out of logs and tracebacks
        return f"Sealer(fingerprint={self.fingerprint()})"

    def fingerprint(self) -> str:
        """12 hex digits that tell installations' keys apart and reveal nothing of them."""
        return hashlib.sha256(b"sluice secrets key fingerprint\0" + self.key).hexdigest()[:12]

    def seal_key_digest(self, digest_hex: str) -> str:
        """`sealed:<...>` for a key's sha256 hex digest."""
        return SEALED_PREFIX + self._seal(bytes.fromhex(digest_hex), _API_KEY)

    def open_key_digest(self, sealed: str) -> str:
        """The sha256 hex digest inside a sealed key; SealError when it does not open."""
        part = sealed_part(sealed)
        if part is None:
            raise SealError("not a sealed value")
        digest = self._open(part, _API_KEY)
        if len(digest) != 32:
            raise SealError("a sealed key holds a 32-byte digest")
        return digest.hex()

    def seal_channel(self, url: str) -> str:
        """`<scheme>://<host>[:port]/… sealed:<...>` for a webhook URL."""
        return f"{redact_url(url, mark_rest=True)}{_MARK}{self._seal(url.encode(), _CHANNEL)}"

    def open_channel(self, sealed: str) -> str:
        part = sealed_part(sealed)
        if part is None:
            raise SealError("not a sealed value")
        try:
            return self._open(part, _CHANNEL).decode()
        except UnicodeDecodeError:
            raise SealError("a sealed channel holds UTF-8 text") from None

    def seal_env(self, value: str) -> str:
        """`sealed:<...>` for a value of a command server's `env`."""
        return SEALED_PREFIX + self._seal(value.encode("utf-8", "surrogatepass"), _ENV)

    def open_env(self, sealed: str) -> str:
        part = sealed_part(sealed)
        if part is None:
            raise SealError("not a sealed value")
        try:
            return self._open(part, _ENV).decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            raise SealError("a sealed value holds UTF-8 text") from None

    def _seal(self, plain: bytes, field: bytes) -> str:
        sealed = AESSIV(self.key).encrypt(plain, [field])
        return base64.urlsafe_b64encode(sealed).decode().rstrip("=")

    def _open(self, part: str, field: bytes) -> bytes:
        try:
            raw = base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
            return AESSIV(self.key).decrypt(raw, [field])
        except (binascii.Error, ValueError, InvalidTag):
            raise SealError(
                "it does not open with this installation's secrets key (altered, or sealed "
                "by another installation)"
            ) from None
