"""Tenant keys in the spec: how a key is kept (its sha256 digest), how a digest is written
(`sha256:<hex>`), and the checks on what an operator may write where a key goes."""

from __future__ import annotations

import errno
import hashlib
import re
from typing import Annotated

from pydantic import AfterValidator, Field

__all__ = [
    "DIGEST_PREFIX",
    "KEY_FORM",
    "KEY_LINE",
    "KEY_SOURCE_FIELDS",
    "MIN_KEY_GUESSES_LOG10",
    "SECRET_FIELDS",
    "SECRET_FILE_MAX_BYTES",
    "ApiKey",
    "EnvVarName",
    "KeyDigest",
    "KeyFilePath",
    "KeyPath",
    "SecretFileError",
    "check_digest",
    "digest_entry",
    "key_digest",
    "weak_key_reason",
]

KeyPath = tuple[str | int, ...]
"""Where a key came from, relative to its tenant: ("api_keys", 2), ("api_keys_env",), ..."""

DIGEST_PREFIX = "sha256:"
"""An `api_keys` entry `sha256:<64 lowercase hex>` is a key's digest, not a plain key."""

SECRET_FIELDS = frozenset({"api_keys", "api_key_sha256", "api_keys_env", "api_key_env"})
"""Fields whose values no error message may echo: they hold keys, or may hold a key pasted
by mistake where a digest or a variable's name belongs (a tenant's, a scheduled drill's)."""

_HEX64 = re.compile(r"[0-9a-f]{64}")

SECRET_FILE_MAX_BYTES = 64 * 1024
"""The most a secret file (`api_keys_file`, a drill's `api_key_file`) may hold. A keys file
holds at most a few hundred keys: 64 KiB is 250 keys of the longest form (256 characters) or
over 1,500 of 40; anything larger is not a keys file (a log, a device, a mistake)."""

KEY_LINE = re.compile(r"[A-Za-z0-9._~+/=-]{16,256}")
"""What a line of a keys file must be (after trimming blanks): one key, 16 to 256 characters
of letters, digits and `. _ ~ + / = -` (what token generators, base64 and base64url emit);
no spaces, no colons (so an account line `root:x:0:0:...` is no key), no control bytes. A
`sha256:<64 lowercase hex>` digest line is accepted too."""

KEY_FORM = (
    "a key is 16-256 characters of letters, digits and . _ ~ + / = - (no spaces or colons), "
    f"or '{DIGEST_PREFIX}<64 lowercase hex>'"
)
"""`KEY_LINE` in words, for error messages."""


class SecretFileError(OSError):
    """A secret file that is refused before (or instead of) being read: not an absolute
    path, not a regular file, too large. `strerror` says what it is; `fix` what to do."""

    def __init__(self, reason: str, fix: str) -> None:
        super().__init__(errno.EINVAL, reason)
        self.fix = fix


def key_digest(key: str) -> str:
    """How a key is kept: the sha256 hex digest (lowercase) of its UTF-8 bytes."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


MIN_KEY_GUESSES_LOG10 = 16
"""A plain key must take an attacker at least 10^16 guesses by zxcvbn's estimate (which
knows dictionaries, keyboard walks, repeats and sequences): what 16 random letters and digits
give. A key is a bearer credential any client of the gateway can try, so it must outlast
online guessing at any rate limit for years; a generated key (`openssl rand -hex 24`, a
cloud provider's `sk-...`) is far above it. Digests (`sha256:<hex>`) cannot be judged and are
taken as they are."""

_JUDGED_CHARS = 100
"""zxcvbn's matching grows with the square of the length; past 100 characters a key is not
weak for want of length, and a 256-character one would cost a tenth of a second to judge."""


def weak_key_reason(key: str) -> str | None:
    """Why `key` is too easy to guess, or None; never quotes the key."""
    from zxcvbn import zxcvbn  # 40 ms to import: only when a plain key is checked

    guesses = float(zxcvbn(key[:_JUDGED_CHARS])["guesses_log10"])
    if guesses >= MIN_KEY_GUESSES_LOG10:
        return None
    return (
        f"this API key is too easy to guess (about 10^{int(guesses)} guesses; at least "
        f"10^{MIN_KEY_GUESSES_LOG10} needed, which 16 random letters and digits give): "
        "write a generated key, e.g. `openssl rand -hex 24`"
    )


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def digest_entry(entry: str) -> str | None:
    """The digest in a well-formed `sha256:<64 lowercase hex>` entry, else None."""
    if entry.startswith(DIGEST_PREFIX):
        digest = entry[len(DIGEST_PREFIX) :]
        if _HEX64.fullmatch(digest):
            return digest
    return None


def _check_key(entry: str) -> str:
    if not entry.strip():
        raise ValueError("an API key must not be empty or blank; write the key or remove the entry")
    if not _is_utf8(entry):
        raise ValueError("an API key must be valid Unicode text (no lone surrogate escapes)")
    if entry.startswith(DIGEST_PREFIX) and digest_entry(entry) is None:
        raise ValueError(
            f"a '{DIGEST_PREFIX}' entry must be followed by exactly 64 lowercase hex digits "
            "(the key's sha256 digest, e.g. `printf %s KEY | sha256sum`); fix the digest"
        )
    return entry


def check_digest(digest: str) -> str:
    if not _HEX64.fullmatch(digest):
        hint = (
            f"; drop the '{DIGEST_PREFIX}' prefix here"
            if digest.startswith(DIGEST_PREFIX)
            else "; plain keys go under api_keys"
        )
        raise ValueError(
            "a key digest is exactly 64 lowercase hex digits (the key's sha256, e.g. "
            f"`printf %s KEY | sha256sum`){hint}"
        )
    return digest


def _check_path(path: str) -> str:
    if not path.strip() or "\0" in path:
        raise ValueError("a key file path must be non-empty text; name the file holding the keys")
    if not path.startswith("/"):
        raise ValueError(
            "a key file path must be absolute (e.g. /etc/sluice/tenant.keys): it is read on "
            "the controller's machine, not relative to wherever Sluice was started"
        )
    return path


ApiKey = Annotated[str, AfterValidator(_check_key)]
KeyDigest = Annotated[str, AfterValidator(check_digest)]
EnvVarName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=255)]
KeyFilePath = Annotated[str, AfterValidator(_check_path), Field(max_length=4096)]
"""Where a secret file is: an absolute path on the controller's machine. What it must be
(a regular file of at most `SECRET_FILE_MAX_BYTES`, symlinks followed, as Kubernetes secret
volumes are) is checked when it is read (`sluice.control.keysources.read_secret_file`)."""
KEY_SOURCE_FIELDS = frozenset({"api_keys_env", "api_keys_file"})
