"""Sleeping standby through a real `sluice up` (issue 36's fast tier, its sleeping half).

The servers are `openai_stub.py` with vLLM's sleep mode (POST /sleep?level=1, POST /wake_up
taking 1 s, GET /is_sleeping) and a 15 s load before /v1/models answers, so a new instance
cannot help a burst in time: only the sleeping one can.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Sluice, running
from tests.faults.conftest import Api, wait_until

STUB = str(Path(__file__).with_name("openai_stub.py"))
ARGV = [sys.executable, STUB, "--host", "{host}", "--port", "{port}", "--model", "{model}"]
ARGV += ["--delay", "1.0", "--wake-s", "1.0", "--load-s", "15"]
KEY = "sk-search-b095adcc724f4f8a"

SPEC = f"""
gateway: {{host: 127.0.0.1, port: 0}}
pools:
  - {{name: gpu, accelerator: fake-gpu, count: 4, memory_gb: 16}}
groups:
  - name: chat
    owner: ops@example.com
    business: search
    alert_channel: "#ops"
    models:
      m-chat:
        runtime: command
        command:
          argv: [{", ".join(f'"{a}"' for a in ARGV)}]
          metrics_path: /metrics
          stop_grace_s: 1
          sleep: {{level: 1, wake_timeout_s: 10, host_memory_gb: 16}}
    resources: {{pool: gpu, accelerators: 1, memory_gb: 1}}
    max_concurrency: 1
    slow_start_s: 0
    queue: {{max_length: 50, max_wait_s: 20}}
    health: {{interval_s: 0.5, failure_threshold: 2, timeout_s: 1, startup_timeout_s: 40}}
    drain_timeout_s: 5
    autoscaling: {{min: 1, max: 3, sleeping_standby: 1}}
tenants:
  - {{name: search, api_keys: [{KEY}]}}
routes:
  - {{tag: chat, match: {{models: [m-chat]}}, to: chat}}
