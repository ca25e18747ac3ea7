"""Schemathesis against the control API of a real `sluice up`: every operation of the OpenAPI
schema it serves (`GET /v1/openapi.json`, behind a token) is fuzzed with valid and invalid
requests, with an admin token and with a viewer token. No answer is a 5xx, and every 4xx is
the platform's JSON error `{"error": {"code", "message"}}`.

Destructive operations (apply, scale, failover, revoke, gc, rollouts) run for real on this
throwaway platform; only revoking the tokens the test itself uses is kept out.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from sluice.control.tokens import BOOTSTRAP_ADMIN
from tests.e2e.conftest import Sluice, running

SIM = "{startup_s: 0.2, service_time: {kind: fixed, seconds: 0.01}, memory_gb: 1}"
GROUP = """
  - name: {name}
    owner: ops@example.com
    business: search
    alert_channel: "#ops"
    models:
      m-chat: {{runtime: sim, sim: {sim}}}
    resources: {{pool: local, memory_gb: 1}}
    max_concurrency: 8
    replicas: 1
    slow_start_s: 0
    warmup: {{requests: 1}}
"""
SPEC = (
    """
gateway: {host: 127.0.0.1, port: 0}
pools:
  - {name: local, count: 8, memory_gb: 16}
groups:
"""
    + GROUP.format(name="chat", sim=SIM)
    + "    backup: chat-v2\n"
    + GROUP.format(name="chat-v2", sim=SIM)
    + """
tenants:
  - {name: search, api_keys: [sk-search-b095adcc724f4f8a]}
routes:
  - {tag: chat-main, match: {models: [m-chat]}, to: chat}
rollouts:
  - {name: chat-rollout, baseline: chat, canary: chat-v2, steps: [50, 100], hold_s: 1}
"""
)

FUZZER, VIEWER = "fuzz-admin", "fuzz-viewer"
PROTECTED = {BOOTSTRAP_ADMIN, FUZZER, VIEWER}
"""Tokens this test (and the CLI helpers it polls with) keep using: never revoked."""
EXAMPLES = 12
"""Requests per operation, per generation mode, per role: ~30 operations x 2 x 2 x 12."""


@schemathesis.check
def error_envelope(ctx: Any, response: schemathesis.Response, case: schemathesis.Case) -> None:
    """A 4xx is the platform's error: JSON `{"error": {"code": str, "message": str}}`."""
    if not 400 <= response.status_code < 500:
        return
    try:
        body = json.loads(response.content)
    except ValueError:
        raise AssertionError(
            f"{response.status_code} with a body that is not JSON: {response.content[:200]!r}"
        ) from None
    error = body.get("error") if isinstance(body, dict) else None
    assert isinstance(error, dict), f"{response.status_code} without an 'error' object: {body}"
    assert isinstance(error.get("code"), str), f"'error.code' is not text: {body}"
    assert isinstance(error.get("message"), str), f"'error.message' is not text: {body}"


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sluice]:
    home = tmp_path_factory.mktemp("schema")
    with running(
        home,
        SPEC,
        "both groups ready",
        lambda s: {i["group"] for i in s.ready("chat") + s.ready("chat-v2")} == {"chat", "chat-v2"},
    ) as s:
        s.token(FUZZER, "admin")
        s.token(VIEWER, "viewer")
        yield s


def load_schema(platform: Sluice, token: str) -> Any:
    return schemathesis.openapi.from_url(
        f"{platform.control_url}/v1/openapi.json",
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )


def test_the_schema_is_served_behind_a_token(platform: Sluice) -> None:
    url = f"{platform.control_url}/v1/openapi.json"
    with httpx.Client(trust_env=False, timeout=30) as client:
        refused = client.get(url)
        assert refused.status_code == 401, refused.text
        assert refused.json()["error"]["code"] == "unauthorized"
        served = client.get(url, headers=platform.control_headers())
    assert served.status_code == 200
    schema = served.json()
    assert schema["openapi"].startswith("3.")
    assert "/v1/openapi.json" in schema["paths"]
    assert {"/v1/groups/{group}/scale", "/v1/revisions", "/v1/tokens"} <= set(schema["paths"])


NOT_FUZZED = {"/v1/control/stop"}
"""`sluice down`: a valid request stops the platform under test (tests/e2e/test_handover.py
stops one on purpose; its refusals are the guard's, fuzzed on every other route)."""


def _not_protected(case: schemathesis.Case) -> bool:
    return not (
        case.operation.path == "/v1/tokens/{name}/revoke"
        and (case.path_parameters or {}).get("name") in PROTECTED
    )


