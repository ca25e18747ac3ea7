"""The worker as the controller runs it: a real `python -m sluice.worker` subprocess."""

from __future__ import annotations

import json
import math
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

START_TIMEOUT_S = 20.0
EMBEDDING_LOAD_TIMEOUT_S = 120.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def sim(seconds: float, startup_s: float = 0.0, version: str = "v1", **extra: Any) -> dict:
    return {
        "runtime": "sim",
        "version": version,
        "sim": {"startup_s": startup_s, "service_time": {"kind": "fixed", "seconds": seconds}}
        | extra,
    }


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def logs(self) -> str:
        return self.log.read_text(errors="replace")

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.url + path, timeout=5)

    def post(self, path: str, body: Any, timeout: float = 10) -> httpx.Response:
        return httpx.post(self.url + path, json=body, timeout=timeout)

    def wait_for(self, path: str, timeout: float) -> httpx.Response:
        """Poll until `path` answers 200; fail with the worker's log if it never does."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"worker exited early:\n{self.logs()}"
            try:
                response = self.get(path)
                if response.status_code == 200:
                    return response
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        pytest.fail(f"{path} not 200 after {timeout}s:\n{self.logs()}")

    def stats(self) -> dict[str, Any]:
        return self.get("/stats").json()

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="x", max_retries=0, timeout=30)


Launch = Callable[..., Worker]


@pytest.fixture(scope="module")
def launch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launch]:
    """Start workers on free ports; every one is killed at teardown, whatever happened."""
    started: list[tuple[subprocess.Popen[bytes], Any]] = []

    def start(models: dict[str, dict], max_concurrency: int = 8) -> Worker:
        port = free_port()
        config = {
            "instance_id": f"grp-{port}",
            "group": "grp",
            "host": "127.0.0.1",
            "port": port,
            "max_concurrency": max_concurrency,
            "models": models,
        }
        log = tmp_path_factory.mktemp("worker") / "stderr.log"
        sink = log.open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "sluice.worker", "--config-json", json.dumps(config)],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
        started.append((proc, sink))
        worker = Worker(proc, f"http://127.0.0.1:{port}", log)
        worker.wait_for("/health", START_TIMEOUT_S)
        return worker

    yield start
    for proc, sink in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        sink.close()


@pytest.fixture(scope="module")
def worker(launch: Launch) -> Worker:
    """One ready sim worker shared by the request/response tests."""
    started = launch(
        {
            "chat-sim": sim(0.05, version="v3", output_tokens=8),
            "slow-sim": sim(0.6),
        }
    )
    started.wait_for("/ready", START_TIMEOUT_S)
    return started


def test_bad_config_exits_with_2() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sluice.worker", "--config-json", '{"port": 1}'],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "invalid config" in result.stderr
    assert "instance_id" in result.stderr


def test_ready_only_after_the_models_load(launch: Launch) -> None:
    loading = launch({"m": sim(0.01, startup_s=1.5)})
    assert loading.get("/health").json()["status"] == "ok"
    not_ready = loading.get("/ready")
    assert not_ready.status_code == 503
    assert not_ready.json()["ready"] is False
    early = loading.post("/v1/completions", {"model": "m", "prompt": "hi"})
    assert early.status_code == 503
    assert early.json()["error"]["code"] == "unavailable"
    assert loading.stats()["ready"] is False

    assert loading.wait_for("/ready", START_TIMEOUT_S).json() == {"ready": True}
    assert loading.stats()["ready"] is True


def test_chat_completion_with_the_openai_client(worker: Worker) -> None:
    with worker.openai() as client:
        raw = client.chat.completions.with_raw_response.create(
            model="chat-sim", messages=[{"role": "user", "content": "say something nice"}]
        )
    answer = raw.parse()
    assert raw.headers["x-sluice-model-version"] == "v3"
    assert answer.model == "chat-sim"
    assert answer.system_fingerprint == "chat-sim:v3"
    assert answer.choices[0].message.content == " ".join(f"tok{i}" for i in range(8))
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (3, 8)


def test_streaming_chat_yields_tokens_as_they_are_produced(worker: Worker) -> None:
    arrivals: list[float] = []
    pieces: list[str] = []
    chunks = []
    with worker.openai() as client:
        start = time.monotonic()
        stream = client.chat.completions.create(
            model="slow-sim",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
        for chunk in stream:
            chunks.append(chunk)
            assert chunk.system_fingerprint == "slow-sim:v1"
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
                arrivals.append(time.monotonic() - start)
    assert "".join(pieces) == "tok0 tok1 tok2 tok3 tok4 tok5"
    assert len(pieces) == 6
    finals = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finals[-1] == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    # Spread over the 0.6 s service time, not delivered in one burst at the end.
    assert arrivals[-1] - arrivals[0] > 0.3


def test_streaming_response_is_server_sent_events(worker: Worker) -> None:
    body = {"model": "chat-sim", "prompt": "x", "max_tokens": 2, "stream": True}
    with httpx.stream("POST", worker.url + "/v1/completions", json=body, timeout=10) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-sluice-model-version"] == "v3"
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    texts = [json.loads(line[6:])["choices"][0]["text"] for line in lines[:-1]]
    assert texts == ["tok0", " tok1", ""]


def test_text_completion(worker: Worker) -> None:
    with worker.openai() as client:
        answer = client.completions.create(model="chat-sim", prompt="one two three", max_tokens=4)
    assert answer.object == "text_completion"
    assert answer.choices[0].text == "tok0 tok1 tok2 tok3"
    assert answer.choices[0].finish_reason == "length"
    assert answer.system_fingerprint == "chat-sim:v3"
    assert answer.usage is not None and answer.usage.prompt_tokens == 3


def test_sim_embeddings_are_deterministic(worker: Worker) -> None:
    with worker.openai() as client:
        first = client.embeddings.create(model="chat-sim", input=["a cat", "a dog"])
        again = client.embeddings.create(model="chat-sim", input="a cat")
    assert [len(item.embedding) for item in first.data] == [384, 384]
    assert again.data[0].embedding == pytest.approx(first.data[0].embedding, abs=1e-6)
    assert first.usage.prompt_tokens == 4


def test_models_are_listed(worker: Worker) -> None:
    with worker.openai() as client:
        ids = sorted(model.id for model in client.models.list())
    assert ids == ["chat-sim", "slow-sim"]


def test_unknown_model_is_a_404_json_error(worker: Worker) -> None:
    response = worker.post("/v1/chat/completions", {"model": "nope", "messages": []})
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    assert "nope" in response.json()["error"]["message"]
    with worker.openai() as client, pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x")


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"messages": [{"role": "user", "content": "x"}]}', "model"),
        (b'{"model": "chat-sim"}', "messages"),
        (b'{"model": "chat-sim", "messages": [], "max_tokens": 0}', "max_tokens"),
    ],
)
def test_malformed_requests_are_400(worker: Worker, body: bytes, fragment: str) -> None:
    response = httpx.post(worker.url + "/v1/chat/completions", content=body, timeout=5)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert fragment in error["message"]


def test_metrics_count_requests_by_model_and_status(worker: Worker) -> None:
    worker.post("/v1/completions", {"model": "chat-sim", "prompt": "x"})
    text = worker.get("/metrics").text
    assert 'sluice_worker_requests_total{model="chat-sim",status="200"}' in text
    assert "sluice_worker_inflight 0.0" in text
    assert 'sluice_worker_request_seconds_count{model="chat-sim"}' in text


def test_concurrency_limit_queues_the_excess(launch: Launch) -> None:
    limited = launch({"m": sim(0.5)}, max_concurrency=2)
    limited.wait_for("/ready", START_TIMEOUT_S)
    body = {"model": "m", "prompt": "x"}

    def timed_request() -> tuple[int, float]:
        start = time.monotonic()
        status = limited.post("/v1/completions", body).status_code
        return status, time.monotonic() - start

    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = [pool.submit(timed_request) for _ in range(4)]
        deadline = time.monotonic() + 5
        busy = limited.stats()
        # Sample until all four are in and two wait: a request that finished its slot but
        # not yet its last byte still counts in flight, so stopping at inflight == 4 alone
        # can catch the instant the second round starts.
        while (busy["inflight"], busy["queued"]) != (4, 2) and time.monotonic() < deadline:
            time.sleep(0.02)
            busy = limited.stats()
        results = [future.result(timeout=10) for future in futures]

    assert (busy["inflight"], busy["queued"]) == (4, 2)
    assert [status for status, _ in results] == [200] * 4
    latencies = sorted(seconds for _, seconds in results)
    assert latencies[1] < 0.9 <= latencies[2], f"expected two rounds: {latencies}"
    after = limited.stats()
    assert (after["inflight"], after["queued"], after["served"], after["errors"]) == (0, 0, 4, 0)


def test_sigterm_finishes_in_flight_requests_then_exits_0(launch: Launch) -> None:
    draining = launch({"m": sim(1.5)})
    draining.wait_for("/ready", START_TIMEOUT_S)
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(draining.post, "/v1/completions", {"model": "m", "prompt": "x"})
        deadline = time.monotonic() + 5
        while draining.stats()["inflight"] < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        draining.proc.send_signal(signal.SIGTERM)
        refused = False
        deadline = time.monotonic() + 1.0
        while not refused and time.monotonic() < deadline:
            try:
                draining.get("/health")
                time.sleep(0.02)
            except (httpx.ConnectError, httpx.RemoteProtocolError):
                # Refused, or accepted in the moment before the listener closed and then
                # closed unanswered: either way the request was not taken.
                refused = True
        response = pending.result(timeout=10)
    assert refused, "the worker kept accepting connections after SIGTERM"
    assert response.status_code == 200
    assert response.json()["choices"][0]["text"].startswith("tok0")
    assert draining.proc.wait(timeout=10) == 0, draining.logs()


def _cosine(a: list[float], b: list[float]) -> float:
    dot = math.fsum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(math.fsum(x * x for x in a) * math.fsum(y * y for y in b))


@pytest.mark.embedding
def test_embedding_runtime_serves_real_sentence_vectors(launch: Launch) -> None:
    embedder = launch({"minilm": {"runtime": "embedding", "version": "v2"}})
    embedder.wait_for("/ready", EMBEDDING_LOAD_TIMEOUT_S)
    sentences = [
        "The cat sat on the mat.",
        "A kitten was sitting on a rug.",
        "Quarterly interest rates rose sharply.",
    ]
    with embedder.openai() as client:
        result = client.embeddings.create(model="minilm", input=sentences)
    vectors = [item.embedding for item in result.data]
    assert [len(v) for v in vectors] == [384, 384, 384]
    assert _cosine(vectors[0], vectors[1]) > _cosine(vectors[0], vectors[2]) + 0.2
    assert result.usage.prompt_tokens > len(sentences)

    single = embedder.post("/v1/embeddings", {"model": "minilm", "input": sentences[0]})
    assert single.status_code == 200
    assert single.headers["x-sluice-model-version"] == "v2"
    assert single.json()["data"][0]["embedding"] == pytest.approx(vectors[0], abs=1e-5)

    chat = embedder.post(
        "/v1/chat/completions",
        {"model": "minilm", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert chat.status_code == 400
    assert "/v1/embeddings" in chat.json()["error"]["message"]


# --- Canary analysis: per-request samples, resource counters, bad-canary behaviours -------


def _samples(worker: Worker, after: int = 0, limit: int | None = None) -> dict[str, Any]:
    query = f"?after={after}" + ("" if limit is None else f"&limit={limit}")
    response = worker.get("/sluice/samples" + query)
    assert response.status_code == 200, response.text
    return response.json()


def test_samples_record_each_request_kind(launch: Launch) -> None:
    fresh = launch({"m": sim(0.4, version="v2", output_tokens=5)})
    fresh.wait_for("/ready", START_TIMEOUT_S)
    assert _samples(fresh) == {"next": 0, "samples": []}

    chat = {"model": "m", "messages": [{"role": "user", "content": "hello there"}]}
    assert fresh.post("/v1/chat/completions", chat).status_code == 200
    with httpx.stream(
        "POST", fresh.url + "/v1/chat/completions", json=chat | {"stream": True}, timeout=10
    ) as response:
        assert response.status_code == 200
        list(response.iter_lines())
    assert fresh.post("/v1/embeddings", {"model": "m", "input": "a b"}).status_code == 200
    assert fresh.post("/v1/completions", {"model": "nope", "prompt": "x"}).status_code == 404

    page = _samples(fresh)
    assert page["next"] == 4
    plain, streamed, embedded, missing = page["samples"]
    assert [s["seq"] for s in page["samples"]] == [1, 2, 3, 4]
    assert set(plain) == {
        "seq", "at", "model", "status", "latency_s", "ttft_s", "tpot_s",
        "output_tokens", "finish_reason", "text",
    }  # fmt: skip
    assert plain["model"] == "m" and plain["status"] == 200
    assert plain["ttft_s"] is None and plain["tpot_s"] is None
    assert (plain["output_tokens"], plain["finish_reason"]) == (5, "stop")
    assert plain["text"] == "tok0 tok1 tok2 tok3 tok4"
    assert plain["latency_s"] >= 0.4
    assert abs(plain["at"] - time.time()) < 30

    # Five tokens paced over 0.4 s: the first after ~0.08 s, then one every ~0.08 s.
    assert streamed["status"] == 200 and streamed["output_tokens"] == 5
    assert streamed["text"] == plain["text"] and streamed["finish_reason"] == "stop"
    assert 0.04 < streamed["ttft_s"] < 0.3
    assert streamed["tpot_s"] == pytest.approx(
        (streamed["latency_s"] - streamed["ttft_s"]) / 4, rel=1e-6
    )
    assert 0.04 < streamed["tpot_s"] < 0.2

    assert embedded["status"] == 200 and embedded["text"] is None
    assert embedded["output_tokens"] is None and embedded["finish_reason"] is None
    assert missing["status"] == 404 and missing["model"] is None


def test_samples_page_with_after_and_limit(launch: Launch) -> None:
    fresh = launch({"m": sim(0.0, output_tokens=2)})
    fresh.wait_for("/ready", START_TIMEOUT_S)
    for i in range(5):
        fresh.post("/v1/completions", {"model": "m", "prompt": f"p{i}"})
    first = _samples(fresh, after=0, limit=2)
    assert [s["seq"] for s in first["samples"]] == [1, 2] and first["next"] == 2
    rest = _samples(fresh, after=first["next"], limit=10)
    assert [s["seq"] for s in rest["samples"]] == [3, 4, 5] and rest["next"] == 5
    assert _samples(fresh, after=5) == {"next": 5, "samples": []}
    # A cursor from before a restart (beyond the last seq) starts over.
    assert [s["seq"] for s in _samples(fresh, after=99, limit=1)["samples"]] == [1]
    for query, name in [("?limit=0", "limit"), ("?after=x", "after"), ("?after=-1", "after")]:
        bad = fresh.get("/sluice/samples" + query)
        assert bad.status_code == 400 and name in bad.json()["error"]["message"]


def test_stats_report_resource_counters(launch: Launch) -> None:
    fresh = launch({"a": sim(0.0, memory_gb=2.5), "b": sim(0.0, memory_gb=0.5)})
    fresh.wait_for("/ready", START_TIMEOUT_S)
    before = fresh.stats()
    for _ in range(3):
        fresh.post("/v1/completions", {"model": "a", "prompt": "x"})
    fresh.post("/v1/completions", {"model": "nope", "prompt": "x"})
    after = fresh.stats()
    assert {"inflight", "queued", "served", "errors", "ready"} <= set(after)
    assert after["requests_total"] - before["requests_total"] == 4
    assert after["requests_total"] == after["served"] + after["errors"]
    assert after["cpu_s_total"] >= before["cpu_s_total"] > 0
    assert 10 * 2**20 < after["rss_bytes"] < 4 * 2**30
    assert after["memory_gb"] == pytest.approx(3.0)


def test_error_rate_answers_500_with_an_openai_error(launch: Launch) -> None:
    failing = launch({"bad": sim(0.01, error_rate=1.0), "half": sim(0.0, error_rate=0.5)})
    failing.wait_for("/ready", START_TIMEOUT_S)
    chat = {"model": "bad", "messages": [{"role": "user", "content": "x"}]}
    response = failing.post("/v1/chat/completions", chat)
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["code"] == "internal_error" and error["type"] == "server_error"
    assert "error_rate" in error["message"]
    streamed = failing.post("/v1/chat/completions", chat | {"stream": True})
    assert streamed.status_code == 500, "a stream must fail before its 200 goes out"
    with failing.openai() as client, pytest.raises(openai.InternalServerError):
        client.embeddings.create(model="bad", input="x")

    statuses = [
        failing.post("/v1/completions", {"model": "half", "prompt": "x"}).status_code
        for _ in range(40)
    ]
    assert set(statuses) == {200, 500}
    samples = _samples(failing)["samples"]
    assert [s["status"] for s in samples[:3]] == [500, 500, 500]
    assert samples[0]["output_tokens"] is None and samples[0]["text"] is None
    assert failing.stats()["errors"] == 3 + statuses.count(500)


def test_empty_rate_answers_empty_text(launch: Launch) -> None:
    empty = launch({"m": sim(0.05, empty_rate=1.0)})
    empty.wait_for("/ready", START_TIMEOUT_S)
    with empty.openai() as client:
        answer = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}]
        )
        chunks = list(
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x"}], stream=True
            )
        )
    assert answer.choices[0].message.content == ""
    assert answer.usage is not None and answer.usage.completion_tokens == 0
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert not any(c.choices[0].delta.content for c in chunks if c.choices)
    plain, streamed = _samples(empty)["samples"]
    assert (plain["output_tokens"], plain["text"]) == (0, "")
    assert (streamed["output_tokens"], streamed["text"], streamed["ttft_s"]) == (0, "", None)


def test_seeded_text_depends_on_version_and_prompt_not_instance(launch: Launch) -> None:
    models = {
        "old": sim(0.0, version="v1", seed=7),
        "new": sim(0.0, version="v2", seed=7),
    }
    first, second = launch(models), launch(models)
    first.wait_for("/ready", START_TIMEOUT_S)
    second.wait_for("/ready", START_TIMEOUT_S)

    def text(worker: Worker, model: str, prompt: str) -> str:
        body = {"model": model, "prompt": prompt, "max_tokens": 12}
        return worker.post("/v1/completions", body).json()["choices"][0]["text"]

    old = text(first, "old", "tell me a story")
    assert old == text(second, "old", "tell me a story")
    assert "tok" not in old and len(old.split()) == 12
    assert old != text(first, "new", "tell me a story")
    assert old != text(first, "old", "another prompt")


# --- Clients that go away ----------------------------------------------------------------


def _raw_post(worker: Worker, path: str, body: dict[str, Any]) -> socket.socket:
    """A request sent on a socket of its own, whose answer nobody will read."""
    payload = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", int(worker.url.rsplit(":", 1)[1])), timeout=5)
    sock.sendall(
        b"POST %s HTTP/1.1\r\nhost: w\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (path.encode(), len(payload), payload)
    )
    return sock


def _wait_idle(worker: Worker, timeout: float = 5.0) -> float:
    """Seconds until the worker has nothing in flight (fails after `timeout`)."""
    start = time.monotonic()
    while (stats := worker.stats())["inflight"] or stats["queued"]:
        assert time.monotonic() - start < timeout, f"still busy: {stats}"
        time.sleep(0.02)
    return time.monotonic() - start


def test_a_client_leaving_stops_its_generation_and_frees_the_slot(launch: Launch) -> None:
    busy = launch({"slow": sim(30.0, output_tokens=300), "fast": sim(0.01)}, max_concurrency=2)
    busy.wait_for("/ready", START_TIMEOUT_S)
    chat = {"model": "slow", "messages": [{"role": "user", "content": "x"}]}
    kinds = [
        ("/v1/chat/completions", chat),  # non-streaming, in a slot
        ("/v1/chat/completions", chat | {"stream": True}),  # streaming, in a slot
        ("/v1/completions", {"model": "slow", "prompt": "x"}),  # waiting for a slot
        ("/v1/embeddings", {"model": "slow", "input": "x"}),  # waiting for a slot
    ]
    socks = [_raw_post(busy, path, body) for path, body in kinds]
    partial = socket.create_connection(("127.0.0.1", int(busy.url.rsplit(":", 1)[1])))
    partial.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: w\r\ncontent-length: 99\r\n\r\n{")
    socks.append(partial)  # and one still sending its body
    deadline = time.monotonic() + 5
    while (busy.stats()["inflight"], busy.stats()["queued"]) != (5, 2):
        assert time.monotonic() < deadline, busy.stats()
        time.sleep(0.02)
    assert socks[1].recv(65536).startswith(b"HTTP/1.1 200 OK")  # the stream has begun
    for sock in socks:
        sock.close()
    freed = _wait_idle(busy)
    start = time.monotonic()
    fast = busy.post("/v1/completions", {"model": "fast", "prompt": "x"})
    took = time.monotonic() - start
    print(
        f"\n5 clients left: worker idle after {freed * 1000:.0f} ms; next took {took * 1000:.0f} ms"
    )
    assert fast.status_code == 200 and took < 5.0
    stats = busy.stats()
    assert (stats["disconnected"], stats["errors"], stats["served"]) == (5, 0, 1)
    assert stats["requests_total"] == 6
    rows = _samples(busy)["samples"]
    assert sorted(row["status"] for row in rows) == [200] + [499] * 5
    streamed = next(r for r in rows if r["status"] == 499 and r["output_tokens"] is not None)
    assert streamed["output_tokens"] < 300  # stopped early, not generated to the end
    metrics = busy.get("/metrics").text
    assert 'sluice_worker_requests_total{model="slow",status="disconnected"} 4.0' in metrics
    assert 'status="error"' not in metrics


def test_deeply_nested_json_is_a_400_on_the_worker(worker: Worker) -> None:
    deep = b'{"model":"chat-sim","x":' + b"[" * 5000 + b"]" * 5000 + b"}"
    response = httpx.post(worker.url + "/v1/completions", content=deep, timeout=5)
    assert response.status_code == 400, response.text
    assert "nested too deeply" in response.json()["error"]["message"]


def test_a_sim_worker_sleeps_and_wakes_as_vllms_sleep_mode(launch: Launch) -> None:
    """POST /sleep answers once asleep (`sim.sleep_s` later); asleep it refuses requests with
    a 503 naming the wake but stays ready (weights in host memory, the process healthy);
    POST /wake_up answers once awake (`sim.wake_s` later) and it serves again."""
    w = launch({"m": sim(0.01, sleep_s=0.3, wake_s=0.6)})
    w.wait_for("/ready", START_TIMEOUT_S)
    assert w.get("/is_sleeping").json() == {"is_sleeping": False}
    t0 = time.monotonic()
    assert httpx.post(w.url + "/sleep?level=1", timeout=10).status_code == 200
    assert time.monotonic() - t0 >= 0.3
    assert w.get("/is_sleeping").json() == {"is_sleeping": True}
    refused = w.post("/v1/completions", {"model": "m", "prompt": "hi"})
    assert refused.status_code == 503 and "/wake_up" in refused.json()["error"]["message"]
    assert w.get("/ready").status_code == 200
    assert w.stats()["refused_asleep"] == 1 and w.stats()["sleep_state"] == "asleep"
    assert httpx.post(w.url + "/sleep?level=3", timeout=10).status_code == 400
    t0 = time.monotonic()
    assert httpx.post(w.url + "/wake_up", timeout=10).status_code == 200
    assert time.monotonic() - t0 >= 0.6
    assert w.get("/is_sleeping").json() == {"is_sleeping": False}
    assert w.post("/v1/completions", {"model": "m", "prompt": "hi"}).status_code == 200


def test_a_worker_of_real_models_has_no_sleep_mode(launch: Launch) -> None:
    w = launch({"m": sim(0.01), "e": {"runtime": "embedding", "version": "v1"}})
    assert httpx.post(w.url + "/sleep", timeout=10).status_code == 404
    assert w.get("/is_sleeping").status_code == 404
