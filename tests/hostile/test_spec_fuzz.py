"""Hostile specs: whatever the text, `load_spec_text` loads it or raises `SpecError` whose
every issue names the file (and a line), and `redact_secrets` returns text or raises
`SpecError`; never another exception, never a traceback, in bounded time and memory.

Fuzzed: arbitrary text, YAML-ish text, arbitrary YAML documents (spec-shaped or not), and
mutations of the real examples (lines deleted, duplicated, replaced, re-indented; scalars
swapped for other types, huge numbers, unicode, NUL and other control characters, deep
nesting, anchors and aliases), up to `SAFE_DEPTH` and `SAFE_DIGITS`, past the loader's own
limits (nesting 64, 100,000 values after aliases). The tests at the end pin down, one each,
the crashes this suite found and the loader now refuses with a located error.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from sluice.core import SpecError
from sluice.spec import LoadedSpec, PlatformSpec, load_spec_text, redact_secrets

SOURCE = "hostile/platform.yaml"
ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = {
    p.name: p.read_text(encoding="utf-8") for p in sorted((ROOT / "examples").glob("*.yaml"))
}
EXAMPLE_DATA = [yaml.safe_load(text) for text in EXAMPLES.values()]

SAFE_DEPTH = 300
"""Nesting the fuzzers build: past the loader's limit of 64 (test_deep_nesting_is_refused)."""
SAFE_DIGITS = 4000
"""Digits of the integers the fuzzers write: past the spec's bounds (a quota's `guaranteed` is
at most 1,000,000: test_huge_integers_are_refused) and near PyYAML's 4300-digit int() limit
(test_constructor_errors_are_spec_errors), each refused with a located error."""

FUZZ = settings(
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
        HealthCheck.filter_too_much,
    ],
)

# --- what every outcome must satisfy --------------------------------------------------------

_BREAK = re.compile("\r\n|[\r\n\x85\u2028\u2029]")
"""A line break as YAML (and PyYAML's marks) count them."""
_UNPRINTABLE = re.compile("[^\t\n\r\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
"""A character PyYAML's reader refuses (its ReaderError carries no line today)."""


def lines_of(text: str) -> int:
    return len(_BREAK.findall(text)) + 1


def check_issues(exc: SpecError, text: str) -> None:
    """Every issue names the file and a line inside the text, and renders as UTF-8 text (an
    edge prints it or serves it as JSON)."""
    assert exc.issues, "a SpecError names at least one problem"
    last = lines_of(text)
    for issue in exc.issues:
        assert issue.file == SOURCE, str(issue)
        if issue.line is None:
            # Known gap (test_unreadable_characters_have_a_line): a reader error has no mark.
            assert _UNPRINTABLE.search(text), f"no line for: {issue}"
        else:
            assert 1 <= issue.line <= last, f"line {issue.line} of {last}: {issue}"
        str(issue).encode("utf-8")
        json.dumps(issue.to_json(), ensure_ascii=False, allow_nan=False).encode("utf-8")
    json.dumps(exc.to_json(), ensure_ascii=False).encode("utf-8")


def load_outcome(text: str) -> LoadedSpec | SpecError:
    try:
        loaded = load_spec_text(text, SOURCE)
    except SpecError as exc:
        check_issues(exc, text)
        return exc
    assert isinstance(loaded.spec, PlatformSpec)
    assert loaded.text == text
    assert loaded.source == SOURCE
    return loaded


def redact_outcome(text: str) -> str | SpecError:
    try:
        out = redact_secrets(text, SOURCE)
    except SpecError as exc:
        check_issues(exc, text)
        return exc
    assert isinstance(out, str)
    assert lines_of(out) == lines_of(text), "redaction moved lines"
    return out


def survives(text: str) -> None:
    load_outcome(text)
    redact_outcome(text)


def redaction_holds(text: str) -> None:
    """Redacted text is a fixed point of redaction, and no plain key survives it."""
    out = redact_outcome(text)
    if isinstance(out, SpecError):
        return
    assert redact_secrets(out, SOURCE) == out, "redaction is not idempotent"
    loaded = load_outcome(out)
    if isinstance(loaded, LoadedSpec):
        leaked = [t.name for t in loaded.spec.tenants if t.api_keys]
        assert not leaked, f"plain keys survive redaction in tenants {leaked}"


# --- strategies -----------------------------------------------------------------------------


def _field_names(model: type[BaseModel], seen: set[type[BaseModel]]) -> Iterator[str]:
    if model in seen:
        return
    seen.add(model)
    for name, field in model.model_fields.items():
        yield name
        for inner in _models_in(field.annotation):
            yield from _field_names(inner, seen)


def _models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in get_args(annotation) if get_origin(annotation) is not None else ():
        yield from _models_in(arg)


FIELD_NAMES = sorted(set(_field_names(PlatformSpec, set())) | {"kind", "fixed", "linear"})
TOP_FIELDS = sorted(PlatformSpec.model_fields)

huge_ints = st.integers(min_value=-(10**SAFE_DIGITS), max_value=10**SAFE_DIGITS)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    huge_ints,
    st.floats(),  # nan and +-inf included
    st.text(max_size=24),
    st.sampled_from(["local", "chat", "sim", "embedding", "*", "sk-x", "sha256:" + "a" * 64]),
    st.dates(),
    st.datetimes(),
    st.binary(max_size=16),
)
keys = st.one_of(
    st.sampled_from(FIELD_NAMES),
    st.text(max_size=12),
    st.integers(),
    st.none(),
    st.booleans(),
)
documents = st.recursive(
    scalars,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(keys, kids, max_size=5),
    max_leaves=40,
)
spec_shaped = st.dictionaries(st.sampled_from(TOP_FIELDS), documents, min_size=1, max_size=6)


