"""A real `python -m sluice.worker` serving the tiny random GPT-2 with the `transformers`
runtime: readiness after load and warm-up, the OpenAI wire format (streams with usage,
text completions, stop, errors before a stream starts), and a client that leaves."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.integration.test_worker import Worker, free_port
from tests.tiny_lm import TinyLM

LOAD_TIMEOUT_S = 120.0
MESSAGES = [{"role": "user", "content": "hello there"}]


def config(model_path: Path, max_concurrency: int = 4, **params: Any) -> dict[str, Any]:
    port = free_port()
    return {
        "instance_id": f"lm-{port}",
        "group": "lm",
        "host": "127.0.0.1",
        "port": port,
        "max_concurrency": max_concurrency,
        "models": {
            "tiny": {
                "runtime": "transformers",
                "version": "r1",
                "transformers": {"model_path": str(model_path), **params},
            }
        },
    }


def start(cfg: dict[str, Any], log: Path) -> Worker:
    sink = log.open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "sluice.worker", "--config-json", json.dumps(cfg)],
        stdout=sink,
        stderr=subprocess.STDOUT,
    )
    sink.close()  # the child holds its own copy
    return Worker(proc, f"http://127.0.0.1:{cfg['port']}", log)


def stop(worker: Worker) -> None:
    if worker.proc.poll() is None:
        worker.proc.kill()
    worker.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def served(tiny_lm: TinyLM, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    """One worker, max_concurrency 1 (the disconnect test needs to see its slot freed)."""
    worker = start(
        config(tiny_lm.main, max_concurrency=1, max_new_tokens=1000),
        tmp_path_factory.mktemp("lm") / "worker.log",
    )
    try:
        worker.wait_for("/health", 20)
        first = worker.get("/ready")
        # torch alone takes over a second to import: the first answer is "still loading"
        assert (first.status_code, first.json().get("loading")) == (503, ["tiny"])
        worker.wait_for("/ready", LOAD_TIMEOUT_S)
        yield worker
    finally:
        stop(worker)


@pytest.fixture(scope="module")
def tokenizer(tiny_lm: TinyLM) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_lm.main), local_files_only=True)


def test_the_model_is_listed_and_loaded(served: Worker) -> None:
    [model] = served.get("/v1/models").json()["data"]
    assert (model["id"], model["runtime"], model["version"], model["ready"]) == (
        "tiny",
        "transformers",
        "r1",
        True,
    )


def test_a_chat_stream_sends_tokens_then_usage(served: Worker, tokenizer: Any) -> None:
    chunks = list(
        served.openai().chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            max_tokens=30,
            seed=5,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    content = [
        c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
    ]
    assert len(content) > 5
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    usage = chunks[-1].usage
    assert usage is not None and not chunks[-1].choices
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert usage.prompt_tokens == len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    assert (usage.completion_tokens, usage.total_tokens) == (30, usage.prompt_tokens + 30)
    whole = served.openai().chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=30, seed=5
    )
    assert whole.choices[0].message.content == "".join(content)
    assert whole.usage is not None and whole.usage.completion_tokens == 30


def test_a_text_completion_with_a_stop_string(served: Worker) -> None:
    client = served.openai()
    free = client.completions.create(model="tiny", prompt="the river", max_tokens=40, temperature=0)
    text = free.choices[0].text
    stop = text[15:18]
    for given in (stop, [stop, "never-there"]):  # one string, or a list of them
        cut = client.completions.create(
            model="tiny", prompt="the river", max_tokens=40, temperature=0, stop=given
        )
        assert cut.choices[0].text == text[: text.find(stop)]
        assert cut.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("temperature", 2.5, "temperature"),
        ("top_p", 0, "top_p"),
        ("stop", ["a", "b", "c", "d", "e"], "at most 4 items"),
        ("stop", "x" * 1001, "at most 1000 characters"),
        ("seed", 2**63, "seed"),
    ],
)
def test_sampling_fields_out_of_range_are_400(
    served: Worker, field: str, value: object, fragment: str
) -> None:
    r = served.post("/v1/completions", {"model": "tiny", "prompt": "hi", field: value})
    assert r.status_code == 400 and fragment in r.json()["error"]["message"]


def test_a_prompt_past_the_context_is_a_400_even_for_a_stream(served: Worker) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        served.openai().completions.create(
            model="tiny", prompt="hello " * 600, max_tokens=5, stream=True
        )
    assert caught.value.code == "context_length_exceeded"


def test_embeddings_are_refused(served: Worker) -> None:
    r = served.post("/v1/embeddings", {"model": "tiny", "input": "x"})
    assert r.status_code == 400 and "does not serve /v1/embeddings" in r.text


def test_a_client_that_leaves_frees_the_slot(served: Worker) -> None:
    before = served.stats()
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 1000, "stream": True}
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", served.url + "/v1/completions", json=body) as r,
    ):
        events = 0
        for line in r.iter_lines():
            events += line.startswith("data: ")
            if events == 3:
                break  # leave mid-stream: the connection closes here
    deadline = time.monotonic() + 30
    while served.stats()["inflight"] and time.monotonic() < deadline:
        time.sleep(0.05)
    after = served.stats()
    assert (after["inflight"], after["disconnected"] - before["disconnected"]) == (0, 1)
    # The one slot is free again: the next request is served, not queued behind 1000 tokens.
    quick = served.post("/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 2})
    assert quick.status_code == 200 and quick.json()["usage"]["completion_tokens"] == 2


def test_a_model_directory_gone_at_launch_fails_the_worker_saying_why(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "gone"
    worker = start(config(missing), tmp_path / "worker.log")
    try:
        assert worker.proc.wait(timeout=LOAD_TIMEOUT_S) == 1
    finally:
        stop(worker)
    assert "model 'tiny' failed to load" in worker.logs() and str(missing) in worker.logs()
