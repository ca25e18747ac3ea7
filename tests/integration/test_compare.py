"""`sluice compare` against real worker processes (direct URL targets) and, once, through a
real `sluice up` gateway with an operator tenant (group:NAME targets)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sluice.tools import CompareOptions, compare, parse_target
from tests.integration.test_worker import (
    EMBEDDING_LOAD_TIMEOUT_S,
    START_TIMEOUT_S,
    Launch,
    sim,
)
from tests.integration.test_worker import launch as launch  # the fixture, re-used

DATA = Path(__file__).parents[1] / "data"
CHAT_SUITE = DATA / "compare_chat.jsonl"
EMBED_SUITE = DATA / "compare_embed.jsonl"


def sluice_cli(*args: str, home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "SLUICE_API_KEY"}
    environ |= {"SLUICE_HOME": str(home), **env}
    return subprocess.run(
        [sys.executable, "-m", "sluice", "compare", *args],
        capture_output=True,
        text=True,
        env=environ,
        timeout=120,
    )


def compare_json(*args: str, home: Path, **env: str) -> dict[str, Any]:
    r = sluice_cli(*args, "--json", home=home, **env)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stdout}{r.stderr}"
    return json.loads(r.stdout)


def chat_sim(version: str, seed: int, output_tokens: int, **extra: Any) -> dict[str, Any]:
    return sim(0.01, version=version, seed=seed, output_tokens=output_tokens, **extra)


@pytest.fixture(scope="module")
def baseline(launch: Launch) -> str:
    worker = launch({"m": chat_sim("v1", 3, 16)})
    worker.wait_for("/ready", START_TIMEOUT_S)
    return worker.url


@pytest.fixture(scope="module")
def canary(launch: Launch) -> str:
    """Another version that writes in another style, four times as long."""
    worker = launch({"m": chat_sim("v2", 4, 64)})
    worker.wait_for("/ready", START_TIMEOUT_S)
    return worker.url


@pytest.fixture(scope="module")
def different(
    baseline: str, canary: str, tmp_path_factory: pytest.TempPathFactory
) -> tuple[dict[str, Any], Path]:
    """One CLI run, baseline against canary, with a report directory."""
    home = tmp_path_factory.mktemp("home")
    report = home / "report"
    result = compare_json(
        "--suite", str(CHAT_SUITE), "--a", baseline, "--b", canary, "--report", str(report),
        "--worst", "3", home=home,
    )  # fmt: skip
    return result, report


def test_the_same_behaviour_twice_matches_exactly(
    launch: Launch, baseline: str, tmp_path: Path
) -> None:
    twin = launch({"m": chat_sim("v1", 3, 16)})  # another instance, same version and seed
    twin.wait_for("/ready", START_TIMEOUT_S)
    result = compare_json(
        "--suite", str(CHAT_SUITE), "--a", baseline, "--b", twin.url, home=tmp_path
    )
    summary = result["summary"]
    assert result["schema"] == "sluice.compare/1"
    assert (summary["items"], summary["compared"]) == (12, 12)
    assert summary["exact_match_rate"] == 1.0
    assert summary["text"]["similarity"] == {"mean": 1.0, "median": 1.0, "min": 1.0}
    assert summary["text"]["length_ks"]["statistic"] == 0.0
    assert summary["errors"] == {"a": 0, "b": 0}
    assert summary["status"] == {"a": {"200": 12}, "b": {"200": 12}}
    first = result["items"][0]
    assert (first["id"], first["line"], first["kind"], first["exact"]) == (
        "chat-01",
        1,
        "chat",
        True,
    )
    assert first["a"]["text"] == first["b"]["text"] and "tok" not in first["a"]["text"]


def test_different_behaviours_differ_in_text_and_length(
    different: tuple[dict[str, Any], Path], baseline: str, canary: str
) -> None:
    result, _ = different
    assert result["a"] == {"target": baseline, "url": baseline, "group": None}
    summary, text = result["summary"], result["summary"]["text"]
    assert summary["exact_match_rate"] == 0.0
    assert text["similarity"]["mean"] < 0.6 and text["similarity"]["median"] < 0.6
    assert text["output_tokens"]["a"]["p50"] == 16 and text["output_tokens"]["b"]["p50"] == 64
    # 11 of 12 items differ in length (one caps max_tokens at 8 on both sides).
    assert text["length_ks"]["statistic"] == pytest.approx(11 / 12)
    assert text["length_ks"]["p_value"] < 0.01
    assert text["finish_reason"] == {"a": {"stop": 11, "length": 1}, "b": {"stop": 11, "length": 1}}
    assert text["empty_rate"] == {"a": 0.0, "b": 0.0}
    assert text["style"]["a"]["words_per_sentence"] == pytest.approx((11 * 16 + 8) / 12)
    assert text["style"]["b"]["refusal_rate"] == 0.0
    assert summary["latency_s"]["a"]["count"] == 12 and summary["latency_s"]["b"]["p95"] > 0

    worst = result["worst"]
    assert len(worst) == 3
    assert [w["similarity"] for w in worst] == sorted(w["similarity"] for w in worst)
    assert worst[0]["similarity"] <= min(i["similarity"] for i in result["items"])
    assert all(w["a"]["text"] and w["b"]["text"] for w in worst)
    assert {w["a"]["version"] for w in worst} == {"v1"}
    assert {w["b"]["version"] for w in worst} == {"v2"}
    capped = next(i for i in result["items"] if i["id"] == "chat-04")
    assert capped["a"]["output_tokens"] == capped["b"]["output_tokens"] == 8


def test_report_writes_a_page_with_plots_and_the_json(
    different: tuple[dict[str, Any], Path],
) -> None:
    result, report = different
    assert result["report"] == str(report / "index.html")
    page = (report / "index.html").read_text()
    for png in ("lengths.png", "similarity.png", "latency.png"):
        assert (report / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f'src="{png}"' in page
    assert "Worst-differing items" in page and result["worst"][0]["id"] in page
    archived = json.loads((report / "compare.json").read_text())
    assert archived["summary"] == result["summary"]


def test_errors_on_one_side_are_counted_not_compared(baseline: str, launch: Launch) -> None:
    flaky = launch({"m": chat_sim("v1", 3, 16, error_rate=0.5)})
    flaky.wait_for("/ready", START_TIMEOUT_S)
    a = parse_target(baseline, "--a", None)
    b = parse_target(flaky.url + "/v1", "--b", None)
    assert b.url == flaky.url
    result = asyncio.run(compare(CHAT_SUITE, a, b, CompareOptions(concurrency=2)))
    summary = result["summary"]
    failed = [i for i in result["items"] if i["b"]["error"]]
    assert 0 < summary["errors"]["b"] == len(failed) < 12
    assert summary["status"]["b"] == {"200": 12 - len(failed), "500": len(failed)}
    assert summary["compared"] == 12 - len(failed) and summary["exact_match_rate"] == 1.0
    assert all(i["exact"] is None and i["similarity"] is None for i in failed)
    assert "error_rate" in failed[0]["b"]["error"] and failed[0]["b"]["status"] == 500


def test_a_bad_suite_line_names_file_and_line(tmp_path: Path) -> None:
    suite = tmp_path / "suite.jsonl"
    good = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    suite.write_text(f"{good}\n\n{{not json\n" + json.dumps({"model": "m"}) + "\n")
    r = sluice_cli("--suite", str(suite), "--a", "http://127.0.0.1:9", "--b", "http://127.0.0.1:9",
                   home=tmp_path)  # fmt: skip
    assert r.returncode == 2
    assert f"{suite}:3: (top level): not valid JSON" in r.stderr
    assert f"{suite}:4: (top level): give exactly one of 'messages'" in r.stderr

    r = sluice_cli("--suite", str(suite), "--a", "http://127.0.0.1:9", "--b", "x", "--json",
                   home=tmp_path)  # fmt: skip
    assert r.returncode == 2
    [issue] = json.loads(r.stdout)["error"]["issues"]
    assert issue["field"] == "--b" and "group:NAME" in issue["message"]


def test_an_unreachable_target_is_unavailable(baseline: str, tmp_path: Path) -> None:
    r = sluice_cli("--suite", str(CHAT_SUITE), "--a", baseline, "--b", "http://127.0.0.1:9",
                   "--timeout", "5", "--json", home=tmp_path)  # fmt: skip
    assert r.returncode == 6
    assert "--b http://127.0.0.1:9" in json.loads(r.stdout)["error"]["message"]
    r = sluice_cli("--suite", str(CHAT_SUITE), "--a", "group:x", "--b", baseline, home=tmp_path)
    assert r.returncode == 6 and "--endpoint" in r.stderr


@pytest.mark.embedding
def test_two_embedding_instances_agree(launch: Launch, tmp_path: Path) -> None:
    first = launch({"e": {"runtime": "embedding", "version": "minilm"}})
    second = launch({"e": {"runtime": "embedding", "version": "minilm"}})
    first.wait_for("/ready", EMBEDDING_LOAD_TIMEOUT_S)
    second.wait_for("/ready", EMBEDDING_LOAD_TIMEOUT_S)
    result = compare_json("--suite", str(EMBED_SUITE), "--a", first.url, "--b", second.url,
                          "--report", str(tmp_path / "r"), home=tmp_path)  # fmt: skip
    summary = result["summary"]
    assert summary["kinds"] == {"embedding": 6} and summary["compared"] == 6
    assert summary["embedding"]["cosine"]["min"] == pytest.approx(1.0, abs=1e-4)
    assert summary["text"]["compared"] == 0 and summary["text"]["length_ks"] is None
    assert all(i["a"]["text"] is None and i["cosine"] is not None for i in result["items"])
    assert (tmp_path / "r" / "index.html").exists()


# --- group:NAME through a real gateway ------------------------------------------------------

SPEC = """
gateway: {host: 127.0.0.1, port: 0}
pools:
  - {name: local, count: 4, memory_gb: 16}
