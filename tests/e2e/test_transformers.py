"""End to end: a `transformers` group (the tiny random GPT-2 of tests/tiny_lm.py) behind a
real `sluice up`, driven through the gateway with the official openai client: tokens stream
one by one as they are generated, `usage` is right, plain completions work, and a client
that leaves the gateway mid-stream is a disconnect on the instance (which stops generating)."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Sluice, running
from tests.tiny_lm import TinyLM

pytestmark = pytest.mark.serial  # it measures time or rates: run alone (Makefile)

SPEC = """
gateway: {{host: 127.0.0.1, port: 0}}
pools:
  - {{name: local, count: 2, memory_gb: 16}}
groups:
  - name: lm
    owner: alice@example.com
    business: search
    alert_channel: "#search"
    models:
      tiny-lm:
        runtime: transformers
        version: r1
        transformers: {{model_path: "{path}", max_new_tokens: 1000}}
    resources: {{pool: local, accelerators: 1, memory_gb: 1}}
    max_concurrency: 2
    replicas: 1
    slow_start_s: 0
    warmup: {{requests: 1}}
    health: {{startup_timeout_s: 120}}
tenants:
  - name: e2e
    api_keys: [sk-e2e-f78ed04e82bcf081]
routes:
  - tag: lm-main
    match: {{models: [tiny-lm]}}
    to: lm
"""
MESSAGES: Any = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def platform(tiny_lm: TinyLM, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sluice]:
    home = tmp_path_factory.mktemp("transformers")
    spec = SPEC.format(path=tiny_lm.main)
    with running(home, spec, "the lm group ready", lambda s: bool(s.ready("lm")), 180) as s:
        yield s


@pytest.fixture(scope="module")
def tokenizer(tiny_lm: TinyLM) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_lm.main), local_files_only=True)


def test_tokens_stream_through_the_gateway_one_by_one(platform: Sluice, tokenizer: Any) -> None:
    client = platform.client()
    arrivals: list[tuple[float, str]] = []
    chunks = []
    # The arrival times are this process's readings: no collector pause in between (as the
    # first test of a whole run, with every module collected, one took ~0.25 s here and
    # the tokens then read as one burst)
    gc.collect()
    gc.disable()
    try:
        sent = time.perf_counter()
        stream = client.chat.completions.create(
            model="tiny-lm",
            messages=MESSAGES,
            max_tokens=300,
            seed=42,
            stream=True,
            stream_options={"include_usage": True},
        )
        for chunk in stream:
            chunks.append(chunk)
            if chunk.choices and chunk.choices[0].delta.content:
                arrivals.append((time.perf_counter() - sent, chunk.choices[0].delta.content))
    finally:
        gc.enable()
    assert len(arrivals) > 50
    first, last = arrivals[0][0], arrivals[-1][0]
    # Streamed as generated, not buffered to the end anywhere on the way: the first token
    # arrives well before the last one (a ratio, whatever the machine's speed).
    assert first < last / 2, f"first token at {first:.3f}s, last at {last:.3f}s"
    assert len({round(t, 4) for t, _ in arrivals}) > len(arrivals) / 2

    usage = chunks[-1].usage
    assert usage is not None and not chunks[-1].choices
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert usage.prompt_tokens == len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    assert usage.completion_tokens == 300  # the tiny model has no EOS: it runs to max_tokens
    assert usage.total_tokens == usage.prompt_tokens + 300
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == ["length"]

    # The same request (same seed) without streaming: the same text, the same usage.
    whole = client.chat.completions.create(
        model="tiny-lm", messages=MESSAGES, max_tokens=300, seed=42
    )
    assert whole.choices[0].message.content == "".join(text for _, text in arrivals)
    assert whole.usage is not None
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (
        usage.prompt_tokens,
        300,
    )


def test_text_completions_through_the_gateway(platform: Sluice, tokenizer: Any) -> None:
    client = platform.client()
    raw = client.completions.with_raw_response.create(
        model="tiny-lm", prompt="the quick brown fox", max_tokens=12, temperature=0
    )
    result = raw.parse()
    assert raw.headers["x-sluice-group"] == "lm"
    assert result.usage is not None
    assert result.usage.prompt_tokens == len(tokenizer("the quick brown fox")["input_ids"])
    assert result.usage.completion_tokens == 12
    assert result.choices[0].finish_reason == "length"
    again = client.completions.create(
        model="tiny-lm", prompt="the quick brown fox", max_tokens=12, temperature=0
    )
    assert again.choices[0].text == result.choices[0].text  # greedy: the same every time
    assert result.system_fingerprint == "tiny-lm:r1"


def test_a_client_leaving_mid_stream_reaches_the_instance_as_a_disconnect(platform: Sluice) -> None:
    [instance] = platform.ready("lm")
    stats_url = instance["url"] + "/stats"
    before = httpx.get(stats_url, timeout=5).json()
    body = {"model": "tiny-lm", "messages": MESSAGES, "max_tokens": 1000, "stream": True}
    headers = {"Authorization": "Bearer sk-e2e-f78ed04e82bcf081"}
    with (
        httpx.Client(base_url=platform.endpoint, timeout=30, trust_env=False) as client,
        client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r,
    ):
        assert r.status_code == 200
        events = 0
        for line in r.iter_lines():
            events += line.startswith("data: ")
            if events == 3:
                break  # 1000 tokens take the tiny model about a second: leave long before
    deadline = time.monotonic() + 30
    after = before
    while time.monotonic() < deadline:
        after = httpx.get(stats_url, timeout=5).json()
        if after["inflight"] == 0 and after["requests_total"] > before["requests_total"]:
            break
        time.sleep(0.05)
    # The gateway cancelled its upstream request and the worker saw the disconnect (not a
    # response it finished): that closes the stream, which stops the generation thread
    # within one token (tests/integration/test_transformers_runtime.py counts the passes).
    assert after["disconnected"] - before["disconnected"] == 1, after
    assert after["served"] == before["served"] and after["inflight"] == 0
