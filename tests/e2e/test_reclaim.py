"""Under-use becomes a proposal (issue 37), end to end through `sluice up`: a month of
hourly history stored before the start (group `batch` peaks at 0.9 busy units on a
guarantee of 4; `nightly` at 0.5 on 2; `search` needs its whole 2; `fresh` has ten days).
`sluice report usage --propose` files one reviewed proposal per chronically under-used
group with the returnable units and their evidence, never a second while one is pending;
another person's approval lowers the guarantee in the live spec. Then the scheduled check,
turned on in the spec, supersedes the proposal that approval made stale."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from sluice.policy.history import HOUR_S, Rollup, bucket_start
from sluice.store import RollupRow, Store
from tests.e2e.conftest import Sluice, kill_workers_of

GROUP = """
  - name: {name}
    owner: {name}-team@example.com
    business: {name}
    alert_channel: "#{name}"
    models:
      m-{name}: {{runtime: sim, version: v1}}
    resources: {{pool: local, accelerators: 1, memory_gb: 1}}
    max_concurrency: 4
    replicas: 0
    quota: {{guaranteed: {guaranteed}}}
"""
HISTORY = {  # group: (days stored, hourly peak of busy units, mean busy units)
    "batch": (30, 0.9, 0.5),
    "nightly": (30, 0.5, 0.2),
    "search": (30, 1.8, 1.2),
    "fresh": (10, 0.3, 0.1),
}


def spec(batch: int = 4, reclaim: bool = False) -> str:
    guarantees = {"batch": batch, "nightly": 2, "search": 2, "fresh": 2}
    return (
        "gateway: {host: 127.0.0.1, port: 0}\n"
        "control: {review: {routes: true}}\n"
        f"reclaim: {{enabled: {'true' if reclaim else 'false'}}}\n"
        "pools:\n  - {name: local, count: 16, memory_gb: 64}\ngroups:"
        + "".join(GROUP.format(name=n, guaranteed=g) for n, g in guarantees.items())
    )


def store_history(home: Path, now: float) -> None:
    """Hour rows ending at the last whole hour, as the observer would have merged them."""
    last = bucket_start(now, HOUR_S) - HOUR_S
    rows = []
    for group, (days, peak, mean) in HISTORY.items():
        for k in range(int(days * 24)):
            start = last - k * HOUR_S
            top = peak * 2 if k % 200 == 7 else peak  # a few odd hours: above the p99 rank
            r = Rollup(
                start=start,
                seconds=HOUR_S,
                requests=360,
                gauges={"busy_units": (mean * 60, top, 60), "held_units": (60.0, 1.0, 60)},
            )
            rows.append(RollupRow(group, int(HOUR_S), start, r.to_json()))
    store = Store.for_home(home)
    try:
        store.write_rollups(rows)
    finally:
        store.close()


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[Sluice]:
    path = tmp_path / "platform.yaml"
    path.write_text(spec())
    store_history(tmp_path, time.time())
    s = Sluice(tmp_path, path)
    s.start()
    try:
        yield s
    finally:
        s.kill()
        kill_workers_of(tmp_path)


def verdicts(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["group"]: v for v in doc["reclaim"]}


def live_guarantee(s: Sluice, group: str) -> int:
    r = httpx.get(
        s.control_url + "/v1/revisions",
        params={"limit": 1},
        headers=s.control_headers(),
        trust_env=False,
        timeout=10,
    )
    text = r.raise_for_status().json()[0]["yaml_text"]
    found = [g for g in yaml.safe_load(text)["groups"] if g["name"] == group]
    return int(found[0]["quota"]["guaranteed"])


def test_under_use_becomes_a_reviewed_proposal_and_approval_lowers_the_guarantee(
    platform: Sluice,
) -> None:
    s = platform
    s.token("alice"), s.token("bob")  # both enrolled before anything is proposed
    # The report alone says what --propose would file, and why not for the others.
    v = verdicts(s.cli("report", "usage"))
    assert v["batch"]["propose"] and (v["batch"]["returnable"], v["batch"]["new_guaranteed"]) == (
        3,
        1,
    )
    assert v["nightly"]["propose"] and v["nightly"]["returnable"] == 1
    assert not v["fresh"]["propose"] and v["fresh"]["why"].startswith("not enough history")
    assert v["fresh"]["weeks_observed"] == 1
    assert not v["search"]["propose"] and v["search"]["why"].startswith("not chronic")
    assert s.cli("proposals") == []

    code, doc = s.as_user("alice", "report", "usage", "--propose")
    assert code == 0, doc
    v = verdicts(doc)
    batch, nightly = v["batch"]["proposal"], v["nightly"]["proposal"]
    assert batch and nightly and v["fresh"]["proposal"] is None and v["search"]["proposal"] is None
    p = s.cli("proposal", "show", str(batch))
    assert p["state"] == "pending" and p["author"] == "alice"
    assert p["reason"].startswith("quota reclaim batch: guarantee 4 -> 1 (3 unit(s) back")
    assert "4 week(s) observed" in p["reason"]
    assert "p99 of hourly peaks of busy units 0.90" in p["reason"]
    assert "returnable = guaranteed 4 - ceil(0.90) = 3" in p["reason"]
    assert "-    quota: {guaranteed: 4}" in p["diff"] and "+    quota: {guaranteed: 1}" in p["diff"]
    assert p["preview"]["needs_review"] == ["groups.batch.quota"]

    # No second proposal while one is pending: the report says which one waits.
    again = verdicts(s.cli("report", "usage", "--propose"))
    assert again["batch"]["proposal"] is None and f"#{batch}" in again["batch"]["why"]
    assert sorted(x["id"] for x in s.cli("proposals")) == sorted([batch, nightly])
    shown = s.show("report", "usage")
    assert f"reclaim batch: no proposal: proposal #{batch}" in shown
    assert "reclaim fresh: no proposal: not enough history" in shown

    # The author's person cannot approve it; another person does, and the guarantee drops.
    code, out = s.as_user("alice", "approve", str(batch), "--reason", "mine")
    assert code != 0 and out["error"]["code"] == "forbidden", out
    code, out = s.as_user("bob", "approve", str(batch), "--reason", "batch agrees")
    assert code == 0 and out["state"] == "approved", out
    assert live_guarantee(s, "batch") == 1
    assert live_guarantee(s, "nightly") == 2
    after = verdicts(s.cli("report", "usage"))
    assert after["batch"]["returnable"] == 0 and not after["batch"]["propose"]

    # nightly's proposal was made against the revision before: the scheduled check (on in
    # the spec now) files a fresh one and rejects the stale one, naming its successor.
    s.cli("apply", "-f", write(s, "on.yaml", spec(batch=1, reclaim=True)), "--reason", "on")
    deadline = time.monotonic() + 60
    fresh: list[dict[str, Any]] = []
    while time.monotonic() < deadline and not fresh:
        fresh = [x for x in s.cli("proposals") if x["author"] == "schedule/reclaim"]
        time.sleep(0.5)
    assert [x["reason"].split(":")[0] for x in fresh] == ["quota reclaim nightly"], fresh
    old = s.cli("proposal", "show", str(nightly))
    assert old["state"] == "rejected"
    assert old["review_reason"].startswith(f"superseded by proposal #{fresh[0]['id']}")
    s.cli("approve", str(fresh[0]["id"]), "--reason", "nightly agrees")  # any other person
    assert live_guarantee(s, "nightly") == 1


def write(s: Sluice, name: str, text: str) -> str:
    path = s.home / name
    path.write_text(text)
    return str(path)
