"""Tenant API keys are never at rest in plain text.

`redact_secrets` rewrites a spec's YAML so that every plain key under `tenants[*].api_keys`
becomes `"sha256:<hex>"` (what the control plane stores and serves); it edits the text in
place at the positions PyYAML reports, so comments, order and line numbers stay as they were
and a later error still points at the line the operator wrote.

`resolve_key_sources` reads the keys a tenant names instead of writing them
(`api_keys_env`, `api_keys_file`) and keeps only their digests. Both are pure: the caller
hands in the environment and a file reader (`sluice.control.keysources.read_secret_file`,
which opens only a regular file, never blocks on a pipe or device, and reads at most
`SECRET_FILE_MAX_BYTES`); what the file holds is checked here, line by line.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator, Mapping

import yaml

from sluice.core.errors import SpecError, SpecIssue
from sluice.core.urls import channel_kind
from sluice.spec.checks import check_keys
from sluice.spec.keys import (
    DIGEST_PREFIX,
    KEY_FORM,
    KEY_LINE,
    SECRET_FILE_MAX_BYTES,
    KeyPath,
    SecretFileError,
    digest_entry,
    key_digest,
    weak_key_reason,
)
from sluice.spec.loader import _dotted, _line_for, _line_map, _yaml_issue, check_shape
from sluice.spec.models import PlatformSpec, TenantSpec
from sluice.spec.sealing import SEALED_PREFIX, Sealer, SealError, sealed_part

__all__ = [
    "key_digest",
    "open_secrets",
    "redact_secrets",
    "resolve_key_sources",
    "seal_secrets",
    "secret_env_names",
]

_MERGE_TAG = "tag:yaml.org,2002:merge"
_NULL_TAG = "tag:yaml.org,2002:null"
_BREAKS = "\r\n\x85\u2028\u2029"
"""What YAML counts as a line break; the redacted text keeps every one of them."""


def redact_secrets(text: str, source: str = "<spec>") -> str:
    """`text` with each plain key under `tenants[*].api_keys` replaced by its digest
    `"sha256:<64 lowercase hex>"`; digests, comments and line numbers are left as they are.
    Idempotent. Raises SpecError when `text` is not YAML."""
    root, starts = _compose(text, source)
    edits: dict[int, tuple[int, str]] = {}
    for node in _key_scalars(root):
        value = node.value
        if node.tag == _NULL_TAG or not value.strip() or digest_entry(value) is not None:
            continue  # nothing secret to hide (an empty key is reported by validation)
        if sealed_part(value) is not None:
            continue  # sealed already (`seal_secrets` checks it opens)
        # A lone surrogate (`"\ud800"`) is refused by validation; hide it all the same.
        raw = value.encode("utf-8", "surrogatepass")
        _replace(edits, text, node, starts, f'"{DIGEST_PREFIX}{hashlib.sha256(raw).hexdigest()}"')
    out = _edited(text, edits)
    _check_redacted(out, source)
    return out


def seal_secrets(text: str, source: str, sealer: Sealer) -> str:
    """`text` as the store keeps it: `redact_secrets`, then every key digest, alert webhook
    URL and command `env` value sealed with the installation's key (`sluice.spec.sealing`);
    values sealed already must open with it. Lines and comments stay where they were.
    Deterministic and idempotent, so an unchanged spec seals to the same text. A plain key
    that is too easy to guess (`weak_key_reason`) is refused here, where a spec is applied
    or proposed."""
    root, _ = _compose(text, source)
    weak = [
        SpecIssue("tenants", why, source, node.start_mark.line + 1)
        for node in _key_scalars(root)
        if node.tag != _NULL_TAG
        and node.value.strip()
        and digest_entry(node.value) is None
        and sealed_part(node.value) is None
        and (why := weak_key_reason(node.value)) is not None
    ]
    if weak:
        raise SpecError(weak)
    text = redact_secrets(text, source)
    root, starts = _compose(text, source)
    edits: dict[int, tuple[int, str]] = {}
    for node in _key_scalars(root):
        if (digest := digest_entry(node.value)) is not None:
            _replace(edits, text, node, starts, f'"{sealer.seal_key_digest(digest)}"')
        elif sealed_part(node.value) is not None:
            _opened(sealer.open_key_digest, node, source)
    for node in _channel_scalars(root):
        if sealed_part(node.value) is not None:
            _opened(sealer.open_channel, node, source)
        elif channel_kind(node.value) == "webhook":
            sealed = sealer.seal_channel(node.value.strip())
            _replace(edits, text, node, starts, json.dumps(sealed, ensure_ascii=False))
    for node in _env_scalars(root):
        if node.value.startswith(SEALED_PREFIX):
            _opened(sealer.open_env, node, source)
        elif node.tag != _NULL_TAG:
            _replace(edits, text, node, starts, json.dumps(sealer.seal_env(node.value)))
    return _edited(text, edits)


def open_secrets(text: str, source: str, sealer: Sealer) -> str:
    """The stored `text` with its sealed values opened: keys back to `sha256:<hex>`
    digests, webhooks to their URLs, env values to their text (what the controller parses;
    never stored or served).
    Raises SpecError naming the line of a value that does not open with `sealer`."""
    root, starts = _compose(text, source)
    edits: dict[int, tuple[int, str]] = {}
    for node in _key_scalars(root):
        if sealed_part(node.value) is not None:
            digest = _opened(sealer.open_key_digest, node, source)
            _replace(edits, text, node, starts, f'"{DIGEST_PREFIX}{digest}"')
    for node in _channel_scalars(root):
        if sealed_part(node.value) is not None:
            url = _opened(sealer.open_channel, node, source)
            _replace(edits, text, node, starts, json.dumps(url))
    for node in _env_scalars(root):
        if node.value.startswith(SEALED_PREFIX):
            value = _opened(sealer.open_env, node, source)
            _replace(edits, text, node, starts, json.dumps(value))
    return _edited(text, edits)


def _opened(open_: Callable[[str], str], node: yaml.ScalarNode, source: str) -> str:
    try:
        return open_(node.value)
    except SealError as exc:
        why = (
            f"a sealed value {exc}: every controller of an installation needs the same secrets "
            "key (copy $SLUICE_HOME/secrets.key of the first, or set SLUICE_SECRETS_KEY_FILE), "
            "or write the secret again in clear for it to be sealed anew"
        )
        raise SpecError([SpecIssue("", why, source, node.start_mark.line + 1)]) from None


def _compose(text: str, source: str) -> tuple[yaml.Node | None, dict[int, int]]:
    """The node tree of `text`, and each scalar token's start by its end (a node's start
    includes its anchor and tag; the scalar token's start does not)."""
    try:
        check_shape(text, source)
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        starts = {
            t.end_mark.index: t.start_mark.index
            for t in yaml.scan(text, Loader=yaml.SafeLoader)
            if isinstance(t, yaml.ScalarToken)
        }
    except yaml.YAMLError as exc:
        raise SpecError([_yaml_issue(exc, source, text)]) from None
    return root, starts


