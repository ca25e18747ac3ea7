"""Tenant keys are never at rest in plain text: redaction keeps the YAML (comments, lines)
and its meaning; digests, key sources and bad keys are checked; no error shows a key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.core import SpecError
from sluice.policy import build_routing_snapshot
from sluice.spec import (
    PlatformSpec,
    key_digest,
    load_spec_text,
    redact_secrets,
    resolve_key_sources,
)

HEAD = """\
# a spec with secrets in it
pools: [{name: p, count: 4, memory_gb: 16}]
groups:
  - name: chat
    owner: o
    business: b
    alert_channel: c
    models: {m: {runtime: sim}}
    resources: {pool: p, memory_gb: 1}
"""
TAIL = """\
routes:
  - tag: main   # the only rule
    match: {models: [m]}
    to: chat
"""
KEY_A, KEY_B, KEY_C = (
    "sk-live-alpha-0001",
    "sk-live-bravo-0002",
    "sk-live-charlie-0003-62664aa4eba92b8c",
)
KEYS = (KEY_A, KEY_B, KEY_C)

FLOW = f"""\
tenants:
  - name: acme   # the first tenant
    api_keys: [{KEY_A}, '{KEY_B}', "{KEY_C}"]  # three styles
    priority: high
"""
BLOCK = f"""\
tenants:
  - name: acme
    api_keys:
      - {KEY_A}     # plain
      - '{KEY_B}'
      # a comment between keys
      - "{KEY_C}"
    priority: high
"""
MULTILINE = f"""\
tenants:
  - name: acme
    api_keys:
      - |-
        {KEY_A}
      - "{KEY_B[:8]}
        {KEY_B[8:]}"
      - >-
        {KEY_C}

    priority: high
"""


def spec_text(tenants: str) -> str:
    return HEAD + tenants + TAIL


def issues(text: str, source: str = "s.yaml") -> list[str]:
    with pytest.raises(SpecError) as caught:
        load_spec_text(text, source)
    return [str(i) for i in caught.value.issues]


def digests(spec: PlatformSpec) -> list[set[str]]:
    return [{d for _, d in t.key_digests()} for t in spec.tenants]


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


# --- redaction ------------------------------------------------------------------------


@pytest.mark.parametrize("tenants", [FLOW, BLOCK, MULTILINE], ids=["flow", "block", "multiline"])
def test_redaction_hides_every_key_and_keeps_lines_comments_and_meaning(tenants: str) -> None:
    text = spec_text(tenants)
    redacted = redact_secrets(text)
    for key in KEYS:
        assert key not in redacted
        assert key[:12] not in redacted  # nor a piece of a multi-line one
    assert redacted.count("\n") == text.count("\n")
    comments = [line[line.index("#") :] for line in text.splitlines() if "#" in line]
    assert comments == [line[line.index("#") :] for line in redacted.splitlines() if "#" in line]
    assert redacted.startswith(HEAD) and redacted.endswith(TAIL)
    assert line_of(redacted, "priority: high") == line_of(text, "priority: high")
    before, after = load_spec_text(text).spec, load_spec_text(redacted).spec
    assert digests(before) == digests(after)
    assert after.tenants[0].api_keys == []
    assert before.tenants[0].model_dump(exclude={"api_keys", "api_key_sha256"}) == after.tenants[
        0
    ].model_dump(exclude={"api_keys", "api_key_sha256"})


def test_redacted_flow_entries_are_quoted_digests() -> None:
    redacted = redact_secrets(spec_text(FLOW))
    line = redacted.splitlines()[line_of(redacted, "api_keys") - 1]
    want = ", ".join(f'"sha256:{key_digest(k)}"' for k in KEYS)
    assert line == f"    api_keys: [{want}]  # three styles"


@pytest.mark.parametrize("tenants", [FLOW, BLOCK, MULTILINE])
def test_redaction_is_idempotent(tenants: str) -> None:
    once = redact_secrets(spec_text(tenants))
    assert redact_secrets(once) == once


def test_a_later_error_names_the_same_line_after_redaction() -> None:
    text = spec_text(BLOCK).replace("    to: chat\n", "    to: nowhere\n")
    before, after = issues(text), issues(redact_secrets(text, "s.yaml"))
    assert before == after
    assert after[0].startswith(f"s.yaml:{line_of(text, 'to: nowhere')}: routes[0].to")


def test_an_error_in_a_redacted_key_names_the_same_line() -> None:
    tenants = BLOCK.replace(f"      - '{KEY_B}'\n", f"      - '{KEY_B}'\n      - ''\n")
    text = spec_text(tenants)
    [before] = issues(text)
    [after] = issues(redact_secrets(text))
    assert before == after
    where = line_of(text, "- ''")
    assert before.startswith(f"s.yaml:{where}: tenants[0].api_keys[2]: an API key must not be")


def test_digest_entries_anchors_tags_and_merges_are_handled() -> None:
    digest = key_digest("sk-already-hashed")
    tenants = f"""\
