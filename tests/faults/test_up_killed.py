"""Fault: the `sluice up` process (gateway, controller and control API in one) is killed with
SIGKILL under a steady 20 req/s, and started again at once with plain `sluice up` (no -f) on
the same state directory and the same gateway port.

While no gateway listens every request fails (connection refused): those, and the ones in
flight on the killed gateway, are expected, and the gap (kill to the first answer of the new
gateway) is measured. Nothing else may fail. The workers live in their own sessions, so
they survive; the new run must adopt them: the same instance ids with the same pids, no
launch, and no extra worker of this state directory running (counted from /proc).

The second test kills `sluice up` while a new instance is still loading its model (8 s):
the restarted run must not route to it before its `/ready` says 200. It did, when
`InstanceSupervisor.recover` adopted on `/health` (a loading worker answers that 200): the
gateway sent requests to it and got 503 "still loading" until outlier ejection; recover
now adopts only on `/ready` and replaces an instance that is not ready.
"""

from __future__ import annotations

import time
from pathlib import Path

from tests.e2e.conftest import kill_workers_of
from tests.faults.conftest import (
    Api,
    Load,
    Outcome,
    PinnedSluice,
    group_spec,
    lines,
    platform_spec,
    report,
    wait_until,
    worker_pids,
)

SPEC = platform_spec(
    group_spec("chat", replicas=3), "  - {tag: chat-main, match: {models: [m-chat]}, to: chat}\n"
)
RATE = 20.0


def in_outage(o: Outcome, outcomes: list[Outcome], killed: float) -> bool:
    """A failure that belongs to the restart's gap: answered after the kill and sent before
    the first request that succeeded after it; or the restarted gateway's 503 "no routes
    yet" (before its controller's first routes) answered before that success was answered
    (two clients' send times race by milliseconds across the moment routes appear)."""
    ok = [x for x in outcomes if x.ok and x.sent > killed]
    if o.done < killed or not ok:
        return False
    if o.sent <= min(x.sent for x in ok):
        return True
    early = o.status == 503 and "no routes yet" in o.error
    return early and o.done <= min(x.done for x in ok)


def test_sigkill_of_sluice_up_then_restart_adopts_every_instance(tmp_path: Path) -> None:
    spec = tmp_path / "platform.yaml"
    spec.write_text(SPEC)
    s = PinnedSluice(tmp_path, spec)
    s.start()
    try:
        with Api(s) as api:
            wait_until("3 ready", lambda: len(api.ready("chat")) == 3, 90, 0.25)
            before = {i["id"]: i["pid"] for i in api.instances("chat")}
        assert worker_pids(tmp_path) == {i: [pid] for i, pid in before.items()}
        load = Load(s.endpoint, rate=RATE).start(max_s=60)
        try:
            time.sleep(3.0)
            killed = time.monotonic()
            s.kill()  # SIGKILL: no drain, no cleanup, control.json left behind
            s.start(with_spec=False)
            listening = time.monotonic()
            with Api(s) as api:
                adopted = wait_until(
                    "the same 3 instances ready",
                    lambda: {i["id"] for i in api.ready("chat")} == set(before),
                    60,
                )
                time.sleep(4.0)  # a few ticks: long enough to launch a duplicate, if it would
                after = {i["id"]: i["pid"] for i in api.instances("chat")}
                events = api.events("chat")
        finally:
            outcomes = load.stop()
        first_ok = min(o.sent for o in outcomes if o.ok and o.sent > killed)
        expected = [o for o in outcomes if not o.ok and in_outage(o, outcomes, killed)]
        unexpected = [o for o in outcomes if not o.ok and o not in expected]
        report(
            "sluice-up-sigkill-restart",
            len(outcomes),
            len(expected) + len(unexpected),
            len(expected),
            adopted - killed,
            gap_s=round(first_ok - killed, 2),
            restart_to_endpoint_s=round(listening - killed, 2),
            in_flight_at_kill=sum(1 for o in expected if o.sent < killed),
        )
        assert not unexpected, list(lines(unexpected))
        assert first_ok - killed < 20.0
        assert after == before  # the same instances, the same processes
        assert worker_pids(tmp_path) == {i: [pid] for i, pid in before.items()}  # no extra
        restarted_at = max(e["at"] for e in events if e["kind"] == "adopted")
        assert {e["instance"] for e in events if e["kind"] == "adopted"} == set(before)
        assert not [e for e in events if e["kind"] == "launch" and e["at"] >= restarted_at]
        # every answer after the gap came from an adopted instance
        assert {o.instance for o in outcomes if o.ok and o.sent > first_ok} <= set(before)
    finally:
        s.kill()
        kill_workers_of(tmp_path)


SLOW_SIM = "{startup_s: 8, service_time: {kind: fixed, seconds: 0.02}, memory_gb: 1}"
SLOW_SPEC = platform_spec(
    group_spec("chat", sim=SLOW_SIM), "  - {tag: chat-main, match: {models: [m-chat]}, to: chat}\n"
)


class RoutedBeforeReady(AssertionError):
    """The restarted gateway sent requests to an instance still loading its model."""


def test_sigkill_while_an_instance_loads_does_not_route_to_it_before_ready(
    tmp_path: Path,
) -> None:
    spec = tmp_path / "platform.yaml"
    spec.write_text(SLOW_SPEC)
    s = PinnedSluice(tmp_path, spec)
    s.start()
    try:
        with Api(s) as api:
            wait_until("1 ready", lambda: len(api.ready("chat")) == 1, 90, 0.25)
            api.post("/v1/groups/chat/scale", {"replicas": 2, "reason": "faults: scale up"})
            wait_until(
                "a second instance loading",
                lambda: any(i["state"] == "starting" for i in api.instances("chat")),
                30,
            )
            time.sleep(0.5)  # its record (pid, port) is written off the loop
        load = Load(s.endpoint, rate=RATE).start(max_s=60)
        try:
            time.sleep(1.0)
            killed = time.monotonic()
            s.kill()
            s.start(with_spec=False)
            with Api(s) as api:
                wait_until("2 ready", lambda: len(api.ready("chat")) == 2, 60)
                time.sleep(6.0)  # past the second instance's load time
        finally:
            outcomes = load.stop()
        first_ok = min(o.sent for o in outcomes if o.ok and o.sent > killed)
        unexpected = [o for o in outcomes if not o.ok and not in_outage(o, outcomes, killed)]
        report(
            "sluice-up-sigkill-while-loading",
            len(outcomes),
            sum(1 for o in outcomes if not o.ok),
            len(outcomes) - len(unexpected) - sum(1 for o in outcomes if o.ok),
            first_ok - killed,
            unexpected=len(unexpected),
        )
        loading = [o for o in unexpected if o.status == 503 and "still loading" in o.error]
        assert not [o for o in unexpected if o not in loading], list(lines(unexpected))
        if loading:
            raise RoutedBeforeReady(list(lines(loading)))
    finally:
        s.kill()
        kill_workers_of(tmp_path)
