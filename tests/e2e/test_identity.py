"""End to end through `sluice up`: who may drive the control API (tokens, roles, group scope,
revoke and expiry), that nothing reaches a handler without a token, the Host check, metrics
behind a token, one `sluice up` per state directory, reviewed changes by two people, and that
no tenant key or API token is ever written down or served back in clear."""

from __future__ import annotations

import hashlib
import json
import secrets
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from sluice.control.alerts_api import alert_routes
from sluice.control.api import build_control_api
from sluice.control.console import is_console_path
from tests.e2e.conftest import Sluice, kill_workers_of, running

SIM = "{startup_s: 0.2, service_time: {kind: fixed, seconds: 0.01}, memory_gb: 1}"
GROUP = """
  - name: {name}
    owner: ops@example.com
    business: search
    alert_channel: "#ops"
    description: "{description}"
    models:
{models}
    resources: {{pool: local, accelerators: 1, memory_gb: 2}}
    max_concurrency: 8
    replicas: 1
    slow_start_s: 0
    warmup: {{requests: 1}}
{extra}"""


def group(name: str, *models: str, description: str = "", extra: str = "") -> str:
    lines = "\n".join(f"      {m}: {{runtime: sim, version: v1, sim: {SIM}}}" for m in models)
    return GROUP.format(name=name, models=lines, description=description, extra=extra)


def platform_spec(description: str = "", tenants: str | None = None) -> str:
    """Two groups: `alpha` (m-alpha; backup `beta`) and `beta` (m-alpha and m-beta)."""
    return (
        """
gateway: {host: 127.0.0.1, port: 0}
pools:
  - {name: local, count: 8, memory_gb: 16}
groups:
"""
        + group("alpha", "m-alpha", description=description, extra="    backup: beta\n")
        + group("beta", "m-alpha", "m-beta")
        + """
tenants:
"""
        + (
            tenants
            if tenants is not None
            else "  - {name: main, api_keys: [sk-id-main-77742775923c273d]}\n"
        )
        + """
routes:
  - tag: alpha-main
    match: {models: [m-alpha]}
    to: alpha
  - tag: beta-main
    match: {models: [m-beta]}
    to: beta
"""
    )


def both_ready(s: Sluice, groups: set[str], key: str = "", models: tuple[str, ...] = ()) -> bool:
    """Each group has a ready instance and the gateway already serves each model (its
    routing table follows a ready instance by a tick)."""
    if not {i["group"] for i in s.instances() if i["state"] == "ready"} >= groups:
        return False
    return all(chat(s, key, m).status_code == 200 for m in models)


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sluice]:
    """Shared by the tests that leave nothing behind another test could trip on: each uses
    its own token names and compares only against what it saw itself."""
    home = tmp_path_factory.mktemp("identity")
    with running(
        home,
        platform_spec(),
        "alpha and beta ready",
        lambda s: both_ready(
            s, {"alpha", "beta"}, "sk-id-main-77742775923c273d", ("m-alpha", "m-beta")
        ),
    ) as s:
        yield s


# --- helpers ----------------------------------------------------------------------------


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def control(s: Sluice) -> httpx.Client:
    return httpx.Client(base_url=s.control_url, trust_env=False, timeout=30)


def admin_token(s: Sluice) -> str:
    return (s.home / "admin.token").read_text().strip()


def revision(s: Sluice) -> int:
    with control(s) as c:
        return int(c.get("/healthz").json()["revision"])


def audit_log(s: Sluice) -> list[dict[str, Any]]:
    with control(s) as c:
        r = c.get("/v1/audit", params={"limit": 100000}, headers=bearer(admin_token(s)))
    assert r.status_code == 200, r.text
    return list(r.json())


