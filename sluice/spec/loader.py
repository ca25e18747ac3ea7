"""Load a spec from YAML so that every error names the file, the line and the field.

PyYAML gives each node a position; we walk the node tree beside the parsed data and keep a
map from field path to line. pydantic's error locations and our own semantic checks are
paths too, so each problem is reported as `file:line: field: what is wrong (and the fix)`.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from sluice.core.errors import NotFound, SpecError, SpecIssue
from sluice.spec.checks import ModelReader, check_platform
from sluice.spec.modeldir import read_loadable_model_dir
from sluice.spec.models import SECRET_FIELDS, PlatformSpec

__all__ = ["LoadedSpec", "load_spec_file", "load_spec_text", "located"]

Path_ = tuple[str | int, ...]


class LoadedSpec:
    """A validated spec with the YAML text it came from (stored as a revision)."""

    __slots__ = ("source", "spec", "text")

    def __init__(self, spec: PlatformSpec, text: str, source: str) -> None:
        self.spec = spec
        self.text = text
        self.source = source


def load_spec_file(
    path: str | Path, read_model: ModelReader | None = read_loadable_model_dir
) -> LoadedSpec:
    """Load a spec file as an operator wrote it. Here, at the file edge (validate, up -f,
    apply), model directories are read too, so a model that cannot fit or a directory that
    is not there is refused before launch; `load_spec_text` (revisions from the store, the
    control API on its event loop) skips that I/O unless given a reader."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise NotFound(f"spec file not found: {p}", file=str(p)) from None
    except OSError as exc:
        raise SpecError([SpecIssue("", f"cannot read spec: {exc.strerror}", str(p))]) from None
    return load_spec_text(text, str(p), read_model)


MAX_DEPTH = 64
"""Deepest nesting of collections a spec may have (PyYAML's composer recurses per level)."""
MAX_NODES = 100_000
"""Most values a spec may hold once its aliases are expanded ('billion laughs')."""


class _Loader(yaml.SafeLoader):
    """SafeLoader whose constructors report a scalar they cannot build as a YAML error with
    its mark (PyYAML raises ValueError for `2024-13-45` or 5000 digits, KeyError for
    `!!bool maybe`, AttributeError for `!!timestamp x`)."""

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except yaml.YAMLError:
            raise
        except (ValueError, KeyError, AttributeError, TypeError, OverflowError):
            kind = str(node.tag).rsplit(":", 1)[-1]
            value = str(node.value)[:40] if isinstance(node, yaml.ScalarNode) else "this node"
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read {value!r} as {kind}", node.start_mark
            ) from None


def check_shape(text: str, source: str) -> None:
    """Refuse, before composing, what would exhaust the stack or the memory: nesting deeper
    than MAX_DEPTH, an alias inside the node it names, more than MAX_NODES values once
    aliases are expanded. PyYAML's parser is iterative: this pass is linear in the text."""
    sizes: dict[str, int] = {}
    stack: list[list[Any]] = []  # [anchor, values so far] of each open collection
    total = 0

    def refuse(event: yaml.Event, why: str) -> SpecError:
        line = event.start_mark.line + 1 if event.start_mark is not None else None
        return SpecError([SpecIssue("", why, source, line)])

    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            if len(stack) >= MAX_DEPTH:
                raise refuse(event, f"nested deeper than {MAX_DEPTH} levels")
            stack.append([event.anchor, 1])
            continue
        if isinstance(event, yaml.CollectionEndEvent):
            anchor, n = stack.pop()
            if anchor is not None:
                sizes[anchor] = n
        elif isinstance(event, yaml.AliasEvent):
            if any(open_anchor == event.anchor for open_anchor, _ in stack):
                raise refuse(event, f"alias *{event.anchor} is inside the node it names")
            n = sizes.get(event.anchor or "", 1)
        elif isinstance(event, yaml.ScalarEvent):
            n = 1
            if event.anchor is not None:
                sizes[event.anchor] = 1
        else:
            continue
        if stack:
            stack[-1][1] += n
            count = stack[-1][1]
        else:
            total += n
            count = total
        if count > MAX_NODES:
            raise refuse(event, f"more than {MAX_NODES} values once aliases are expanded")


def load_spec_text(
    text: str, source: str = "<spec>", read_model: ModelReader | None = None
) -> LoadedSpec:
    """Parse, validate fields, then check cross-references; raise SpecError with all issues.
    `read_model`: check model directories too (see `load_spec_file`)."""
    try:
        check_shape(text, source)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.load(text, Loader=_Loader)  # a SafeLoader
    except yaml.YAMLError as exc:
        raise SpecError([_yaml_issue(exc, source, text)]) from None
    if not isinstance(data, dict):
        raise SpecError([SpecIssue("", "the spec must be a YAML mapping (key: value)", source, 1)])
    lines = _line_map(node)
    try:
        spec = PlatformSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_issues_from_pydantic(exc, lines, source)) from None
    problems = [
        SpecIssue(_dotted(path), msg, source, _line_for(path, lines))
        for path, msg in check_platform(spec, read_model)
    ]
    if problems:
        raise SpecError(problems)
    return LoadedSpec(spec, text, source)


_BREAKS = re.compile("\r\n|[\r\n\x85\u2028\u2029]")


