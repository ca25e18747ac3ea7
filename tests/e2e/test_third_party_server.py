"""A `command` group running a real third-party OpenAI-compatible server: Hugging Face's
`transformers serve` (FastAPI + uvicorn, no Sluice code in it) on the tiny random GPT-2 of
`tests/tiny_lm.py`, fully offline, through a real `sluice up`.

`transformers serve MODEL` pins the server to MODEL and answers only requests whose `model`
is that exact string (others get 400), and `/v1/models` lists it under that name: so the
group's model id is the model directory's path, passed as `{model_path}`, and the default
readiness (the first `/v1/models` that lists the model) holds once the weights are loaded.

One `sluice up` (each start of the server costs seconds of torch import on this machine):
warm-up requests reach each server before traffic, chat through the gateway with the
official `openai` client (non-streaming with `usage`, and streaming chunk by chunk), `kill -9`
of one server under load is replaced, and a drain 2 -> 1 under an open-loop streaming load
loses no request while a long stream the drained server holds runs to its end.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Sluice, running
from tests.faults.conftest import Api, Load, Outcome, in_flight, lines, report, wait_until
from tests.tiny_lm import TinyLM

pytestmark = pytest.mark.serial  # it measures time or rates: run alone (Makefile)

pytest.importorskip("fastapi")
pytest.importorskip(
    "accelerate", reason="`transformers serve` loads models with accelerate: the embedding extra"
)

SHORT_TOKENS = 16
LONG_TOKENS = 300
STARTUP_S = 120  # torch import + model load, two servers at once on a busy 2-core machine


def spec(model: str) -> str:
    argv = [
        sys.executable, "-m", "transformers.cli.transformers", "serve", "{model_path}",
        "--host", "{host}", "--port", "{port}", "--device", "cpu", "--log-level", "info",
    ]  # fmt: skip
    return f"""
gateway: {{host: 127.0.0.1, port: 0}}
pools:
  - {{name: cpu, accelerator: virtual, count: 4, memory_gb: 16}}
groups:
  - name: tf
    owner: ops@example.com
    business: search
    alert_channel: "#ops"
    models:
      "{model}":
        runtime: command
        command:
          argv: [{", ".join(f'"{a}"' for a in argv)}]
          model_path: "{model}"
          health_path: /health
          stop_grace_s: 10
          env: {{HF_HUB_OFFLINE: "1", TRANSFORMERS_OFFLINE: "1", OMP_NUM_THREADS: "1"}}
    resources: {{pool: cpu, accelerators: 1, memory_gb: 1}}
    max_concurrency: 8
    replicas: 2
    slow_start_s: 0
    warmup: {{requests: 2, timeout_s: 60}}
    health: {{interval_s: 0.5, failure_threshold: 3, timeout_s: 5, startup_timeout_s: {STARTUP_S}}}
    drain_timeout_s: 60
tenants:
  - {{name: search, api_keys: [sk-search-b095adcc724f4f8a]}}
routes:
  - {{tag: r-tf, match: {{models: ["{model}"]}}, to: tf}}
