"""A `command` group through a real `sluice up`: a third-party-like OpenAI-compatible server
(`openai_stub.py`, no Sluice code in it) launched from an argv template behind the gateway.

It warms up, streams to the official `openai` client, drains under load without losing a
request although the server itself dies at once on SIGTERM (Sluice waits for the gateway's
in-flight count for that instance), is replaced after `kill -9`, and every bad command ends
`failed` with its log's last lines in the event, under crash-loop backoff.
"""

from __future__ import annotations

import itertools
import os
import signal
import sys
import time
from pathlib import Path

import httpx

from tests.e2e.conftest import Sluice, kill_workers_of, running
from tests.faults.conftest import (
    Api,
    Load,
    Outcome,
    PinnedSluice,
    in_flight,
    lines,
    report,
    wait_until,
)

STUB = str(Path(__file__).with_name("openai_stub.py"))
TOKENS = 10
TOKEN_DELAY_S = 0.1


def group(
    name: str, argv: str, *, replicas: int = 2, startup_s: float = 20, extra: str = ""
) -> str:
    return f"""
  - name: {name}
    owner: ops@example.com
    business: search
    alert_channel: "#ops"
    models:
      m-{name}:
        runtime: command
        command:
          argv: {argv}
          stop_grace_s: 1
{extra}
    resources: {{pool: gpu, accelerators: 1, memory_gb: 1}}
    max_concurrency: 16
    replicas: {replicas}
    slow_start_s: 0
    warmup: {{requests: 2}}
    health: {{interval_s: 0.5, failure_threshold: 2, timeout_s: 1, startup_timeout_s: {startup_s}}}
    drain_timeout_s: 30
"""


def stub_argv(*flags: str) -> str:
    args = [sys.executable, STUB, "--host", "{host}", "--port", "{port}", "--model", "{model}"]
    return "[" + ", ".join(f'"{a}"' for a in [*args, "--name", "gpu{gpu_ids}", *flags]) + "]"


def platform(groups: str, models: list[str]) -> str:
    routes = "".join(f"  - {{tag: r-{m}, match: {{models: [m-{m}]}}, to: {m}}}\n" for m in models)
    return (
        "gateway: {host: 127.0.0.1, port: 0}\n"
        "pools:\n  - {name: gpu, accelerator: fake-gpu, count: 8, memory_gb: 16, "
        "devices: [0, 1, 2, 3, 4, 5, 6, 7]}\n"
        "groups:"
        + groups
        + "tenants:\n  - {name: search, api_keys: [sk-search-b095adcc724f4f8a]}\n"
        + "routes:\n"
        + routes
    )


CHAT = platform(
    group("chat", stub_argv("--token-delay", str(TOKEN_DELAY_S), "--delay", "0.05")), ["chat"]
)


class StreamLoad(Load):
    """`Load` whose requests stream TOKENS tokens, TOKEN_DELAY_S apart: a request is only
    ok if its stream ends with [DONE] after every token (a server stopped mid-stream
    cannot be hidden by the gateway's retry, which needs nothing to have been sent)."""

    def _one_at(self, due: float) -> Outcome:
        sent = time.monotonic()
        status, instance, error = 0, "", ""
        try:
            with self.client.stream(
                "POST",
                "/v1/chat/completions",
                headers={"Authorization": self.auth},
                json={
                    "model": self.model,
                    "max_tokens": TOKENS,
                    "stream": True,
                    "messages": [{"role": "user", "content": "x"}],
                },
            ) as r:
                status, instance = r.status_code, r.headers.get("x-sluice-instance", "")
                data = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
            if status == 200 and (len(data) != TOKENS + 1 or data[-1] != "data: [DONE]"):
                status, error = 599, f"stream cut after {len(data)} events"
        except httpx.HTTPError as exc:
            status, error = 0, repr(exc)[:300]
        out = Outcome(due, sent, time.monotonic(), status, "chat", instance, error)
        with self._lock:
            self._done.append(out)
        return out


def chat_ready(s: Sluice, n: int = 2) -> bool:
    return len(s.ready("chat")) == n


