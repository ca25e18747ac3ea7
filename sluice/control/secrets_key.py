"""The installation's secrets key: what seals tenant key digests and webhook URLs in stored
revisions (`sluice.spec.sealing`). It lives outside the store, so a copy of the database
(a backup, a replica, a leaked dump) holds nothing an attacker can use.

`$SLUICE_SECRETS_KEY_FILE` names it (a mounted Kubernetes secret, a file under /etc); else it
is `$SLUICE_HOME/secrets.key`, created on the first start (mode 0600). Every controller of
one installation (a standby on the same database) needs the same key: without it a stored
revision does not open, and the controller says so at start instead of leading.
The file holds the key as 128 hex digits (one line), easy to copy into a secret store.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

from sluice.control.keysources import read_secret_file
from sluice.core import SluiceError
from sluice.spec.sealing import KEY_BYTES, Sealer

__all__ = ["KEY_FILE_ENV", "SecretsKeyError", "installation_sealer"]

KEY_FILE_ENV = "SLUICE_SECRETS_KEY_FILE"


class SecretsKeyError(SluiceError):
    """The installation's secrets key is missing, unreadable or malformed."""

    code = "secrets_key"


def installation_sealer(home: Path, environ: dict[str, str] | None = None) -> Sealer:
    """The sealer of this installation's key: read from `$SLUICE_SECRETS_KEY_FILE`, else
    from `home/secrets.key`, which is created (random, 0600) when neither exists."""
    env = os.environ if environ is None else environ
    named = env.get(KEY_FILE_ENV)
    path = Path(named) if named else home / "secrets.key"
    if not named and not path.exists():
        _create(path)
    try:
        text = read_secret_file(str(path.absolute()), limit=1024)
    except OSError as exc:
        raise SecretsKeyError(
            f"cannot read the secrets key {path}: {exc.strerror or exc}; "
            f"point {KEY_FILE_ENV} at the installation's key file"
        ) from None
    try:
        key = bytes.fromhex(text.strip())
    except ValueError:
        key = b""
    if len(key) != KEY_BYTES:
        raise SecretsKeyError(
            f"the secrets key {path} is not {2 * KEY_BYTES} hex digits; write one with "
            f"`openssl rand -hex {KEY_BYTES} > {path}` (a new installation only: revisions "
            "sealed with the old key would not open)"
        )
    return Sealer(key)


def _create(path: Path) -> None:
    """A new random key, written in full to a temporary file and then linked into place, so
    that a process starting at the same moment reads either no key or the whole of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(KEY_BYTES) + "\n")
            f.flush()
            os.fsync(f.fileno())
        # FileExistsError: another process made the installation's key first; it is used
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
