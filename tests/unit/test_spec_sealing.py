"""Secrets sealed at rest (issue 31): what the store keeps of a spec holds no tenant key, no
key digest and no webhook URL past its host, opens back to what the controller needs with
the installation's key only, and refuses weak keys and values sealed by another key."""

from __future__ import annotations

import hashlib

import pytest

from sluice.core import SpecError
from sluice.spec import Sealer, load_spec_text, open_revision, seal_secrets
from tests.unit.test_spec_servers import COMMAND
from tests.unit.test_spec_servers import spec as command_spec

KEY = "sk-acme-3f9c2b7a41d86e05c9b1"
DIGEST = hashlib.sha256(b"given-as-digest-7c1e94b2d0a6f3").hexdigest()
HOOK = "https://hooks.example.com/services/T0K3N-SECRET?sig=abc"

SPEC = f"""\
pools: [{{name: p, count: 4, memory_gb: 16}}]
groups:
  - name: chat
    owner: a@example.com
    business: b
    alert_channel: "{HOOK}"
    models: {{m: {{runtime: sim}}}}
    resources: {{pool: p, memory_gb: 1}}
  - name: quiet
    owner: a@example.com
    business: b
    alert_channel: "#quiet-oncall"
    models: {{q: {{runtime: sim}}}}
    resources: {{pool: p, memory_gb: 1}}
tenants:
  - name: acme  # the first tenant
    api_keys: [{KEY}, "sha256:{DIGEST}"]
routes:
  - {{tag: r, match: {{models: [m]}}, to: chat}}
  - {{tag: q, match: {{models: [q]}}, to: quiet}}
"""

SEALER = Sealer(bytes(range(64)))
OTHER = Sealer(bytes(range(1, 65)))


def test_the_stored_text_holds_no_key_digest_or_webhook_and_keeps_every_line() -> None:
    stored = seal_secrets(SPEC, "p.yaml", SEALER)
    plain_digest = hashlib.sha256(KEY.encode()).hexdigest()
    for secret in (KEY, plain_digest, DIGEST, "T0K3N", "services", "sig=abc"):
        assert secret not in stored
    assert stored.count("\n") == SPEC.count("\n")
    assert '"https://hooks.example.com/… sealed:' in stored
    assert "#quiet-oncall" in stored and "# the first tenant" in stored
    # deterministic and idempotent: an unchanged spec is an unchanged revision
    assert seal_secrets(SPEC, "p.yaml", SEALER) == stored
    assert seal_secrets(stored, "p.yaml", SEALER) == stored


def test_the_controller_opens_what_it_needs_and_a_reader_without_the_key_gets_no_key() -> None:
    stored = seal_secrets(SPEC, "p.yaml", SEALER)
    spec = open_revision(stored, "revision 1", SEALER).spec
    [tenant] = spec.tenants
    assert sorted(d for _, d in tenant.key_digests()) == sorted(
        [hashlib.sha256(KEY.encode()).hexdigest(), DIGEST]
    )
    assert spec.groups[0].alert_channel == HOOK
    # a client of the API parses the stored text as it is: a sealed entry is no key at all
    blind = load_spec_text(stored, "revision 1").spec
    assert blind.tenants[0].key_digests() == []
    assert blind.groups[0].alert_channel.startswith("https://hooks.example.com/…")


def test_another_installations_key_or_an_altered_value_is_refused_with_its_line() -> None:
    stored = seal_secrets(SPEC, "p.yaml", SEALER)
    with pytest.raises(SpecError) as other:
        open_revision(stored, "revision 1", OTHER)
    assert other.value.issues[0].line == 17  # the keys line
    assert "SLUICE_SECRETS_KEY_FILE" in str(other.value)
    with pytest.raises(SpecError):  # nor can it be slipped into a new spec
        seal_secrets(stored, "p.yaml", OTHER)
    altered = stored.replace("sealed:", "sealed:A", 1)
    with pytest.raises(SpecError):
        open_revision(altered, "revision 1", SEALER)


def test_a_sealed_key_does_not_open_as_a_webhook() -> None:
    stored = seal_secrets(SPEC, "p.yaml", SEALER)
    sealed_key = next(
        w.strip('",[]') for w in stored.split() if w.startswith(("[sealed:", '["sealed:'))
    )
    moved = stored.replace('"#quiet-oncall"', f'"https://evil.example.com/… {sealed_key}"')
    with pytest.raises(SpecError):
        open_revision(moved, "revision 1", SEALER)


@pytest.mark.parametrize(
    "weak", ["sk-search", "aaaaaaaaaaaaaaaaaaaaaaaa", "0123456789abcdef", "password123"]
)
def test_a_weak_key_is_refused_naming_its_line_never_its_text(weak: str) -> None:
    with pytest.raises(SpecError) as refused:
        seal_secrets(SPEC.replace(KEY, weak), "p.yaml", SEALER)
    [issue] = refused.value.issues
    assert issue.line == 17 and "too easy to guess" in issue.message
    assert weak not in str(refused.value)


def test_the_sealer_never_shows_its_key() -> None:
    assert bytes(range(64)).hex() not in repr(SEALER)
    assert repr(SEALER) != repr(OTHER)


def test_a_command_servers_env_values_are_sealed_and_its_names_stay_readable() -> None:
    token = "hf_" + "Q7v" * 10
    text = command_spec(COMMAND + f'          env: {{HF_TOKEN: "{token}", OMP_NUM_THREADS: 4}}\n')
    stored = seal_secrets(text, "p.yaml", SEALER)
    assert token not in stored and "HF_TOKEN" in stored and "OMP_NUM_THREADS" in stored
    command = open_revision(stored, "revision 1", SEALER).spec.groups[0].models["qwen"].command
    assert command is not None and command.env == {"HF_TOKEN": token, "OMP_NUM_THREADS": "4"}
    assert seal_secrets(stored, "p.yaml", SEALER) == stored
