"""Every read scoped (issue 31), end to end through `sluice up`: a viewer token scoped to one
team's group calls every GET route the control API has (enumerated from the app, so a new
route cannot slip past), the CLI and the console, and reads nothing of the other team; an
unscoped viewer reads both.

Everything of the hidden team carries the string `zeta` (its groups, owner, tenant, route,
rollout, drill, capacity report, proposal, audit reason); nothing of the visible team
does. An answer to the scoped viewer may name zeta only in a refusal (403) or a 404."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Sluice, running
from tests.e2e.test_identity import app_routes, both_ready

SIM = "{startup_s: 0.2, service_time: {kind: fixed, seconds: 0.01}, memory_gb: 1}"
GROUP = """
  - name: {name}
    owner: {owner}
    business: {business}
    alert_channel: "#{business}"
    models:
      {model}: {{runtime: sim, version: v1, sim: {sim}}}
    resources: {{pool: local, accelerators: 1, memory_gb: 2}}
    max_concurrency: 8
    {scaling}
    slow_start_s: 0
    warmup: {{requests: 1}}
"""


def spec(extra_tenant: str = "") -> str:
    return (
        """
gateway: {host: 127.0.0.1, port: 0}
pools:
  - {name: local, count: 8, memory_gb: 16}
groups:
"""
        + GROUP.format(
            name="alpha-team",
            owner="alpha@example.com",
            business="search",
            model="m-alpha",
            sim=SIM,
            scaling="replicas: 1",
        )
        + GROUP.format(
            name="zeta-hidden",
            owner="zeta-owner@example.com",
            business="zeta-biz",
            model="m-zeta",
            sim=SIM,
            scaling="replicas: 1",
        )
        + GROUP.format(
            name="zeta-canary",
            owner="zeta-owner@example.com",
            business="zeta-biz",
            model="m-zeta",
            sim=SIM,
            scaling="autoscaling: {min: 1, max: 2, interval_s: 5}\n    slo: {latency_ms: 1000}",
        )
        + """
tenants:
  - {name: alpha-tenant, api_keys: [sk-scoped-alpha-1-233c23a655fe17ab]}
  - {name: zeta-tenant, api_keys: [sk-scoped-other-1-aab02f5bbea50f0a]}
"""
        + extra_tenant
        + """
routes:
  - tag: alpha-route
    match: {models: [m-alpha]}
    to: alpha-team
  - tag: zeta-route
    match: {tenants: [zeta-tenant], models: [m-zeta]}
    to: zeta-hidden
rollouts:
  - name: zeta-rollout
    baseline: zeta-hidden
    canary: zeta-canary
    steps: [20, 50, 100]
    hold_s: 600
    analysis: {min_samples: 30}
drills:
  - name: zeta-drill
    group: zeta-canary
    cron: "0 3 1 1 *"
    api_key_env: SLUICE_TEST_ZETA_DRILL_KEY_NOT_SET