def test_a_command_group_warms_up_streams_and_drains_under_load_losing_nothing(
    tmp_path: Path,
) -> None:
    with running(tmp_path, CHAT, "2 ready", chat_ready) as s, Api(s) as api:
        ready = api.ready("chat")
        assert sorted(i["devices"] for i in ready) == ["0", "1"]  # pinned, one device each
        for inst in ready:  # warm-up: two real requests reached each server before traffic
            log = (s.home / "instances" / f"{inst['id']}.log").read_text()
            assert log.count("POST /v1/chat/completions") == 2

        # streaming through the gateway to the official client: token by token, with usage
        stream = s.client("sk-search-b095adcc724f4f8a").chat.completions.create(
            model="m-chat",
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "one two three"}],
        )
        arrivals, text, usage = [], "", None
        for chunk in stream:
            arrivals.append(time.monotonic())
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            if chunk.usage is not None:
                usage = chunk.usage
        assert text == "w0 w1 w2 w3 w4"
        assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (3, 5)
        gaps = [b - a for a, b in itertools.pairwise(arrivals[:4])]
        assert min(gaps) > TOKEN_DELAY_S / 2  # chunks arrived one by one, not buffered

        # drain under a streaming load: each request is in flight for about 1 s
        load = StreamLoad(s.endpoint, model="m-chat", rate=8.0).start(max_s=30)
        try:
            time.sleep(3.0)
            scaled_at = time.monotonic()
            s.cli("scale", "chat", "1", "--reason", "drain under load")
            wait_until("one instance left", lambda: len(api.instances("chat")) == 1, timeout=40)
            stopped_at = time.monotonic()
            time.sleep(2.0)
        finally:
            outcomes = load.stop()
        (left,) = api.instances("chat")
        [drained] = [i["id"] for i in ready if i["id"] != left["id"]]
        failed = [o for o in outcomes if not o.ok]
        evs = api.events("chat")
        drain_s = _between(evs, drained, "drain", "stopped")
        # the drain began with requests in flight on the instance (event times are wall
        # clock, the outcomes' monotonic)
        drain_at = _at(evs, drained, "drain") - (time.time() - time.monotonic())
        late = [o for o in outcomes if o.instance == drained and o.sent < drain_at < o.done]
        report(
            "command-drain-under-load",
            len(outcomes),
            len(failed),
            0,
            stopped_at - scaled_at,
            drain_s=round(drain_s, 2),
            in_flight_at_drain=len(late),
        )
        assert not failed, "\n".join(lines(outcomes))
        assert late, "the drain overlapped no in-flight request: the test proved nothing"
        assert not [e for e in evs if e["kind"] == "drain-timeout"]
        assert drain_s < 30  # ended on the gateway's count, not on drain_timeout_s
        assert len(outcomes) >= 30


def _at(events: list[dict[str, object]], instance: str, kind: str) -> float:
    return next(
        float(str(e["at"])) for e in events if e["instance"] == instance and e["kind"] == kind
    )


def _between(events: list[dict[str, object]], instance: str, first: str, then: str) -> float:
    return _at(events, instance, then) - _at(events, instance, first)


def test_kill_9_of_a_command_server_is_replaced_under_load(tmp_path: Path) -> None:
    with running(tmp_path, CHAT, "2 ready", chat_ready) as s, Api(s) as api:
        load = Load(s.endpoint, model="m-chat", rate=20.0).start(max_s=40)
        try:
            time.sleep(2.0)
            victim = api.ready("chat")[0]
            os.kill(victim["pid"], signal.SIGKILL)
            killed = time.monotonic()
            back = wait_until(
                "a replacement ready",
                lambda: (
                    len(r := api.ready("chat")) == 2 and victim["id"] not in {i["id"] for i in r}
                ),
                timeout=30,
            )
            time.sleep(2.0)
        finally:
            outcomes = load.stop()
        failed = [o for o in outcomes if not o.ok]
        report("command-kill-9", len(outcomes), len(failed), 0, back - killed)
        assert len(failed) <= min(16, in_flight(outcomes, killed)), "\n".join(lines(outcomes))
        [failure] = [e for e in api.events("chat") if e["kind"] == "failed"]
        assert "process exited with code -9" in failure["message"]
        assert failure["detail"]["log_tail"]  # what the server said last
        devices = [i["devices"] for i in api.ready("chat")]
        assert len(set(devices)) == 2 and "" not in devices  # still one device each