def fuzz(platform: Sluice, role: str, token: str) -> tuple[int, list[str]]:
    """Every operation, `EXAMPLES` valid and `EXAMPLES` invalid requests each, with `token`;
    returns (how many operations, what failed: one entry per operation and mode)."""
    schema = load_schema(platform, token)
    headers = {"authorization": f"Bearer {token}"}
    failures: list[str] = []
    operations = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.path in NOT_FUZZED:
            continue
        operations += 1
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            strategy = operation.as_strategy(generation_mode=mode, headers=headers)

            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                database=None,
                derandomize=False,
                phases=[Phase.explicit, Phase.generate, Phase.shrink],
                suppress_health_check=list(HealthCheck),
            )
            @given(case=strategy.filter(_not_protected))
            def run(case: schemathesis.Case) -> None:
                response = case.call(headers=headers, timeout=15)
                case.validate_response(
                    response, checks=[not_a_server_error, error_envelope], headers=headers
                )

            try:
                run()
            except Unsatisfiable:
                # Nothing in the operation can be made invalid (no parameters but the token,
                # which is fixed): there are no negative cases to send.
                assert mode is GenerationMode.NEGATIVE, operation.label
            except (Exception, BaseExceptionGroup) as exc:  # collect all: one report
                lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
                keep = [ln for ln in lines if ln.startswith(("- ST", "[", "curl")) or "error" in ln]
                what = "\n    ".join(ln[:400] for ln in (keep or lines)[:8])
                failures.append(f"[{role}] {operation.label} ({mode.value}):\n    {what}")
    return operations, failures


@pytest.mark.parametrize("role", ["admin", "viewer"])
def test_every_operation_survives_fuzzing(platform: Sluice, role: str) -> None:
    token = platform.token(FUZZER if role == "admin" else VIEWER, role)
    operations, failures = fuzz(platform, role, token)
    assert operations >= 25, f"only {operations} operations in the schema"
    assert not failures, "\n".join(failures)
    # The platform is still answering, and our tokens still work.
    with httpx.Client(trust_env=False, timeout=30) as client:
        r = client.get(
            f"{platform.control_url}/v1/whoami", headers={"Authorization": f"Bearer {token}"}
        )
    assert r.status_code == 200 and r.json()["role"] == role, r.text


# --- what the fuzzing finds, one deterministic test per bug ----------------------------------


def call(
    platform: Sluice, method: str, path: str, *, content: bytes | None = None, token: str = ""
) -> httpx.Response:
    token = token or platform.token(FUZZER, "admin")
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    with httpx.Client(base_url=platform.control_url, trust_env=False, timeout=30) as client:
        return client.request(method, path, content=content, headers=headers)


def assert_error(r: httpx.Response, *statuses: int) -> dict[str, Any]:
    assert r.status_code in statuses, (r.status_code, r.text[:300])
    error = r.json()["error"]
    assert isinstance(error["code"], str) and isinstance(error["message"], str), error
    return error


LISTS = ["/v1/revisions", "/v1/events", "/v1/audit", "/v1/proposals", "/v1/groups/chat/explain"]


@pytest.mark.parametrize("limit", ["0", "-1", str(2**63)])
@pytest.mark.parametrize("path", LISTS)
def test_list_limits_out_of_range_are_422(platform: Sluice, path: str, limit: str) -> None:
    assert_error(call(platform, "GET", f"{path}?limit={limit}"), 422)


@pytest.mark.parametrize("path", LISTS)
def test_list_limits_in_range_answer(platform: Sluice, path: str) -> None:
    assert call(platform, "GET", f"{path}?limit=1").status_code == 200


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", ""), ("POST", "/approve"), ("POST", "/reject")],
    ids=["get", "approve", "reject"],
)
def test_proposal_ids_past_64_bits_are_refused(platform: Sluice, method: str, path: str) -> None:
    body = b'{"reason": "fuzz"}' if method == "POST" else None
    r = call(platform, method, f"/v1/proposals/{2**63}{path}", content=body)
    assert_error(r, 404, 422)


@pytest.mark.parametrize(
    ("method", "path", "body", "statuses"),
    [
        ("POST", "/v1/groups/chat/scale", b"\x80 not utf-8", (400, 422)),
        ("POST", "/v1/tokens", b"\xc3\x28", (400, 422)),
        ("GET", "/v1/no-such-thing", None, (404,)),
        ("GET", "/v1/groups/a%2Fb/explain", None, (404,)),
        ("DELETE", "/v1/groups", None, (405,)),
    ],
    ids=["scale-bad-utf8", "tokens-bad-utf8", "unknown-path", "slash-in-name", "wrong-method"],
)
def test_http_errors_are_the_platform_error(
    platform: Sluice, method: str, path: str, body: bytes | None, statuses: tuple[int, ...]
) -> None:
    assert_error(call(platform, method, path, content=body), *statuses)


