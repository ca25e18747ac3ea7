"""Fault: the controller's tick raises, from a real fault of its store.

Another process takes the write lock of `state.db` and holds it (a stuck `sqlite3` shell, a
backup tool): every write `sluice up` tries fails after SQLite's busy timeout (5 s) with
"database is locked", an OperationalError, so each tick fails and the controller holds the
last good state. Under a steady 30 req/s the gateway loses nothing, `sluice status` says
degraded (and why) while the lock is held and ok once it is gone.

The second test adds a `kill -9` of one of the two instances while the store is locked: no
tick runs, so the dead instance stays in the routing table until the lock goes; the
gateway's retry (nothing was sent to a closed port) and outlier ejection still lose no
request, and after the lock the controller replaces the instance.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

from tests.e2e.conftest import Sluice, running
from tests.faults.conftest import (
    Api,
    Load,
    group_spec,
    lines,
    platform_spec,
    ready_counts,
    report,
    wait_until,
)

SPEC = platform_spec(
    group_spec("chat", replicas=2), "  - {tag: chat-main, match: {models: [m-chat]}, to: chat}\n"
)
RATE = 30.0
HOLD_S = 8.0


def cli_status(s: Sluice) -> dict[str, Any]:
    return dict(s.cli("status"))


def locked_store(home: Path, s: Sluice, api: Api, kill: bool) -> None:
    load = Load(s.endpoint, rate=RATE).start(max_s=90)
    victim: dict[str, Any] = {}
    try:
        time.sleep(2.0)
        assert cli_status(s)["status"] == "ok"
        lock = sqlite3.connect(home / "state.db", isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")
        locked_at = time.monotonic()
        try:
            wait_until("degraded", lambda: api.status()["status"] == "degraded", 30, 0.2)
            noticed = time.monotonic() - locked_at
            st = cli_status(s)  # what `sluice status` says, not only the API
            assert st["status"] == "degraded", st
            assert "database is locked" in str(st["degraded"]), st
            before = {i["id"] for i in api.instances("chat")}
            if kill:
                victim = api.ready("chat")[0]
                os.kill(victim["pid"], signal.SIGKILL)
            time.sleep(HOLD_S)
            if kill:  # no tick ran: nothing was replaced, the gateway still has its table
                assert {i["id"] for i in api.instances("chat")} == before
                chat = api.get("/v1/dataplane")["groups"]["chat"]
                assert chat["instances"] == 2, chat
                assert [e["instance"] for e in chat["ejected"]] == [victim["id"]], chat
        finally:
            lock.execute("ROLLBACK")
            lock.close()
        released = time.monotonic()
        ok_at = wait_until("ok again", lambda: api.status()["status"] == "ok", 60, 0.2)
        if kill:
            wait_until(
                "a replacement ready",
                lambda: (
                    len(
                        [i for i in api.ready("chat") if i["id"] != victim["id"]]  # type: ignore[index]
                    )
                    == 2
                ),
                45,
            )
        time.sleep(2.0)
    finally:
        outcomes = load.stop()
    st = cli_status(s)
    assert st["status"] == "ok", st
    failed = [o for o in outcomes if not o.ok]
    report(
        "store-locked" + ("+kill-9" if kill else ""),
        len(outcomes),
        len(failed),
        0,
        ok_at - released,
        noticed_s=round(noticed, 2),
        tick_failures=st["controller"]["tick_failures"],
    )
    assert not failed, list(lines(outcomes))
    assert any("takes writes again" in e["message"] for e in api.events(limit=50))


def test_a_locked_store_degrades_the_controller_and_the_gateway_serves(tmp_path: Path) -> None:
    with (
        running(tmp_path, SPEC, "2 ready", lambda s: ready_counts(s) == {"chat": 2}) as s,
        Api(s) as api,
    ):
        locked_store(tmp_path, s, api, kill=False)


def test_an_instance_dies_while_the_store_is_locked_and_nothing_is_lost(tmp_path: Path) -> None:
    with (
        running(tmp_path, SPEC, "2 ready", lambda s: ready_counts(s) == {"chat": 2}) as s,
        Api(s) as api,
    ):
        locked_store(tmp_path, s, api, kill=True)