def nested(depth: int, leaf: Any, kind: str) -> Any:
    for _ in range(depth):
        leaf = [leaf] if kind == "list" else {"a": leaf}
    return leaf


deep = st.builds(nested, st.integers(1, SAFE_DEPTH), scalars, st.sampled_from(["list", "map"]))


@st.composite
def dumped(draw: st.DrawFn, data: st.SearchStrategy[Any]) -> str:
    """A document as PyYAML writes it: block or flow style, escaped or raw unicode."""
    return yaml.safe_dump(
        draw(data),
        default_flow_style=draw(st.sampled_from([False, True, None])),
        allow_unicode=draw(st.booleans()),
        width=draw(st.sampled_from([20, 80, 10_000])),
        sort_keys=False,
    )


SCALAR_TEXT = st.one_of(
    huge_ints.map(str),
    st.floats().map(repr),
    st.text(max_size=40).map(json.dumps),  # "\ud800"-style escapes included
    st.text(max_size=40, alphabet=st.characters(exclude_categories=())).map(json.dumps),
    st.integers(1, SAFE_DEPTH).map(lambda d: "[" * d + "]" * d),
    st.integers(1, SAFE_DEPTH).map(lambda d: "{a: " * d + "1" + "}" * d),
    st.sampled_from(
        [
            ".inf",
            "-.inf",
            ".nan",
            "1e999",
            "-0",
            "0x1F",
            "0o17",
            "1_000",
            "190:20:30",
            "~",
            "null",
            "yes",
            "off",
            "2024-02-29",
            "2024-02-29T12:00:00Z",
            "[]",
            "{}",
            "''",
            '""',
            "|\n  block\n",
            "!!binary aGk=",
            "!!str 1",
            "!!float 1",
            "!!int 7",
            "!!null ''",
            "!!set {a}",
            "!!omap [{a: 1}]",
            "!!python/name:os.system",
            "!custom x",
            "*undefined",
            "&anchor value",
            "? complex\n: key",
            "<<: {a: 1}",
            "- a\n- b",
            "'" + "x" * 10_000 + "'",
            "\x00",
            "\ufeff",
        ]
    ),
)
INSERTS = st.sampled_from(
    [
        *("\x00", "\x01", "\x1b", "\x7f", "\t", "\r", "\r\n", "\x85", "\u2028", "\ufeff"),
        *("\ufffe", "\ud800", "é", "\u202e", "😀", "\U0010ffff"),
        *(":", "- ", "#", "&a ", "*a", "!!", "{", "]"),
    ]
)
YAMLISH = st.text(
    alphabet=st.one_of(
        st.sampled_from(list(":-[]{},&*!|>'\"#%@`?~<= \t\n\r\\")),
        # digits: only 1, so no date-like scalar (2024-13-45) hits the timestamp crash
        st.sampled_from(list("ab1.e_xy")),
        st.characters(exclude_characters="0123456789"),
    ),
    max_size=200,
)
_SCALAR_AT = re.compile(r"(:[ \t]+)([^\s,{}\[\]#&*!|>][^,{}\[\]#\n]*)")
"""A `key: value` scalar, in block or flow style (group 2 is the value)."""