def _yaml_issue(exc: yaml.YAMLError, source: str, text: str | None = None) -> SpecIssue:
    mark = getattr(exc, "problem_mark", None)
    line = mark.line + 1 if mark is not None else None
    if line is None and isinstance(exc, yaml.reader.ReaderError) and text is not None:
        line = len(_BREAKS.findall(text, 0, exc.position)) + 1  # no mark: count the breaks
    problem = getattr(exc, "problem", None) or str(exc)
    return SpecIssue("", f"not valid YAML: {problem}", source, line)


def _line_map(node: yaml.Node | None) -> dict[Path_, int]:
    """Field path -> 1-based line where that field (its key, or the list item) starts."""
    out: dict[Path_, int] = {}

    def walk(n: yaml.Node, path: Path_) -> None:
        if isinstance(n, yaml.MappingNode):
            for key_node, value_node in n.value:
                child = (*path, str(key_node.value))
                out[child] = key_node.start_mark.line + 1
                walk(value_node, child)
        elif isinstance(n, yaml.SequenceNode):
            for i, item in enumerate(n.value):
                child = (*path, i)
                out[child] = item.start_mark.line + 1
                walk(item, child)

    if node is not None:
        out[()] = node.start_mark.line + 1
        walk(node, ())
    return out


def _line_for(path: Path_, lines: dict[Path_, int]) -> int | None:
    """The line of the deepest prefix of `path` present in the YAML (missing keys point at
    their parent; pydantic's union tags are skipped)."""
    best: int | None = lines.get(())
    cur: Path_ = ()
    for part in path:
        if (*cur, part) in lines:
            cur = (*cur, part)
            best = lines[cur]
    return best


_PART = re.compile(r"\[(\d+)\]|([^.\[\]]+)")


def located(error: SpecError, text: str, source: str) -> SpecError:
    """`error` from a check made after loading (one that names its fields by group or pool
    name, `groups.chat.slo`, and no file) with `source` and each field's line in `text`: the
    field's own, or its nearest parent's where it is missing. Issues about anything else
    (a command's option, `--trace`) or already located are kept as they are."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return error
    if not isinstance(root, yaml.MappingNode):
        return error
    top = {str(k.value) for k, _ in root.value}
    issues = []
    for issue in error.issues:
        parts = [m.group(2) or int(m.group(1)) for m in _PART.finditer(issue.field)]
        if issue.file != "<spec>" or not parts or parts[0] not in top:
            issues.append(issue)
            continue
        issues.append(SpecIssue(issue.field, issue.message, source, _named_line(root, parts)))
    return SpecError(issues)


def _named_line(node: yaml.Node, parts: list[str | int]) -> int:
    """The line of the field at `parts` under `node`, a list item named by its index or
    its `name`; the nearest parent's where the rest is missing."""
    line = node.start_mark.line + 1
    for part in parts:
        child: yaml.Node | None = None
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if str(key.value) == str(part):
                    line, child = key.start_mark.line + 1, value
                    break
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                if part == i or _name_of(item) == part:
                    line, child = item.start_mark.line + 1, item
                    break
        if child is None:
            return line
        node = child
    return line


def _name_of(node: yaml.Node) -> str | None:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if key.value == "name" and isinstance(value, yaml.ScalarNode):
                return str(value.value)
    return None


def _dotted(path: Iterable[str | int]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _issues_from_pydantic(
    exc: ValidationError, lines: dict[Path_, int], source: str
) -> list[SpecIssue]:
    issues = []
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        kind = err["type"]
        if kind == "extra_forbidden":
            msg = f"unknown field {loc[-1]!r}" + _allowed_fields_hint(loc, str(loc[-1]))
        elif kind == "missing":
            msg = "required field is missing"
        else:
            got = err.get("input")
            # Never echo a key: not from a key field, nor a tenant written as a bare string.
            secret = any(p in SECRET_FIELDS for p in loc) or (
                loc[:1] == ("tenants",) and len(loc) <= 2
            )
            shown = "" if secret or isinstance(got, dict | list) else f" (got {_shown(got)})"
            text = err["msg"].removeprefix("Value error, ")
            msg = f"{text}{shown}"
        field = _dotted(p for p in loc if not _is_union_tag(p))
        issues.append(SpecIssue(field, msg, source, _line_for(loc, lines)))
    return issues


def _shown(value: Any) -> str:
    try:
        return repr(value)
    except ValueError:  # an int past Python's 4300-digit limit for str()
        return f"an integer of {value.bit_length()} bits"


def _is_union_tag(part: str | int) -> bool:
    return isinstance(part, str) and part in {"fixed", "lognormal", "linear"}


def _allowed_fields_hint(loc: tuple[Any, ...], bad: str) -> str:
    """'; did you mean X? allowed: a, b, c' for the model that owns the unknown field."""
    model: Any = PlatformSpec
    for part in loc[:-1]:
        if isinstance(part, int) or not (isinstance(model, type) and issubclass(model, BaseModel)):
            continue
        field = model.model_fields.get(part)
        if field is None:
            return ""
        model = _inner_model(field.annotation)
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return ""
    allowed = sorted(model.model_fields)
    close = difflib.get_close_matches(bad, allowed, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{hint} allowed: {', '.join(allowed)}"


def _inner_model(annotation: Any) -> Any:
    """list[GroupSpec] -> GroupSpec, dict[str, ModelSpec] -> ModelSpec, X | None -> X."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) is not None:
        for arg in reversed(get_args(annotation)):
            inner = _inner_model(arg)
            if inner is not None:
                return inner
    return None
