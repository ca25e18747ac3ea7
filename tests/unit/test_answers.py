"""What an OpenAI-format answer says about itself, read from the bytes the gateway relayed
(`sluice.policy.answers`): JSON documents, SSE streams with and without usage, capped copies
and bytes that are neither."""

from __future__ import annotations

import json
import re

from hypothesis import given
from hypothesis import strategies as st

from sluice.policy.answers import (
    HELD_MAX,
    TEXT_CHARS,
    AnswerFacts,
    UsageStripper,
    ask_for_usage,
    read_answer,
    usage_in_tail,
)


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


def _usage_by_pattern(last: bytes) -> tuple[int, int] | None:
    """`usage_in_tail` as it was before its byte-scan fast path: the patterns only."""
    tail = last[-1024:]
    at = tail.rfind(b'"usage"')
    if at < 0:
        return None
    usage = tail[at:]
    both = re.match(
        rb'"usage"\s*:\s*\{\s*"prompt_tokens"\s*:\s*(\d+)\s*,\s*"completion_tokens"\s*:\s*(\d+)',
        usage,
    )
    if both is not None:
        return int(both.group(1)), int(both.group(2))
    prompt = re.search(rb'"prompt_tokens"\s*:\s*(\d+)', usage)
    completion = re.search(rb'"completion_tokens"\s*:\s*(\d+)', usage)
    if prompt is None or completion is None:
        return None
    return int(prompt.group(1)), int(completion.group(1))


_PIECES = st.sampled_from(
    [b'"usage"', b":", b"{", b'"prompt_tokens":', b'"completion_tokens":', b",", b"}", b" ",
     b"\n", b"0", b"7", b"42", b"\xd9\xa3", b"-1", b"1_0", b"+", b'"total_tokens":16', b"null",
     b"x" * 700, b'"usage":{"prompt_tokens":', b',"completion_tokens":', b"9" * 17]
)  # fmt: skip


@given(st.lists(_PIECES, max_size=12).map(b"".join))
def test_usage_in_tail_reads_what_the_patterns_read(last: bytes) -> None:
    assert usage_in_tail(last) == _usage_by_pattern(last)


def test_usage_in_tail_compact_and_spaced_forms_agree() -> None:
    for last in (
        b'{"usage":{"prompt_tokens":9,"completion_tokens":7,"total_tokens":16}}',
        b'{"usage":{"prompt_tokens":9,"completion_tokens":7}}',  # no comma after it
        b'{"usage":{"prompt_tokens":9,"completion_tokens":7',  # the end of the piece
        b'{"usage": {"prompt_tokens": 9, "completion_tokens": 7}}',
        b'{"usage":{"completion_tokens":7,"prompt_tokens":9}}',
        b'{"usage":{"prompt_tokens":,"completion_tokens":7,"x":1}',
        b'{"usage":{"prompt_tokens":9,"completion_tokens":,"x":1}',
        b'{"usage":{"prompt_tokens":9,"completion_tokens":7 ,"x":1}',
        b'data: {"usage":{"prompt_tokens":123456,"completion_tokens":98765,"t":1}}\n\n',
        b"x" * 2000 + b'{"usage":{"prompt_tokens":9,"completion_tokens":7,"t":1}}',
        b'{"usage":{"prompt_tokens":9,"completion_tokens":7,"t":1}}' + b"x" * 1000,
    ):
        assert usage_in_tail(last) == _usage_by_pattern(last), last
    assert usage_in_tail(b'{"usage":{"prompt_tokens":9,"completion_tokens":7,"t":1}}') == (9, 7)


# -- asking for a stream's usage on the caller's behalf ---------------------------------------


def asked(body: dict[str, object]) -> dict[str, object] | None:
    raw = json.dumps(body, indent=1).encode() + b"\n"  # whitespace after the brace too
    out = ask_for_usage(raw, body)
    return None if out is None else json.loads(out)


def test_a_stream_is_asked_for_its_usage_unless_it_asks_or_is_no_stream() -> None:
    chat = {"model": "m", "messages": [{"role": "user", "content": "}"}], "stream": True}
    assert asked(chat) == {**chat, "stream_options": {"include_usage": True}}
    kept = {**chat, "stream_options": {"continuous_usage_stats": True}}
    assert asked(kept) == {**chat, "stream_options": {"continuous_usage_stats": True,
                                                      "include_usage": True}}  # fmt: skip
    assert asked({**chat, "stream_options": None}) == asked(chat)
    assert asked({**chat, "stream_options": {"include_usage": True}}) is None
    assert asked({**chat, "stream_options": "bad"}) is None  # the server's to refuse
    assert asked({**chat, "stream": False}) is None
    assert asked({"model": "m", "prompt": "x"}) is None


def relayed(stream_bytes: bytes, cuts: list[int]) -> bytes:
    stripper = UsageStripper()
    out, start = [], 0
    for cut in [*sorted(set(cuts)), len(stream_bytes)]:
        out.append(stripper.feed(stream_bytes[start:cut]))
        start = cut
    return b"".join(out) + stripper.flush()


@given(st.lists(st.integers(min_value=0, max_value=400)), st.booleans())
def test_the_usage_chunk_is_taken_out_however_the_stream_is_cut(
    cuts: list[int], crlf: bool
) -> None:
    with_usage = stream(["a", "b]", "[]"], usage=True)
    without = stream(["a", "b]", "[]"])
    if crlf:
        with_usage = with_usage.replace(b"\n", b"\r\n")
        without = without.replace(b"\n", b"\r\n")
    assert relayed(with_usage, [c for c in cuts if c <= len(with_usage)]) == without
    assert relayed(without, [c for c in cuts if c <= len(without)]) == without


def test_whole_events_pass_at_once_and_a_long_unfinished_one_is_not_held() -> None:
    stripper = UsageStripper()
    event = b'data: {"choices": [{"delta": {"content": "x"}}]}\n\n'
    assert stripper.feed(event + event[:10]) == event  # the unfinished end waits...
    assert stripper.feed(event[10:]) == event  # ...for the rest of its event
    long = b"data: " + b"y" * HELD_MAX
    assert stripper.feed(long) == long  # no event stream after all: relayed as it comes
    assert stripper.flush() == b""
