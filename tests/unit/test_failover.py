"""Failovers checked when set and on every later spec (R3), and mirrors that respect tenant
boundaries (R7)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.core import SpecError
from sluice.policy import failover_problem, stranded_failovers
from sluice.spec import PlatformSpec, load_spec_text

TRAFFIC = (Path(__file__).parents[2] / "examples" / "traffic.yaml").read_text()


def spec(text: str = TRAFFIC) -> PlatformSpec:
    return load_spec_text(text, "traffic.yaml").spec


def test_the_spec_backup_takes_all_of_the_groups_traffic() -> None:
    s = spec()
    chat = s.group("chat")
    assert chat is not None and chat.backup == "chat-backup"
    assert failover_problem(s, "chat", None) is None
    assert failover_problem(s, "chat", "chat-backup") is None
    assert "must be another existing group" in (failover_problem(s, "chat", "chat") or "")
    assert "not in the spec" in (failover_problem(s, "ghost", "chat") or "")


def test_a_later_spec_that_strands_a_failover_is_named() -> None:
    in_force = {"chat": "chat-backup"}
    assert stranded_failovers(spec(), in_force) == []
    narrowed = TRAFFIC.replace(
        "    groups: [chat, chat-canary, chat-backup, shadow]   # shadow: the mirror sees their"
        " requests\n  - name: batch-jobs",
        "    groups: [chat, chat-canary, shadow]\n  - name: batch-jobs",
        1,
    )
    assert narrowed != TRAFFIC
    [problem] = stranded_failovers(spec(narrowed), in_force)
    assert problem == (
        "failover chat -> chat-backup: tenant(s) search may use 'chat' but not 'chat-backup'"
    )


def test_a_mirror_group_must_be_allowed_to_every_tenant_the_rule_matches() -> None:
    closed = TRAFFIC.replace(", shadow]   # shadow: the mirror sees their requests", "]")
    with pytest.raises(SpecError) as caught:
        spec(closed)
    [issue] = caught.value.issues
    assert issue.field == "routes[1].mirror.group" and issue.line is not None
    assert "tenant(s) search, batch-jobs may reach this rule but not its mirror group" in str(issue)
