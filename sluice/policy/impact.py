"""The impact preview of a route change (R5): replay logged requests through the current and
the proposed rules and count what would move where.

Pure: the caller reads the access log and passes parsed `LoggedRequest`s. A request is
replayed by (tenant, model, priority), the dimensions the log keeps. Headers are not logged,
so a header rule that could catch a request (its other conditions hold and it comes before
the rule that matched) makes that request's outcome unknown; it is counted as
`header_dependent`, never guessed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sluice.policy.routing import DIRECT_ROUTE_TAG, RequestMeta, RouteRule, RouteTable

__all__ = ["Impact", "LoggedRequest", "Move", "route_impact"]


@dataclass(frozen=True, slots=True)
class LoggedRequest:
    """One access-log line, reduced to what routing looked at and what it chose."""

    tenant: str
    model: str
    priority: str = "normal"
    route: str | None = None
    """The tag logged when it was served (it may predate the current revision)."""


@dataclass(frozen=True, slots=True)
class Move:
    """`requests` replayed requests that would go to `to` instead of `from_`.

    A destination is a group name, or `a 90% / b 10%` for a weighted rule."""

    from_: str
    to: str
    requests: int
    from_tags: tuple[str, ...]
    to_tags: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "from": self.from_,
            "to": self.to,
            "requests": self.requests,
            "from_tags": list(self.from_tags),
            "to_tags": list(self.to_tags),
        }


@dataclass(frozen=True, slots=True)
class Impact:
    """The preview. Counts are requests of the replayed sample; `groups[g]` holds `before` and
    `after`: the requests (weighted rules split by weight, so possibly fractional) that the
    current and the proposed rules send to group `g`."""

    replayed: int
    skipped: int
    """Lines without tenant or model (refused before routing) or sent to a group directly."""
    unchanged: int
    moved: int
    unroutable: int
    """Requests that the proposed rules route nowhere (the current ones did)."""
    header_dependent: int
    header_rules: tuple[str, ...]
    """Tags of header rules, in either table, that a replayed request could have hit."""
    stale_log: int
    """Requests whose logged tag differs from the current rules' answer (logged under an
    older revision, or headers decided it)."""
    moves: tuple[Move, ...]
    tag_changes: dict[str, int]
    """`"old -> new"` tag pairs that changed, with their request counts."""
    groups: dict[str, dict[str, float]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        notes = []
        if self.header_dependent:
            notes.append(
                f"{self.header_dependent} request(s) could match header rule(s) "
                f"{', '.join(self.header_rules)}; headers are not logged, so their outcome "
                "is not replayed (counted apart, not guessed)"
            )
        if self.replayed == 0:
            notes.append("no logged traffic to replay")
        return {
            "replayed": self.replayed,
            "skipped": self.skipped,
            "unchanged": self.unchanged,
            "moved": self.moved,
            "unroutable": self.unroutable,
            "header_dependent": self.header_dependent,
            "header_rules": list(self.header_rules),
            "stale_log": self.stale_log,
            "moves": [m.to_json() for m in self.moves],
            "tag_changes": dict(self.tag_changes),
            "groups": {g: dict(v) for g, v in self.groups.items()},
            "notes": notes,
        }


def route_impact(
    current: Sequence[RouteRule], proposed: Sequence[RouteRule], requests: Iterable[LoggedRequest]
) -> Impact:
    """Replay `requests` through both ordered rule lists (see the module docstring)."""
    before_table, after_table = RouteTable(current), RouteTable(proposed)
    replayed = skipped = unchanged = unroutable = header_dependent = stale = 0
    header_rules: set[str] = set()
    moves: Counter[tuple[str, str]] = Counter()
    move_tags: dict[tuple[str, str], tuple[set[str], set[str]]] = {}
    tag_changes: Counter[str] = Counter()
    groups: dict[str, dict[str, float]] = {}
    for req in requests:
        if not req.tenant or not req.model or req.route == DIRECT_ROUTE_TAG:
            skipped += 1
            continue
        replayed += 1
        meta = RequestMeta(req.tenant, req.model, req.priority)
        old, new = before_table.lookup(meta), after_table.lookup(meta)
        hidden = _header_rules_before(current, meta, old.index if old else len(current))
        hidden += _header_rules_before(proposed, meta, new.index if new else len(proposed))
        if hidden:
            header_dependent += 1
            header_rules.update(hidden)
            continue
        old_tag = old.tag if old else None
        if req.route is not None and req.route != old_tag:
            stale += 1
        _tally(groups, old.targets if old else (), "before")
        _tally(groups, new.targets if new else (), "after")
        old_to = _destination(old.targets) if old else "(no route)"
        new_to = _destination(new.targets) if new else "(no route)"
        if new is None and old is not None:
            unroutable += 1
        if old_tag != (new.tag if new else None):
            tag_changes[f"{old_tag or '(none)'} -> {new.tag if new else '(none)'}"] += 1
        if old_to == new_to:
            unchanged += 1
            continue
        key = (old_to, new_to)
        moves[key] += 1
        tags = move_tags.setdefault(key, (set(), set()))
        tags[0].add(old_tag or "(none)")
        tags[1].add(new.tag if new else "(none)")
    ordered = sorted(moves.items(), key=lambda kv: (-kv[1], kv[0]))
    return Impact(
        replayed=replayed,
        skipped=skipped,
        unchanged=unchanged,
        moved=sum(moves.values()),
        unroutable=unroutable,
        header_dependent=header_dependent,
        header_rules=tuple(sorted(header_rules)),
        stale_log=stale,
        moves=tuple(
            Move(a, b, n, tuple(sorted(move_tags[a, b][0])), tuple(sorted(move_tags[a, b][1])))
            for (a, b), n in ordered
        ),
        tag_changes=dict(sorted(tag_changes.items())),
        groups={g: {k: round(v, 3) for k, v in c.items()} for g, c in sorted(groups.items())},
    )


def _header_rules_before(rules: Sequence[RouteRule], meta: RequestMeta, stop: int) -> list[str]:
    """Tags of header rules ahead of rule `stop` whose tenant, model and priority hold."""
    return [
        r.tag
        for r in rules[:stop]
        if (r.headers or r.header_prefixes)
        and (not r.tenants or meta.tenant in r.tenants)
        and (not r.models or meta.model in r.models)
        and (not r.priorities or meta.priority in r.priorities)
    ]


def _destination(targets: tuple[tuple[str, int], ...]) -> str:
    if len(targets) == 1:
        return targets[0][0]
    total = sum(w for _, w in targets) or 1
    return " / ".join(f"{g} {100.0 * w / total:g}%" for g, w in targets)


def _tally(
    groups: dict[str, dict[str, float]], targets: tuple[tuple[str, int], ...], side: str
) -> None:
    total = sum(w for _, w in targets)
    for g, w in targets:
        counts = groups.setdefault(g, {"before": 0.0, "after": 0.0})
        counts[side] += w / total if total else 0.0