groups:
  - name: stable
    owner: alice@example.com
    business: search
    alert_channel: "#search"
    models:
      m: {runtime: sim, version: v1, sim: {startup_s: 0.1, seed: 3, output_tokens: 16,
          service_time: {kind: fixed, seconds: 0.01}}}
    resources: {pool: local, accelerators: 1, memory_gb: 2}
    replicas: 1
  - name: canary
    owner: alice@example.com
    business: search
    alert_channel: "#search"
    models:
      m: {runtime: sim, version: v2, sim: {startup_s: 0.1, seed: 4, output_tokens: 64,
          service_time: {kind: fixed, seconds: 0.01}}}
    resources: {pool: local, accelerators: 1, memory_gb: 2}
    replicas: 1
tenants:
  - {name: ops, api_keys: [sk-ops-c391959605db2757], operator: true}
  - {name: app, api_keys: [sk-app-72016003589eb0bb]}
routes:
  - {tag: main, match: {models: [m]}, to: stable}
"""


@pytest.fixture(scope="module")
def gateway_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """`sluice up` with a stable and a canary group; yields its state directory once both
    groups answer through the gateway."""
    home = tmp_path_factory.mktemp("up")
    spec = home / "spec.yaml"
    spec.write_text(SPEC)
    env = {**os.environ, "SLUICE_HOME": str(home)}
    cmd = [sys.executable, "-m", "sluice", "up", "-f", str(spec), "--log-level", "warning"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    lines: list[str] = []
    found = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("endpoint: "):
                found.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        assert found.wait(60), "sluice up printed no endpoint:\n" + "".join(lines)
        endpoint = json.loads((home / "control.json").read_text())["endpoint"]
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        for group in ("stable", "canary"):
            headers = {"authorization": "Bearer sk-ops-c391959605db2757", "x-sluice-group": group}
            deadline = time.monotonic() + 60
            while True:
                r = httpx.post(endpoint + "/v1/chat/completions", json=body, headers=headers)
                if r.status_code == 200:
                    break
                assert time.monotonic() < deadline, f"{group}: {r.status_code} {r.text}"
                time.sleep(0.2)
        yield home
    finally:
        proc.send_signal(signal.SIGINT)  # stops the fleet; SIGTERM would hand it over
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        reader.join(10)
        assert proc.stdout is not None
        proc.stdout.close()


def test_group_targets_go_through_the_gateway(gateway_home: Path) -> None:
    result = compare_json("--suite", str(CHAT_SUITE), "--a", "group:stable", "--b", "group:canary",
                          home=gateway_home, SLUICE_API_KEY="sk-ops-c391959605db2757")  # fmt: skip
    endpoint = json.loads((gateway_home / "control.json").read_text())["endpoint"]
    assert result["a"] == {"target": "group:stable", "url": endpoint, "group": "stable"}
    summary = result["summary"]
    assert summary["compared"] == 12 and summary["exact_match_rate"] == 0.0
    assert summary["text"]["output_tokens"]["b"]["p50"] == 64
    assert {i["b"]["version"] for i in result["items"]} == {"v2"}

    # Only operator tenants may pick a group: for others the header is ignored and the
    # route rules send both sides to the stable group.
    other = compare_json("--suite", str(CHAT_SUITE), "--a", "group:stable", "--b", "group:canary",
                         "--api-key", "sk-app-72016003589eb0bb", home=gateway_home)  # fmt: skip
    assert other["summary"]["exact_match_rate"] == 1.0
    assert {i["b"]["version"] for i in other["items"]} == {"v1"}


# --- the pure parts, without processes ------------------------------------------------------


def test_scores_of_texts_and_vectors() -> None:
    from sluice.policy.compare import cosine, distribution, jaccard, percentile, sequence_ratio

    assert sequence_ratio("", "") == 1.0 and sequence_ratio("abc", "xyz") == 0.0
    assert sequence_ratio("the cat sat", "the cat sat down") == pytest.approx(22 / 27)
    assert jaccard("The cat", "the dog") == pytest.approx(1 / 3) and jaccard("", "") == 1.0
    assert cosine([1.0, 0.0], [2.0, 0.0]) == pytest.approx(1.0)
    assert cosine([1.0, 0.0], [0.0, 0.0]) == 0.0 and cosine([1.0], [1.0, 2.0]) == 0.0
    assert percentile([1, 2, 3, 4], 50) == 2.5 and percentile([], 50) is None
    assert distribution([]) == dict.fromkeys(("mean", "min", "p50", "p95", "max")) | {"count": 0}


def test_suite_rules_are_checked_per_line(tmp_path: Path) -> None:
    from sluice.core.errors import SpecError
    from sluice.tools import load_suite

    chat = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    lines = [
        chat | {"id": "one"},
        chat | {"id": "one"},
        chat | {"stream": True},
        {"model": "m", "input": "a", "prompt": "b"},
        {"model": "m", "messages": []},
        {"model": "m", "prompt": "text", "id": 7},
    ]
    suite = tmp_path / "s.jsonl"
    suite.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    with pytest.raises(SpecError) as caught:
        load_suite(suite)
    assert [(i.line, i.field) for i in caught.value.issues] == [
        (2, "id"), (3, "stream"), (4, ""), (5, "messages"),
    ]  # fmt: skip
    suite.write_text(json.dumps(lines[-1]) + "\n" + json.dumps(lines[0]) + "\n")
    first, second = load_suite(suite)
    assert (first.id, first.kind, "id" in first.body) == ("7", "completion", False)
    assert (second.id, second.kind, second.line) == ("one", "chat", 2)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(SpecError, match="no requests"):
        load_suite(empty)


def test_answers_are_read_from_each_api_shape() -> None:
    import base64
    import struct

    from sluice.tools.compare import read_answer

    chat = {
        "choices": [{"message": {"content": "hi there"}, "finish_reason": "stop"}],
        "usage": {"completion_tokens": 2},
    }
    answer = read_answer("chat", 200, chat, 0.1, "v1")
    assert (answer.ok, answer.text, answer.output_tokens, answer.finish_reason) == (
        True, "hi there", 2, "stop",
    )  # fmt: skip
    packed = base64.b64encode(struct.pack("<2f", 0.5, -1.0)).decode()
    vectors = {"data": [{"index": 1, "embedding": packed}, {"index": 0, "embedding": [1, 0]}]}
    assert read_answer("embedding", 200, vectors, 0.1, None).vectors == ((1.0, 0.0), (0.5, -1.0))
    failed = read_answer("completion", 500, {"error": {"message": "boom"}}, 0.1, None)
    assert (failed.ok, failed.error) == (False, "boom")
    broken = read_answer("completion", 200, {"choices": []}, 0.1, None)
    assert not broken.ok and broken.error is not None and "unreadable" in broken.error