"""


def stream(
    client: httpx.Client, model: str, max_tokens: int, on_chunk: Callable[[str], None] | None = None
) -> tuple[int, str, str]:
    """One streaming chat request: (status, instance, error); ok only if the stream ends
    with the server's last chunks (finish_reason `length`, then the usage chunk that
    `stream_options.include_usage` asks for, with usage = max_tokens) after every token: a
    server stopped mid-stream cannot be hidden by a retry once bytes were sent."""
    status, instance, error = 0, "", ""
    try:
        with client.stream(
            "POST",
            "/v1/chat/completions",
            headers={"Authorization": "Bearer sk-search-b095adcc724f4f8a"},
            json={
                "model": model,
                "max_tokens": max_tokens,
                "stream": True,
                "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": "hi"}],
            },
        ) as r:
            status, instance = r.status_code, r.headers.get("x-sluice-instance", "")
            events = []
            for ln in r.iter_lines():
                if ln.startswith("data: ") and ln != "data: [DONE]":
                    events.append(ln)
                    if on_chunk is not None:
                        on_chunk(instance)
        last = events[-1] if events else ""
        if status == 200 and (
            not any('"finish_reason":"length"' in e for e in events[-2:])
            or f'"completion_tokens":{max_tokens}' not in last
        ):
            status, error = 599, f"stream cut after {len(events)} events: {last[-300:]}"
        elif status != 200:
            error = f"status {status}"
    except httpx.HTTPError as exc:
        status, error = 0, repr(exc)[:300]
    return status, instance, error


class StreamLoad(Load):
    """`Load` whose requests stream SHORT_TOKENS tokens each (see `stream`)."""

    def _one_at(self, due: float) -> Outcome:
        sent = time.monotonic()
        status, instance, error = stream(self.client, self.model, SHORT_TOKENS)
        out = Outcome(due, sent, time.monotonic(), status, "tf", instance, error)
        with self._lock:
            self._done.append(out)
        return out


class LongStream(threading.Thread):
    """A long streaming request in the background; `started` once its first chunk came."""

    def __init__(self, endpoint: str, model: str) -> None:
        super().__init__(daemon=True)
        self.client = httpx.Client(base_url=endpoint, trust_env=False, timeout=120)
        self.model = model
        self.started = threading.Event()
        self.instance = ""
        self.result: tuple[int, str, str] = (0, "", "not run")
        self.done_at = 0.0

    def _chunk(self, instance: str) -> None:
        self.instance = instance
        self.started.set()

    def run(self) -> None:
        try:
            self.result = stream(self.client, self.model, LONG_TOKENS, self._chunk)
        finally:
            self.done_at = time.monotonic()
            self.started.set()
            self.client.close()


def log_of(s: Sluice, instance: str) -> str:
    return (s.home / "instances" / f"{instance}.log").read_text(errors="replace")


@pytest.mark.timeout(600)
def test_transformers_serve_behind_a_command_group(tmp_path: Path, tiny_lm: TinyLM) -> None:
    model = str(tiny_lm.main)
    t0 = time.monotonic()
    with (
        running(
            tmp_path, spec(model), "2 ready", lambda s: len(s.ready("tf")) == 2, timeout=STARTUP_S
        ) as s,
        Api(s) as api,
    ):
        startup_s = time.monotonic() - t0
        ready = api.ready("tf")
        for inst in ready:  # warm-up: two real chat requests reached each server first
            log = log_of(s, inst["id"])
            assert "Uvicorn running on http://127.0.0.1:" in log  # it is transformers serve
            assert log.count('"POST /v1/chat/completions HTTP/1.1" 200') == 2, log[-2000:]

        # non-streaming through the gateway to the official client, with usage
        client = s.client("sk-search-b095adcc724f4f8a")
        r = client.chat.completions.create(
            model=model, max_tokens=5, messages=[{"role": "user", "content": "hello world"}]
        )
        assert r.model == model and r.choices[0].finish_reason == "length"
        assert r.choices[0].message.content
        assert r.usage is not None and r.usage.completion_tokens == 5 and r.usage.prompt_tokens > 0

        # streaming: what SSE promises is several events in order, text, then the finish
        # reason last. How many deltas carry text is the server's choice (its detokenizer
        # may hold a token back until a word ends) and how bytes are grouped is the
        # network's, so neither is asserted.
        chunks = list(
            client.chat.completions.create(
                model=model,
                max_tokens=8,
                stream=True,
                messages=[{"role": "user", "content": "hello world"}],
            )
        )
        assert len(chunks) >= 2, chunks
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert chunks[-1].choices[0].finish_reason == "length"
        assert all(c.choices[0].finish_reason is None for c in chunks[:-1] if c.choices)
        # the gateway asked the server for the stream's usage on the caller's behalf, counted
        # its tokens from it (8, not the server's choice of deltas) and kept the chunk out
        assert all(c.usage is None and c.choices for c in chunks)
        assert _completion_tokens(s, "tf", "search") == 5 + 8
        # a model the server was not started with: its own 400 comes through the gateway
        bad = httpx.post(
            f"{s.endpoint}/v1/chat/completions",
            headers={"Authorization": "Bearer sk-search-b095adcc724f4f8a"},
            json={"model": "other", "messages": [{"role": "user", "content": "x"}]},
            timeout=30,
        )
        assert bad.status_code in (400, 404), bad.text

        kill = _kill_9_is_replaced(s, api, model)
        drain = _drain_under_load_loses_nothing(s, api, model)
        report("transformers-serve-startup", 0, 0, 0, startup_s)
        report("transformers-serve-kill-9", *kill)
        report("transformers-serve-drain", *drain[:4], **drain[4])


def _completion_tokens(s: Sluice, group: str, tenant: str) -> float:
    """The gateway's completion token count for `group` and `tenant` (control API /metrics)."""
    text = httpx.get(f"{s.control_url}/metrics", headers=s.control_headers(), timeout=10).text
    for line in text.splitlines():
        if line.startswith("sluice_gateway_completion_tokens_total{") and (
            f'group="{group}"' in line and f'tenant="{tenant}"' in line
        ):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _kill_9_is_replaced(s: Sluice, api: Api, model: str) -> tuple[int, int, int, float]:
    load = StreamLoad(s.endpoint, model=model, rate=4.0).start(max_s=STARTUP_S)
    try:
        time.sleep(2.0)
        victim = api.ready("tf")[0]
        os.kill(victim["pid"], signal.SIGKILL)
        killed = time.monotonic()
        back = wait_until(
            "a replacement ready",
            lambda: len(r := api.ready("tf")) == 2 and victim["id"] not in {i["id"] for i in r},
            timeout=STARTUP_S,
        )
        time.sleep(1.0)
    finally:
        outcomes = load.stop()
    failed = [o for o in outcomes if not o.ok]
    assert len(failed) <= in_flight(outcomes, killed), "\n".join(lines(outcomes))
    [failure] = [e for e in api.events("tf") if e["kind"] == "failed"]
    assert "process exited with code -9" in failure["message"]
    assert failure["detail"]["log_tail"]
    assert len(outcomes) >= 20
    return len(outcomes), len(failed), in_flight(outcomes, killed), back - killed


