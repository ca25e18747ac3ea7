"""Secret files are files: `api_keys_file` (and a drill's `api_key_file`) takes only an
absolute path to a regular file of at most 64 KiB, opened without blocking (a named pipe
never freezes the controller, a device never fills its memory), and each line must be a key;
anything else is refused at apply/start naming the field, why and the fix, never a line."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from sluice.control.drills import DrillScheduler
from sluice.control.keysources import read_secret_file, spec_with_key_sources
from sluice.core import SpecError
from sluice.spec import LoadedSpec, key_digest, load_spec_text
from sluice.spec.keys import SECRET_FILE_MAX_BYTES, SecretFileError

HEAD = """\
pools: [{name: p, count: 4, memory_gb: 16}]
groups:
  - name: chat
    owner: o
    business: b
    alert_channel: c
    models: {m: {runtime: sim}}
    resources: {pool: p, memory_gb: 1}
    slo: {latency_ms: 500}
    autoscaling: {max: 2}
routes:
  - {tag: main, match: {models: [m]}, to: chat}
"""
KEY_A = "sk-live-alpha-000000001"
KEY_B = "sk-live-bravo-000000002"
PASSWD = (
    "root:x:0:0:root:/root:/bin/bash\n"
    "daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n"
    "bin:x:2:2:bin:/bin:/usr/sbin/nologin\n"
)


def loaded(keys_file: str) -> LoadedSpec:
    text = (
        HEAD
        + f"tenants:\n  - {{name: acme, api_keys: [{KEY_A}]}}\n"
        + f"  - name: beta\n    api_keys_file: {keys_file}\n"
    )
    return load_spec_text(text, "platform.yaml")


def refusal(keys_file: str | Path) -> str:
    """The one issue `spec_with_key_sources` raises, checked to name the field and line."""
    spec = loaded(str(keys_file))
    with pytest.raises(SpecError) as caught:
        spec_with_key_sources(spec)
    [issue] = caught.value.issues
    assert issue.field == "tenants[1].api_keys_file"
    assert (issue.file, issue.line) == ("platform.yaml", spec.text.count("\n"))
    return issue.message


@pytest.mark.timeout(10)
def test_a_named_pipe_is_refused_at_once_never_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "keys.fifo"
    os.mkfifo(fifo)  # no writer: a blocking open would wait forever
    started = time.monotonic()
    message = refusal(fifo)
    assert time.monotonic() - started < 1.0
    assert "is a named pipe (FIFO), not a regular file" in message
    assert "name a regular file instead" in message
    # a symlink to it is the pipe too
    link = tmp_path / "keys"
    link.symlink_to(fifo)
    assert "named pipe" in refusal(link)


@pytest.mark.timeout(10)
def test_a_device_is_refused_without_being_read() -> None:
    started = time.monotonic()
    assert "is a character device, not a regular file" in refusal("/dev/zero")
    assert time.monotonic() - started < 1.0
    with pytest.raises(SecretFileError, match="character device"):
        read_secret_file("/dev/urandom")


def test_a_directory_and_a_socket_are_refused(tmp_path: Path) -> None:
    assert "is a directory, not a regular file" in refusal(tmp_path)
    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        assert "is a socket, not a regular file" in refusal(path)


def test_a_relative_path_is_refused_at_validate_and_by_the_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "beta.keys").write_text(KEY_B + "\n")
    monkeypatch.chdir(tmp_path)  # even where it would be found
    with pytest.raises(SpecError) as caught:
        loaded("beta.keys")
    [issue] = caught.value.issues
    assert issue.field == "tenants[1].api_keys_file" and issue.line is not None
    assert "must be absolute" in issue.message
    with pytest.raises(SecretFileError, match="not an absolute path"):
        read_secret_file("beta.keys")


def test_a_file_over_64_kib_is_refused_and_one_at_the_cap_is_read(tmp_path: Path) -> None:
    assert SECRET_FILE_MAX_BYTES == 64 * 1024
    line = KEY_B + "\n"
    at_cap = tmp_path / "at_cap.keys"
    pad = SECRET_FILE_MAX_BYTES - len(line)
    at_cap.write_text("#" * (pad - 1) + "\n" + line)
    assert at_cap.stat().st_size == SECRET_FILE_MAX_BYTES
    spec = spec_with_key_sources(loaded(str(at_cap)))
    assert spec.tenants[1].api_key_sha256 == [key_digest(KEY_B)]
    big = tmp_path / "big.keys"
    big.write_text(line * (SECRET_FILE_MAX_BYTES // len(line) + 1))
    message = refusal(big)
    assert "is larger than 64 KiB" in message and KEY_B not in message


def test_a_pseudo_file_that_says_size_0_is_read_only_up_to_the_cap() -> None:
    """/proc files report size 0: the bound is on the read, not on what stat says. Here:
    the controller's own environment, which holds secrets, is no keys file."""
    os.environ["SLUICE_TEST_SECRET_SENTINEL"] = "sk-" + "s" * 30
    try:
        message = refusal("/proc/self/environ")
    finally:
        del os.environ["SLUICE_TEST_SECRET_SENTINEL"]
    assert "not a key" in message or "larger than" in message
    assert "sk-sss" not in message and "PATH" not in message


