"""The console's page arithmetic: live route shares, chart markup, audit filters, redirects."""

from __future__ import annotations

from sluice.control.console.charts import line_chart
from sluice.control.console.pages import (
    RouteShare,
    audit_filters,
    charts,
    failover_rows,
    match_text,
    overview_rows,
)
from sluice.control.console.routes import _local
from sluice.core.urls import redact_channel


def test_route_share_is_over_the_last_minute_of_readings() -> None:
    share = RouteShare(window_s=60.0)
    first = share.share({"a": {"g": 100}, "b": {"g": 0}}, now=0.0)
    assert first["seconds"] == 0.0 and first["tags"]["a"]["share"] == 1.0  # since start
    share.share({"a": {"g": 130}, "b": {"g": 10}}, now=30.0)
    later = share.share({"a": {"g": 160}, "b": {"g": 40}}, now=90.0)
    # The reading at 0 s is older than the window: the share is from 30 s to 90 s.
    assert later["seconds"] == 60.0 and later["total"] == 60
    assert later["tags"]["a"]["share"] == 0.5 and later["tags"]["b"]["requests"] == 30
    restarted = share.share({"a": {"g": 5}}, now=100.0)  # counters went back: not negative
    assert restarted["tags"]["a"]["requests"] == 0 and restarted["tags"]["a"]["share"] is None


def test_chart_breaks_at_gaps_and_says_when_it_has_no_data() -> None:
    svg = str(
        line_chart(
            [(0, 1.0), (60, 2.0), (120, None), (180, 4.0)],
            label="Load <x>",
            start=0,
            end=180,
            fmt=lambda v: f"{v:.1f}",
        )
    )
    assert svg.count("<polyline") == 1 and svg.count("<circle") == 1  # the lone point
    assert "Load &lt;x&gt;" in svg and "<x>" not in svg  # labels are escaped
    assert "style=" not in svg  # the console's CSP forbids inline styles
    empty = str(line_chart([], label="Queue", start=0, end=60, fmt=str))
    assert "no data in this span" in empty


def test_the_group_page_charts_the_tokens_per_second_beside_the_load() -> None:
    rows = [
        {"start": 0.0, "requests_per_s": 2.0, "prompt_tokens_per_s": 300.0},
        {"start": 60.0, "requests_per_s": 1.0, "completion_tokens_per_s": 12.5},
    ]
    by_title = {c["title"]: c for c in charts(rows, 0.0, 120.0)}
    assert by_title["Prompt tokens"]["last"] == 300.0 and by_title["Load"]["last"] == 1.0
    assert by_title["Completion tokens"]["last"] == 12.5
    assert by_title["Completion tokens"]["unit"] == "tokens/s"


def test_audit_filters_map_the_form_to_the_api() -> None:
    params = audit_filters({"actor": " bob ", "target": "chat", "since": "1h"}, now=7200.0)
    assert params == {"limit": 200, "actor": "bob", "target": "group/chat", "since": 3600.0}
    assert audit_filters({"target": "proposal/3", "since": "bogus"}, now=0.0) == {
        "limit": 200,
        "target": "proposal/3",
    }


def test_login_sends_only_to_console_pages() -> None:
    assert _local("/ui/groups/chat?span=1d") == "/ui/groups/chat?span=1d"
    assert _local("%2Fui%2Froutes") == "/ui/routes"
    for hostile in ("https://evil.example/", "//evil.example/ui/", "/ui/\\evil", "/v1/tokens"):
        assert _local(hostile) == "/ui/"


def test_overview_rows_join_the_api_answers() -> None:
    groups = [
        {
            "name": "chat",
            "business": "search",
            "owner": "a@x",
            "ready": 1,
            "desired": 2,
            "instances": 2,
            "autoscaling": None,
        },
    ]
    rows = overview_rows(
        groups,
        {
            "groups": {
                "chat": {"queued": {"high": 1, "normal": 2, "low": 0}, "in_use": 8, "slots": 8}
            }
        },
        {
            "groups": {
                "chat": [
                    {"requests_per_s": 1.0},
                    {"requests_per_s": 3.5, "p95_ms": 40.0, "slo_attainment": 0.99},
                ]
            }
        },
        {
            "groups": [
                {"name": "chat", "held_units": 2, "borrowed_units": 1, "quota": {"guaranteed": 1}}
            ]
        },
        {"firing": [{"group": "chat", "rule": "queue-wait", "severity": "page"}]},
    )
    (row,) = rows
    assert (row["rps"], row["p95_ms"], row["slo"], row["queued"]) == (3.5, 40.0, 0.99, 3)
    assert (row["held"], row["guaranteed"], row["borrowed"]) == (2, 1, 1)
    assert row["alerts"] == ["queue-wait (page)"] and not row["autoscaled"]


def test_words_for_rules_channels_and_failovers() -> None:
    rule = {
        "tenants": ["t1"],
        "models": [],
        "priorities": ["high"],
        "headers": {"x-a": "1"},
        "header_prefixes": {"x-user": "beta-"},
    }
    assert match_text(rule) == "tenants t1; priority high; x-a = 1; x-user starts beta-"
    assert match_text({}) == "every request"
    assert redact_channel("https://hooks.example.com/T0/secret") == "https://hooks.example.com/…"
    assert redact_channel("#search") == "#search"
    groups = [
        {"name": "a", "backup": "b"},
        {"name": "b", "backup": None},
        {"name": "c", "backup": None},
    ]
    assert failover_rows(groups, {"c": "b"}) == [
        {"name": "a", "backup": "b", "to": None},
        {"name": "c", "backup": None, "to": "b"},
    ]