def _replace(
    edits: dict[int, tuple[int, str]],
    text: str,
    node: yaml.ScalarNode,
    starts: dict[int, int],
    replacement: str,
) -> None:
    """Note that `node`'s scalar becomes `replacement`, keeping every line where it was."""
    end = node.end_mark.index
    start = starts.get(end, node.start_mark.index)
    edits[start] = end, replacement + _skeleton(text[start:end], text[end : end + 1])


def _edited(text: str, edits: dict[int, tuple[int, str]]) -> str:
    pieces: list[str] = []
    done = 0
    for start in sorted(edits):
        end, replacement = edits[start]
        pieces += [text[done:start], replacement]
        done = end
    return "".join([*pieces, text[done:]])


def _check_redacted(text: str, source: str) -> None:
    """A guard: the rewritten text parses and holds no plain key, or it is refused."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise SpecError([_yaml_issue(exc, source, text)]) from None
    for node in _key_scalars(root):
        if (
            node.tag != _NULL_TAG
            and node.value.strip()
            and digest_entry(node.value) is None
            and sealed_part(node.value) is None
        ):
            why = "cannot redact this API key; write it as a plain or quoted string"
            raise SpecError([SpecIssue("tenants", why, source, node.start_mark.line + 1)])


def resolve_key_sources(
    spec: PlatformSpec,
    environ: Mapping[str, str],
    read_text: Callable[[str], str],
    *,
    text: str | None = None,
    source: str = "<spec>",
) -> PlatformSpec:
    """A copy of `spec` whose tenants also hold, in `api_key_sha256`, the digests of the
    keys their `api_keys_env` (the variable in `environ`: keys separated by commas, spaces
    or newlines) and `api_keys_file` (`read_text(path)`: one key per line, blank and `#`
    lines ignored) name. Plain keys are never kept. Digests read by an earlier call are
    replaced, so resolving again refreshes rather than doubles.

    `read_text` is the I/O edge's: it must refuse what is not a secret file (raising
    `SecretFileError`, or any OSError) and bound its read (the live one is
    `sluice.control.keysources.read_secret_file`). A file's path must be absolute, its text
    at most `SECRET_FILE_MAX_BYTES`, and each line that is not blank or a comment a key of
    the form `KEY_LINE` (or a digest).

    Raises SpecError naming the tenant's field (with its line when `text`, the YAML the
    spec came from, is given) for a missing variable, a file refused or unreadable (with
    why: not absolute, a pipe, a device, a directory, too large, a line that is not a key,
    by its number), a source with no keys, or a key that is malformed, repeated or another
    tenant's. No message holds a key, nor any text of a file.
    """
    problems: list[tuple[KeyPath, str]] = []
    tenants: list[TenantSpec] = []
    for i, tenant in enumerate(spec.tenants):
        found: list[tuple[KeyPath, str]] = []
        if tenant.api_keys_env is not None:
            at: KeyPath = ("api_keys_env",)
            keys, problem = _from_env(tenant.api_keys_env, environ)
            _collect(("tenants", i, *at), at, keys, problem, found, problems)
        if tenant.api_keys_file is not None:
            at = ("api_keys_file",)
            keys, problem = _from_file(tenant.api_keys_file, read_text)
            _collect(("tenants", i, *at), at, keys, problem, found, problems)
        sourced = tenant.api_keys_env is not None or tenant.api_keys_file is not None
        tenants.append(tenant.with_source_digests(found) if sourced else tenant)
    resolved = spec.model_copy(update={"tenants": tenants})
    if not problems:
        problems = check_keys(resolved)
    if problems:
        raise SpecError(_located(problems, text, source))
    return resolved


def _key_scalars(root: yaml.Node | None) -> Iterator[yaml.ScalarNode]:
    """Every scalar under `tenants[*].api_keys` (however nested, aliases followed once)."""
    seen: set[int] = set()

    def tenant_maps(node: yaml.Node) -> Iterator[yaml.MappingNode]:
        if not isinstance(node, yaml.MappingNode) or id(node) in seen:
            return
        seen.add(id(node))
        yield node
        for key, value in node.value:
            if key.tag == _MERGE_TAG:  # `<<: *other` pulls in another tenant's fields
                for merged in value.value if isinstance(value, yaml.SequenceNode) else [value]:
                    yield from tenant_maps(merged)

    def scalars(node: yaml.Node) -> Iterator[yaml.ScalarNode]:
        if id(node) in seen:
            return
        seen.add(id(node))
        if isinstance(node, yaml.ScalarNode):
            yield node
        elif isinstance(node, yaml.SequenceNode):
            for item in node.value:
                yield from scalars(item)
        elif isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                yield from scalars(key)
                yield from scalars(value)

    if not isinstance(root, yaml.MappingNode):
        return
    for key, value in root.value:
        if _is_key(key, "tenants") and isinstance(value, yaml.SequenceNode):
            for item in value.value:
                for tenant in tenant_maps(item):
                    for field, keys in tenant.value:
                        if _is_key(field, "api_keys"):
                            yield from scalars(keys)


def _channel_scalars(root: yaml.Node | None) -> Iterator[yaml.ScalarNode]:
    """Every `groups[*].alert_channel` scalar."""
    for group in _group_maps(root):
        yield from _fields(group, "alert_channel")


def _env_scalars(root: yaml.Node | None) -> Iterator[yaml.ScalarNode]:
    """Every value of `groups[*].models.*.command.env`: what a server is given besides
    its argv, tokens included (`HF_TOKEN`, an upstream's key)."""
    for group in _group_maps(root):
        for models in _field_nodes(group, "models"):
            if not isinstance(models, yaml.MappingNode):
                continue
            for _, model in models.value:
                for command in _field_nodes(_merged(model), "command"):
                    for env in _field_nodes(_merged(command), "env"):
                        if isinstance(env, yaml.MappingNode):
                            for _, value in env.value:
                                if isinstance(value, yaml.ScalarNode):
                                    yield value


def _group_maps(root: yaml.Node | None) -> Iterator[yaml.MappingNode]:
    """Each group's mapping under `groups`, with the mappings it merges (`<<: *base`)."""
    if not isinstance(root, yaml.MappingNode):
        return
    for key, value in root.value:
        if _is_key(key, "groups") and isinstance(value, yaml.SequenceNode):
            for item in value.value:
                yield from _merged_maps(item, set())


def _merged_maps(node: yaml.Node, seen: set[int]) -> Iterator[yaml.MappingNode]:
    if not isinstance(node, yaml.MappingNode) or id(node) in seen:
        return
    seen.add(id(node))
    yield node
    for key, value in node.value:
        if key.tag == _MERGE_TAG:
            for merged in value.value if isinstance(value, yaml.SequenceNode) else [value]:
                yield from _merged_maps(merged, seen)


def _merged(node: yaml.Node) -> list[yaml.MappingNode]:
    return list(_merged_maps(node, set()))


def _field_nodes(maps: yaml.MappingNode | list[yaml.MappingNode], name: str) -> Iterator[yaml.Node]:
    """The value of field `name` in the first of `maps` that has it (a mapping's own field
    wins over a merged one)."""
    for m in [maps] if isinstance(maps, yaml.MappingNode) else maps:
        for field, value in m.value:
            if _is_key(field, name):
                yield value
                return


def _fields(group: yaml.MappingNode, name: str) -> Iterator[yaml.ScalarNode]:
    for value in _field_nodes(group, name):
        if isinstance(value, yaml.ScalarNode):
            yield value


def _is_key(node: yaml.Node, name: str) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.value == name


def _skeleton(span: str, then: str) -> str:
    """What stands in for the replaced `span` after its first line: its line breaks, so no
    line moves, and blanks up to where the text `then` goes on, so neither does its column."""
    first = next((n for n, c in enumerate(span) if c in _BREAKS), None)
    if first is None:
        return ""
    last = max(span.rfind(c) for c in _BREAKS)
    breaks = "".join(c for c in span[first : last + 1] if c in _BREAKS)
    carries_on = then != "" and then[0] not in _BREAKS
    return breaks + (" " * (len(span) - last - 1) if carries_on else "")


_SEPARATORS = re.compile(r"[\s,]+")


def _from_env(name: str, environ: Mapping[str, str]) -> tuple[list[str], str | None]:
    raw = environ.get(name)
    if raw is None:
        return [], (
            f"environment variable {name} is not set; set it to the tenant's keys (separated "
            "by commas, spaces or newlines) or remove api_keys_env"
        )
    keys = [k for k in _SEPARATORS.split(raw) if k]
    if not keys:
        return [], (
            f"environment variable {name} holds no keys; set it to the tenant's keys "
            "(separated by commas, spaces or newlines) or remove api_keys_env"
        )
    return keys, None


def _from_file(path: str, read_text: Callable[[str], str]) -> tuple[list[str], str | None]:
    """The keys in the file at `path` (one per line, blank and `#` lines skipped), or why
    not. Every other line must be a key (`KEY_LINE`); a line that is not is reported by its
    number, never its text (the file may be the wrong one and hold other secrets)."""
    if not path.startswith("/"):  # the field's validator refuses it too; a copy may skip it
        return [], (
            f"key file {path!r} is not an absolute path; write the absolute path of the "
            "tenant's keys file (e.g. /etc/sluice/tenant.keys)"
        )
    try:
        body = read_text(path)
    except UnicodeDecodeError:  # its text could hold part of a key: say only what is wrong
        return [], f"key file {path!r} is not UTF-8 text; write one key per line"
    except SecretFileError as exc:
        return [], f"key file {path!r} {exc.strerror}; {exc.fix}"
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        return [], f"cannot read key file {path!r}: {why}; check the path and its permissions"
    if len(body) > SECRET_FILE_MAX_BYTES:  # a reader that does not bound its read
        return [], (
            f"key file {path!r} is larger than {SECRET_FILE_MAX_BYTES // 1024} KiB, which is "
            "no keys file (a few hundred keys at most); point api_keys_file at the keys file"
        )
    keys: list[str] = []
    bad: list[int] = []
    for number, line in enumerate(body.split("\n"), start=1):
        key = line.strip()
        if not key or key.startswith("#"):
            continue
        if KEY_LINE.fullmatch(key) or digest_entry(key) is not None:
            keys.append(key)
        else:
            bad.append(number)
    if bad:
        shown = ", ".join(str(n) for n in bad[:_LINES_SHOWN])
        more = f" (and {len(bad) - _LINES_SHOWN} more)" if len(bad) > _LINES_SHOWN else ""
        which = "line" if len(bad) == 1 else "lines"
        return [], (
            f"key file {path!r}: {which} {shown}{more} {'is' if len(bad) == 1 else 'are'} not "
            f"a key ({KEY_FORM}); fix {'it' if len(bad) == 1 else 'them'} (a '#' starts a "
            "comment) or point api_keys_file at the tenant's keys file"
        )
    if not keys:
        return [], (
            f"key file {path!r} holds no keys; write one key per line ('#' starts a comment) "
            "or remove api_keys_file"
        )
    return keys, None


_LINES_SHOWN = 10
"""How many bad lines of a keys file an error names (then how many more there are)."""


def _collect(
    path: KeyPath,
    at: KeyPath,
    keys: list[str],
    problem: str | None,
    found: list[tuple[KeyPath, str]],
    problems: list[tuple[KeyPath, str]],
) -> None:
    """Digests of a source's keys into `found`; what is wrong with it into `problems`."""
    if problem is not None:
        problems.append((path, problem))
        return
    for key in keys:
        if key.startswith(DIGEST_PREFIX):
            digest = digest_entry(key)
            if digest is None:
                problems.append(
                    (
                        path,
                        f"an entry starting '{DIGEST_PREFIX}' must be followed by exactly 64 "
                        "lowercase hex digits (the key's sha256 digest); fix the digest",
                    )
                )
                continue
            found.append((at, digest))
        else:
            try:
                found.append((at, key_digest(key)))
            except UnicodeEncodeError:  # e.g. an environment variable of non-UTF-8 bytes
                problems.append((path, "holds a key that is not UTF-8 text; fix the source"))
                continue
            if (why := weak_key_reason(key)) is not None:
                problems.append((path, why))


def _located(problems: list[tuple[KeyPath, str]], text: str | None, source: str) -> list[SpecIssue]:
    lines: dict[KeyPath, int] = {}
    if text is not None:
        try:
            lines = _line_map(yaml.compose(text, Loader=yaml.SafeLoader))
        except yaml.YAMLError:
            lines = {}
    return [SpecIssue(_dotted(p), msg, source, _line_for(p, lines)) for p, msg in problems]


def secret_env_names(spec: PlatformSpec) -> frozenset[str]:
    """The environment variables `spec` reads keys from (tenants' `api_keys_env`, scheduled
    drills' and external endpoints' `api_key_env`): what no instance may inherit from
    Sluice's environment, even where the runtime's allow-list would pass the name."""
    names = {t.api_keys_env for t in spec.tenants if t.api_keys_env}
    names.update(d.api_key_env for d in spec.drills if d.api_key_env)
    for g in spec.groups:
        for m in g.models.values():
            if m.external is not None:
                names.update(e.api_key_env for e in m.external.endpoints if e.api_key_env)
    return frozenset(names)