"""


def sleep_state(instance: dict[str, Any]) -> dict[str, Any]:
    r = httpx.get(instance["url"] + "/is_sleeping", timeout=5, trust_env=False)
    r.raise_for_status()
    return dict(r.json())


def asleep(api: Api) -> list[str]:
    """The ready instances whose servers say they sleep (one that is gone says nothing)."""
    out = []
    for i in api.ready("chat"):
        try:
            if sleep_state(i)["is_sleeping"]:
                out.append(i["id"])
        except httpx.ConnectError:
            continue
    return out


def gateway_knows_the_sleeper(api: Api) -> dict[str, Any]:
    """The gateway's view of chat once it counts one sleeper. The worker says it sleeps as
    soon as its sleep call returns; the controller marks it asleep then, and the gateway
    learns it with the next snapshot: a read right after `asleep` can come before that
    (CI, 2026-12-06: instances 1, sleeping 0). Out of rotation it already was."""
    wait_until(
        "the gateway counts the sleeper",
        lambda: api.get("/v1/dataplane")["groups"]["chat"]["sleeping"] == 1,
        10,
    )
    return dict(api.get("/v1/dataplane")["groups"]["chat"])


def ids(api: Api) -> list[str]:
    return [i["id"] for i in api.ready("chat")]


def ask(s: Sluice) -> tuple[int, float, str]:
    started = time.monotonic()
    r = httpx.post(
        s.endpoint + "/v1/chat/completions",
        headers={"authorization": f"Bearer {KEY}"},
        json={"model": "m-chat", "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
        trust_env=False,
    )
    return r.status_code, time.monotonic() - started, r.headers.get("x-sluice-instance", "")


def test_a_burst_wakes_the_sleeping_standby_and_a_new_one_goes_to_sleep(tmp_path: Path) -> None:
    with (
        running(tmp_path, SPEC, "chat's two", lambda s: len(s.ready("chat")) == 2, 120) as s,
        Api(s) as api,
    ):
        # one serves, the newer one is put to sleep and kept out of the routing
        wait_until("the standby asleep", lambda: len(asleep(api)) == 1, 20)
        (sleeper,) = asleep(api)
        before = [i["id"] for i in api.ready("chat")]
        kinds = [e["kind"] for e in api.events("chat") if e.get("instance") == sleeper]
        assert "asleep" in kinds, kinds
        listed = {i["id"]: i["asleep"] for i in s.instances("chat")}
        assert listed == {**dict.fromkeys(listed, False), sleeper: True}, listed
        assert s.cli("get", "groups", "--json")[0]["desired"] == 1
        # nobody said how long the stub's wake takes: nothing is held asleep beyond the standby
        assert "held tier off: all the count serves awake (the servers' wake time is unknown" in (
            s.show("explain", "chat")
        )
        plane = gateway_knows_the_sleeper(api)
        assert (plane["instances"], plane["standby"], plane["sleeping"]) == (1, 0, 1), plane

        # a burst of three on one 1-slot instance: two wait, the gateway wakes the sleeper
        with ThreadPoolExecutor(3) as pool:
            answers = list(pool.map(lambda _: ask(s), range(3)))
        assert all(code == 200 for code, _, _ in answers), answers
        slowest = max(seconds for _, seconds, _ in answers)
        assert slowest < 3.0, answers  # 1 s wake + 1 s answer; a new instance takes 15 s
        served = {iid for _, _, iid in answers}
        by_id = {i["id"]: i for i in api.ready("chat")}
        assert sleeper in served and not sleep_state(by_id[sleeper])["is_sleeping"], answers
        metrics = httpx.get(
            s.control_url + "/metrics", headers=s.control_headers(), timeout=10, trust_env=False
        ).text
        assert 'sluice_gateway_standby_wakes_total{group="chat"} 1.0' in metrics

        # the count takes the woken one in (the burst also scaled it up), and a new
        # standby is launched and put to sleep; the woken one stays awake, in rotation
        wait_until("a new standby asleep", lambda: bool({*asleep(api)} - {*before}), 60)
        assert sleeper not in asleep(api)
        desired = s.cli("get", "groups", "--json")[0]["desired"]
        assert desired >= 2 and len(api.ready("chat")) == desired + 1
        # no request ever reached a sleeping server
        for inst in api.ready("chat"):
            assert sleep_state(inst)["refused"] == 0, inst


def test_the_sleeper_replaces_a_dead_instance_and_a_restart_keeps_who_sleeps(
    tmp_path: Path,
) -> None:
    """The serving instance dies: the sleeping standby is woken to serve in its place (a
    wake, not a 15 s start) and its replacement goes to sleep. Then a killed `sluice up`
    leaves its instances running and the next one adopts them without knowing which
    sleeps: it routes none before a wake (an awake server answers one at once) and sends a
    sleep to the one in the sleeping place (a sleeping one takes it as done), so requests
    are answered and none ever reaches a sleeping server."""
    with running(tmp_path, SPEC, "chat's two", lambda s: len(s.ready("chat")) == 2, 120) as s:
        with Api(s) as api:
            wait_until("the standby asleep", lambda: len(asleep(api)) == 1, 20)
            (sleeper,) = asleep(api)
            (serving,) = [i for i in api.ready("chat") if i["id"] != sleeper]
            os.kill(serving["pid"], signal.SIGKILL)
            wait_until("the sleeper awake", lambda: not asleep(api), 20)
            code, _, iid = ask(s)
            assert (code, iid) == (200, sleeper)
            wait_until("its replacement asleep", lambda: len(asleep(api)) == 1, 60)
            assert serving["id"] not in ids(api) and sleeper not in asleep(api)
            woke = [e for e in api.events("chat") if e.get("instance") == sleeper]
            assert any(e["kind"] == "woken" for e in woke), woke
            (sleeper,) = asleep(api)
            both = set(ids(api))
        s.kill()
        s.start(with_spec=False)
        with Api(s) as api:
            wait_until("both adopted", lambda: set(ids(api)) == both, 60)
            s.wait_routing()

            def listed() -> dict[str, bool]:
                return {i["id"]: i["asleep"] for i in s.instances("chat")}

            # each says whether it sleeps (GET /is_sleeping): known at once, no role swapped
            expected = {**dict.fromkeys(both, False), sleeper: True}
            wait_until("who sleeps known", lambda: listed() == expected, 10)
            for _ in range(3):  # one at a time: the serving one answers, nothing waits
                code, seconds, iid = ask(s)
                assert code == 200 and iid != sleeper and seconds < 1.5, (code, seconds, iid)
            assert asleep(api) == [sleeper]
            for inst in api.ready("chat"):
                assert sleep_state(inst)["refused"] == 0, inst


BATCH_ARGV = [sys.executable, STUB, "--host", "{host}", "--port", "{port}", "--model", "{model}"]
LENT_SPEC = (
    SPEC.replace("count: 4,", "count: 3,")
    .replace(
        "    autoscaling: {min: 1, max: 3, sleeping_standby: 1}\n",
        "    autoscaling: {min: 1, max: 2, sleeping_standby: 1}\n"
        "    quota: {guaranteed: 2, reclaim_grace_s: 1}\n",
    )
    .replace(
        "tenants:",
        f"""  - name: batch
    owner: ops@example.com
    business: ads
    alert_channel: "#ops"
    models:
      m-batch:
        runtime: command
        command:
          argv: [{", ".join(f'"{a}"' for a in BATCH_ARGV)}]
          stop_grace_s: 1
    resources: {{pool: gpu, accelerators: 1, memory_gb: 1}}
    replicas: 2
    drain_timeout_s: 2
    health: {{interval_s: 0.5, failure_threshold: 2, timeout_s: 1, startup_timeout_s: 40}}
