"""What an OpenAI-format answer says about itself, read from the bytes the gateway relayed
(`sluice.policy.answers`): JSON documents, SSE streams with and without usage, capped copies
and bytes that are neither."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from sluice.policy.answers import TEXT_CHARS, AnswerFacts, read_answer, usage_in_tail


def document(content: str, finish: str = "stop", usage: bool = True) -> bytes:
    doc: dict[str, object] = {
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                     "finish_reason": finish}],
    }  # fmt: skip
    if usage:
        doc["usage"] = {
            "prompt_tokens": 12,
            "completion_tokens": 7,
            "prompt_tokens_details": {"cached_tokens": 8},
        }
    return json.dumps(doc).encode()


def stream(tokens: list[str], finish: str = "stop", usage: bool = False) -> bytes:
    out = []
    for t in tokens:
        chunk = {"choices": [{"index": 0, "delta": {"content": t}, "finish_reason": None}]}
        out.append(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    last = {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}
    out.append(b"data: " + json.dumps(last).encode() + b"\n\n")
    if usage:
        u = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": len(tokens)}}
        out.append(b"data: " + json.dumps(u).encode() + b"\n\n")
    out.append(b"data: [DONE]\n\n")
    return b"".join(out)


def test_a_json_answer_gives_its_usage_finish_reason_and_text() -> None:
    facts = read_answer(document("Paris is the capital.", "length"))
    assert facts == AnswerFacts(12, 7, 8, "length", "Paris is the capital.")
    completion = b'{"choices": [{"text": "abc", "finish_reason": "stop"}], "usage": {}}'
    assert read_answer(completion) == AnswerFacts(None, None, None, "stop", "abc")


def test_a_stream_counts_its_chunks_unless_it_gives_usage() -> None:
    counted = read_answer(stream(["Hel", "lo", " there"]))
    assert counted == AnswerFacts(None, 3, None, "stop", "Hello there", counted=True)
    given_usage = read_answer(stream(["a", "b"], "length", usage=True))
    assert given_usage == AnswerFacts(5, 2, None, "length", "ab")
    empty = read_answer(stream([]))
    assert empty.completion_tokens == 0 and empty.text == ""  # an empty answer, not unknown


def test_a_capped_copy_keeps_the_start_of_the_text_and_the_usage_of_the_tail() -> None:
    body = stream([f"w{i} " for i in range(5000)], "length", usage=True)
    head, tail = body[:4096], body[-2048:]
    facts = read_answer(head, tail)
    assert facts.completion_tokens == 5000 and facts.finish_reason == "length"
    assert facts.text is not None and facts.text.startswith("w0 w1 ") and len(facts.text) <= 512
    assert not facts.counted
    # the middle is gone and the tail has no usage: no count rather than a wrong one
    plain = stream([f"w{i} " for i in range(5000)])
    assert read_answer(plain[:4096], plain[-2048:]).completion_tokens is None
    big = document("x" * 100_000)
    facts = read_answer(big[:4096], big[-1024:])
    assert facts.completion_tokens == 7 and facts.finish_reason == "stop" and facts.text is None


def test_the_text_kept_is_bounded() -> None:
    facts = read_answer(document("y" * 10_000))
    assert facts.text == "y" * TEXT_CHARS


@given(st.binary(max_size=2000), st.binary(max_size=200))
def test_any_bytes_are_read_without_raising(head: bytes, tail: bytes) -> None:
    facts = read_answer(head, tail)
    assert facts.completion_tokens is None or facts.completion_tokens >= 0


def test_usage_in_tail_reads_the_counts_at_the_end_of_any_answer() -> None:
    assert usage_in_tail(document("hi")) == (12, 7)
    assert usage_in_tail(stream(["a", "b", "c"], usage=True)) == (5, 3)
    assert usage_in_tail(stream(["a", "b"])) is None  # a stream without usage
    assert usage_in_tail(document("hi", usage=False)) is None
    assert usage_in_tail(b'{"usage": {"prompt_tokens": 3}}') is None  # half a usage
    big = document("z" * 100_000)
    assert usage_in_tail(big[-300:]) == (12, 7)  # only the last piece is needed