def _bomb(levels: int, fan: int) -> str:
    """A small alias bomb ('billion laughs'): fan**levels nodes once expanded."""
    out = [f"laugh0: &l0 [{', '.join(['lol'] * fan)}]"]
    for i in range(1, levels + 1):
        out.append(f"laugh{i}: &l{i} [{', '.join([f'*l{i - 1}'] * fan)}]")
    return "\n".join(out) + "\n"


@st.composite
def mutated_text(draw: st.DrawFn) -> str:
    """An example spec with one to four line-level mutations."""
    lines = draw(st.sampled_from(list(EXAMPLES.values()))).splitlines(keepends=True)
    for _ in range(draw(st.integers(1, 4))):
        if not lines:
            lines = [""]
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(
            st.sampled_from(
                [
                    "delete",
                    "duplicate",
                    "replace",
                    "swap",
                    "indent",
                    "scalar",
                    "scalar",
                    "scalar",
                    "insert",
                    "alias",
                    "bomb",
                    "truncate",
                ]
            )
        )
        line = lines[i]
        if op == "delete":
            del lines[i]
        elif op == "duplicate":
            lines.insert(i, line)
        elif op == "replace":
            lines[i] = draw(YAMLISH) + "\n"
        elif op == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], line
        elif op == "indent":
            lines[i] = " " * draw(st.integers(0, 12)) + line.lstrip(" ")
        elif op == "scalar":
            spots = list(_SCALAR_AT.finditer(line))
            if spots:
                m = draw(st.sampled_from(spots))
                lines[i] = line[: m.start(2)] + draw(SCALAR_TEXT) + line[m.end(2) :]
        elif op == "insert":
            at = draw(st.integers(0, len(line)))
            lines[i] = line[:at] + draw(INSERTS) + line[at:]
        elif op == "alias":
            j = draw(st.integers(0, len(lines) - 1))
            here, there = list(_SCALAR_AT.finditer(line)), list(_SCALAR_AT.finditer(lines[j]))
            if here and there and i != j:
                a, b = draw(st.sampled_from(here)), draw(st.sampled_from(there))
                lines[i] = line[: a.start(2)] + "&x " + line[a.start(2) :]
                lines[j] = lines[j][: b.start(2)] + "*x" + lines[j][b.end(2) :]
        elif op == "bomb":
            lines.insert(i, _bomb(draw(st.integers(1, 4)), draw(st.integers(1, 4))))
        elif op == "truncate":
            lines = [*lines[:i], line[: draw(st.integers(0, len(line)))]]
    return "".join(lines)


def _slots(data: Any) -> Iterator[tuple[Any, Any]]:
    """(container, key) for every value inside `data`."""
    if isinstance(data, dict):
        for k, v in data.items():
            yield data, k
            yield from _slots(v)
    elif isinstance(data, list):
        for k, v in enumerate(data):
            yield data, k
            yield from _slots(v)


@st.composite
def mutated_data(draw: st.DrawFn) -> Any:
    """An example's data with one to three values replaced, removed, nested or copied."""
    data = copy.deepcopy(draw(st.sampled_from(EXAMPLE_DATA)))
    for _ in range(draw(st.integers(1, 3))):
        slots = list(_slots(data))
        if not slots:
            break
        container, key = draw(st.sampled_from(slots))
        op = draw(st.sampled_from(["replace", "replace", "delete", "nest", "duplicate"]))
        if op == "replace":
            container[key] = draw(st.one_of(scalars, documents, deep))
        elif op == "delete":
            del container[key]
        elif op == "nest":
            container[key] = nested(draw(st.integers(1, SAFE_DEPTH)), container[key], "list")
        elif isinstance(container, list):
            container.insert(key, copy.deepcopy(container[key]))
        else:
            container[f"{key}-copy"] = copy.deepcopy(container[key])
    return data


# --- the fuzzers ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_the_examples_load_and_redact(name: str) -> None:
    """The baseline the mutations start from: every example loads and redacts cleanly."""
    assert isinstance(load_outcome(EXAMPLES[name]), LoadedSpec)
    redaction_holds(EXAMPLES[name])


@settings(FUZZ, max_examples=500)
@given(st.text(max_size=300, alphabet=st.characters(exclude_categories=())))
def test_arbitrary_text(text: str) -> None:
    survives(text)


@settings(FUZZ, max_examples=500)
@given(YAMLISH)
def test_yamlish_text(text: str) -> None:
    survives(text)


