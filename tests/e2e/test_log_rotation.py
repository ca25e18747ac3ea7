"""End to end: the access log rotates under load and keeps every request's line.

`sluice gc` runs the retention pass again and again while 30 requests a second go through
the gateway, with `access_log_max_mb` small enough that nearly every pass rotates. The log
is renamed and the gateway moves to a fresh file (`Housekeeper(reopen_access_log=...)`),
so after `sluice up` stops, the live file and the rotated ones hold exactly one line per
request sent, and the oldest rotated file is the very file the gateway opened at start.
(Copy-then-truncate would keep that file as `access.log` and lose the lines written between
the copy and the truncation; a gateway that did not move would write on into `access.log.1`,
and the empty `access.log` would never rotate again.)
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.e2e.conftest import running
from tests.faults.conftest import Api, Load, group_spec, platform_spec

SPEC = platform_spec(
    group_spec("chat", replicas=1),
    "  - {tag: chat-main, match: {models: [m-chat]}, to: chat}\n",
).replace(
    "gateway: {host: 127.0.0.1, port: 0}\n",
    "gateway: {host: 127.0.0.1, port: 0}\n"
    "retention: {access_log_max_mb: 0.002, access_log_keep: 100}\n",
)


def test_access_log_rotation_under_load_loses_no_line(tmp_path: Path) -> None:
    with running(tmp_path, SPEC, "1 ready", lambda s: len(s.ready("chat")) == 1) as s:
        api = Api(s)
        opened = (tmp_path / "access.log").stat().st_ino  # the file `sluice up` opened
        load = Load(s.endpoint, rate=30.0).start(max_s=6.0)
        rotations = 0
        deadline = time.monotonic() + 6.0
        try:
            while time.monotonic() < deadline:
                rotations += "access.log" in api.post("/v1/gc", {})["rotated"]
                time.sleep(0.2)
        finally:
            outcomes = load.stop()
            api.close()
        assert s.stop() == 0  # the gateway flushes its log on the way out
    logs = [tmp_path / "access.log", *tmp_path.glob("access.log.*")]
    ids = [json.loads(line)["request_id"] for f in logs for line in f.read_text().splitlines()]
    print(f"\n{len(outcomes)} requests, {rotations} rotations, {len(ids)} lines")
    assert all(o.ok for o in outcomes) and len(outcomes) >= 150
    assert rotations >= 10
    assert len(ids) == len(set(ids)) == len(outcomes)
    # renamed, not copied: the oldest rotated file is the one the gateway opened at start
    assert (tmp_path / f"access.log.{rotations}").stat().st_ino == opened