"""
    )


SCOPED = "alpha-viewer"
UNSCOPED = "all-viewer"


def ready(s: Sluice) -> bool:
    return both_ready(
        s,
        {"alpha-team", "zeta-hidden", "zeta-canary"},
        "sk-scoped-alpha-1-233c23a655fe17ab",
        ("m-alpha",),
    ) and both_ready(s, set(), "sk-scoped-other-1-aab02f5bbea50f0a", ("m-zeta",))


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sluice]:
    home = tmp_path_factory.mktemp("scoped")
    with running(home, spec(), "both teams ready", ready) as s:
        yield s


def call(s: Sluice, token: str, method: str, path: str, **kw: Any) -> httpx.Response:
    with httpx.Client(base_url=s.control_url, trust_env=False, timeout=30) as c:
        return c.request(method, path, headers={"Authorization": f"Bearer {token}"}, **kw)


def admin(s: Sluice, method: str, path: str, **kw: Any) -> Any:
    r = call(s, (s.home / "admin.token").read_text().strip(), method, path, **kw)
    assert r.status_code == 200, (method, path, r.status_code, r.text)
    return r.json()


def make_zeta_and_alpha_objects(s: Sluice) -> dict[str, Any]:
    """A capacity run of each team, a zeta drill firing, a zeta rollout run, a proposal,
    audit rows of both: real ids to fill the routes' parameters with."""
    report = {"kind": "loadtest", "mode": "simulated", "verdict": "pass"}
    alpha_run = admin(
        s, "POST", "/v1/groups/alpha-team/capacity", json={**report, "report": {"note": "a"}}
    )
    zeta_run = admin(
        s,
        "POST",
        "/v1/groups/zeta-hidden/capacity",
        json={**report, "report": {"note": "zeta-report"}},
    )
    admin(s, "POST", "/v1/drills/zeta-drill/run")
    for group in ("alpha-team", "zeta-hidden"):
        admin(
            s,
            "POST",
            f"/v1/groups/{group}/scale",
            json={"replicas": 1, "reason": f"{group} reason"},
        )
    started = call(
        s,
        (s.home / "admin.token").read_text().strip(),
        "POST",
        "/v1/rollouts/zeta-rollout/start",
        json={"reason": "zeta rollout reason"},
    )
    proposal = admin(
        s,
        "POST",
        "/v1/proposals",
        json={
            "yaml": spec(
                "  - {name: zeta-newco, api_keys: [sk-scoped-other-2-1d684b24be2a32d0]}\n"
            ),
            "reason": "zeta proposal",
        },
    )
    return {
        "alpha_run": alpha_run["id"],
        "zeta_run": zeta_run["id"],
        "rollout_started": started.status_code == 200,
        "proposal": proposal["id"],
    }


def parameter_table(ids: dict[str, Any]) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """(GET, route) -> the concrete paths the scoped viewer calls, each with whose object it
    names: `alpha` (must answer 200, zeta-free), `zeta` (403 or 404, or 200 zeta-free),
    `own` (403: refused to every scoped reader) or `none` (an answer of several groups:
    200, zeta-free)."""
    zeta_group = [
        ("/v1/instances?group=zeta-hidden", "zeta"),
        ("/v1/events?group=zeta-hidden", "zeta"),
        ("/v1/history?group=zeta-hidden", "zeta"),
        ("/v1/alerts?group=zeta-hidden", "zeta"),
        ("/v1/audit?target=group/zeta-hidden", "zeta"),
        ("/v1/audit?target=rollout/zeta-rollout", "zeta"),
        (f"/v1/audit?target=proposal/{ids['proposal']}", "zeta"),
    ]
    return {
        ("GET", "/healthz"): [("/healthz", "none")],
        ("GET", "/metrics"): [("/metrics", "own")],
        ("GET", "/v1/status"): [("/v1/status", "none")],
        ("GET", "/v1/whoami"): [("/v1/whoami", "none")],
        ("GET", "/v1/openapi.json"): [("/v1/openapi.json", "none")],
        ("GET", "/v1/groups"): [("/v1/groups", "none")],
        ("GET", "/v1/instances"): [
            ("/v1/instances", "none"),
            ("/v1/instances?group=alpha-team", "alpha"),
            zeta_group[0],
        ],
        ("GET", "/v1/routes"): [("/v1/routes", "none")],
        ("GET", "/v1/groups/{group}/explain"): [
            ("/v1/groups/alpha-team/explain", "alpha"),
            ("/v1/groups/zeta-hidden/explain", "zeta"),
        ],
        ("GET", "/v1/groups/{group}/spec"): [
            ("/v1/groups/alpha-team/spec", "alpha"),
            ("/v1/groups/zeta-hidden/spec", "zeta"),
        ],
        ("GET", "/v1/groups/{group}/capacity"): [
            ("/v1/groups/alpha-team/capacity?reports=true", "alpha"),
            ("/v1/groups/zeta-hidden/capacity?reports=true", "zeta"),
        ],
        ("GET", "/v1/capacity/{run_id}"): [
            (f"/v1/capacity/{ids['alpha_run']}", "alpha"),
            (f"/v1/capacity/{ids['zeta_run']}", "zeta"),
        ],
        ("GET", "/v1/drills"): [("/v1/drills", "none")],
        ("GET", "/v1/drills/fires"): [
            ("/v1/drills/fires", "none"),
            ("/v1/drills/fires?schedule=zeta-drill", "none"),
        ],
        ("GET", "/v1/history"): [
            ("/v1/history", "none"),
            ("/v1/history?group=alpha-team", "alpha"),
            zeta_group[2],
        ],
        ("GET", "/v1/rollouts"): [("/v1/rollouts", "none")],
        ("GET", "/v1/rollouts/{name}"): [("/v1/rollouts/zeta-rollout", "zeta")],
        ("GET", "/v1/rollouts/{name}/plan"): [("/v1/rollouts/zeta-rollout/plan", "zeta")],
        ("GET", "/v1/proposals"): [("/v1/proposals", "none"), ("/v1/proposals?all=true", "none")],
        ("GET", "/v1/proposals/{proposal_id}"): [(f"/v1/proposals/{ids['proposal']}", "zeta")],
        ("GET", "/v1/quota"): [("/v1/quota", "none")],
        ("GET", "/v1/dataplane"): [("/v1/dataplane", "none")],
        ("GET", "/v1/revisions"): [("/v1/revisions", "own")],
        ("GET", "/v1/audit"): [
            ("/v1/audit?limit=100000", "none"),
            ("/v1/audit?target=group/alpha-team", "alpha"),
            *zeta_group[4:],
        ],
        ("GET", "/v1/events"): [
            ("/v1/events?limit=100000", "none"),
            ("/v1/events?group=alpha-team", "alpha"),
            zeta_group[1],
        ],
        ("GET", "/v1/alerts"): [
            ("/v1/alerts", "none"),
            ("/v1/alerts?group=alpha-team", "alpha"),
            zeta_group[3],
        ],
        ("GET", "/v1/alerts/rules"): [("/v1/alerts/rules", "none")],
        ("GET", "/v1/tokens"): [("/v1/tokens", "own")],  # admins only
    }