@settings(FUZZ, max_examples=300)
@given(dumped(documents))
def test_arbitrary_yaml_documents(text: str) -> None:
    survives(text)


@settings(FUZZ, max_examples=200)
@given(dumped(spec_shaped))
def test_spec_shaped_documents(text: str) -> None:
    """Top-level keys are the spec's own, so validation runs on the values beneath."""
    survives(text)


@settings(FUZZ, max_examples=200)
@given(mutated_text())
def test_mutated_examples(text: str) -> None:
    survives(text)


@settings(FUZZ, max_examples=100)
@given(dumped(mutated_data()))
def test_examples_with_values_of_other_types(text: str) -> None:
    """Data-level mutations get past the YAML and into validation and the cross-checks."""
    survives(text)


TENANT_KEYS = st.one_of(
    st.text(max_size=20),
    st.text(max_size=20).map(json.dumps),
    st.text(max_size=20, alphabet=st.characters(exclude_categories=())).map(json.dumps),
    st.sampled_from(["sk-a", "'sk-a'", "sha256:" + "b" * 64, "~", "''", "|\n      sk-multi"]),
    st.sampled_from(["!!str sk", "&k sk-anchored", "*k", "123", "{a: b}", "[sk-nested]"]),
)


@st.composite
def specs_with_keys(draw: st.DrawFn) -> str:
    """A small spec whose tenants write keys in every style (flow, block, aliased, merged)."""
    tenants = []
    for n in range(draw(st.integers(1, 3))):
        ks = draw(st.lists(TENANT_KEYS, max_size=4))
        if draw(st.booleans()):
            body = f"[{', '.join(ks)}]"
        else:
            body = "".join(f"\n      - {k}" for k in ks) or " []"
        merge = "\n    <<: *base" if n and draw(st.booleans()) else ""
        anchor = " &base" if n == 0 else ""
        tenants.append(f"  -{anchor}\n    name: t{n}{merge}\n    api_keys: {body}\n")
    return "pools: [{name: p, count: 4, memory_gb: 16}]\ntenants:\n" + "".join(tenants)


@settings(FUZZ, max_examples=200)
@given(specs_with_keys())
def test_redaction_of_hostile_keys(text: str) -> None:
    survives(text)
    redaction_holds(text)


@settings(FUZZ, max_examples=50)
@given(mutated_text())
def test_redaction_of_mutated_examples(text: str) -> None:
    redaction_holds(text)


# --- the crashes this suite found, one test each ----------------------------------------------

Call = Callable[[str, str], object]
BOTH: list[Any] = [
    pytest.param(load_spec_text, id="load"),
    pytest.param(redact_secrets, id="redact"),
]


def only_spec_errors(call: Call, text: str) -> SpecError | None:
    try:
        call(text, SOURCE)
    except SpecError as exc:
        check_issues(exc, text)
        return exc
    return None


@pytest.mark.parametrize("call", BOTH)
@pytest.mark.parametrize(
    "text",
    [
        pytest.param("pools: " + "[" * 1000 + "]" * 1000, id="flow-lists"),
        pytest.param("pools: " + "{a: " * 1000 + "1" + "}" * 1000, id="flow-maps"),
        pytest.param("pools:\n" + "".join(" " * i + "- \n" for i in range(1000)), id="block"),
    ],
)
def test_deep_nesting_is_refused(call: Call, text: str) -> None:
    assert only_spec_errors(call, text) is not None


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("pools: &a [*a]", id="list"),
        pytest.param("&a {pools: *a}", id="map"),
        pytest.param("pools:\n  - &p {name: p, count: 1, memory_gb: 1, x: *p}", id="in-pool"),
    ],
)
def test_recursive_aliases_are_refused(text: str) -> None:
    assert only_spec_errors(load_spec_text, text) is not None


@pytest.mark.parametrize(
    "text",
    ["pools: &a [*a]", "&a {pools: *a}", "tenants: [&t {name: t, api_keys: [*t]}]"],
)
def test_redaction_of_recursive_aliases(text: str) -> None:
    """`redact_secrets` follows each alias once, so a cycle ends."""
    redact_outcome(text)


BOMB_SCRIPT = textwrap.dedent(
    """
    import resource, sys
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    from sluice.core import SpecError
    from sluice.spec import load_spec_text, redact_secrets
    text = sys.stdin.read()
    for call in (load_spec_text, redact_secrets):
        try:
            call(text, "bomb.yaml")
        except SpecError:
            pass
    print("bounded")
    """
)


