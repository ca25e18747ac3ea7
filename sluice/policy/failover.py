"""Whether a failover can carry all of a group's traffic (R3): checked when it is set and
again on every apply, so a later spec change can never strand one (a backup removed, a model
it no longer serves, a tenant no longer allowed it)."""

from __future__ import annotations

from collections.abc import Mapping

from sluice.spec import PlatformSpec

__all__ = ["failover_problem", "stranded_failovers"]


def failover_problem(spec: PlatformSpec, group: str, backup: str | None) -> str | None:
    """Why `backup` (default: the group's `backup`) cannot take all of `group`'s traffic
    under `spec`, or None if it can: it must serve every model of the group, and every
    tenant allowed the group must be allowed the backup too."""
    source = spec.group(group)
    if source is None:
        return f"group {group!r} is not in the spec"
    target_name = backup or source.backup
    if target_name is None:
        return f"group {group!r} has no `backup` in the spec; pass --to BACKUP"
    target = spec.group(target_name)
    if target is None or target_name == group:
        return f"backup {target_name!r} must be another existing group"
    missing = sorted(set(source.models) - set(target.models))
    if missing:
        return f"{target_name!r} does not serve {', '.join(missing)}, which {group!r} serves"
    shut_out = [
        t.name
        for t in spec.tenants
        if ("*" in t.groups or group in t.groups)
        and not ("*" in t.groups or target_name in t.groups)
    ]
    if shut_out:
        return f"tenant(s) {', '.join(shut_out)} may use {group!r} but not {target_name!r}"
    return None


def stranded_failovers(spec: PlatformSpec, failovers: Mapping[str, str]) -> list[str]:
    """The failovers in force that `spec` would break, each with its reason."""
    out = []
    for group, backup in sorted(failovers.items()):
        problem = failover_problem(spec, group, backup)
        if problem is not None:
            out.append(f"failover {group} -> {backup}: {problem}")
    return out