BAD = {
    "exits": (
        f'["{sys.executable}", "-c", "import sys; print(\'fatal: cannot load /models/nope\'); '
        f'sys.exit(3)", "{{port}}"]',
        "exited with code 3 before it listened",
        "fatal: cannot load /models/nope",
    ),
    "never": (stub_argv("--never-ready"), "/v1/models answered 503, not 200", "GET /v1/models"),
    "wrongport": (
        stub_argv().replace('"--port", "{port}"', '"--port", "0"'),
        "did not listen on 127.0.0.1:",
        "listening on 127.0.0.1:",
    ),
    "garbage": (stub_argv("--garbage"), "not an OpenAI model list", "binary noise"),
}


def test_bad_commands_go_failed_with_their_log_lines_and_back_off(tmp_path: Path) -> None:
    port_in_env = '          env: {UNUSED: "{port}"}'  # the template must take {port}
    groups = "".join(
        group(name, argv, replicas=1, startup_s=3, extra=port_in_env if name == "wrongport" else "")
        for name, (argv, _, _) in BAD.items()
    )
    text = platform(groups, list(BAD))
    with running(tmp_path, text, "sluice up", lambda s: True) as s, Api(s) as api:

        def failed_twice() -> bool:
            return all(sum(e["kind"] == "failed" for e in api.events(name)) >= 2 for name in BAD)

        wait_until("every bad group failed twice", failed_twice, timeout=60)
        for name, (_, says, in_log) in BAD.items():
            evs = api.events(name)
            failures = [e for e in evs if e["kind"] == "failed"]
            for f in failures:
                assert says in f["message"], (name, f["message"])
                tail = f["detail"]["log_tail"]
                assert any(in_log in line for line in tail), (name, tail)
                assert all(line.isprintable() for line in tail)
            assert any(e["kind"] == "backoff" for e in evs), (name, [e["kind"] for e in evs])
        assert not api.ready("never")


def test_a_restarted_sluice_adopts_command_servers_with_their_devices(tmp_path: Path) -> None:
    """SIGKILL of `sluice up`: the servers live on in their own sessions; the next run knows
    them by SLUICE_INSTANCE_ID in their environment, keeps them, and remembers their
    devices, so a new instance is not pinned to a device one of them holds."""
    spec = tmp_path / "platform.yaml"
    spec.write_text(CHAT)
    s = PinnedSluice(tmp_path, spec)
    s.start()
    try:
        with Api(s) as api:
            wait_until("2 ready", lambda: len(api.ready("chat")) == 2, 60)
            before = {i["id"]: (i["pid"], i["devices"]) for i in api.instances("chat")}
        s.kill()
        s.start(with_spec=False)
        with Api(s) as api:
            wait_until(
                "the same 2 ready", lambda: {i["id"] for i in api.ready("chat")} == set(before), 60
            )
            after = {i["id"]: (i["pid"], i["devices"]) for i in api.instances("chat")}
            assert after == before  # same processes, same devices
            assert sum(e["kind"] == "adopted" for e in api.events("chat")) == 2
            s.cli("scale", "chat", "3", "--reason", "one more")
            wait_until("3 ready", lambda: len(api.ready("chat")) == 3, 60)
            devices = [i["devices"] for i in api.ready("chat")]
            assert len(set(devices)) == 3, devices  # the new one took a free device
        r = s.client("sk-search-b095adcc724f4f8a").chat.completions.create(
            model="m-chat", max_tokens=2, messages=[{"role": "user", "content": "hi"}]
        )
        assert r.choices[0].message.content == "w0 w1"
    finally:
        s.kill()
        kill_workers_of(tmp_path)
