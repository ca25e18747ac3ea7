"""A remote gateway's sync (`sluice.gateway.remote.ControlSync`) against a controller that
answers through httpx's mock transport: it records the groups the controller names, sends
what it recorded of their answers once (never the text), and sends them again after a
sync no controller took."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import httpx

from sluice.gateway import Gateway
from sluice.gateway.remote import ControlSync


def test_recorded_answers_go_up_once_and_again_after_a_failed_sync() -> None:
    gateway = Gateway(rng=random.Random(0))
    bodies: list[dict[str, Any]] = []
    up = {"ok": True}

    def controller(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        if not up["ok"]:
            return httpx.Response(503, json={"error": "standby"})
        return httpx.Response(
            200,
            json={"share": {"index": 0, "count": 1}, "version": None, "sample_groups": ["chat"]},
        )

    sync = ControlSync(gateway, ["http://control"], "tok", "gw-1")

    async def once() -> bool:
        async with httpx.AsyncClient(transport=httpx.MockTransport(controller)) as client:
            return await sync.sync_once(client)

    assert asyncio.run(once())  # learns to record chat
    rings = gateway._state.sampling.groups  # what the exchange path records into
    assert set(rings) == {"chat"}
    rings["chat"].record("chat-1", 200, 0.25, 0.05, 120)
    assert asyncio.run(once())
    assert bodies[-1]["samples"] == {
        "chat-1": [
            {
                "at": bodies[-1]["samples"]["chat-1"][0]["at"],
                "status": 200,
                "latency_s": 0.25,
                "ttft_s": 0.05,
                "output_bytes": 120,
                "output_tokens": None,
                "finish_reason": None,
                "tpot_s": None,
                "text": None,
            }
        ]
    }
    assert asyncio.run(once()) and bodies[-1]["samples"] == {}  # taken: not sent again
    rings["chat"].record("chat-1", 500, 0.5, None, 0)
    up["ok"] = False
    assert not asyncio.run(once())
    up["ok"] = True
    assert asyncio.run(once())
    assert [r["status"] for r in bodies[-1]["samples"]["chat-1"]] == [500]  # not lost