def get_routes(s: Sluice) -> set[tuple[str, str]]:
    """Every GET route: the app's own (`app_routes`), and those `sluice up` adds on top
    (capacity, drills, gateways), from its served OpenAPI document."""
    served = admin(s, "GET", "/v1/openapi.json")["paths"]
    live = {(m.upper(), p) for p, ops in served.items() for m in ops}
    return {(m, p) for m, p in app_routes() | live if m == "GET"}


def test_a_scoped_viewer_reads_nothing_of_another_team_on_any_route(platform: Sluice) -> None:
    s = platform
    ids = make_zeta_and_alpha_objects(s)
    scoped = s.token(SCOPED, role="viewer", groups="alpha-team")
    unscoped = s.token(UNSCOPED, role="viewer")
    # traffic of both teams, so the data plane and history have something of each
    for key, model in (
        ("sk-scoped-alpha-1-233c23a655fe17ab", "m-alpha"),
        ("sk-scoped-other-1-aab02f5bbea50f0a", "m-zeta"),
    ):
        with httpx.Client(base_url=s.endpoint, trust_env=False, timeout=30) as c:
            r = c.post(
                "/v1/chat/completions",
                headers={"Authorization": f"Bearer {key}"},
                json={
                    "model": model,
                    "max_tokens": 1,
                    "messages": [{"role": "user", "content": "x"}],
                },
            )
            assert r.status_code == 200, r.text

    table = parameter_table(ids)
    routes = get_routes(s)
    assert routes - set(table) == set(), (
        f"GET routes without a parameter-table entry: {routes - set(table)}"
    )
    assert set(table) - routes == set(), f"stale table entries: {set(table) - routes}"

    for (_, route), calls in sorted(table.items()):
        for path, whose in calls:
            r = call(s, scoped, "GET", path)
            seen = (route, path, r.status_code, r.text[:300])
            if whose == "own":
                assert r.status_code == 403, seen
                continue
            if whose == "zeta" and r.status_code in (403, 404):
                assert r.json()["error"]["code"] in ("forbidden", "not_found"), seen
                assert "zeta-owner" not in r.text and "zeta-tenant" not in r.text, seen
                continue
            assert r.status_code == 200, seen
            assert "zeta" not in r.text.lower(), seen

    # What the scoped viewer does see of its own team, and how it is refused the rest.
    groups = call(s, scoped, "GET", "/v1/groups").json()
    assert [g["name"] for g in groups] == ["alpha-team"]
    assert {i["group"] for i in call(s, scoped, "GET", "/v1/instances").json()} == {"alpha-team"}
    tags = {r["tag"] for r in call(s, scoped, "GET", "/v1/routes").json()["rules"]}
    assert tags == {"alpha-route", "default:m-alpha"}, tags
    assert {e["group"] for e in call(s, scoped, "GET", "/v1/events").json()} == {"alpha-team"}
    audit = call(s, scoped, "GET", "/v1/audit").json()
    assert audit and {a["target"] for a in audit} == {"group/alpha-team"}, audit
    history = call(s, scoped, "GET", "/v1/history").json()
    assert set(history["groups"]) <= {"alpha-team"}, history
    quota = call(s, scoped, "GET", "/v1/quota").json()
    assert [g["name"] for g in quota["groups"]] == ["alpha-team"] and quota["pools"], quota
    refused = call(s, scoped, "GET", "/v1/events?group=zeta-hidden")
    assert refused.status_code == 403, refused.text
    message = refused.json()["error"]["message"]
    assert SCOPED in message and "alpha-team" in message and "zeta-hidden" in message, message
    revisions = call(s, scoped, "GET", "/v1/revisions").json()["error"]["message"]
    assert "whole platform" in revisions and "/v1/groups" in revisions, revisions
    metrics = call(s, scoped, "GET", "/metrics").json()["error"]["message"]
    assert "unscoped viewer token" in metrics, metrics

    # The unscoped viewer reads both teams.
    def sees_zeta(path: str) -> bool:
        r = call(s, unscoped, "GET", path)
        assert r.status_code == 200, (path, r.text)
        return "zeta" in r.text

    for path in (
        "/v1/groups",
        "/v1/instances",
        "/v1/routes",
        "/v1/events?limit=100000",
        "/v1/audit?limit=100000",
        "/v1/quota",
        "/v1/dataplane",
        "/v1/drills",
        "/v1/drills/fires",
        "/v1/rollouts",
        "/v1/proposals",
        f"/v1/proposals/{ids['proposal']}",
        f"/v1/capacity/{ids['zeta_run']}",
        "/v1/revisions",
        "/v1/alerts/rules",
        "/v1/rollouts/zeta-rollout/plan",
        "/metrics",
    ):
        assert sees_zeta(path), path
    if ids["rollout_started"]:
        assert sees_zeta("/v1/rollouts/zeta-rollout")


