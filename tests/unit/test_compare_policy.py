"""Compare's pure core (`sluice.policy.compare`) and its two shells: `sluice compare` (an
outside client, `sluice.tools.compare`) and the controller's run at a rollout's start
(through `sluice.comparing`) send the same requests and write the same report."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from sluice.comparing import run_suite
from sluice.core.errors import SpecError, Unavailable
from sluice.policy.compare import (
    SCHEMA,
    Answer,
    CompareOptions,
    Target,
    answer_version,
    parse_suite,
    report,
    request_headers,
)
from sluice.tools.compare import compare

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
LINES = [CHAT | {"id": "one"}, {"model": "m", "prompt": "say"}, {"model": "e", "input": "x"}]


def suite_bytes() -> bytes:
    return ("\n".join(json.dumps(line) for line in LINES) + "\n\n").encode()


def test_a_suite_is_parsed_from_bytes_with_its_digest() -> None:
    data = suite_bytes()
    suite = parse_suite(data, "s.jsonl")
    assert [(i.id, i.kind, i.line) for i in suite.items] == [
        ("one", "chat", 1), ("line-2", "completion", 2), ("line-3", "embedding", 3),
    ]  # fmt: skip
    assert "id" not in suite.items[0].body
    assert suite.to_json() == {
        "path": "s.jsonl",
        "sha256": hashlib.sha256(data).hexdigest(),
        "items": 3,
    }


def test_a_bad_suite_names_where_it_was_given() -> None:
    with pytest.raises(SpecError) as caught:
        parse_suite(b"\xff\xfe", "s.jsonl", "compare.suite")
    assert [(i.field, i.file) for i in caught.value.issues] == [("compare.suite", "s.jsonl")]
    with pytest.raises(SpecError) as caught:
        parse_suite(b'{"model": "m"}\nnot json\n', "s.jsonl")
    assert [i.line for i in caught.value.issues] == [1, 2]


def test_headers_and_versions() -> None:
    group, url = Target("group:g", "http://gw", "g"), Target("http://i", "http://i")
    assert request_headers(group, "k") == {"authorization": "Bearer k", "x-sluice-group": "g"}
    assert request_headers(url, None) == {}
    item = parse_suite(suite_bytes(), "s").items[0]
    assert answer_version(item, "v9", {"system_fingerprint": "m:v1"}) == "v9"
    assert answer_version(item, None, {"system_fingerprint": "m:v1"}) == "v1"
    assert answer_version(item, None, {"system_fingerprint": "other:v1"}) is None
    assert answer_version(item, None, "not json") is None


def test_a_side_that_answered_nothing_is_unavailable() -> None:
    suite = parse_suite(suite_bytes(), "s")
    ok = [Answer(200, 0.1, text="x", output_tokens=1)] * 3
    down = [Answer(None, 0.1, error="ConnectError")] * 3
    a, b = Target("http://a", "http://a"), Target("http://b", "http://b")
    with pytest.raises(Unavailable, match="--b http://b"):
        report(suite, a, b, (ok, down), 0.0, 1.0, 10)
    done = report(suite, a, b, (ok, ok), 5.0, 1.25, 1)
    assert (done["schema"], done["started_at"], done["duration_s"]) == (SCHEMA, 5.0, 1.25)
    assert done["summary"]["items"] == 3 and len(done["worst"]) == 1


def _server(version: str) -> httpx.MockTransport:
    """An OpenAI-shaped answer per path; the text names the version."""

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        headers = {"x-sluice-model-version": version}
        if request.url.path == "/v1/embeddings":
            data = [{"index": 0, "embedding": [1.0, 0.0]}]
            return httpx.Response(200, json={"data": data}, headers=headers)
        text = f"{body['model']} {version} says hi"
        if request.url.path == "/v1/chat/completions":
            choice: dict[str, Any] = {"message": {"content": text}, "finish_reason": "stop"}
        else:
            choice = {"text": text, "finish_reason": "length"}
        usage = {"completion_tokens": len(text.split())}
        return httpx.Response(200, json={"choices": [choice], "usage": usage}, headers=headers)

    return httpx.MockTransport(answer)


def _routed() -> httpx.MockTransport:
    a, b = _server("v1"), _server("v2")

    def route(request: httpx.Request) -> httpx.Response:
        side = a if request.url.host == "a" else b
        return side.handle_request(request)

    return httpx.MockTransport(route)


def _stable(doc: dict[str, Any]) -> dict[str, Any]:
    """The report less what the clock decides."""
    doc = json.loads(json.dumps(doc))
    doc.pop("started_at"), doc.pop("duration_s"), doc["summary"].pop("latency_s")
    for row in doc["items"] + doc["worst"]:
        row["a"].pop("latency_s"), row["b"].pop("latency_s")
    return doc


def test_the_controller_and_the_tool_write_the_same_report(tmp_path: Path) -> None:
    path = tmp_path / "suite.jsonl"
    path.write_bytes(suite_bytes())
    a, b = Target("http://a", "http://a"), Target("group:canary", "http://b", "canary")
    options = CompareOptions(worst=2)
    by_tool = asyncio.run(compare(path, a, b, options, transport=_routed()))
    suite = parse_suite(path.read_bytes(), str(path), "compare.suite")  # as the controller
    by_controller = asyncio.run(run_suite(suite, a, b, options, transport=_routed()))
    assert _stable(by_tool) == _stable(by_controller)
    assert by_tool["summary"]["compared"] == 3 and by_tool["summary"]["exact_match_rate"] == 1 / 3
    assert [row["b"]["version"] for row in by_tool["items"]] == ["v2"] * 3