def test_lines_that_are_not_keys_are_refused_by_number_never_by_content(tmp_path: Path) -> None:
    passwd = tmp_path / "passwd"
    passwd.write_text(PASSWD)
    message = refusal(passwd)
    assert f"key file '{passwd}': lines 1, 2, 3 are not a key" in message
    assert "16-256 characters" in message and "no spaces or colons" in message
    assert "root" not in message.replace(str(passwd), "") and "nologin" not in message
    # one bad line among good ones (too short, a space inside, a colon): all named
    mixed = tmp_path / "mixed.keys"
    mixed.write_text(f"# ok\n{KEY_B}\nshort\n\n{KEY_B}x y\nuser:{KEY_B}\n")
    message = refusal(mixed)
    assert "lines 3, 5, 6 are not a key" in message and KEY_B not in message
    many = tmp_path / "many.keys"
    many.write_text("x\n" * 25)
    assert "lines 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 (and 15 more) are not" in refusal(many)
    single = tmp_path / "single.keys"
    single.write_text(f"{KEY_B}\nroot\n")
    assert "line 2 is not a key" in refusal(single)


def test_a_file_that_is_not_utf8_is_refused_without_content(tmp_path: Path) -> None:
    path = tmp_path / "latin1.keys"
    path.write_bytes(KEY_B.encode() + b"\xff\n")
    message = refusal(path)
    assert "is not UTF-8 text" in message and KEY_B not in message


def test_a_symlink_to_a_regular_file_is_followed_as_kubernetes_mounts_secrets(
    tmp_path: Path,
) -> None:
    """A secret volume: keys -> ..data/keys, ..data -> ..2024_05_01_12_00_00.1/."""
    stamped = tmp_path / "..2024_05_01_12_00_00.1"
    stamped.mkdir()
    (stamped / "keys").write_text(f"# beta's keys\n{KEY_B}\n  sha256:{key_digest('x' * 20)}\n")
    (tmp_path / "..data").symlink_to(stamped.name)
    (tmp_path / "keys").symlink_to("..data/keys")
    spec = spec_with_key_sources(loaded(str(tmp_path / "keys")))
    assert spec.tenants[1].api_key_sha256 == [key_digest(KEY_B), key_digest("x" * 20)]
    assert read_secret_file(str(tmp_path / "keys")).startswith("# beta's keys")


def test_a_missing_or_unreadable_file_says_why(tmp_path: Path) -> None:
    assert "No such file or directory" in refusal(tmp_path / "none.keys")
    if os.geteuid() != 0:  # root reads anything
        locked = tmp_path / "locked.keys"
        locked.write_text(KEY_B)
        locked.chmod(0)
        assert "Permission denied" in refusal(locked)


@pytest.mark.timeout(10)
def test_a_drills_key_file_is_read_the_same_way(tmp_path: Path) -> None:
    """The drill's key is read on the event loop when it fires: a pipe is refused at once."""
    fifo = tmp_path / "drill.fifo"
    os.mkfifo(fifo)
    good = tmp_path / "drill.key"
    good.write_text(KEY_A + "\n")
    text = (
        HEAD
        + f"tenants:\n  - {{name: acme, api_keys: [{KEY_A}]}}\n"
        + "drills:\n"
        + f"  - {{name: d1, group: chat, cron: '0 3 * * *', api_key_file: {fifo}}}\n"
        + f"  - {{name: d2, group: chat, cron: '0 3 * * *', api_key_file: {good}}}\n"
    )
    spec = load_spec_text(text).spec
    me = SimpleNamespace(_environ={})
    started = time.monotonic()
    key, why = DrillScheduler._tenant_key(me, spec, spec.drills[0])  # type: ignore[arg-type]
    assert time.monotonic() - started < 1.0
    assert key is None and "named pipe" in why
    assert DrillScheduler._tenant_key(me, spec, spec.drills[1]) == (KEY_A, "")  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="must be absolute"):
        load_spec_text(text.replace(str(good), "drill.key"))