tenants:
  - &base {{name: acme, api_keys: [sha256:{digest}, &shared {KEY_A}]}}
  - <<: *base
    name: beta
    api_keys: [!!str {KEY_B}]
  - {{name: gamma, api_keys: [*shared]}}
"""
    text = HEAD + tenants + TAIL
    redacted = redact_secrets(text)
    assert f"[sha256:{digest}, &shared " in redacted  # a digest stays as written
    assert f'!!str "sha256:{key_digest(KEY_B)}"' in redacted
    assert KEY_A not in redacted and KEY_B not in redacted
    assert redacted.count("\n") == text.count("\n")
    assert redact_secrets(redacted) == redacted
    # The spec itself is refused (gamma shares acme's key), the same way before and after.
    assert issues(text) == issues(redacted)
    assert any(
        "tenants[2].api_keys[0]: this key already belongs to 'acme'" in m for m in issues(text)
    )


def test_crlf_line_endings_survive() -> None:
    text = spec_text(MULTILINE).replace("\n", "\r\n")
    redacted = redact_secrets(text)
    assert redacted.count("\r\n") == text.count("\r\n")
    assert KEY_A not in redacted
    assert digests(load_spec_text(redacted).spec) == digests(load_spec_text(text).spec)


def test_text_without_tenants_or_keys_is_left_alone() -> None:
    text = spec_text("tenants:\n  - {name: acme, api_keys: [], api_keys_env: ACME_KEYS}\n")
    assert redact_secrets(text) == text
    assert redact_secrets(HEAD + TAIL) == HEAD + TAIL
    assert redact_secrets("") == ""


def test_redacting_text_that_is_not_yaml_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match=r"p\.yaml:2: : not valid YAML|not valid YAML"):
        redact_secrets(f"tenants:\n  - {{name: a, api_keys: [{KEY_A}\n", "p.yaml")


_KEY_CHARS = st.characters(
    codec="utf-8", categories=("L", "N", "P", "S", "Zs"), exclude_characters="\x85\u2028\u2029"
)
_PLAIN_CHARS = st.sampled_from("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")


def _as_yaml(key: str, style: str) -> str:
    if style == "plain":
        return key
    if style == "single":
        return "'" + key.replace("'", "''") + "'"
    return json.dumps(key, ensure_ascii=False)


@settings(max_examples=60, deadline=None)
@given(
    entries=st.lists(
        st.one_of(
            st.tuples(st.text(_PLAIN_CHARS, min_size=6, max_size=30), st.just("plain")),
            st.tuples(
                st.text(_KEY_CHARS, min_size=6, max_size=30), st.sampled_from(["single", "double"])
            ),
        ),
        min_size=1,
        max_size=4,
        unique_by=lambda e: e[0],
    ),
    block=st.booleans(),
)
def test_any_key_in_any_style_is_redacted_to_its_digest(
    entries: list[tuple[str, str]], block: bool
) -> None:
    keys = ["sk-" + k for k, _ in entries]
    written = [_as_yaml("sk-" + k, style) for k, style in entries]
    if block:
        lines = "".join(f"      - {w}  # key {n}\n" for n, w in enumerate(written))
        tenants = f"tenants:\n  - name: acme\n    api_keys:\n{lines}"
    else:
        tenants = f"tenants:\n  - name: acme\n    api_keys: [{', '.join(written)}]  # keys\n"
    text = spec_text(tenants)
    redacted = redact_secrets(text)
    assert all(f"sk-{k}" not in redacted for k, _ in entries)
    assert redacted.count("\n") == text.count("\n")
    assert redact_secrets(redacted) == redacted
    spec = load_spec_text(redacted).spec
    assert [d for _, d in spec.tenants[0].key_digests()] == [key_digest(k) for k in keys]


# --- digests in the spec -------------------------------------------------------------


def test_sha256_entries_are_digests_and_downstream_finds_them() -> None:
    da, db = key_digest(KEY_A), key_digest(KEY_B)
    text = spec_text(
        f"tenants:\n  - name: acme\n    api_keys: [sha256:{da}, {KEY_C}]\n"
        f"    api_key_sha256: [{db}]\n"
    )
    tenant = load_spec_text(text).spec.tenants[0]
    assert tenant.api_keys == [KEY_C]
    assert tenant.api_key_sha256 == [db, da]
    assert tenant.key_origins == (("api_keys", 1), ("api_key_sha256", 0), ("api_keys", 0))
    snapshot = build_routing_snapshot(load_spec_text(text).spec, {}, 1)
    for key in KEYS:
        found = snapshot.tenant_for_key(key)
        assert found is not None and found.name == "acme"
    assert snapshot.tenant_for_key(f"sha256:{da}") is None  # a digest is not a key


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ("sha256:abc123", "api_keys[0]"),
        (f"sha256:{key_digest(KEY_A)}0", "api_keys[0]"),
        (f"sha256:{key_digest(KEY_A).upper()}", "api_keys[0]"),
        (f"sha256:{'g' * 64}", "api_keys[0]"),
    ],
)
def test_malformed_sha256_entries_are_rejected_with_field_and_line(entry: str, field: str) -> None:
    text = spec_text(f"tenants:\n  - name: acme\n    api_keys:\n      - {entry}\n")
    [msg] = issues(text)
    assert msg.startswith(f"s.yaml:{line_of(text, entry)}: tenants[0].{field}: ")
    assert "64 lowercase hex digits" in msg and entry not in msg


@pytest.mark.parametrize(
    "digest", ["abc", key_digest(KEY_A).upper(), f"sha256:{key_digest(KEY_A)}", KEY_A]
)
def test_api_key_sha256_entries_are_64_lowercase_hex(digest: str) -> None:
    text = spec_text(f"tenants:\n  - name: acme\n    api_key_sha256:\n      - '{digest}'\n")
    [msg] = issues(text)
    assert msg.startswith(f"s.yaml:{line_of(text, digest)}: tenants[0].api_key_sha256[0]: ")
    assert "64 lowercase hex digits" in msg and digest not in msg


def test_type_errors_on_key_fields_never_echo_the_value() -> None:
    for tenants in (
        f"tenants:\n  - {{name: acme, api_keys: {KEY_A}}}\n",
        f"tenants:\n  - {{name: acme, api_keys: [[{KEY_A}]]}}\n",
        f"tenants:\n  - {{name: acme, api_key_sha256: {KEY_A}}}\n",
        f"tenants:\n  - {{name: acme, api_keys_env: {KEY_A}}}\n",
        f"tenants:\n  - {{name: acme}}\n  - {KEY_A}\n",
        f"tenants: {KEY_A}\n",
    ):
        found = issues(spec_text(tenants))
        assert found and all(KEY_A not in m and "tenants" in m for m in found)


# --- bad keys ------------------------------------------------------------------------


@pytest.mark.parametrize("empty", ["''", '"   "', '"\\t"'])
def test_empty_keys_are_rejected(empty: str) -> None:
    text = spec_text(f"tenants:\n  - name: acme\n    api_keys:\n      - {KEY_A}\n      - {empty}\n")
    [msg] = issues(text)
    assert msg.startswith(f"s.yaml:{line_of(text, empty)}: tenants[0].api_keys[1]: ")
    assert "must not be empty" in msg and KEY_A not in msg


def test_a_key_twice_in_a_tenant_even_once_as_its_digest() -> None:
    text = spec_text(
        f"tenants:\n  - name: acme\n    api_keys:\n      - {KEY_A}\n      - {KEY_B}\n"
        f"      - sha256:{key_digest(KEY_A)}\n      - {KEY_B}  # again\n"
    )
    twice = "this key is listed twice for the tenant (also at api_keys[{}]; a plain key and its "
    twice += "sha256 digest are the same key); remove one"
    found = issues(text)
    assert found == [
        f"s.yaml:{line_of(text, 'sha256:')}: tenants[0].api_keys[2]: {twice.format(0)}",
        f"s.yaml:{line_of(text, '# again')}: tenants[0].api_keys[3]: {twice.format(1)}",
    ]
    assert issues(redact_secrets(text)) == found
    assert not any(k in m for m in found for k in KEYS)


def test_a_key_of_two_tenants_names_the_first_owner_not_the_key() -> None:
    text = spec_text(
        f"tenants:\n  - {{name: acme, api_keys: [{KEY_A}]}}\n"
        f"  - name: beta\n    api_key_sha256: [{key_digest(KEY_B)}, {key_digest(KEY_A)}]\n"
    )
    [msg] = issues(text)
    assert msg.startswith(f"s.yaml:{line_of(text, 'api_key_sha256')}: tenants[1].api_key_sha256[1]")
    assert "this key already belongs to 'acme'" in msg and KEY_A not in msg
    assert issues(redact_secrets(text)) == [msg]


# --- key sources ---------------------------------------------------------------------

INLINE = "sk-inline-key-0001"
SOURCED = f"""\
tenants:
  - {{name: acme, api_keys: [{INLINE}]}}
  - name: beta
    api_keys_env: BETA_KEYS      # keys live outside the spec
    api_keys_file: /etc/sluice/beta.keys
