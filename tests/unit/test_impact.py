"""The impact preview of a route change (R5): replay logged requests through two rule lists."""

from __future__ import annotations

from sluice.policy import LoggedRequest, RouteRule, route_impact

DEFAULT = RouteRule("default:m", (("chat", 1),), models=frozenset({"m"}))


def reqs(tenant: str, n: int, model: str = "m", priority: str = "normal", route: str = "x"):
    return [LoggedRequest(tenant, model, priority, route) for _ in range(n)]


def test_a_new_tenant_rule_moves_only_that_tenants_requests() -> None:
    current = [RouteRule("chat-main", (("chat", 1),), models=frozenset({"m"})), DEFAULT]
    vip = RouteRule("vip", (("chat-vip", 1),), tenants=frozenset({"acme"}))
    log = reqs("acme", 30, route="chat-main") + reqs("other", 70, route="chat-main")
    impact = route_impact(current, [vip, *current], log)
    assert (impact.replayed, impact.moved, impact.unchanged) == (100, 30, 70)
    (move,) = impact.moves
    assert (move.from_, move.to, move.requests) == ("chat", "chat-vip", 30)
    assert (move.from_tags, move.to_tags) == (("chat-main",), ("vip",))
    assert impact.tag_changes == {"chat-main -> vip": 30}
    assert impact.groups == {
        "chat": {"before": 100.0, "after": 70.0},
        "chat-vip": {"before": 0.0, "after": 30.0},
    }
    assert impact.stale_log == 0 and impact.header_dependent == 0


def test_a_canary_split_is_a_move_to_a_weighted_destination() -> None:
    split = RouteRule("canary", (("chat", 90), ("chat-v2", 10)), models=frozenset({"m"}))
    impact = route_impact([DEFAULT], [split], reqs("t", 50, route="default:m"))
    (move,) = impact.moves
    assert move.to == "chat 90% / chat-v2 10%" and move.requests == 50
    assert impact.groups["chat-v2"] == {"before": 0.0, "after": 5.0}
    assert impact.groups["chat"]["after"] == 45.0


def test_priority_is_replayed_and_a_retag_alone_is_not_a_move() -> None:
    low = RouteRule("batch", (("batch", 1),), priorities=frozenset({"low"}))
    retagged = RouteRule("chat-all", (("chat", 1),), models=frozenset({"m"}))
    log = reqs("t", 4, priority="low", route="default:m") + reqs("t", 6, route="default:m")
    impact = route_impact([DEFAULT], [low, retagged], log)
    assert impact.moved == 4 and impact.moves[0].to == "batch"
    assert impact.unchanged == 6
    assert impact.tag_changes == {"default:m -> batch": 4, "default:m -> chat-all": 6}


def test_header_rules_are_flagged_not_guessed() -> None:
    beta = RouteRule("beta", (("chat-beta", 1),), headers=(("x-beta", "1"),))
    only_acme = RouteRule(
        "acme-beta", (("chat-beta", 1),), tenants=frozenset({"acme"}), headers=(("x-b", "1"),)
    )
    log = reqs("acme", 5, route="default:m") + reqs("other", 5, route="default:m")
    impact = route_impact([DEFAULT], [beta, DEFAULT], log)
    assert impact.header_dependent == 10 and impact.header_rules == ("beta",)
    assert impact.moved == 0 and impact.replayed == 10
    assert "headers are not logged" in impact.to_json()["notes"][0]
    impact = route_impact([DEFAULT], [only_acme, DEFAULT], log)
    assert impact.header_dependent == 5 and impact.unchanged == 5  # other's requests are certain


def test_lines_refused_before_routing_or_sent_directly_are_skipped() -> None:
    log = [
        LoggedRequest("", "m"),
        LoggedRequest("t", ""),
        LoggedRequest("t", "m", route="operator-direct"),
    ]
    impact = route_impact([DEFAULT], [], [*log, *reqs("t", 2, route="default:m")])
    assert impact.skipped == 3 and impact.replayed == 2
    assert impact.unroutable == 2 and impact.moves[0].to == "(no route)"


def test_a_log_from_an_older_revision_shows_as_stale() -> None:
    impact = route_impact([DEFAULT], [DEFAULT], reqs("t", 3, route="old-tag"))
    assert impact.stale_log == 3 and impact.moved == 0 and impact.unchanged == 3
    assert impact.to_json()["moves"] == []
