"""End to end through `sluice up` (R5): with `control.review.routes` on, a route change is
proposed (with a preview of real logged traffic), approved by someone else, then applied;
"someone else" is another person, not another token (issue 31)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Sluice, kill_workers_of

SIM = "{startup_s: 0.2, service_time: {kind: fixed, seconds: 0.01}, memory_gb: 1}"
GROUP = """
  - name: {name}
    owner: ops@example.com
    business: search
    alert_channel: "#ops"
    description: "{description}"
    models:
      m-chat: {{runtime: sim, version: v1, sim: {sim}}}
    resources: {{pool: local, accelerators: 1, memory_gb: 1}}
    max_concurrency: 16
    replicas: 1
    slow_start_s: 0
    warmup: {{requests: 1}}
"""
VIP_ROUTE = """
  - tag: acme-vip
    match: {tenants: [acme]}
    to: chat-vip"""


def spec(description: str = "", vip: bool = False) -> str:
    return (
        """
gateway: {host: 127.0.0.1, port: 0}
control: {review: {routes: true}}
pools:
  - {name: local, count: 8, memory_gb: 16}
groups:
"""
        + GROUP.format(name="chat", description=description, sim=SIM)
        + GROUP.format(name="chat-vip", description="", sim=SIM)
        + """
tenants:
  - {name: acme, api_keys: [sk-acme-5f8eee912cd7c0cc]}
  - {name: other, api_keys: [sk-other-3dcad332ca200026]}
routes:"""
        + (VIP_ROUTE if vip else "")
        + """
  - tag: chat-main
    match: {models: [m-chat]}
    to: chat
"""
    )


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[Sluice]:
    """A fresh platform per test: each test's proposals and revisions are its own."""
    home = tmp_path
    path = home / "platform.yaml"
    path.write_text(spec())
    s = Sluice(home, path)
    s.start()
    try:
        s.wait_for(
            "both groups ready",
            lambda: (
                {i["group"] for i in s.instances() if i["state"] == "ready"} == {"chat", "chat-vip"}
            ),
            timeout=120,
        )
        yield s
    finally:
        s.kill()
        kill_workers_of(home)


def as_user(s: Sluice, user: str, *args: str) -> tuple[int, Any]:
    """Run `sluice ARGS --json` with `user`'s own admin token."""
    return s.as_user(user, *args)


def send(s: Sluice, key: str, n: int) -> list[httpx.Response]:
    with httpx.Client(base_url=s.endpoint, trust_env=False, timeout=30) as client:
        return [
            client.post(
                "/v1/chat/completions",
                headers={"Authorization": f"Bearer {key}"},
                json={"model": "m-chat", "max_tokens": 1, "messages": [{"role": "user"}]},
            )
            for _ in range(n)
        ]


def write(s: Sluice, name: str, text: str) -> str:
    path = s.home / name
    path.write_text(text)
    return str(path)