"""


def fail_read(path: str) -> str:
    raise FileNotFoundError(2, "No such file or directory", path)


def test_keys_from_env_and_file_are_kept_only_as_digests(tmp_path: Path) -> None:
    keyfile = tmp_path / "beta.keys"
    keyfile.write_text(f"# rotated 2024-05\n{KEY_B}\n\n  {KEY_C}  \n#{KEY_A}\n")
    text = spec_text(SOURCED.replace("/etc/sluice/beta.keys", str(keyfile)))
    spec = load_spec_text(text).spec
    beta = spec.tenants[1]
    assert (beta.api_keys_env, beta.api_keys_file) == ("BETA_KEYS", str(keyfile))
    environ = {
        "BETA_KEYS": f" {KEY_A}x, sk-env-2-47f45509700a0ef2\n sk-env-3-d5f2ba29b3f4d2cb\t",
        "OTHER": "x",
    }
    read = lambda p: Path(p).read_text(encoding="utf-8")  # noqa: E731
    resolved = resolve_key_sources(spec, environ, read)
    want = [
        key_digest(k)
        for k in (
            f"{KEY_A}x",
            "sk-env-2-47f45509700a0ef2",
            "sk-env-3-d5f2ba29b3f4d2cb",
            KEY_B,
            KEY_C,
        )
    ]
    assert resolved.tenants[1].api_key_sha256 == want
    assert resolved.tenants[1].api_keys == []
    assert resolved.tenants[0] == spec.tenants[0]
    assert spec.tenants[1].api_key_sha256 == []  # the input is untouched
    dumped = resolved.model_dump_json()
    assert not any(k in dumped for k in (KEY_B, KEY_C, "sk-env-2-47f45509700a0ef2"))
    snapshot = build_routing_snapshot(resolved, {}, 1)
    found = snapshot.tenant_for_key("sk-env-3-d5f2ba29b3f4d2cb")
    assert found is not None and found.name == "beta"
    # Resolving again refreshes (a rotated variable replaces the old digests).
    again = resolve_key_sources(resolved, {"BETA_KEYS": "sk-env-9-1d50a2aab3ed52fb"}, read)
    assert again.tenants[1].api_key_sha256 == [
        key_digest(k) for k in ("sk-env-9-1d50a2aab3ed52fb", KEY_B, KEY_C)
    ]
    redacted = redact_secrets(text)  # the sources are names, not secrets: left as written
    assert redacted.split("  - name: beta\n")[1] == text.split("  - name: beta\n")[1]


def test_digests_in_a_source_are_digests() -> None:
    spec = load_spec_text(spec_text(SOURCED)).spec
    digest = key_digest(KEY_B)
    resolved = resolve_key_sources(spec, {"BETA_KEYS": f"sha256:{digest}"}, lambda _: KEY_C)
    assert resolved.tenants[1].api_key_sha256 == [digest, key_digest(KEY_C)]


@pytest.mark.parametrize(
    ("environ", "read", "field", "needle"),
    [
        ({}, lambda _: KEY_C, "api_keys_env", "environment variable BETA_KEYS is not set"),
        ({"BETA_KEYS": " ,\n "}, lambda _: KEY_C, "api_keys_env", "BETA_KEYS holds no keys"),
        (
            {"BETA_KEYS": KEY_B},
            fail_read,
            "api_keys_file",
            "cannot read key file '/etc/sluice/beta.keys': No",
        ),
        ({"BETA_KEYS": KEY_B}, lambda _: "# none\n\n", "api_keys_file", "holds no keys"),
        ({"BETA_KEYS": "sha256:abc"}, lambda _: KEY_C, "api_keys_env", "64 lowercase hex"),
        ({"BETA_KEYS": KEY_B}, lambda _: INLINE, "api_keys_file", "belongs to 'acme'"),
        ({"BETA_KEYS": f"{KEY_B},{KEY_B}"}, lambda _: KEY_C, "api_keys_env", "listed twice"),
        ({"BETA_KEYS": KEY_B}, lambda _: KEY_B, "api_keys_file", "also at api_keys_env"),
        ({"BETA_KEYS": "sk-\udcff"}, lambda _: KEY_C, "api_keys_env", "not UTF-8 text"),
    ],
)
def test_bad_key_sources_name_the_field_and_line_never_a_key(
    environ: dict[str, str], read: object, field: str, needle: str
) -> None:
    text = spec_text(SOURCED)
    spec = load_spec_text(text).spec
    with pytest.raises(SpecError) as caught:
        resolve_key_sources(spec, environ, read, text=text, source="s.yaml")  # type: ignore[arg-type]
    [issue] = caught.value.issues
    assert issue.field == f"tenants[1].{field}"
    assert issue.line == line_of(text, field) and issue.file == "s.yaml"
    assert needle in issue.message
    assert not any(k in caught.value.message for k in (*KEYS, INLINE))


def test_unreadable_and_undecodable_files_say_why_without_content() -> None:
    spec = load_spec_text(spec_text(SOURCED)).spec

    def undecodable(_: str) -> str:
        raise UnicodeDecodeError("utf-8", KEY_B.encode() + b"\xff", len(KEY_B), 19, "invalid")

    def denied(_: str) -> str:
        raise PermissionError(13, "Permission denied")

    for read, why in ((undecodable, "is not UTF-8 text"), (denied, "Permission denied")):
        with pytest.raises(SpecError) as caught:
            resolve_key_sources(spec, {"BETA_KEYS": KEY_A}, read)
        assert why in caught.value.message and KEY_B not in caught.value.message
        assert caught.value.issues[0].line is None  # no text given: no line


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ("api_keys_env: 1BAD", "api_keys_env"),
        ("api_keys_env: BAD-NAME", "api_keys_env"),
        ("api_keys_file: ''", "api_keys_file"),
        ("api_keys_file: '  '", "api_keys_file"),
        ("api_keys_file: beta.keys", "api_keys_file"),  # relative: refused at validate
        ("api_keys_file: ./keys/beta", "api_keys_file"),
    ],
)
def test_key_source_fields_are_validated(fields: str, field: str) -> None:
    text = spec_text(f"tenants:\n  - name: acme\n    {fields}\n")
    [msg] = issues(text)
    assert msg.startswith(f"s.yaml:{line_of(text, field)}: tenants[0].{field}: ")
