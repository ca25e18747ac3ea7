"""The fleet's state in PostgreSQL (issue 21): the real `sluice up -f` with
$SLUICE_DATABASE_URL naming a fresh database on the test server (`.ci/run` starts one; see
tests/databases.py) keeps its revision, the scale and its audit row there, not in a
state.db; stopped and started again on the same database it resumes them, and the reports
that read the store directly (`sluice groups doc`) read that database too. The URL's
password appears in no output.
"""

from __future__ import annotations

from pathlib import Path

import httpx
from sqlalchemy.engine import make_url

from sluice.store import Store
from tests.databases import postgres_database
from tests.e2e.conftest import Sluice, running

SPEC = """
gateway: {host: 127.0.0.1, port: 0}
pools:
  - {name: local, count: 2, memory_gb: 16}
groups:
  - name: chat
    owner: alice@example.com
    business: search
    alert_channel: "#search"
    models:
      e2e-sim:
        runtime: sim
        version: v1
        sim: {startup_s: 0.2, service_time: {kind: fixed, seconds: 0.01}, memory_gb: 1}
    resources: {pool: local, accelerators: 1, memory_gb: 2}
    max_concurrency: 4
    replicas: 1
    health: {interval_s: 0.5, failure_threshold: 2, timeout_s: 1}
    drain_timeout_s: 5
tenants:
  - {name: e2e, api_keys: [sk-e2e-f78ed04e82bcf081]}
routes:
  - {tag: chat-main, match: {models: [e2e-sim]}, to: chat}
"""


def revisions(s: Sluice) -> list[dict[str, object]]:
    with httpx.Client(trust_env=False, headers=s.control_headers(), timeout=10) as c:
        r = c.get(s.control_url + "/v1/revisions")
    r.raise_for_status()
    listed: list[dict[str, object]] = r.json()
    return listed


def test_state_in_postgresql_survives_a_restart(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    with postgres_database() as url:
        password = str(make_url(url).password)
        env = {"SLUICE_DATABASE_URL": url}
        with running(home, SPEC, "chat ready", lambda s: len(s.ready("chat")) == 1, 90, env) as s:
            scaled = s.cli("scale", "chat", "2", "--reason", "state in postgres")
            assert (scaled["from"], scaled["to"]) == (1, 2)
            s.wait_for("chat at 2", lambda: len(s.ready("chat")) == 2)
            [scale] = s.cli("audit", "--action", "scale")
            assert (scale["target"], scale["reason"]) == ("group/chat", "state in postgres")
            before = revisions(s)
            assert [r["number"] for r in before] == [1]
            assert s.stop() == 0
            output = "".join(s.output)

            assert not list(home.glob("state.db*")), "the state went to a SQLite file"
            with Store.open(url) as store:
                assert store.replicas_overrides() == {"chat": 2}
                assert [a.id for a in store.list_audit(action="scale")] == [scale["id"]]
                latest = store.latest_revision()
                assert latest is not None and latest.number == 1

            s.start(with_spec=False)  # plain `up` resumes the live revision from the database
            s.wait_for("chat back at 2", lambda: len(s.ready("chat")) == 2)
            assert revisions(s) == before
            assert s.cli("audit", "--action", "scale") == [scale]
            doc = s.cli("groups", "doc")
            assert doc["revision"] == 1
            [chat] = doc["groups"]
            assert (chat["group"], chat["instances"]) == ("chat", {"ready": 2})
            assert s.stop() == 0
            output += "".join(s.output)
        assert password not in output