def test_route_change_is_proposed_previewed_approved_by_another_and_applied(
    platform: Sluice,
) -> None:
    s = platform
    assert {
        r.status_code
        for r in send(s, "sk-acme-5f8eee912cd7c0cc", 12) + send(s, "sk-other-3dcad332ca200026", 8)
    } == {200}
    time.sleep(0.5)  # the gateway flushes its access log every 0.1 s

    # A non-route change still applies directly.
    code, out = as_user(s, "alice", "apply", "-f", write(s, "a.yaml", spec("v2")), "--reason", "d")
    assert code == 0 and out["changed"], out
    base = out["revision"]

    # A route change does not: 409, naming the section and the way forward.
    vip = write(s, "vip.yaml", spec("v2", vip=True))
    code, out = as_user(s, "alice", "apply", "-f", vip, "--reason", "vip lane")
    assert code == 3 and out["error"]["code"] == "conflict", out
    assert out["error"]["sections"] == ["routes"]
    assert "sluice propose" in out["error"]["message"]

    code, p = as_user(s, "alice", "propose", "-f", vip, "--reason", "vip lane for acme")
    assert code == 0, p
    assert (p["state"], p["author"], p["base_revision"]) == ("pending", "alice", base)
    assert "+  - tag: acme-vip" in p["diff"]
    preview = p["preview"]
    assert preview["sections"] == ["routes"] and preview["needs_review"] == ["routes"]
    routes = preview["routes"]
    assert routes["replayed"] == 20 and routes["moved"] == 12 and routes["unchanged"] == 8
    assert routes["moves"] == [
        {
            "from": "chat",
            "to": "chat-vip",
            "requests": 12,
            "from_tags": ["chat-main"],
            "to_tags": ["acme-vip"],
        }
    ]
    assert routes["tag_changes"] == {"chat-main -> acme-vip": 12}
    assert routes["groups"]["chat-vip"] == {"before": 0.0, "after": 12.0}
    code, listed = as_user(s, "bob", "proposals")
    assert code == 0 and [x["id"] for x in listed] == [p["id"]]

    code, out = as_user(s, "alice", "approve", str(p["id"]), "--reason", "lgtm")
    assert (
        code == 5
        and out["error"]["code"] == "forbidden"
        and "the author cannot approve their own change" in out["error"]["message"]
    )
    assert all(
        r.headers["x-sluice-route"] == "chat-main" for r in send(s, "sk-acme-5f8eee912cd7c0cc", 3)
    )

    code, done = as_user(s, "bob", "approve", str(p["id"]), "--reason", "checked the preview")
    assert code == 0, done
    assert (done["state"], done["reviewer"], done["revision"]) == ("approved", "bob", base + 1)
    rev = s.cli("get", "routes")  # the gateway routes by the new rule
    assert [r["tag"] for r in rev["rules"]][:2] == ["acme-vip", "chat-main"]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        r = send(s, "sk-acme-5f8eee912cd7c0cc", 1)[0]
        if r.headers["x-sluice-route"] == "acme-vip":
            break
        time.sleep(0.1)
    assert (r.headers["x-sluice-route"], r.headers["x-sluice-group"]) == ("acme-vip", "chat-vip")
    assert send(s, "sk-other-3dcad332ca200026", 1)[0].headers["x-sluice-group"] == "chat"

    code, (latest, *_) = as_user(s, "bob", "audit", "--limit", "1")  # newest first
    assert (latest["action"], latest["actor"], latest["target"]) == (
        "approve",
        "bob",
        f"proposal/{p['id']}",
    )
    with httpx.Client(trust_env=False, headers=s.control_headers()) as c:
        (revision, *_) = c.get(f"{s.control_url}/v1/revisions", params={"limit": 1}).json()
    assert revision["number"] == base + 1 and revision["author"] == "alice"
    assert f"proposal #{p['id']} by alice, approved by bob" in revision["reason"]
    assert "acme-vip" in revision["diff"]
    audit = s.cli("audit", "--target", f"proposal/{p['id']}")
    assert [(a["action"], a["actor"]) for a in audit] == [("approve", "bob"), ("propose", "alice")]
    code, listed = as_user(s, "bob", "proposals")
    assert listed == []


def test_reject_and_stale_proposals(platform: Sluice) -> None:
    s = platform
    vip = write(s, "vip.yaml", spec("v2", vip=True))
    code, p1 = as_user(s, "alice", "propose", "-f", vip, "--reason", "vip lane")
    assert code == 0, p1
    code, out = as_user(s, "alice", "reject", str(p1["id"]), "--reason", "withdrawn")
    assert code == 0 and (out["state"], out["reviewer"]) == ("rejected", "alice")
    code, out = as_user(s, "bob", "approve", str(p1["id"]), "--reason", "too late")
    assert code == 3 and "already rejected" in out["error"]["message"]

    code, p2 = as_user(s, "alice", "propose", "-f", vip, "--reason", "vip lane again")
    assert code == 0, p2
    # Someone applies another (ungated) change first: p2's base is no longer current.
    newer = write(s, "newer.yaml", spec("v3"))
    code, out = as_user(s, "carol", "apply", "-f", newer, "--reason", "describe chat")
    assert code == 0 and out["changed"], out
    code, out = as_user(s, "bob", "approve", str(p2["id"]), "--reason", "ok")
    assert code == 3 and "stale" in out["error"]["message"]
    assert out["error"]["current_revision"] == out["error"]["base_revision"] + 1
    code, shown = as_user(s, "bob", "proposal", "show", str(p2["id"]))
    assert code == 0 and shown["state"] == "pending"
    code, every = as_user(s, "bob", "proposals", "--all")
    assert [x["state"] for x in every] == ["pending", "rejected"]
    code, out = as_user(s, "bob", "proposal", "show", "999")
    assert code == 4


