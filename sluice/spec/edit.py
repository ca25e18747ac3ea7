"""Edits of a spec's YAML text that keep everything else as written: what a proposal filed
on an operator's behalf changes (a capacity test's targets, a reclaimed guarantee), so its
diff shows only that."""

from __future__ import annotations

import io
from typing import Any

__all__ = ["spec_with_guarantee", "spec_with_targets"]


def _load(yaml_text: str) -> tuple[Any, Any]:
    """The YAML round-tripper (indents as written, no folding) and the document."""
    from ruamel.yaml import YAML
    from ruamel.yaml.util import load_yaml_guess_indent

    _, sequence, dash = load_yaml_guess_indent(yaml_text)  # "  - key": 4 and 2
    sequence, dash = sequence or 2, dash or 0
    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096  # never fold a long line that was written on one
    yaml.indent(mapping=max(sequence - dash, 2), sequence=sequence, offset=dash)
    return yaml, yaml.load(yaml_text)


def _group(doc: Any, group: str) -> Any:
    found = [g for g in doc.get("groups") or [] if g.get("name") == group]
    if not found:
        raise ValueError(f"the live spec has no group named {group!r}")
    return found[0]


def _dump(yaml: Any, doc: Any) -> str:
    out = io.StringIO()
    yaml.dump(doc, out)
    return out.getvalue()


def spec_with_targets(yaml_text: str, group: str, targets: dict[str, float]) -> str:
    """The spec with `group`'s `autoscaling.targets` set to `targets`, everything else as
    written (comments and order kept: ruamel's round trip, so the proposal's diff shows only
    what changed)."""
    yaml, doc = _load(yaml_text)
    autoscaling = _group(doc, group).get("autoscaling")
    if autoscaling is None:
        raise ValueError(f"group {group!r} has no autoscaling block to set targets in")
    current = autoscaling.setdefault("targets", {})
    for key, value in targets.items():
        current[key] = value
    return _dump(yaml, doc)


def spec_with_guarantee(yaml_text: str, group: str, guaranteed: int) -> str:
    """The spec with `group`'s `quota.guaranteed` set to `guaranteed` (a reclaim proposal,
    `sluice.policy.reclaim`), everything else as written; a `lendable` above the new
    guarantee comes down to it (a group lends only its own guarantee)."""
    yaml, doc = _load(yaml_text)
    quota = _group(doc, group).get("quota")
    if quota is None:
        raise ValueError(f"group {group!r} has no quota block: no guarantee to lower")
    if int(quota.get("guaranteed") or 0) == guaranteed:
        raise ValueError(f"group {group!r} is already guaranteed {guaranteed} unit(s)")
    quota["guaranteed"] = guaranteed
    lendable = quota.get("lendable")
    if lendable is not None and int(lendable) > guaranteed:
        quota["lendable"] = guaranteed
    return _dump(yaml, doc)