def test_alias_bomb_is_bounded_in_time_and_memory() -> None:
    """Run in a child process: with a 1 GiB address-space cap, and killed after 10 s."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", BOMB_SCRIPT],
            input=_bomb(9, 9).replace("laugh9", "pools"),
            capture_output=True,
            text=True,
            timeout=10,
            cwd=ROOT,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the alias bomb ran past 10 s")
    assert done.returncode == 0 and "bounded" in done.stdout, done.stderr[-2000:]


def test_ordinary_aliases_still_load() -> None:
    """Aliases themselves are fine: a bound must not refuse ordinary reuse (merge keys)."""
    text = (
        "pools:\n"
        "  - &pool {name: a, count: 2, memory_gb: 16}\n"
        "  - {<<: *pool, name: b}\n"
        "tenants:\n"
        "  - &t {name: t1, api_keys: [k1-6ab9f1eb8f7d3388], groups: &all ['*']}\n"
        "  - {<<: *t, name: t2, api_keys: [k2-015f7e6bc5aeaf48], models: *all}\n"
    )
    loaded = load_outcome(text)
    assert isinstance(loaded, LoadedSpec), loaded
    assert [p.name for p in loaded.spec.pools] == ["a", "b"]
    redaction_holds(text)


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("2024-13-45", id="impossible-date"),
        pytest.param("2024-02-30T10:00:00Z", id="impossible-timestamp"),
        pytest.param("!!int abc", id="int-tag"),
        pytest.param("!!float abc", id="float-tag"),
        pytest.param("!!bool abc", id="bool-tag"),
        pytest.param("!!timestamp abc", id="timestamp-tag"),
        pytest.param("9" * 4301, id="4301-digits"),
        pytest.param("1" + "_0" * 5000, id="underscored-digits"),
    ],
)
def test_constructor_errors_are_spec_errors(value: str) -> None:
    text = f"pools:\n  - name: p\n    count: {value}\n    memory_gb: 1\n"
    exc = only_spec_errors(load_spec_text, text)
    assert exc is not None
    assert [i.line for i in exc.issues] == [3]


@pytest.mark.parametrize("digits", [309, 400, 4000])
def test_huge_integers_are_refused(digits: int) -> None:
    big = "9" * digits
    text = textwrap.dedent(
        f"""\
        pools: [{{name: p, count: {big}, memory_gb: 16}}]
        groups:
          - name: g
            owner: o
            business: b
            alert_channel: c
            models: {{m: {{runtime: sim}}}}
            resources: {{pool: p, memory_gb: 1}}
            quota: {{guaranteed: {big}}}
        """
    )
    assert only_spec_errors(load_spec_text, text) is not None


@pytest.mark.parametrize("call", BOTH)
@pytest.mark.parametrize("char", ["\x00", "\x1b", "\ufffe", "\ud800"])
def test_unreadable_characters_have_a_line(call: Call, char: str) -> None:
    text = f"pools:\n  - name: p{char}\n    count: 1\n    memory_gb: 1\n"
    exc = only_spec_errors(call, text)
    assert exc is not None
    assert [i.line for i in exc.issues] == [2]


@pytest.mark.parametrize(
    "text",
    [
        "pools: [{name: p, count: 1, memory_gb: .inf}]",
        "pools: [{name: p, count: 1, memory_gb: 16, price_per_hour: .inf}]",
        "pools: [{name: p, count: 1, memory_gb: 1e999}]",
        "pools: [{name: p, count: 1, memory_gb: 16}]\n"
        "tenants: [{name: t, api_keys: [k-8254c329a92850f6], rate_limit: {rps: .inf}}]",
    ],
    ids=["pool-memory", "price", "1e999", "rate-limit-rps"],
)
def test_non_finite_numbers_are_refused(text: str) -> None:
    assert only_spec_errors(load_spec_text, text) is not None


@pytest.mark.parametrize(
    "value", ["0x" + "f" * 4000, "-0x" + "f" * 4000], ids=["hex", "negative-hex"]
)
def test_huge_integer_in_an_error_message(value: str) -> None:
    text = f"pools:\n  - name: p\n    count: 1\n    memory_gb: 1\n    accelerator: {value}\n"
    exc = only_spec_errors(load_spec_text, text)
    assert exc is not None
    assert [(i.field, i.line) for i in exc.issues] == [("pools[0].accelerator", 5)]