def changes(audit: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The audit rows of what was done, without the refused attempts (`request-refused`)."""
    return [a for a in audit if a["action"] != "request-refused"]


def chat(s: Sluice, key: str, model: str) -> httpx.Response:
    with httpx.Client(base_url=s.endpoint, trust_env=False, timeout=30) as c:
        return c.post(
            "/v1/chat/completions",
            headers=bearer(key),
            json={"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]},
        )


def sluice_cli(s: Sluice, *args: str, token: str | None = None) -> tuple[int, Any]:
    """`sluice [--token T] ARGS --json` as a person would type it: (exit code, JSON)."""
    r = subprocess.run(
        [sys.executable, "-m", "sluice", *(["--token", token] if token else []), *args, "--json"],
        capture_output=True,
        text=True,
        env=s.env(),
        timeout=60,
    )
    return r.returncode, json.loads(r.stdout)


def assert_error(r: httpx.Response, status: int, code: str, *words: str) -> str:
    """`r` is `status` with the JSON error body `{"error": {"code", "message"}}`."""
    assert r.status_code == status, (r.request.method, r.request.url, r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json"), r.headers
    err = r.json()["error"]
    assert err["code"] == code and isinstance(err["message"], str) and err["message"], err
    for w in words:
        assert w in err["message"], (w, err)
    return str(err["message"])


def app_routes() -> set[tuple[str, str]]:
    """(method, path) of every route of the control API, from the app itself: the router
    tree walked (FastAPI >= 0.16x keeps an included router as one entry), and cross-checked
    against its OpenAPI paths so a route hidden by either view is still counted."""
    stand_in = SimpleNamespace(clock=None)  # only `tokens.clock` is read while building
    app = build_control_api(
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        stand_in,  # type: ignore[arg-type]
        allowed_hosts=["127.0.0.1"],
        more_routes=lambda api: alert_routes(api, None, lambda: None),  # type: ignore[arg-type]
    )  # the routes `sluice up` adds (the alerts') included

    def walk(routes: list[Any], prefix: str = "") -> Iterator[tuple[str, str]]:
        for r in routes:
            inner = getattr(r, "original_router", None)
            if inner is not None:
                context = getattr(r, "include_context", None)
                yield from walk(inner.routes, prefix + str(getattr(context, "prefix", "") or ""))
            elif is_console_path(prefix + r.path):
                continue  # the console logs in by session: tests/e2e/test_console.py
            else:
                for method in r.methods - {"HEAD", "OPTIONS"}:
                    yield method, prefix + r.path

    walked = set(walk(app.routes))
    documented = {
        (method.upper(), path) for path, ops in app.openapi()["paths"].items() for method in ops
    }
    assert documented <= walked, documented - walked
    return walked


# --- 1. roles and group scope --------------------------------------------------------------


def test_viewer_cannot_scale_and_scoped_operator_acts_only_on_its_group(platform: Sluice) -> None:
    s = platform
    s.token("t1-viewer", role="viewer")
    s.token("t1-op-alpha", role="operator", groups="alpha")
    t0 = time.time()

    code, out = s.as_user("t1-viewer", "scale", "alpha", "2", "--reason", "try")
    assert code == 5 and out["error"]["code"] == "forbidden", out
    assert "needs the operator role" in out["error"]["message"], out
    assert "'t1-viewer' is viewer" in out["error"]["message"], out
    assert (out["error"]["needs"], out["error"]["role"]) == ("operator", "viewer")

    code, out = s.as_user("t1-op-alpha", "scale", "alpha", "2", "--reason", "t1 peak")
    assert code == 0 and out == {"group": "alpha", "from": out["from"], "to": 2}, out
    code, out = s.as_user("t1-op-alpha", "scale", "beta", "2", "--reason", "not mine")
    assert code == 5 and out["error"]["code"] == "forbidden", out
    assert "may act only on group(s) alpha, not beta" in out["error"]["message"], out
    assert out["error"]["groups"] == ["beta"]
    args = ("route", "failover", "alpha", "--to", "beta", "--reason", "into beta")
    code, out = s.as_user("t1-op-alpha", *args)
    assert code == 5 and out["error"]["groups"] == ["beta"], out
    # Over raw HTTP the same refusals are 403s.
    with control(s) as c:
        r = c.post(
            "/v1/groups/beta/scale",
            json={"replicas": 2, "reason": "x"},
            headers=bearer(s.token("t1-op-alpha")),
        )
        assert_error(r, 403, "forbidden", "alpha", "beta")
        r = c.post(
            "/v1/groups/alpha/scale",
            json={"replicas": 3, "reason": "x"},
            headers=bearer(s.token("t1-viewer")),
        )
        assert_error(r, 403, "forbidden", "operator role")
    groups = {g["name"]: g for g in s.cli("get", "groups")}
    assert (groups["alpha"]["desired"], groups["beta"]["desired"]) == (2, 1)

    # The audit names the token: the change that happened, and each refused attempt as
    # such (`request-refused`, with the request and its status), nothing else.
    mine = s.cli("audit", "--actor", "t1-op-alpha")
    done = [a for a in mine if a["action"] != "request-refused"]
    assert [(a["actor"], a["action"], a["target"], a["reason"]) for a in done] == [
        ("t1-op-alpha", "scale", "group/alpha", "t1 peak")
    ]
    assert done[0]["detail"]["to"] == 2
    tried = {(a["target"], a["detail"]["status"]) for a in mine if a["action"] == "request-refused"}
    assert ("POST /v1/groups/beta/scale", 403) in tried, tried
    viewer = s.cli("audit", "--actor", "t1-viewer")
    assert {(a["action"], a["target"]) for a in viewer} == {
        ("request-refused", "POST /v1/groups/alpha/scale")
    }, viewer
    scales = s.cli("audit", "--action", "scale", "--limit", "1000")
    assert scales and {a["action"] for a in scales} == {"scale"}
    assert done[0] in scales
    creates = s.cli("audit", "--action", "token-create", "--limit", "1000")
    targets = {a["target"] for a in creates}
    assert {"token/t1-viewer", "token/t1-op-alpha"} <= targets and all(
        a["action"] == "token-create" for a in creates
    )
    # --since / --until: an ISO local time, and a duration ago.
    since = datetime.fromtimestamp(t0).isoformat()
    after = s.cli("audit", "--since", since, "--actor", "t1-op-alpha")
    assert after == mine
    assert s.cli("audit", "--until", since, "--actor", "t1-op-alpha") == []
    assert s.cli("audit", "--since", "1h", "--actor", "t1-op-alpha") == mine
    later = datetime.fromtimestamp(time.time() + 1).isoformat()
    assert s.cli("audit", "--since", later) == []
    assert {a["target"] for a in s.cli("audit", "--since", since, "--limit", "1000")} >= {
        "group/alpha"
    }
    assert not any(a["at"] < t0 for a in s.cli("audit", "--since", since, "--limit", "1000"))


def test_scoped_operator_cannot_fail_over_into_a_group_outside_its_scope(
    platform: Sluice,
) -> None:
    s = platform
    s.token("t1b-op-alpha", role="operator", groups="alpha")
    try:
        # `alpha` has `backup: beta` in the spec: the same target as `--to beta`, implied.
        code, out = s.as_user("t1b-op-alpha", "route", "failover", "alpha", "--reason", "x")
        assert code == 5 and out["error"]["code"] == "forbidden", out
    finally:
        s.cli("route", "restore", "alpha", "--reason", "t1b cleanup")


# --- 2. reviewed changes: two people ----------------------------------------------------------

VIP_ROUTE = """  - tag: acme-vip
    match: {tenants: [acme]}
    to: vip
"""


def review_spec(change: bool = False, quota: bool = False) -> str:
    return (
        """
gateway: {host: 127.0.0.1, port: 0}
control: {review: {routes: true}}
pools:
  - {name: local, count: 8, memory_gb: 16}
groups:
"""
        + group("chat", "m-chat", extra="    quota: {guaranteed: 1}\n" if quota else "")
        + group("vip", "m-chat")
        + """
tenants:
  - {name: acme, api_keys: [sk-id-acme-aa3f43d4be0f426d]}
  - {name: other, api_keys: [sk-id-other-599c3cc0c68bc1f6]}
"""
        + ("  - {name: newco, api_keys: [sk-id-newco-4d4bd14fcdc4b8cb]}\n" if change else "")
        + """
routes:
"""
        + (VIP_ROUTE if change else "")
        + """  - tag: chat-main
    match: {models: [m-chat]}
    to: chat
"""
    )


def test_reviewed_change_needs_a_second_admin_before_the_gateway_routes_by_it(
    tmp_path: Path,
) -> None:
    with running(
        tmp_path,
        review_spec(),
        "chat and vip ready",
        lambda s: both_ready(s, {"chat", "vip"}, "sk-id-acme-aa3f43d4be0f426d", ("m-chat",)),
    ) as s:
        for name, role in (("alice", "admin"), ("bob", "admin"), ("olga", "operator")):
            s.token(name, role=role)
        s.token("vera", role="viewer")
        base = revision(s)
        change = tmp_path / "change.yaml"
        change.write_text(review_spec(change=True))

        code, out = s.as_user("alice", "apply", "-f", str(change), "--reason", "vip + newco")
        assert code == 3 and out["error"]["code"] == "conflict", out
        assert out["error"]["sections"] == ["routes", "tenants"], out
        assert "sluice propose" in out["error"]["message"]
        # A group's quota is gated too.
        quota = tmp_path / "quota.yaml"
        quota.write_text(review_spec(quota=True))
        code, out = s.as_user("alice", "apply", "-f", str(quota), "--reason", "guarantee")
        assert code == 3 and out["error"]["sections"] == ["groups.chat.quota"], out
        assert revision(s) == base

        code, out = s.as_user("vera", "propose", "-f", str(change), "--reason", "viewer")
        assert code == 5 and "needs the operator role" in out["error"]["message"], out
        code, p = s.as_user("alice", "propose", "-f", str(change), "--reason", "vip lane")
        assert code == 0 and (p["state"], p["author"]) == ("pending", "alice"), p
        # the proposal holds the key's digest
        assert "sk-id-newco-4d4bd14fcdc4b8cb" not in json.dumps(p)

        code, out = s.as_user("alice", "approve", str(p["id"]), "--reason", "lgtm")
        assert code == 5 and out["error"]["code"] == "forbidden", out
        assert "the author cannot approve their own change" in out["error"]["message"]
        with control(s) as c:
            r = c.post(
                f"/v1/proposals/{p['id']}/approve",
                json={"reason": "lgtm"},
                headers=bearer(s.token("alice")),
            )
            assert_error(r, 403, "forbidden", "cannot approve their own")
        code, out = s.as_user("olga", "approve", str(p["id"]), "--reason", "op")
        assert code == 5 and "needs the admin role" in out["error"]["message"], out
        # Nothing changed yet: old route, the new tenant's key unknown.
        assert revision(s) == base
        r = chat(s, "sk-id-acme-aa3f43d4be0f426d", "m-chat")
        assert (r.status_code, r.headers["x-sluice-route"]) == (200, "chat-main")
        assert chat(s, "sk-id-newco-4d4bd14fcdc4b8cb", "m-chat").status_code == 401

        code, done = s.as_user("bob", "approve", str(p["id"]), "--reason", "checked")
        assert code == 0, done
        assert (done["state"], done["reviewer"], done["revision"]) == ("approved", "bob", base + 1)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            r = chat(s, "sk-id-acme-aa3f43d4be0f426d", "m-chat")
            if r.headers.get("x-sluice-route") == "acme-vip":
                break
            time.sleep(0.1)
        assert (r.status_code, r.headers["x-sluice-route"], r.headers["x-sluice-group"]) == (
            200,
            "acme-vip",
            "vip",
        )
        r = chat(s, "sk-id-newco-4d4bd14fcdc4b8cb", "m-chat")
        assert (r.status_code, r.headers["x-sluice-group"]) == (200, "chat"), r.text
        assert chat(s, "sk-id-other-599c3cc0c68bc1f6", "m-chat").headers["x-sluice-group"] == "chat"
        trail = s.cli("audit", "--target", f"proposal/{p['id']}")
        assert [(a["action"], a["actor"]) for a in trail] == [
            ("approve", "bob"),
            ("propose", "alice"),
        ]
        (applied,) = s.cli("audit", "--action", "apply", "--since", "10m", "--limit", "1")
        assert (applied["actor"], applied["target"]) == ("alice", f"revision/{base + 1}")


# --- 3. nothing reaches a handler without a token ------------------------------------------

ROUTES: dict[tuple[str, str], str] = {
    # (method, route) -> the concrete path called ({proposal} and {victim} filled in)
    ("GET", "/healthz"): "/healthz",
    ("GET", "/metrics"): "/metrics",
    ("GET", "/v1/alerts"): "/v1/alerts",
    ("GET", "/v1/alerts/rules"): "/v1/alerts/rules",
    ("GET", "/v1/audit"): "/v1/audit",
    ("GET", "/v1/history"): "/v1/history",
    ("GET", "/v1/dataplane"): "/v1/dataplane",
    ("GET", "/v1/events"): "/v1/events",
    ("GET", "/v1/groups"): "/v1/groups",
    ("GET", "/v1/groups/{group}/explain"): "/v1/groups/alpha/explain",
    ("GET", "/v1/groups/{group}/spec"): "/v1/groups/alpha/spec",
    ("GET", "/v1/instances"): "/v1/instances",
    ("GET", "/v1/proposals"): "/v1/proposals",
    ("GET", "/v1/proposals/{proposal_id}"): "/v1/proposals/{proposal}",
    ("GET", "/v1/quota"): "/v1/quota",
    ("GET", "/v1/revisions"): "/v1/revisions",
    ("GET", "/v1/rollouts"): "/v1/rollouts",
    ("GET", "/v1/rollouts/{name}"): "/v1/rollouts/nope",
    ("GET", "/v1/rollouts/{name}/plan"): "/v1/rollouts/nope/plan",
    ("GET", "/v1/routes"): "/v1/routes",
    ("GET", "/v1/tokens"): "/v1/tokens",
    ("GET", "/v1/whoami"): "/v1/whoami",
    ("GET", "/v1/status"): "/v1/status",
    ("GET", "/v1/openapi.json"): "/v1/openapi.json",
    ("POST", "/v1/gc"): "/v1/gc",
    ("POST", "/v1/groups/{group}/failover"): "/v1/groups/alpha/failover",
    ("POST", "/v1/groups/{group}/restore"): "/v1/groups/alpha/restore",
    ("POST", "/v1/groups/{group}/scale"): "/v1/groups/alpha/scale",
    ("POST", "/v1/proposals"): "/v1/proposals",
    ("POST", "/v1/proposals/{proposal_id}/approve"): "/v1/proposals/{proposal}/approve",
    ("POST", "/v1/proposals/{proposal_id}/reject"): "/v1/proposals/{proposal}/reject",
    ("POST", "/v1/revisions"): "/v1/revisions",
    ("POST", "/v1/rollouts/{name}/{action}"): "/v1/rollouts/nope/start",
    ("POST", "/v1/tokens"): "/v1/tokens",
    ("POST", "/v1/tokens/{name}/revoke"): "/v1/tokens/{victim}/revoke",
}


ADMIN_POSTS = {
    "/v1/gc",
    "/v1/proposals/{proposal_id}/approve",
    "/v1/revisions",
    "/v1/tokens",
    "/v1/tokens/{name}/revoke",
}


def post_body(route: str, change: str) -> dict[str, Any] | None:
    """A valid body for each POST, so that only the token can stop it: were it let through,
    each would change something the test then sees (audit, tokens, revision, proposals)."""
    if route.endswith("/scale"):
        return {"replicas": 3, "reason": "intruder"}
    if route in ("/v1/revisions", "/v1/proposals"):
        return {"yaml": change, "reason": "intruder"}
    if route == "/v1/tokens":
        return {"name": "intruder", "role": "admin"}
    if route.endswith("/revoke"):
        return None
    return {"reason": "intruder"}


def test_every_route_refuses_a_missing_malformed_or_unknown_token(platform: Sluice) -> None:
    s = platform
    assert app_routes() == set(ROUTES), "a control API route was added or removed: list it"
    admin = admin_token(s)
    viewer_name = f"t3-viewer-{secrets.token_hex(3)}"
    viewer = s.token(viewer_name, role="viewer")
    victim_name = f"t3-victim-{secrets.token_hex(3)}"
    victim = s.token(victim_name, role="viewer")
    change = platform_spec(description="changed by an intruder")
    proposal = s.home / "t3-proposal.yaml"  # someone else's pending proposal, to approve
    proposal.write_text(platform_spec(description=f"t3 {secrets.token_hex(3)}"))
    author = f"t3-author-{secrets.token_hex(3)}"
    code, p = s.as_user(author, "propose", "-f", str(proposal), "--reason", "x")
    assert code == 0, p
    fill = {"proposal": str(p["id"]), "victim": victim_name}

    with control(s) as c:
        before = {
            "audit": changes(audit_log(s)),
            "tokens": c.get("/v1/tokens", headers=bearer(admin)).json(),
            "revision": revision(s),
            "proposals": c.get("/v1/proposals", params={"all": True}, headers=bearer(admin)).json(),
            "groups": [
                (g["name"], g["desired"]) for g in c.get("/v1/groups", headers=bearer(admin)).json()
            ],
        }
        unknown = "slc_" + secrets.token_urlsafe(32)
        assert len(unknown) == 47
        bad_auth: list[tuple[dict[str, str], str]] = [
            ({}, "no token"),
            ({"Authorization": ""}, "no token"),
            ({"Authorization": "Bearer"}, "malformed Authorization header"),
            ({"Authorization": "Basic YWRtaW46YWRtaW4="}, "malformed Authorization header"),
            ({"Authorization": f"Token {admin}"}, "malformed Authorization header"),
            ({"Authorization": "Bearer not-a-token"}, "malformed token"),
            ({"Authorization": f"Bearer {admin}x"}, "malformed token"),
            ({"Authorization": f"Bearer {admin[:-1]}"}, "malformed token"),
            ({"Authorization": f"Bearer {unknown}"}, "unknown token"),
        ]
        calls = 0
        for (method, route), template in sorted(ROUTES.items()):
            path = template.format(**fill)
            body = post_body(path, change) if method == "POST" else None
            if route == "/healthz":
                for headers, _ in bad_auth:
                    r = c.request(method, path, headers=headers)
                    assert r.status_code == 200 and r.json()["status"] == "ok", r.text
                continue
            for headers, why in bad_auth:
                r = c.request(method, path, headers=headers, json=body)
                assert_error(r, 401, "unauthorized", why)
                calls += 1
            if method == "POST":
                r = c.request(method, path, headers=bearer(viewer), json=body)
                needs = "admin" if route in ADMIN_POSTS else "operator"
                assert_error(r, 403, "forbidden", f"needs the {needs} role")
            else:
                r = c.request(method, path, headers=bearer(viewer))
                expected = {
                    "/v1/tokens": 403,
                    "/v1/rollouts/{name}": 404,
                    "/v1/rollouts/{name}/plan": 404,
                }.get(route, 200)
                assert r.status_code == expected, (path, r.status_code, r.text)
        assert calls == (len(ROUTES) - 1) * len(bad_auth)

        after = {
            "audit": changes(audit_log(s)),
            "tokens": c.get("/v1/tokens", headers=bearer(admin)).json(),
            "revision": revision(s),
            "proposals": c.get("/v1/proposals", params={"all": True}, headers=bearer(admin)).json(),
            "groups": [
                (g["name"], g["desired"]) for g in c.get("/v1/groups", headers=bearer(admin)).json()
            ],
        }
        assert after == before
        # what is on record besides: the viewer's refused attempts, never a missing, malformed
        # or unknown token's (no one's: answered, not audited)
        refused = [
            a
            for a in audit_log(s)
            if a["action"] == "request-refused" and a["actor"].startswith("t3-")
        ]
        assert refused and {a["actor"] for a in refused} == {viewer_name}, refused
        assert c.get("/v1/whoami", headers=bearer(victim)).json()["name"] == victim_name


# --- 4. revoke and expiry ----------------------------------------------------------------------


def test_revoked_token_fails_at_once_and_an_expired_one_after_its_time(platform: Sluice) -> None:
    s = platform
    name = f"t4-ops-{secrets.token_hex(3)}"
    created = s.cli("token", "create", name, "--role", "operator")
    token = created["token"]
    assert created["name"] == name and created["role"] == "operator" and token.startswith("slc_")
    code, groups = sluice_cli(s, "get", "groups", token=token)  # the global --token flag
    assert code == 0 and {g["name"] for g in groups} >= {"alpha", "beta"}, groups
    with control(s) as c:
        me = c.get("/v1/whoami", headers=bearer(token)).json()
        # the installation's admin enrolls a new person: the token's name (no --owner)
        assert me == {"name": name, "person": name, "role": "operator", "groups": None}
        revoked = s.cli("token", "revoke", name)
        assert revoked["name"] == name and revoked["revoked_by"] == "admin", revoked
        r = c.get("/v1/whoami", headers=bearer(token))
        assert_error(r, 401, "unauthorized", "revoked", name)
        r = c.post(
            "/v1/groups/alpha/scale", json={"replicas": 1, "reason": "x"}, headers=bearer(token)
        )
        assert_error(r, 401, "unauthorized", "revoked")
    code, out = sluice_cli(s, "get", "groups", token=token)
    assert code == 5 and "revoked" in out["error"]["message"], out
    listed = {t["name"]: t for t in s.cli("token", "list")}
    assert listed[name]["revoked_at"] is not None and "token" not in listed[name]
    code, out = sluice_cli(s, "token", "create", name)  # names stay taken after a revoke
    assert code == 3, out
    (entry,) = s.cli("audit", "--target", f"token/{name}", "--action", "token-revoke")
    assert entry["actor"] == "admin"

    short = f"t4-short-{secrets.token_hex(3)}"
    created = s.cli("token", "create", short, "--role", "viewer", "--expires", "1s")
    assert created["expires_at"] == pytest.approx(created["created_at"] + 1, abs=0.01)
    while time.time() < created["expires_at"] + 0.3:
        time.sleep(0.1)
    with control(s) as c:
        r = c.get("/v1/groups", headers=bearer(created["token"]))
        assert_error(r, 401, "unauthorized", "expired", short)
    code, out = sluice_cli(s, "get", "groups", token=created["token"])
    assert code == 5 and "expired" in out["error"]["message"], out
    code, out = sluice_cli(s, "token", "create", "t4-bad", "--expires", "soon")
    assert code == 2, out


# --- 5. Host check and metrics ---------------------------------------------------------------


def test_unknown_host_is_refused_and_metrics_moved_behind_a_token(platform: Sluice) -> None:
    s = platform
    admin = admin_token(s)
    viewer = s.token(f"t5-scraper-{secrets.token_hex(3)}", role="viewer")
    # some traffic to count
    assert chat(s, "sk-id-main-77742775923c273d", "m-alpha").status_code == 200
    port = s.control_url.rsplit(":", 1)[1]
    with control(s) as c:
        for host in ("evil.example", f"evil.example:{port}", "127.0.0.2", "sluice.corp.example"):
            for path, headers in (("/v1/groups", bearer(admin)), ("/healthz", {})):
                r = c.get(path, headers={**headers, "Host": host})
                assert_error(r, 421, "bad_host", "does not serve host")
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost"):
            r = c.get("/v1/whoami", headers={**bearer(admin), "Host": host})
            assert r.status_code == 200 and r.json()["name"] == "admin", (host, r.text)

        assert_error(c.get("/metrics"), 401, "unauthorized", "no token")
        r = c.get("/metrics", headers=bearer(viewer))
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("text/plain"), r.headers
        assert "# TYPE sluice_" in r.text and "# HELP" in r.text, r.text[:500]
    with httpx.Client(base_url=s.endpoint, trust_env=False, timeout=30) as gw:
        assert gw.get("/metrics").status_code == 404
        assert gw.get("/metrics", headers=bearer("sk-id-main-77742775923c273d")).status_code == 404
        assert gw.get("/healthz").status_code == 200


# --- 6. one `sluice up` per state directory ---------------------------------------------------


def test_second_up_on_the_same_state_directory_exits_at_once_naming_the_first(
    platform: Sluice,
) -> None:
    s = platform
    assert s.proc is not None
    info = (s.home / "control.json").read_text()
    other = s.home / "t6-other.yaml"
    other.write_text(platform_spec(description="t6: must never be applied"))
    rev = revision(s)
    for args in (["up", "--port", "0"], ["up", "-f", str(other), "--reason", "t6", "--port", "0"]):
        # It does not wait for the first to let go: a wait on the state directory's lock
        # would outlast the 30 s timeout (how long a start takes is bench's, not a test's).
        r = subprocess.run(
            [sys.executable, "-m", "sluice", *args],
            capture_output=True,
            text=True,
            env=s.env(),
            timeout=30,
        )
        assert r.returncode == 3, (r.returncode, r.stdout, r.stderr)
        text = " ".join((r.stdout + r.stderr).split())  # rich may wrap; compare words
        assert "already running" in text and f"pid {s.proc.pid}" in text, text
        assert s.endpoint in text, text
    # The first one is untouched: same control file, same revision, still serving.
    assert (s.home / "control.json").read_text() == info
    assert revision(s) == rev and s.proc.poll() is None
    assert chat(s, "sk-id-main-77742775923c273d", "m-alpha").status_code == 200


# --- 7. no key or token in clear, anywhere -------------------------------------------------------


def secret_spec(keys: dict[str, str], keys_file: Path, with_newco: bool) -> str:
    newco = f"  - {{name: newco, api_keys: [{keys['newco']}]}}\n" if with_newco else ""
    return (
        """
gateway: {host: 127.0.0.1, port: 0}
control: {review: {routes: true}}
pools:
  - {name: local, count: 8, memory_gb: 16}
groups:
"""
        + group("chat", "m-chat")
        + f"""
tenants:
  - name: acme
    api_keys:
      - {keys["acme1"]}
      - "{keys["acme2"]}"
  - {{name: globex, api_keys: ['{keys["globex"]}']}}
  - name: envco
    api_keys_env: SLUICE_E2E_ENVCO_KEYS
  - name: fileco
    api_keys_file: {keys_file}
{newco}
routes:
  - tag: chat-main
    match: {{models: [m-chat]}}
    to: chat
"""
    )


def every_get(s: Sluice, token: str) -> list[tuple[str, bytes]]:
    """The answer of every GET route of the control API (asserted to be every one)."""
    with control(s) as c:
        props = c.get("/v1/proposals", params={"all": True, "limit": 1000}, headers=bearer(token))
        paths = {
            "/healthz": "/healthz",
            "/metrics": "/metrics",
            "/v1/alerts": "/v1/alerts",
            "/v1/alerts/rules": "/v1/alerts/rules",
            "/v1/audit": "/v1/audit?limit=100000",
            "/v1/history": "/v1/history",
            "/v1/dataplane": "/v1/dataplane",
            "/v1/events": "/v1/events?limit=100000",
            "/v1/groups": "/v1/groups",
            "/v1/groups/{group}/explain": "/v1/groups/chat/explain?limit=1000",
            "/v1/groups/{group}/spec": "/v1/groups/chat/spec",
            "/v1/instances": "/v1/instances",
            "/v1/proposals": "/v1/proposals?all=true&limit=1000",
            "/v1/quota": "/v1/quota",
            "/v1/revisions": "/v1/revisions?limit=1000",
            "/v1/rollouts": "/v1/rollouts",
            "/v1/rollouts/{name}": "/v1/rollouts/none",
            "/v1/rollouts/{name}/plan": "/v1/rollouts/none/plan",
            "/v1/routes": "/v1/routes",
            "/v1/tokens": "/v1/tokens",
            "/v1/whoami": "/v1/whoami",
            "/v1/status": "/v1/status",
            "/v1/openapi.json": "/v1/openapi.json",
        }
        ids = [p["id"] for p in props.json()]
        assert ids, props.text
        gets = {r for m, r in app_routes() if m == "GET"}
        assert gets == set(paths) | {"/v1/proposals/{proposal_id}"}, gets
        out = []
        for path in [*paths.values(), *(f"/v1/proposals/{i}" for i in ids)]:
            r = c.get(path, headers=bearer(token))
            assert r.status_code in (200, 404), (path, r.status_code, r.text)
            out.append((path, r.content))
        return out


def state_files(home: Path) -> dict[str, bytes]:
    """Every file under the state directory but admin.token (which holds a token by
    design): the store and its -wal/-shm, instance logs, access.log, control.json, ..."""
    return {
        str(p.relative_to(home)): p.read_bytes()
        for p in sorted(home.rglob("*"))
        if p.is_file() and p.name != "admin.token"
    }


def assert_nowhere(secrets_: dict[str, str], places: dict[str, bytes]) -> None:
    found = [
        (what, where)
        for what, value in secrets_.items()
        for where, data in places.items()
        if value.encode() in data
    ]
    assert found == [], f"secrets in clear: {found}"


def test_no_key_or_token_is_stored_logged_or_served_in_clear(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = {name: f"sk-{name}-{secrets.token_hex(12)}" for name in ("acme1", "acme2", "globex")}
    keys |= {name: f"sk-{name}-{secrets.token_hex(12)}" for name in ("env1", "env2", "file1")}
    keys |= {
        "file2": f"sk-file2-{secrets.token_hex(12)}",
        "newco": f"sk-new-{secrets.token_hex(12)}",
    }
    # The env source is read by `sluice up` (Sluice.env() passes the test's environment).
    monkeypatch.setenv("SLUICE_E2E_ENVCO_KEYS", f"{keys['env1']}, {keys['env2']}")
    keys_file = tmp_path / "fileco.keys"  # outside the state directory: the operator's file
    keys_file.write_text(f"# fileco's keys\n{keys['file1']}\n\n  {keys['file2']}\n")
    home = tmp_path / "home"
    spec = tmp_path / "platform.yaml"
    spec.write_text(secret_spec(keys, keys_file, with_newco=False))
    tenant_of = {
        "acme1": "acme",
        "acme2": "acme",
        "globex": "globex",
        "env1": "envco",
        "env2": "envco",
        "file1": "fileco",
        "file2": "fileco",
        "newco": "newco",
    }

    def traffic(s: Sluice, which: list[str]) -> None:
        for k in which:
            r = chat(s, keys[k], "m-chat")
            assert r.status_code == 200, (k, r.status_code, r.text)

    s = Sluice(home, spec)
    try:
        s.start()
        s.wait_for("chat serving", lambda: both_ready(s, {"chat"}, keys["acme1"], ("m-chat",)))
        assert stat.S_IMODE(home.stat().st_mode) == 0o700
        traffic(s, [k for k in keys if k != "newco"])
        assert chat(s, keys["newco"], "m-chat").status_code == 401

        tokens = {"admin": admin_token(s), "alice": s.token("alice"), "bob": s.token("bob")}
        change = tmp_path / "newco.yaml"
        change.write_text(secret_spec(keys, keys_file, with_newco=True))
        code, out = s.as_user("alice", "apply", "-f", str(change), "--reason", "newco")
        assert code == 3 and out["error"]["sections"] == ["tenants"], out
        code, p = s.as_user("alice", "propose", "-f", str(change), "--reason", "onboard newco")
        assert code == 0, p
        code, done = s.as_user("bob", "approve", str(p["id"]), "--reason", "ok")
        assert code == 0 and done["state"] == "approved", done
        deadline = time.monotonic() + 15
        while chat(s, keys["newco"], "m-chat").status_code != 200:
            assert time.monotonic() < deadline, "newco's key never started working"
            time.sleep(0.1)
        traffic(s, list(keys))

        # Restart: plain `sluice up` resumes the live revision (keys re-read from env/file).
        assert s.stop() == 0
        s.start(with_spec=False)
        s.wait_for(
            "chat serving again", lambda: both_ready(s, {"chat"}, keys["acme1"], ("m-chat",))
        )
        traffic(s, list(keys))
        time.sleep(0.5)  # the gateway flushes its access log every 0.1 s

        answers = {}
        for who, token in tokens.items():
            answers |= {f"GET {path} as {who}": body for path, body in every_get(s, token)}
        for args in (("audit",), ("proposals", "--all"), ("token", "list"), ("get", "routes")):
            answers[f"sluice {' '.join(args)}"] = s.show(*args).encode()
        answers[f"sluice proposal show {p['id']}"] = s.show(
            "proposal", "show", str(p["id"])
        ).encode()
        answers["sluice up output"] = "".join(s.output).encode()
        everything = {
            **keys,
            **{f"digest:{n}": hashlib.sha256(k.encode()).hexdigest() for n, k in keys.items()},
            **{f"token:{n}": t for n, t in tokens.items()},
        }
        assert_nowhere(everything, answers)
        # What is served instead: each written key sealed (neither the key nor its digest), in
        # revisions (text and diff) and in the proposal.
        revs = json.loads(answers["GET /v1/revisions?limit=1000 as admin"])
        assert '"sealed:' in revs[0]["diff"] and '"sealed:' in revs[0]["yaml_text"], revs[0]
        shown = json.loads(answers[f"GET /v1/proposals/{p['id']} as admin"])
        assert '"sealed:' in shown["diff"] and '"sealed:' in shown["yaml_text"], shown
        running_files = state_files(home)
        assert_nowhere(everything, running_files)

        assert s.stop() == 0  # a clean stop checkpoints the WAL into state.db
        stopped_files = state_files(home)
        assert_nowhere(everything, stopped_files)
        assert_nowhere(everything, {"sluice up output": "".join(s.output).encode()})

        # The search looked at the real thing: the store holds the sealed keys, the access log
        # each tenant's traffic, the instance logs exist.
        stored = b"".join(
            v for k, v in {**running_files, **stopped_files}.items() if "state.db" in k
        )
        assert b'"sealed:' in stored
        access = stopped_files["access.log"].decode()
        tenants_seen = {json.loads(line).get("tenant") for line in access.splitlines() if line}
        assert set(tenant_of.values()) <= tenants_seen, tenants_seen
        assert any(k.startswith("instances/") and k.endswith(".log") for k in stopped_files)
        assert any(k.startswith("state.db") for k in running_files)

        assert stat.S_IMODE(home.stat().st_mode) == 0o700
        assert stat.S_IMODE((home / "state.db").stat().st_mode) == 0o600
        assert stat.S_IMODE((home / "admin.token").stat().st_mode) == 0o600
        loose = [
            (str(p), oct(stat.S_IMODE(p.stat().st_mode)))
            for p in home.rglob("*")
            if not p.is_symlink() and p.stat().st_mode & 0o077
        ]
        assert loose == [], loose
    finally:
        s.kill()
        kill_workers_of(home)


# --- 8. bad keys are refused, nothing applied -------------------------------------------------


def test_duplicate_or_empty_key_is_a_spec_error_and_nothing_is_applied(platform: Sluice) -> None:
    s = platform
    base = revision(s)
    dup = "sk-t8-dup-" + secrets.token_hex(6)
    cases = {
        "dup-in-tenant": (
            f"  - {{name: main, api_keys: [sk-id-main-77742775923c273d, {dup}, {dup}]}}\n",
            "tenants[0].api_keys[2]",
            "listed twice",
        ),
        "dup-across": (
            f"  - {{name: main, api_keys: [sk-id-main-77742775923c273d, {dup}]}}\n"
            f"  - {{name: second, api_keys: [{dup}]}}\n",
            "tenants[1].api_keys[0]",
            "already belongs to 'main'",
        ),
        "empty": (
            '  - {name: main, api_keys: [sk-id-main-77742775923c273d, ""]}\n',
            "tenants[0].api_keys[1]",
            "",
        ),
    }
    for name, (tenants, field, words) in cases.items():
        path = s.home / f"t8-{name}.yaml"
        path.write_text(platform_spec(description=name, tenants=tenants))
        r = subprocess.run(
            [sys.executable, "-m", "sluice", "apply", "-f", str(path), "--reason", name],
            capture_output=True,
            text=True,
            env={**s.env(), "COLUMNS": "200"},
            timeout=60,
        )
        assert r.returncode == 2, (name, r.returncode, r.stdout, r.stderr)
        assert f"{path}:" in r.stderr and f" {field}: " in r.stderr, (name, r.stderr)
        assert words in r.stderr and dup not in r.stdout + r.stderr, (name, r.stderr)
        code, out = sluice_cli(s, "apply", "-f", str(path), "--reason", name)
        assert code == 2 and out["error"]["code"] == "invalid_spec", out
        assert field in [i["field"] for i in out["error"]["issues"]], out
        # The API refuses it the same way (422) when the CLI's own check is skipped.
        with control(s) as c:
            body = {"yaml": path.read_text(), "source": path.name, "reason": name}
            resp = c.post("/v1/revisions", json=body, headers=bearer(admin_token(s)))
            assert_error(resp, 422, "invalid_spec", field)
            assert dup not in resp.text
        assert revision(s) == base, name

    # A key source the controller cannot read: refused on the server (422 -> exit 2).
    path = s.home / "t8-env.yaml"
    path.write_text(
        platform_spec(
            description="env",
            tenants="  - {name: main, api_keys: [sk-id-main-77742775923c273d]}\n"
            "  - {name: second, api_keys_env: SLUICE_T8_UNSET_VARIABLE}\n",
        )
    )
    code, out = sluice_cli(s, "apply", "-f", str(path), "--reason", "env")
    assert code == 2 and out["error"]["code"] == "invalid_spec", out
    (issue,) = out["error"]["issues"]
    assert issue["field"] == "tenants[1].api_keys_env" and "not set" in issue["message"], issue
    assert revision(s) == base
    assert chat(s, "sk-id-main-77742775923c273d", "m-alpha").status_code == 200