def test_malformed_json_is_the_platform_error(platform: Sluice) -> None:
    r = call(platform, "POST", "/v1/groups/chat/scale", content=b'{"replicas": 1,')
    assert assert_error(r, 422)["code"] == "invalid_request"


def test_token_groups_must_be_text(tmp_path: Path) -> None:
    """On a platform of its own: today this request poisons the token list and the audit."""
    with running(tmp_path, SPEC, "chat ready", lambda s: bool(s.ready("chat"))) as s:
        body = b'{"name": "surrogate-scope", "role": "viewer", "groups": ["\\ud800"]}'
        created = call(s, "POST", "/v1/tokens", content=body)
        tokens, audit = call(s, "GET", "/v1/tokens"), call(s, "GET", "/v1/audit?limit=5")
    assert (tokens.status_code, audit.status_code) == (200, 200), (tokens.text, audit.text)
    assert_error(created, 422)


@pytest.mark.parametrize("path", ["/v1/revisions", "/v1/proposals"])
def test_spec_source_must_be_text(platform: Sluice, path: str) -> None:
    body = b'{"yaml": "pools: [", "reason": "hostile", "source": "\\ud800"}'
    assert_error(call(platform, "POST", path, content=body), 422)


def test_an_unpaired_surrogate_reason_is_422(platform: Sluice) -> None:
    body = b'{"replicas": 1, "reason": "\\ud800"}'
    assert_error(call(platform, "POST", "/v1/groups/chat/scale", content=body), 422)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/groups/chat/scale", b'{"replicas": 1, "reason": "a\\u0000b"}'),
        ("/v1/tokens", b'{"name": "nul", "role": "viewer", "groups": ["c\\u0000"]}'),
        ("/v1/groups/chat/pin", b'{"replicas": 1, "for_s": 5, "reason": "\\u0000"}'),
    ],
)
def test_a_nul_in_text_is_422_on_every_backend(platform: Sluice, path: str, body: bytes) -> None:
    """PostgreSQL's text cannot hold NUL: it is refused before the store, on SQLite too."""
    before = call(platform, "GET", "/v1/audit?limit=1").json()
    r = call(platform, "POST", path, content=body)
    assert "NUL" in assert_error(r, 422)["message"] + r.text
    assert call(platform, "GET", "/v1/audit?limit=1").json() == before  # nothing done


def apply(platform: Sluice, yaml_text: str) -> httpx.Response:
    body = json.dumps({"yaml": yaml_text, "reason": "hostile", "source": "hostile.yaml"})
    return call(platform, "POST", "/v1/revisions", content=body.encode())


@pytest.mark.parametrize(
    "yaml_text",
    [
        "pools: [\x00]",
        "\tpools: []",
        "- just a list",
        "pools: !!python/object/apply:os.system ['true']",
        "pools: &a [x, *b]",
        "pools: [{name: p, count: 1, memory_gb: 1, extra: 1}]",
    ],
    ids=["nul", "tab", "not-a-mapping", "python-tag", "undefined-alias", "unknown-field"],
)
def test_bad_specs_over_the_api_are_422(platform: Sluice, yaml_text: str) -> None:
    error = assert_error(apply(platform, yaml_text), 422)
    assert error["code"] == "invalid_spec"
    assert all(issue["file"] == "hostile.yaml" for issue in error["issues"])


@pytest.mark.parametrize(
    "yaml_text",
    [
        "pools: " + "[" * 1000 + "]" * 1000,
        "pools: " + "[" * 1000,
        "pools: &a [*a]",
        "pools: 2024-13-45",
        "pools: [{name: p, count: 1, memory_gb: 1}]\n"
        "groups: [{name: g, owner: o, business: b, alert_channel: c, models: {m: {runtime: sim}},"
        " resources: {pool: p, memory_gb: 1}, quota: {guaranteed: " + "9" * 400 + "}}]",
    ],
    ids=["deep", "deep-unclosed", "recursive-alias", "impossible-date", "huge-int"],
)
def test_loader_crashes_over_the_api_are_422(platform: Sluice, yaml_text: str) -> None:
    assert assert_error(apply(platform, yaml_text), 422)["code"] == "invalid_spec"