def _drain_under_load_loses_nothing(
    s: Sluice, api: Api, model: str
) -> tuple[int, int, int, float, dict[str, Any]]:
    ready = {i["id"] for i in api.ready("tf")}
    assert len(ready) == 2
    load = StreamLoad(s.endpoint, model=model, rate=3.0).start(max_s=STARTUP_S)
    longs: list[LongStream] = []
    try:
        time.sleep(2.0)
        # a long stream on each server, so whichever one drains holds one to its end
        while {ls.instance for ls in longs if ls.is_alive()} != ready:
            assert len(longs) < 8, [(ls.instance, ls.result) for ls in longs]
            ls = LongStream(s.endpoint, model)
            ls.start()
            assert ls.started.wait(60)
            longs.append(ls)
        alive = [ls for ls in longs if ls.is_alive()]
        scaled_at = time.monotonic()
        s.cli("scale", "tf", "1", "--reason", "drain under load")
        wait_until("one instance left", lambda: len(api.instances("tf")) == 1, timeout=90)
        stopped_at = time.monotonic()
        time.sleep(2.0)
    finally:
        outcomes = load.stop()
        for ls in longs:
            ls.join(120)
    (left,) = api.instances("tf")
    [drained] = sorted(ready - {left["id"]})
    failed = [o for o in outcomes if not o.ok]
    long_failed = [ls.result for ls in longs if ls.result[0] != 200]
    held = [ls for ls in alive if ls.instance == drained]
    evs = api.events("tf")
    at = {e["kind"]: float(e["at"]) for e in evs if e["instance"] == drained}
    assert not failed, "\n".join(lines(outcomes))
    assert not long_failed, long_failed
    assert held and all(ls.done_at > scaled_at for ls in held)  # the drain waited for it
    assert not [e for e in evs if e["kind"] == "drain-timeout"]
    assert len(outcomes) >= 15
    return (
        len(outcomes) + len(longs),
        len(failed) + len(long_failed),
        0,
        stopped_at - scaled_at,
        {"drain_s": round(at["stopped"] - at["drain"], 2), "long_streams_on_drained": len(held)},
    )
