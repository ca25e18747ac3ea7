"""Cross-reference checks a field validator cannot do: names, pools, memory fit, targets.

Each problem is `(path, message)`; the loader turns paths into file:line. A spec that could
not start (a model that does not fit its accelerator) is rejected here, before launch (G2).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from sluice.spec.models import GroupSpec, PlatformSpec, RouteSpec

__all__ = ["check_platform"]

Problem = tuple[tuple[str | int, ...], str]


def check_platform(spec: PlatformSpec) -> list[Problem]:
    return [
        *_unique_names(spec),
        *_group_resources(spec),
        *_pool_capacity(spec),
        *_references(spec),
        *_schedules(spec),
    ]


def _unique_names(spec: PlatformSpec) -> Iterator[Problem]:
    sections: dict[str, list[str]] = {
        "pools": [p.name for p in spec.pools],
        "groups": [g.name for g in spec.groups],
        "tenants": [t.name for t in spec.tenants],
    }
    for section, names in sections.items():
        seen = Counter(names)
        for i, name in enumerate(names):
            if seen[name] > 1:
                yield (section, i, "name"), f"duplicate name {name!r}; names must be unique"
    tags = Counter(r.tag for r in spec.routes)
    for i, r in enumerate(spec.routes):
        if tags[r.tag] > 1:
            yield ("routes", i, "tag"), f"duplicate tag {r.tag!r}; every rule needs its own tag"
    owners: dict[str, str] = {}
    for i, t in enumerate(spec.tenants):
        for j, key in enumerate(t.api_keys):
            other = owners.setdefault(key, t.name)
            if other != t.name:
                yield ("tenants", i, "api_keys", j), f"this key already belongs to {other!r}"


def _group_resources(spec: PlatformSpec) -> Iterator[Problem]:
    for i, g in enumerate(spec.groups):
        pool = spec.pool(g.resources.pool)
        if pool is None:
            names = ", ".join(p.name for p in spec.pools)
            yield (
                ("groups", i, "resources", "pool"),
                f"no pool named {g.resources.pool!r}; pools: {names}",
            )
            continue
        if pool.kind != "inference":
            yield (
                ("groups", i, "resources", "pool"),
                f"pool {pool.name!r} is a {pool.kind} pool; inference groups need an "
                "inference pool (Q5)",
            )
        capacity = pool.memory_gb * g.resources.accelerators
        if g.resources.memory_gb > capacity:
            yield (
                ("groups", i, "resources", "memory_gb"),
                f"{g.resources.memory_gb:g} GiB does not fit {g.resources.accelerators} x "
                f"{pool.memory_gb:g} GiB {pool.accelerator} accelerator(s) of pool "
                f"{pool.name!r}; ask for more accelerators or a high-memory pool",
            )
        need = sum(m.memory_gb for m in g.models.values())
        if need > g.resources.memory_gb:
            yield (
                ("groups", i, "resources", "memory_gb"),
                f"the group's models need {need:g} GiB but an instance gets "
                f"{g.resources.memory_gb:g} GiB; raise resources.memory_gb to >= {need:g}",
            )


def _pool_capacity(spec: PlatformSpec) -> Iterator[Problem]:
    for i, pool in enumerate(spec.pools):
        used = sum(
            g.replicas * g.resources.accelerators
            for g in spec.groups
            if g.resources.pool == pool.name
        )
        if used > pool.count:
            yield (
                ("pools", i, "count"),
                f"groups ask for {used} accelerators but the pool has {pool.count}; "
                "lower replicas or grow the pool",
            )


def _references(spec: PlatformSpec) -> Iterator[Problem]:
    groups = {g.name: g for g in spec.groups}
    for i, g in enumerate(spec.groups):
        if g.backup is not None and (g.backup == g.name or g.backup not in groups):
            yield ("groups", i, "backup"), f"backup {g.backup!r} must be another existing group"
    for i, r in enumerate(spec.routes):
        yield from _route_groups(i, r, groups)
    tenant_names = {t.name for t in spec.tenants}
    for i, r in enumerate(spec.routes):
        for j, t in enumerate(r.match.tenants):
            if t not in tenant_names:
                yield ("routes", i, "match", "tenants", j), f"no tenant named {t!r}"
    for i, tenant in enumerate(spec.tenants):
        for j, gname in enumerate(tenant.groups):
            if gname != "*" and gname not in groups:
                yield ("tenants", i, "groups", j), f"no group named {gname!r}"


def _schedules(spec: PlatformSpec) -> Iterator[Problem]:
    """Scheduled floors name existing templates and have cron expressions that parse."""
    from croniter import croniter

    for name, entries in spec.schedule_templates.items():
        for j, entry in enumerate(entries):
            if not croniter.is_valid(entry.cron):
                yield ("schedule_templates", name, j, "cron"), f"invalid cron {entry.cron!r}"
    for i, g in enumerate(spec.groups):
        if g.autoscaling is None:
            continue
        for j, item in enumerate(g.autoscaling.schedules):
            path: tuple[str | int, ...] = ("groups", i, "autoscaling", "schedules", j)
            if isinstance(item, str):
                if item not in spec.schedule_templates:
                    known = ", ".join(spec.schedule_templates) or "none defined"
                    yield path, f"no schedule template {item!r}; schedule_templates: {known}"
            elif not croniter.is_valid(item.cron):
                yield (*path, "cron"), f"invalid cron {item.cron!r}"


def _route_groups(i: int, route: RouteSpec, groups: dict[str, GroupSpec]) -> Iterator[Problem]:
    """Every group a rule can send to (split, fallback, mirror) exists and serves its models."""
    places: list[tuple[tuple[str | int, ...], str]] = (
        [(("routes", i, "to"), route.to)]
        if isinstance(route.to, str)
        else [(("routes", i, "to", j, "group"), t.group) for j, t in enumerate(route.to)]
    )
    places += [(("routes", i, "fallback", j), g) for j, g in enumerate(route.fallback)]
    if route.mirror is not None:
        places.append((("routes", i, "mirror", "group"), route.mirror.group))
    for path, name in places:
        group = groups.get(name)
        if group is None:
            yield path, f"no group named {name!r}; groups: {', '.join(groups)}"
            continue
        missing = [m for m in route.match.models if m not in group.models]
        if missing:
            yield (
                path,
                f"group {name!r} does not serve model(s) {', '.join(missing)}; it "
                f"serves {', '.join(group.models)}",
            )
