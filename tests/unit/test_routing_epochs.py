"""Routing snapshots carry the lease epoch of the leader that published them (issue 31): a
gateway never swaps in one of an older epoch than it serves, a remote gateway refuses a
deposed controller's whole sync answer and asks the next controller, and the controller
sends its snapshot to a gateway on another epoch even when the version numbers match
(each leader numbers its snapshots from 1)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
from typing import Any

import httpx
import pytest

from sluice.control.gateways import GatewayFleet
from sluice.core import ManualClock
from sluice.gateway import Gateway
from sluice.gateway.remote import ControlSync
from sluice.gateway.server import StaleRouting
from sluice.policy import RoutingSnapshot, build_routing_snapshot
from sluice.policy.routing import Endpoint
from sluice.policy.snapshot_wire import snapshot_from_json, snapshot_to_json
from sluice.spec import load_spec_text

SPEC = """
pools: [{name: local, count: 2, memory_gb: 8}]
groups:
  - name: chat
    owner: ops@example.com
    business: core
    alert_channel: "#ops"
    models: {m: {runtime: sim}}
    resources: {pool: local, accelerators: 1, memory_gb: 1}
    replicas: 1
"""


def _snapshot(version: int, epoch: int) -> RoutingSnapshot:
    spec = load_spec_text(SPEC, "test.yaml").spec
    return dataclasses.replace(build_routing_snapshot(spec, {}, version), epoch=epoch)


def test_warm_standby_travels_to_remote_gateways_and_an_older_controllers_has_none() -> None:
    spec = load_spec_text(SPEC, "test.yaml").spec
    warm = Endpoint("chat-2", "127.0.0.1", 9002, 8)
    snap = build_routing_snapshot(spec, {}, 1, standby={"chat": [warm], "other": []})
    assert snap.standby == {"chat": (warm,)}
    assert snapshot_from_json(json.loads(json.dumps(snapshot_to_json(snap)))).standby == {
        "chat": (warm,)
    }
    legacy = snapshot_to_json(snap)
    del legacy["standby"]
    assert snapshot_from_json(legacy).standby == {}


def test_the_epoch_travels_and_an_older_one_is_refused() -> None:
    assert snapshot_from_json(snapshot_to_json(_snapshot(3, 5))).epoch == 5
    legacy = snapshot_to_json(_snapshot(3, 5))
    del legacy["epoch"]  # a controller of before: epoch 0
    assert snapshot_from_json(legacy).epoch == 0
    gateway = Gateway(rng=random.Random(0))
    gateway.update(_snapshot(9, 2))
    with pytest.raises(StaleRouting, match="epoch 1, older than epoch 2"):
        gateway.update(_snapshot(50, 1))  # a deposed leader's, however new its version
    assert (gateway.snapshot_version, gateway.snapshot_epoch) == (9, 2)
    gateway.update(_snapshot(1, 3))  # the next leader starts again from 1
    assert (gateway.snapshot_version, gateway.snapshot_epoch) == (1, 3)


def test_the_controller_sends_its_snapshot_to_a_gateway_on_another_epoch() -> None:
    fleet = GatewayFleet(ManualClock())
    fleet.publish(_snapshot(3, 2))

    def sync(have: int | None, have_epoch: int | None) -> Any:
        answer = fleet.sync("gw-1", "boot", {}, {}, have, (0, 1), have_epoch=have_epoch)
        return answer["epoch"], answer["snapshot"] is not None

    assert sync(3, 1) == (2, True)  # v3 of epoch 1 is not v3 of epoch 2
    assert sync(3, 2) == (2, False)
    assert sync(3, None) == (2, False)  # a gateway of before: versions only


def test_a_remote_gateway_refuses_a_deposed_controllers_answer() -> None:
    gateway = Gateway(rng=random.Random(0))
    bodies: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    new_up = {"ok": False}

    def answer(version: int, epoch: int) -> dict[str, Any]:
        return {
            "share": {"index": 0, "count": 1},
            "version": version,
            "epoch": epoch,
            "snapshot": snapshot_to_json(_snapshot(version, epoch)),
            "sample_groups": [],
        }

    def controllers(request: httpx.Request) -> httpx.Response:
        who = request.url.host
        bodies[who].append(json.loads(request.content))
        if who == "old":
            return httpx.Response(200, json=answer(40, 1))
        if not new_up["ok"]:
            return httpx.Response(503, json={"error": {"message": "standby"}})
        return httpx.Response(200, json=answer(2, 2))

    sync = ControlSync(gateway, ["http://old", "http://new"], "tok", "gw-1")

    async def once() -> bool:
        async with httpx.AsyncClient(transport=httpx.MockTransport(controllers)) as client:
            return await sync.sync_once(client)

    assert asyncio.run(once())  # the old leader, before the takeover: epoch 1
    assert (gateway.snapshot_version, gateway.snapshot_epoch) == (40, 1)
    new_up["ok"] = True
    sync._current = 1  # the old one was paused: the gateway went on to the new one
    assert asyncio.run(once())
    assert (gateway.snapshot_version, gateway.snapshot_epoch) == (2, 2)
    assert bodies["new"][-1]["have_epoch"] == 1
    sync._current = 0  # the old one is back (resumed) and answers first: refused whole
    assert asyncio.run(once())
    assert (gateway.snapshot_version, gateway.snapshot_epoch) == (2, 2)
    assert bodies["old"][-1]["have_epoch"] == 2 and len(bodies["new"]) == 2  # asked next
    new_up["ok"] = False  # only the deposed one answers: nothing taken from it
    assert not asyncio.run(once())
    assert (gateway.snapshot_version, gateway.snapshot_epoch) == (2, 2)