def test_the_cli_and_the_console_show_a_scoped_viewer_only_its_team(platform: Sluice) -> None:
    s = platform
    s.token(SCOPED, role="viewer", groups="alpha-team")
    code, groups = s.as_user(SCOPED, "get", "groups")
    assert code == 0 and [g["name"] for g in groups] == ["alpha-team"], groups
    s.token(UNSCOPED, role="viewer")
    code, unscoped = s.as_user(UNSCOPED, "get", "groups")
    assert code == 0 and "zeta-hidden" in {g["name"] for g in unscoped}, unscoped

    with httpx.Client(base_url=s.control_url, trust_env=False, timeout=30) as c:
        form = c.get("/ui/login")
        nonce = re.search(r'name="nonce" value="([^"]+)"', form.text)
        assert nonce, form.text[:500]
        logged_in = c.post(
            "/ui/login",
            data={"token": s.token(SCOPED), "nonce": nonce.group(1), "next": "/ui/"},
            follow_redirects=False,
        )
        assert logged_in.status_code == 303, logged_in.text
        for page in ("/ui/", "/ui/routes", "/ui/quota", "/ui/audit", "/ui/rollouts"):
            r = c.get(page)
            assert r.status_code == 200, (page, r.text[:500])
            assert "zeta" not in r.text.lower(), (page, r.text)
            if page == "/ui/":
                assert "alpha-team" in r.text
        r = c.get("/ui/groups/zeta-hidden")
        assert r.status_code in (403, 404), r.text[:300]
        assert "zeta-owner" not in r.text
