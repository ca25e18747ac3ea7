"""Edits of a spec's YAML text that keep everything else as written: what a proposal filed
on an operator's behalf changes (a capacity test's targets), so its diff shows only that."""

from __future__ import annotations

import io

__all__ = ["spec_with_targets"]


def spec_with_targets(yaml_text: str, group: str, targets: dict[str, float]) -> str:
    """The spec with `group`'s `autoscaling.targets` set to `targets`, everything else as
    written (comments and order kept: ruamel's round trip, so the proposal's diff shows only
    what changed)."""
    from ruamel.yaml import YAML
    from ruamel.yaml.util import load_yaml_guess_indent

    _, sequence, dash = load_yaml_guess_indent(yaml_text)  # "  - key": 4 and 2
    sequence, dash = sequence or 2, dash or 0
    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096  # never fold a long line that was written on one
    yaml.indent(mapping=max(sequence - dash, 2), sequence=sequence, offset=dash)
    doc = yaml.load(yaml_text)
    found = [g for g in doc.get("groups") or [] if g.get("name") == group]
    if not found:
        raise ValueError(f"the live spec has no group named {group!r}")
    autoscaling = found[0].get("autoscaling")
    if autoscaling is None:
        raise ValueError(f"group {group!r} has no autoscaling block to set targets in")
    current = autoscaling.setdefault("targets", {})
    for key, value in targets.items():
        current[key] = value
    out = io.StringIO()
    yaml.dump(doc, out)
    return out.getvalue()
