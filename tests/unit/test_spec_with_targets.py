"""`sluice loadtest --propose` edits only the group's targets: comments, order and the
file's own indentation stay as written, so the proposal's diff is the change alone."""

from __future__ import annotations

import difflib

import pytest

from sluice.spec.edit import spec_with_targets

SPEC = """\
# the fleet
groups:
  - name: chat   # the busy one
    autoscaling:
      max: 4
      targets: {utilization: 0.7}
  - name: embed
    replicas: 2
"""


def test_only_the_targets_change() -> None:
    new = spec_with_targets(SPEC, "chat", {"utilization": 0.9, "queue_per_instance": 2.0})
    changed = [
        line
        for line in difflib.unified_diff(SPEC.splitlines(), new.splitlines(), lineterm="")
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    assert changed == [
        "-      targets: {utilization: 0.7}",
        "+      targets: {utilization: 0.9, queue_per_instance: 2.0}",
    ]
    assert "# the busy one" in new and new.startswith("# the fleet")


def test_a_group_without_autoscaling_or_unknown_is_refused() -> None:
    with pytest.raises(ValueError, match="no autoscaling block"):
        spec_with_targets(SPEC, "embed", {"utilization": 0.9})
    with pytest.raises(ValueError, match="no group named 'nope'"):
        spec_with_targets(SPEC, "nope", {"utilization": 0.9})
