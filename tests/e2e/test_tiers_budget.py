"""End to end: stable and burst tiers (S9) and a budget that bounds the fleet (Q6).

Group `chat` runs 3 instances on a guarantee of 1 unit: its oldest instance is its stable
part, the two newer ones burst. Lowering its budget to 2 accelerators drains the newest
burst instance with the budget as the reason; scaling down to 1 keeps the stable one.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.conftest import Sluice, running

SPEC = """
gateway: {{host: 127.0.0.1, port: 0}}
pools:
  - {{name: gpu, count: 4, memory_gb: 16, price_per_hour: 2.0}}
groups:
  - name: chat
    owner: ops@example.com
    business: core
    alert_channel: "#ops"
    models:
      m-chat: {{runtime: sim, sim: {{startup_s: 0.2, memory_gb: 1}}}}
    resources: {{pool: gpu, accelerators: 1, memory_gb: 1}}
    replicas: 3
    drain_timeout_s: 5
    quota: {{guaranteed: 1}}{budget}
tenants:
  - {{name: search, api_keys: [sk-search-b095adcc724f4f8a]}}
"""


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sluice]:
    home = tmp_path_factory.mktemp("tiers")
    with running(
        home,
        SPEC.format(budget=""),
        "chat has 3 ready instances",
        lambda s: len(s.ready("chat")) == 3,
        timeout=60,
    ) as s:
        yield s


def alive(s: Sluice) -> list[dict[str, object]]:
    return [i for i in s.instances("chat") if i["state"] in ("ready", "starting", "pending")]


def test_tiers_and_a_lowered_budget_drain_the_newest_burst_instance(platform: Sluice) -> None:
    s = platform
    s.wait_for("tiers are known", lambda: all(i["tier"] for i in alive(s)), 10)
    by_age = sorted(alive(s), key=lambda i: i["created_at"])  # type: ignore[arg-type, return-value]
    assert [i["tier"] for i in by_age] == ["stable", "burst", "burst"]
    stable = by_age[0]["id"]
    assert "tiers: 1 stable on its guaranteed units" in s.show("explain", "chat")

    s.spec.write_text(SPEC.format(budget="\n    budget: {max_accelerators: 2}"))
    s.cli("apply", "-f", str(s.spec), "--reason", "cap chat at 2 accelerators")
    s.wait_for("chat is down to 2", lambda: len(alive(s)) == 2, 30)
    events = s.cli("events", "chat", "--limit", "200")
    drained = [e for e in events if e["instance"] == by_age[2]["id"] and e["kind"] == "drain"]
    assert drained and "max_accelerators" in drained[0]["message"], events
    assert {i["id"] for i in alive(s)} == {stable, by_age[1]["id"]}
    quota = s.cli("quota")
    (row,) = [g for g in quota["groups"] if g["name"] == "chat"]
    assert row["granted_instances"] == 2 and "max_accelerators" in (row["refused"] or "")

    s.cli("scale", "chat", "1", "--reason", "quiet hours")
    s.wait_for("chat is down to 1", lambda: len(alive(s)) == 1, 30)
    (left,) = alive(s)
    assert left["id"] == stable and left["tier"] == "stable"
