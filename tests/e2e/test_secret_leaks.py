"""No secret in clear, anywhere (issue 31): after a flow with a webhook alert channel, tenant
keys written inline, read from an environment variable and from a keys file, a minted token,
a proposal carrying a new key, traffic with every key and a restart of `sluice up`, none of
those secrets, nor any key's sha256 digest, is in any file of the state directory (state.db
and its WAL, every log), any answer of any GET route of the control API, `sluice up`'s own
output, any process's command line or any instance's environment. The keys still work
after the restart: what the store keeps opens with the installation's key
(`$SLUICE_HOME/secrets.key`, which, with `admin.token`, is a secret by design and not
searched)."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import Sluice, kill_workers_of
from tests.e2e.test_scoped_reads import (
    admin,
    get_routes,
    make_zeta_and_alpha_objects,
    parameter_table,
    ready,
    spec,
)

INLINE_KEY = "sk-leak-inline-" + secrets.token_hex(12)
ENV_KEY = "sk-leak-env-" + secrets.token_hex(12)
FILE_KEY = "sk-leak-file-" + secrets.token_hex(12)
WEAK_KEY = "sk-weak-" + secrets.token_hex(2)
"""guessable: 10^8 or so by zxcvbn (a word and four hex digits)"""
HOOK_TOKEN = "HOOKTOKEN" + secrets.token_hex(8)
HOOK = f"http://127.0.0.1:9/services/{HOOK_TOKEN}?sig={HOOK_TOKEN}"
KEYS_VAR = "SLUICE_TEST_LEAK_KEYS"
NOT_SEARCHED = {"secrets.key", "admin.token"}


def leaky_spec(keys_file: Path) -> str:
    text = spec(
        f"  - name: leak-tenant\n"
        f"    api_keys: [{INLINE_KEY}]\n"
        f"    api_keys_env: {KEYS_VAR}\n"
        f"    api_keys_file: {keys_file}\n"
    )
    return text.replace('alert_channel: "#zeta-biz"', f'alert_channel: "{HOOK}"', 1)


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[tuple[Sluice, Path]]:
    home = tmp_path / "home"
    home.mkdir()
    keys_file = tmp_path / "leak.keys"
    keys_file.write_text(f"# the leak tenant's keys\n{FILE_KEY}\n")
    spec_file = tmp_path / "platform.yaml"  # the operator's file, not the state
    spec_file.write_text(leaky_spec(keys_file))
    s = Sluice(home, spec_file, environ={KEYS_VAR: ENV_KEY})
    try:
        yield s, keys_file
    finally:
        s.kill()
        kill_workers_of(home)


def answers_with_every_key(s: Sluice) -> None:
    for key in (INLINE_KEY, ENV_KEY, FILE_KEY):
        with httpx.Client(base_url=s.endpoint, trust_env=False, timeout=30) as c:
            r = c.post(
                "/v1/chat/completions",
                headers={"Authorization": f"Bearer {key}"},
                json={
                    "model": "m-alpha",
                    "max_tokens": 1,
                    "messages": [{"role": "user", "content": "x"}],
                },
            )
        assert r.status_code == 200, r.text


def every_file(home: Path) -> Iterator[tuple[str, bytes]]:
    for path in sorted(home.rglob("*")):
        if path.is_file() and path.name not in NOT_SEARCHED:
            yield str(path.relative_to(home)), path.read_bytes()


def command_lines() -> Iterator[tuple[str, bytes]]:
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            yield f"pid {proc.name}", (proc / "cmdline").read_bytes()
        except OSError:
            continue  # gone, or not ours to read


def test_no_secret_nor_key_digest_is_stored_logged_served_or_on_a_command_line(
    platform: tuple[Sluice, Path],
) -> None:
    s, _ = platform
    s.start()
    s.wait_for("both teams ready", lambda: ready(s))
    answers_with_every_key(s)
    ids = make_zeta_and_alpha_objects(s)  # a proposal, a rollout, a drill, capacity runs
    viewer_token = s.token("leak-viewer", role="viewer")
    proposed_key = "sk-leak-proposed-" + secrets.token_hex(12)
    text = s.spec.read_text().replace(
        "routes:", f"  - {{name: leak-newco, api_keys: [{proposed_key}]}}\nroutes:", 1
    )
    admin(s, "POST", "/v1/proposals", json={"yaml": text, "reason": "a new tenant"})

    first_run = list(s.output)
    assert s.stop() == 0  # a restart, on the same spec: sealed alike, so no new revision
    s.start()
    s.wait_for("both teams ready again", lambda: ready(s))
    answers_with_every_key(s)  # the keys open from the store with the installation's key
    revisions = admin(s, "GET", "/v1/revisions")
    assert len(revisions) == 1, [r["reason"] for r in revisions]
    groups = {g["name"]: g for g in admin(s, "GET", "/v1/groups")}
    assert groups["zeta-hidden"]["alert_channel"] == "http://127.0.0.1:9/…"

    # a weak key is refused at apply naming its line, never its text, and the attempt is
    # audited with nothing applied
    weak = s.spec.with_name("weak.yaml")
    weak.write_text(s.spec.read_text().replace(INLINE_KEY, f"{INLINE_KEY}, {WEAK_KEY}"))
    code, out = s.as_user("leak-admin", "apply", "-f", str(weak), "--reason", "weak")
    assert code != 0 and "too easy to guess" in out["error"]["message"], out
    [refused] = s.cli("audit", "--action", "apply-refused")
    assert refused["actor"] == "leak-admin" and "weak.yaml:" in refused["reason"], refused
    assert refused["person"] == "leak-admin", refused
    # every audit row names the person holding its token, recorded or looked up (a scale)
    scaled = s.cli("audit", "--action", "scale")
    assert scaled and all(row["person"] == "admin" for row in scaled), scaled
    assert len(admin(s, "GET", "/v1/revisions")) == 1

    places: list[tuple[str, bytes]] = list(every_file(s.home))
    table = parameter_table(ids)
    assert get_routes(s) <= set(table)  # every GET route is called: a new one cannot slip by
    for calls in table.values():
        for path, _whose in calls:
            with httpx.Client(base_url=s.control_url, trust_env=False, timeout=30) as c:
                r = c.get(path, headers=s.control_headers())
            places.append((f"GET {path}", r.content))
    places.append(("sluice up's output", "\n".join(first_run + s.output).encode()))
    places.extend(command_lines())
    # `sluice up` has a key in its environment (KEYS_VAR): no instance inherits it
    pids = [i["pid"] for i in s.instances() if i.get("pid")]
    assert pids
    for pid in pids:
        places.append(
            (f"environment of instance pid {pid}", Path(f"/proc/{pid}/environ").read_bytes())
        )

    secrets_of_the_flow = {
        "inline key": INLINE_KEY,
        "env key": ENV_KEY,
        "file key": FILE_KEY,
        "proposed key": proposed_key,
        "webhook token": HOOK_TOKEN,
        "viewer token": viewer_token,
        "weak key": WEAK_KEY,
    }
    for name, key in list(secrets_of_the_flow.items())[:4]:
        secrets_of_the_flow[f"{name}'s sha256"] = hashlib.sha256(key.encode()).hexdigest()
    leaks = [
        f"{name} in {where}"
        for where, blob in places
        for name, secret in secrets_of_the_flow.items()
        if secret.encode() in blob
    ]
    assert leaks == [], "\n".join(leaks)
    assert any(where == "state.db" for where, _ in places)