tenants:""",
    )
)


PINNED_SPEC = LENT_SPEC.replace(
    "count: 3, memory_gb: 16}", "count: 3, memory_gb: 16, devices: [0, 1, 2]}"
)


@pytest.mark.parametrize("pool", ["units", "devices"])
def test_a_sleepers_units_are_lent_and_reclaimed_when_a_burst_needs_it(
    tmp_path: Path, pool: str
) -> None:
    """Three units: chat keeps one serving and one sleeping on its guarantee of two; batch
    (no guarantee) wants two. Once the sleeper is fenced from the gateway (not wakeable),
    batch borrows its unit. A burst on chat then scales it up: the sleeper is needed, but
    its unit is lent, so it is not woken until batch's borrowed instance is reclaimed
    (drained, stopped); then it wakes and serves. No request reaches a sleeping server.
    On a pool that pins devices the unit is the sleeper's own device: batch's borrower runs
    on it, and the sleeper wakes there once that borrower has stopped."""
    spec = PINNED_SPEC if pool == "devices" else LENT_SPEC
    assert "guaranteed: 2" in spec and "name: batch" in spec
    assert ("devices: [0, 1, 2]" in spec) is (pool == "devices")
    with (
        running(tmp_path, spec, "chat's two", lambda s: len(s.ready("chat")) == 2, 120) as s,
        Api(s) as api,
    ):
        wait_until("the standby asleep", lambda: len(asleep(api)) == 1, 30)
        (sleeper,) = asleep(api)

        def lent() -> bool:
            return any(i["units_lent"] for i in s.instances("chat") if i["id"] == sleeper)

        wait_until("its unit lent, batch on it", lambda: lent() and len(s.ready("batch")) == 2, 60)
        plane = api.get("/v1/dataplane")["groups"]["chat"]
        assert plane["sleeping"] == 0, plane  # no gateway may wake it now
        rows = {i["id"]: i for i in s.instances("chat")}
        assert rows[sleeper]["asleep"] and rows[sleeper]["units_lent"], rows
        borrowed = max(s.ready("batch"), key=lambda i: i["created_at"])["id"]
        devices = {i["id"]: i["devices"] for i in s.instances()}
        if pool == "devices":  # no device is free but the sleeper's: the borrower runs there
            assert devices[borrowed] == devices[sleeper] != "", devices

        # a burst: 8 requests on one 1-slot instance (1 s each); chat scales up, the sleeper
        # waits for its unit (a reclaim of batch's newest), then wakes and serves
        started = time.time()
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: ask(s), range(8)))
        assert all(code == 200 for code, _, _ in answers), answers
        assert sleeper in {iid for _, _, iid in answers}, answers
        events = api.events()
        drained = [e for e in events if e.get("instance") == borrowed and "reclaim" in e["message"]]
        woken = [e for e in events if e.get("instance") == sleeper and e["kind"] == "woken"]
        assert drained and woken, [(e["kind"], e["message"]) for e in events[-30:]]
        assert min(e["at"] for e in drained) <= min(e["at"] for e in woken)
        if pool == "devices":  # woken where it sleeps, once the borrower there has stopped
            stopped = [
                e for e in events if e.get("instance") == borrowed and e["kind"] == "stopped"
            ]
            assert stopped and min(e["at"] for e in stopped) <= min(e["at"] for e in woken)
            assert {i["id"]: i["devices"] for i in s.instances()}[sleeper] == devices[sleeper]
        kinds = [e["kind"] for e in events[::-1] if e.get("instance") == sleeper]
        assert kinds.index("units-lent") < kinds.index("units-back") < kinds.index("woken"), kinds
        assert borrowed not in {i["id"] for i in s.ready("batch")}
        # reclaim grace 1 s + the borrower's drain + a 1 s wake; a new instance takes 15 s
        to_serve = min(e["at"] for e in woken) - started
        slowest = max(seconds for _, seconds, _ in answers)
        print(f"sleeper serving {to_serve:.1f} s after the burst began (slowest {slowest:.1f} s)")
        assert to_serve < 15, to_serve
        for inst in api.ready("chat"):
            assert sleep_state(inst)["refused"] == 0, inst


def test_a_restart_while_a_sleepers_units_are_lent_keeps_the_loan_and_the_fence(
    tmp_path: Path,
) -> None:
    """As above, but `sluice up` is killed (SIGKILL) while batch runs on the sleeper's unit
    and started again: the new controller reads the fence back from the store, so its very
    first snapshot keeps the sleeper unwakeable and its first tick keeps the sleeper's unit
    lent (batch's borrowed instance is not drained as over a shrunk pool, units-lent is not
    said again). A burst sent at once then finds the sleeper fenced: a gateway cannot wake
    it onto batch's unit; the count's scale-up reclaims batch's instance first, then the
    controller wakes the sleeper, and units-back is said once."""
    with running(tmp_path, LENT_SPEC, "chat's two", lambda s: len(s.ready("chat")) == 2, 120) as s:
        with Api(s) as api:
            wait_until("the standby asleep", lambda: len(asleep(api)) == 1, 30)
            (sleeper,) = asleep(api)

            def lent() -> bool:
                return any(i["units_lent"] for i in s.instances("chat") if i["id"] == sleeper)

            wait_until(
                "its unit lent, batch on it", lambda: lent() and len(s.ready("batch")) == 2, 60
            )
            borrowed = max(s.ready("batch"), key=lambda i: i["created_at"])["id"]
            fleet = {i["id"] for i in s.ready("chat")} | {i["id"] for i in s.ready("batch")}
            sleeper_url = next(i["url"] for i in api.ready("chat") if i["id"] == sleeper)
        s.kill()
        restarted = time.time()
        s.start(with_spec=False)
        with Api(s) as api:
            s.wait_routing()
            rows = {i["id"]: i for i in s.instances()}
            assert set(rows) == fleet, rows  # all adopted, nothing launched or drained
            assert rows[sleeper]["asleep"] and rows[sleeper]["units_lent"], rows[sleeper]
            plane = api.get("/v1/dataplane")["groups"]["chat"]
            assert plane["sleeping"] == 0, plane  # fenced from the first snapshot on
            time.sleep(3.0)  # a few ticks: the loan stands
            assert borrowed in {i["id"] for i in s.ready("batch")}

            started = time.time()
            with ThreadPoolExecutor(8) as pool:
                answers = list(pool.map(lambda _: ask(s), range(8)))
            assert all(code == 200 for code, _, _ in answers), answers
            events = api.events()
            shrank = [e for e in events if "shrank" in e["message"]]
            assert not shrank, shrank
            drained = [
                e for e in events if e.get("instance") == borrowed and "reclaim" in e["message"]
            ]
            woken = [e for e in events if e.get("instance") == sleeper and e["kind"] == "woken"]
            assert drained and woken, [(e["kind"], e["message"]) for e in events[-30:]]
            assert started <= min(e["at"] for e in drained) <= min(e["at"] for e in woken)
            kinds = [e["kind"] for e in events[::-1] if e.get("instance") == sleeper]
            assert kinds.count("units-lent") == 1 and kinds.count("units-back") == 1, kinds
            assert kinds.index("units-lent") < kinds.index("units-back") < kinds.index("woken")
            back = next(
                e for e in events if e.get("instance") == sleeper and e["kind"] == "units-back"
            )
            assert back["at"] > restarted, back
            woke = min(e["at"] for e in woken)
            print(
                f"after the restart: burst at +{started - restarted:.1f} s, borrower reclaimed "
                f"+{min(e['at'] for e in drained) - started:.1f} s and sleeper woken "
                f"+{woke - started:.1f} s into it; the sleeper's events: {kinds}"
            )
            state = sleep_state({"url": sleeper_url})
            assert state["wakes"] == 1 and state["refused"] == 0, state
            for inst in api.ready("chat"):
                assert sleep_state(inst)["refused"] == 0, inst


SIM_SPEC = SPEC.replace(
    SPEC[SPEC.index("      m-chat:") : SPEC.index("    resources:")],
    """      m-chat:
        runtime: sim
        sim: {startup_s: 15, sleep_s: 0.2, wake_s: 1.0,
              service_time: {kind: fixed, seconds: 1.0}}