def with_token(s: Sluice, token: str, *args: str) -> tuple[int, Any]:
    """`sluice ARGS --json` with a token minted during the test: (exit code, JSON output)."""
    r = subprocess.run(
        [sys.executable, "-m", "sluice", *args, "--json"],
        capture_output=True,
        text=True,
        env={**s.env(), "SLUICE_TOKEN": token},
        timeout=60,
    )
    return r.returncode, json.loads(r.stdout)


def test_two_people_not_two_tokens(platform: Sluice) -> None:
    s = platform
    vip = write(s, "vip.yaml", spec("v2", vip=True))
    code, p = as_user(s, "alice", "propose", "-f", vip, "--reason", "vip lane")
    assert code == 0 and p["author_person"] == "alice", p

    # Alice mints a second admin token: it is hers, whatever she asks.
    code, out = as_user(s, "alice", "token", "create", "sock", "--role", "admin", "--owner", "bob")
    assert code == 5 and out["error"]["code"] == "forbidden", out
    assert "a token can only be minted for yourself" in out["error"]["message"]
    code, sock = as_user(s, "alice", "token", "create", "sock", "--role", "admin")
    assert code == 0 and (sock["name"], sock["person"]) == ("sock", "alice"), sock

    # Approving her own proposal with it: refused, audited, nothing applied.
    code, out = with_token(s, sock["token"], "approve", str(p["id"]), "--reason", "lgtm")
    assert code == 5 and out["error"]["code"] == "forbidden", out
    assert out["error"]["message"] == (
        f"proposal {p['id']} was proposed by token alice (person alice); token sock belongs "
        f"to the same person: ask another person to `sluice approve {p['id']}`"
    )
    code, shown = as_user(s, "bob", "proposal", "show", str(p["id"]))
    assert code == 0 and shown["state"] == "pending"
    assert "acme-vip" not in [r["tag"] for r in s.cli("get", "routes")["rules"]]
    (refused,) = s.cli("audit", "--action", "approve-refused")
    assert (refused["actor"], refused["target"]) == ("sock", f"proposal/{p['id']}")
    assert (refused["detail"]["person"], refused["detail"]["author_person"]) == ("alice", "alice")
    shown_audit = s.show("audit", "--action", "approve-refused")
    assert "PERSON" in shown_audit and "alice" in shown_audit

    # Another person approves.
    code, done = as_user(s, "bob", "approve", str(p["id"]), "--reason", "checked")
    assert code == 0, done
    assert (done["reviewer"], done["reviewer_person"], done["author_person"]) == (
        "bob",
        "bob",
        "alice",
    )
    (approved,) = s.cli("audit", "--action", "approve")
    assert (approved["actor"], approved["detail"]["person"]) == ("bob", "bob")

    # The issue's own path, with the installation's admin token: propose, enroll a "second
    # person", approve with it. Refused: that person was enrolled after the proposal.
    back = write(s, "back.yaml", spec("v2"))
    p2 = s.cli("propose", "-f", back, "--reason", "drop the vip lane")
    assert p2["author_person"] == "admin"
    puppet = s.cli("token", "create", "puppet", "--role", "admin")
    assert puppet["person"] == "puppet"
    code, out = with_token(s, puppet["token"], "approve", str(p2["id"]), "--reason", "ok")
    assert code == 5 and "enrolled by the proposer after proposing" in out["error"]["message"]
    code, done = as_user(s, "bob", "approve", str(p2["id"]), "--reason", "ok")
    assert code == 0 and done["state"] == "approved", done
