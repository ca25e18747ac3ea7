"""End to end: `sluice up` with a sim group and a real embedding group, driven through the
stable endpoint with the official openai client while the platform scales, rolls, heals
and restarts. The tests share one `sluice up` (module fixture) but each starts from the
steady state (chat 1 ready instance, embed 1) and leaves it so: any order, or alone."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import time
from pathlib import Path

import httpx
import openai
import pytest

from sluice.runtime.local import pid_runs_instance
from tests.e2e.conftest import Sluice, Stream, write_spec

pytestmark = pytest.mark.embedding


def steady(sluice: Sluice) -> None:
    """Wait for the state every test starts from: one chat and one embed instance, ready."""
    sluice.wait_for(
        "chat and embed steady",
        lambda: (
            len(sluice.ready("chat")) == len(sluice.instances("chat")) == 1
            and len(sluice.ready("embed")) == 1
        ),
        timeout=240,
    )


def test_both_groups_become_ready_and_serve(sluice: Sluice) -> None:
    steady(sluice)
    client = sluice.client()
    raw = client.chat.completions.with_raw_response.create(
        model="e2e-sim", max_tokens=5, messages=[{"role": "user", "content": "hi there"}]
    )
    chat = raw.parse()
    assert chat.choices[0].message.content
    assert raw.headers["x-sluice-group"] == "chat"
    assert raw.headers["x-sluice-route"] == "chat-main"
    assert raw.headers["x-sluice-instance"] == sluice.ready("chat")[0]["id"]
    assert chat.system_fingerprint == f"e2e-sim:{version(sluice)}"

    stream = client.chat.completions.create(
        model="e2e-sim",
        max_tokens=6,
        stream=True,
        messages=[{"role": "user", "content": "stream please"}],
    )
    pieces = [
        c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content
    ]
    assert len(pieces) >= 3

    emb = client.embeddings.create(
        model="e2e-embed",
        input=["a cat sits on the mat", "a kitten on a rug", "quarterly tax filing deadline"],
    )
    vecs = [d.embedding for d in emb.data]
    assert len(vecs[0]) == 384
    assert _cosine(vecs[0], vecs[1]) > _cosine(vecs[0], vecs[2])

    models = sorted(m.id for m in client.models.list())
    assert models == ["e2e-embed", "e2e-sim"]


def test_errors_are_clear_json(sluice: Sluice) -> None:
    url = sluice.endpoint + "/v1/chat/completions"
    body = {"model": "e2e-sim", "messages": [{"role": "user", "content": "x"}]}
    r = httpx.post(url, json=body, trust_env=False)
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    r = httpx.post(
        url,
        json={**body, "model": "nope"},
        trust_env=False,
        headers={"Authorization": "Bearer sk-e2e-f78ed04e82bcf081"},
    )
    assert r.status_code == 404 and "nope" in r.json()["error"]["message"]
    with pytest.raises(openai.PermissionDeniedError) as denied:
        sluice.client("sk-outsider-8091a51d2118c7ee").embeddings.create(
            model="e2e-embed", input="x"
        )
    assert "embed" not in json.dumps(denied.value.body).replace("e2e-embed", "")


def test_access_log_carries_route_group_and_instance(sluice: Sluice) -> None:
    steady(sluice)
    client = sluice.client()
    for _ in range(5):
        client.chat.completions.create(
            model="e2e-sim", max_tokens=1, messages=[{"role": "user", "content": "log me"}]
        )
    time.sleep(0.3)  # the gateway flushes its access log every 0.1 s
    lines = [json.loads(line) for line in (sluice.home / "access.log").read_text().splitlines()]
    served = [line for line in lines if line["status"] == 200 and line["model"] == "e2e-sim"]
    assert len(served) >= 5 and all(
        line["route"] == "chat-main"
        and line["group"] == "chat"
        and line["instance"].startswith("chat-")
        for line in served
    )


def test_scale_1_to_3_to_1_under_load_loses_nothing(sluice: Sluice) -> None:
    steady(sluice)
    with Stream(sluice, "e2e-sim") as stream:
        time.sleep(1)
        out = sluice.cli("scale", "chat", "3", "--reason", "e2e: peak")
        assert out == {"group": "chat", "from": 1, "to": 3}
        sluice.wait_for("3 ready", lambda: len(sluice.ready("chat")) == 3)
        time.sleep(1.5)  # traffic reaches the new instances
        sluice.cli("scale", "chat", "1", "--reason", "e2e: peak over")
        sluice.wait_for("back to 1", lambda: len(sluice.instances("chat")) == 1)
        time.sleep(1)
    assert stream.errors == []
    assert stream.ok > 50
    served_by = {
        json.loads(line)["instance"]
        for line in (sluice.home / "access.log").read_text().splitlines()[-200:]
    }
    assert len({i for i in served_by if i and i.startswith("chat-")}) >= 3
    audit = sluice.cli("audit", "--target", "group/chat")
    assert [(a["action"], a["detail"]["to"], a["actor"], a["reason"]) for a in audit[:2]] == [
        ("scale", 1, "admin", "e2e: peak over"),
        ("scale", 3, "admin", "e2e: peak"),
    ]


def test_version_change_rolls_under_load_without_loss(sluice: Sluice) -> None:
    steady(sluice)
    before, after = version(sluice), f"v{int(version(sluice)[1:]) + 1}"
    write_spec(sluice.spec, after, embed=True)
    old = {i["id"] for i in sluice.instances("chat")}
    with Stream(sluice, "e2e-sim") as stream:
        time.sleep(1)
        applied = sluice.cli("apply", "-f", str(sluice.spec), "--reason", f"e2e: ship {after}")
        assert applied["changed"] and f"+        version: {after}" in applied["diff"]
        sluice.wait_for(
            "v2 rolled out",
            lambda: (
                {i["id"] for i in sluice.instances("chat")}.isdisjoint(old)
                and len(sluice.ready("chat")) == 1
                and len(sluice.instances("chat")) == 1
            ),
        )
        time.sleep(1)
    assert stream.errors == []
    assert f"e2e-sim:{before}" in stream.fingerprints
    assert stream.fingerprints[-1] == f"e2e-sim:{after}"
    kinds = [e["kind"] for e in sluice.cli("events", "chat")]
    assert {"launch", "ready", "drain", "stopped"} <= set(kinds)


def test_kill_9_of_an_instance_is_detected_and_replaced(sluice: Sluice) -> None:
    steady(sluice)
    [victim] = sluice.ready("chat")
    os.kill(victim["pid"], signal.SIGKILL)
    sluice.wait_for(
        "replacement ready",
        lambda: any(i["id"] != victim["id"] for i in sluice.ready("chat")),
        timeout=60,
    )
    events = sluice.cli("events", "chat")
    failed = [e for e in events if e["kind"] == "failed" and e["instance"] == victim["id"]]
    assert failed and "exited with code -9" in failed[0]["message"]
    r = sluice.client().chat.completions.create(
        model="e2e-sim", max_tokens=2, messages=[{"role": "user", "content": "still here?"}]
    )
    assert r.choices[0].message.content


def test_a_hung_instance_fails_its_health_probes_and_is_replaced(sluice: Sluice) -> None:
    steady(sluice)
    [victim] = sluice.ready("chat")
    os.kill(victim["pid"], signal.SIGSTOP)  # alive but answering nothing
    try:
        sluice.wait_for(
            "replacement ready",
            lambda: any(i["id"] != victim["id"] for i in sluice.ready("chat")),
            timeout=60,
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim["pid"], signal.SIGCONT)
    failed = [
        e
        for e in sluice.cli("events", "chat")
        if e["kind"] == "failed" and e["instance"] == victim["id"]
    ]
    assert failed and "health probes failed in a row" in failed[0]["message"]
    sluice.wait_for("hung process gone", lambda: not _worker_running(victim["id"]), timeout=30)


def test_restart_leaves_no_orphans_and_adopts_after_a_crash(sluice: Sluice) -> None:
    steady(sluice)
    live = version(sluice)
    # 1. Graceful stop: every instance stops with it.
    ids = [i["id"] for i in sluice.instances()]
    assert sluice.stop() == 0
    assert not [i for i in ids if _worker_running(i)]

    # 2. Restart on the same state directory, no -f: resumes the latest revision.
    sluice.start(with_spec=False)
    sluice.wait_for(
        "restarted",
        lambda: len(sluice.ready("chat")) == 1 and len(sluice.ready("embed")) == 1,
        timeout=240,
    )
    assert version(sluice) == live

    # 3. Crash (kill -9 of sluice itself): instances survive in their own sessions, and the
    #    next start adopts them instead of starting them again.
    survivors = {i["id"]: i["pid"] for i in sluice.instances()}
    before = set(survivors)
    sluice.kill()
    assert all(pid_runs_instance(pid, i) for i, pid in survivors.items())
    sluice.start(with_spec=False)
    sluice.wait_for(
        "adopted",
        lambda: {i["id"] for i in sluice.ready("chat") + sluice.ready("embed")} == before,
        timeout=60,
    )
    adopted = [e for e in sluice.cli("events") if e["kind"] == "adopted"]
    assert {e["instance"] for e in adopted} >= before

    # 4. Final stop: no worker of any run is left.
    assert sluice.stop() == 0
    every_instance_ever = [p.stem for p in (sluice.home / "instances").glob("*.log")]
    assert len(every_instance_ever) >= 4
    assert not [i for i in every_instance_ever if _worker_running(i)]

    # 5. Leave the platform running for the module's other tests.
    sluice.start(with_spec=False)
    steady(sluice)


def version(sluice: Sluice) -> str:
    """The chat model's version in the live revision."""
    (chat,) = [g for g in sluice.cli("get", "groups") if g["name"] == "chat"]
    return str(chat["models"]["e2e-sim"]["version"])


def _worker_running(instance_id: str) -> bool:
    return any(
        pid_runs_instance(int(p.name), instance_id)
        for p in Path("/proc").iterdir()
        if p.name.isdigit()
    )


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