""",
)


def worker_stats(instance: dict[str, Any]) -> dict[str, Any]:
    r = httpx.get(instance["url"] + "/stats", timeout=5, trust_env=False)
    r.raise_for_status()
    return dict(r.json())


def test_a_sim_group_keeps_sleeping_standby_from_its_spec_and_a_burst_wakes_it(
    tmp_path: Path,
) -> None:
    """The same fast tier on `runtime: sim` workers (their sleep mode: sim.sleep_s,
    sim.wake_s), as `sluice simulate` runs it from the same spec."""
    with (
        running(tmp_path, SIM_SPEC, "chat's two", lambda s: len(s.ready("chat")) == 2, 120) as s,
        Api(s) as api,
    ):
        wait_until("the standby asleep", lambda: len(asleep(api)) == 1, 20)
        (sleeper,) = asleep(api)
        plane = gateway_knows_the_sleeper(api)
        assert (plane["instances"], plane["sleeping"]) == (1, 1), plane
        with ThreadPoolExecutor(3) as pool:
            answers = list(pool.map(lambda _: ask(s), range(3)))
        assert all(code == 200 for code, _, _ in answers), answers
        slowest = max(seconds for _, seconds, _ in answers)
        assert slowest < 3.5, answers  # 1 s wake + 1 s answer; a new instance takes 15 s
        assert sleeper in {iid for _, _, iid in answers}, answers
        for inst in api.ready("chat"):  # no request ever reached a sleeping worker
            assert worker_stats(inst)["refused_asleep"] == 0, inst


def test_a_burst_wakes_both_sleepers_at_once(tmp_path: Path) -> None:
    """Two sleeping standby and a burst of five on one 1-slot instance: four wait, more than
    one sleeper can take, so the gateway wakes both together (two wake calls at once, not
    one after the other) and both serve the burst."""
    spec = SIM_SPEC.replace("wake_s: 1.0", "wake_s: 2.0").replace(
        "{min: 1, max: 3, sleeping_standby: 1}", "{min: 1, max: 3, sleeping_standby: 2}"
    )
    with (
        running(tmp_path, spec, "chat's three", lambda s: len(s.ready("chat")) == 3, 120) as s,
        Api(s) as api,
    ):
        wait_until("both asleep", lambda: len(asleep(api)) == 2, 20)
        sleepers = set(asleep(api))
        with ThreadPoolExecutor(5) as pool:
            answers = list(pool.map(lambda _: ask(s), range(5)))
        assert all(code == 200 for code, _, _ in answers), answers
        assert sleepers <= {iid for _, _, iid in answers}, answers
        metrics = httpx.get(
            s.control_url + "/metrics", headers=s.control_headers(), timeout=10, trust_env=False
        ).text
        assert 'sluice_gateway_standby_wakes_total{group="chat"} 2.0' in metrics
        # both woke in the burst's first wake time: 2 s wake + 1 s answer, and the rest
        assert max(seconds for _, seconds, _ in answers) < 4.5, answers
        for inst in api.ready("chat"):  # no request ever reached a sleeping worker
            assert worker_stats(inst)["refused_asleep"] == 0, inst
