"""What an OpenAI-format answer says about itself: token counts, why it stopped, and the start
of its text, read from the bytes the gateway relayed (issue 35).

Any server behind `command` or `external` that speaks the OpenAI API (vLLM, SGLang, llama.cpp,
TGI, a hosted endpoint) answers a completion either as one JSON document or as a stream of
server-sent events (`data: {...}` chunks, then `data: [DONE]`). Both may carry `usage`
(`prompt_tokens`, `completion_tokens`, `prompt_tokens_details.cached_tokens`) and each choice
its `finish_reason` ("stop", "length": cut off at `max_tokens`, ...). A stream carries usage only
when asked (`stream_options.include_usage`); without it the completion's length is the number
of chunks with content: one token per chunk for vLLM, SGLang and OpenAI, an estimate for
servers that batch tokens into chunks (`AnswerFacts.counted` says which it is).

The gateway keeps a capped copy of the answer (`head`, plus the last bytes in `tail` when it
outgrew the cap): usage and the finish reason are at the end of a stream, the text at its
start.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

import orjson

__all__ = ["AnswerFacts", "UsageStripper", "ask_for_usage", "read_answer", "usage_in_tail"]

TEXT_CHARS = 512
"""the start of the text kept for the text-based criteria (style drift, empty answers)"""

_USAGE = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
_PROMPT = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
_BOTH = re.compile(
    rb'"usage"\s*:\s*\{\s*"prompt_tokens"\s*:\s*(\d+)\s*,\s*"completion_tokens"\s*:\s*(\d+)'
)
"""usage as OpenAI, vLLM and SGLang write it: prompt tokens, then completion tokens"""
_FINISH = re.compile(rb'"finish_reason"\s*:\s*"([A-Za-z_]{1,32})"')


@dataclass(frozen=True, slots=True)
class AnswerFacts:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None
    text: str | None = None
    """the start of the answer's text (at most `TEXT_CHARS`); None when none was read"""
    counted: bool = False
    """`completion_tokens` counts a stream's chunks with content (no usage was given)"""


def read_answer(head: bytes, tail: bytes = b"", text_chars: int = TEXT_CHARS) -> AnswerFacts:
    """The facts of one answer: `head` its first bytes (all of it when `tail` is empty),
    `tail` its last bytes when the copy was capped. Never raises: what cannot be read is
    None."""
    start = head.lstrip()[:5]
    if start == b"data:" or start.startswith(b":"):
        return _read_stream(head, tail, text_chars)
    if not tail:
        try:
            doc = orjson.loads(head)
        except orjson.JSONDecodeError:
            doc = None
        if isinstance(doc, dict):
            return _read_document(doc, text_chars)
    return _scan(head + b"\n" + tail)


_TAIL_BYTES: Final = 1024
"""the end of an answer where its usage is looked for (OpenAI, vLLM, SGLang put it last)"""


_COMPACT: Final = b'"usage":{"prompt_tokens":'
_COMPACT_COMPLETION: Final = b',"completion_tokens":'
"""usage as most servers write it, without spaces: read by byte scans, not `_BOTH`"""


def usage_in_tail(last: bytes) -> tuple[int, int] | None:
    """(prompt tokens, completion tokens) from the end of an answer's last body piece: the
    per-request token count of every answer, so it reads no more than `_TAIL_BYTES` and
    only by pattern (a nested `"usage"` inside a message's text could fool it; the canary
    path, `read_answer`, parses). None when the end says no usage.

    The compact form (`"usage":{"prompt_tokens":9,"completion_tokens":7,...`) is read with
    one byte search and digit loops, with the same result as the patterns: in the compiled
    gateway a loop over bytes is native code, where each `bytes` method or `int()` call
    costs about as much as the whole loop; anything else (spaces, another order, the end
    of the piece) goes to the patterns."""
    size = len(last)
    at = last.rfind(b'"usage"', size - _TAIL_BYTES if size > _TAIL_BYTES else 0)
    if at < 0:
        return None
    p = at + len(_COMPACT)
    if last[at:p] == _COMPACT:
        prompt, p = _digits(last, p)
        q = p + len(_COMPACT_COMPLETION)
        if prompt >= 0 and last[p:q] == _COMPACT_COMPLETION:
            completion, end = _digits(last, q)
            if completion >= 0 and end < size and last[end] == 44:  # b","
                return prompt, completion
    usage = last[at:]
    both = _BOTH.match(usage)
    if both is not None:  # the usual order, in one step
        return int(both.group(1)), int(both.group(2))
    prompt_m = _PROMPT.search(usage)
    completion_m = _USAGE.search(usage)
    if prompt_m is None or completion_m is None:
        return None
    return int(prompt_m.group(1)), int(completion_m.group(1))


def _digits(data: bytes, start: int) -> tuple[int, int]:
    """(the decimal number at `start`, the index after it); -1 for the number when no digit
    is there or more than 18 are (no token count is that long: the patterns decide)."""
    end, size, value = start, len(data), 0
    while end < size:
        byte = data[end]
        if byte < 48 or byte > 57:  # not b"0"-b"9"
            break
        value = value * 10 + byte - 48
        end += 1
    return (value if start < end <= start + 18 else -1), end


_ASK_USAGE = b',"stream_options":{"include_usage":true}'


def ask_for_usage(body: bytes, payload: object) -> bytes | None:
    """`body` asking its server for the stream's token usage (`stream_options.include_usage`,
    which OpenAI, vLLM, SGLang, llama.cpp, TGI and transformers serve honour): what the
    gateway sends for a streamed completion whose caller did not ask, so that every stream
    is counted in tokens, not in chunks. `payload`: the parsed body. None when the request
    is no stream or already asks (or its `stream_options` is no object: the server judges
    that). The usual case, no `stream_options`, splices the field in before the object's
    closing brace (no re-encoding)."""
    if not isinstance(payload, dict) or payload.get("stream") is not True:
        return None
    if "stream_options" not in payload:
        end = body.rstrip().rfind(b"}")  # the body is a JSON object: its last brace closes it
        return body[:end] + _ASK_USAGE + body[end:]
    options = payload["stream_options"]
    if options is None:
        options = {}
    if not isinstance(options, dict) or options.get("include_usage") is True:
        return None
    return orjson.dumps({**payload, "stream_options": {**options, "include_usage": True}})


HELD_MAX = 64 * 1024
"""Bytes of an unfinished event `UsageStripper` holds at most: a stream whose events are
longer (or that is no event stream after all) is relayed as it comes, unstripped."""


class UsageStripper:
    """Takes out of a server-sent event stream the usage chunk the gateway asked for on its
    caller's behalf (`ask_for_usage`): the event whose `choices` is empty and whose `usage`
    is an object, sent before `data: [DONE]`. The caller gets the stream it asked for; the
    gateway has already counted the tokens from the bytes it read. Other chunks' `"usage":
    null`, which OpenAI adds to every chunk once usage is asked, are left as they are (the
    schema allows them).

    Whole events pass at once; only the unfinished end of a piece waits for the rest of
    its event (at most `HELD_MAX` bytes), so no token is delayed beyond its own event.
    While nothing is `held`, a piece that ends an event and does not say `"usage"` passes
    unchanged: a caller may skip `feed` for it (the gateway does, for most pieces)."""

    __slots__ = ("held",)

    def __init__(self) -> None:
        self.held = b""
        """the start of an event whose end has not come yet"""

    def feed(self, data: bytes) -> bytes:
        """The bytes of `data` (after what was held) to relay now."""
        if self.held:
            data = self.held + data
            self.held = b""
        lf, crlf = data.rfind(b"\n\n"), data.rfind(b"\r\n\r\n")
        cut = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
        if cut < len(data):
            if len(data) - cut > HELD_MAX:
                return data
            data, self.held = data[:cut], data[cut:]
        at = data.find(b'"usage"')
        while at >= 0:  # each event naming usage: taken out if it is the usage chunk
            start, end = _event_around(data, at)
            if _usage_only(data[start:end]):
                data = data[:start] + data[end:]
                at = data.find(b'"usage"', start)
            else:
                at = data.find(b'"usage"', end)
        return data

    def flush(self) -> bytes:
        """What is still held at the stream's end (an event the server never finished)."""
        held, self.held = self.held, b""
        return held


def _event_around(data: bytes, at: int) -> tuple[int, int]:
    """The bounds of the whole event holding offset `at` of `data` (whole events only),
    its blank line included: events end in LF LF or CR LF CR LF."""
    lf, crlf = data.rfind(b"\n\n", 0, at), data.rfind(b"\r\n\r\n", 0, at)
    start = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
    lf, crlf = data.find(b"\n\n", at), data.find(b"\r\n\r\n", at)
    ends = [e for e in (lf + 2 if lf >= 0 else -1, crlf + 4 if crlf >= 0 else -1) if e >= 0]
    return start, min(ends) if ends else len(data)


def _usage_only(event: bytes) -> bool:
    """Is `event` the usage chunk: `data: {"choices": [], "usage": {...}}`?"""
    if not event.startswith(b"data:") or b"[]" not in event:
        return False
    try:
        doc = orjson.loads(event[5:])
    except orjson.JSONDecodeError:
        return False
    return isinstance(doc, dict) and doc.get("choices") == [] and isinstance(doc.get("usage"), dict)


def _read_document(doc: dict[str, Any], text_chars: int) -> AnswerFacts:
    prompt, completion, cached = _usage(doc.get("usage"))
    finish, text = None, None
    choices = doc.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        first = choices[0]
        finish = _str(first.get("finish_reason"))
        message = first.get("message")
        content = message.get("content") if isinstance(message, dict) else first.get("text")
        if isinstance(content, str):
            text = content[:text_chars]
    return AnswerFacts(prompt, completion, cached, finish, text)


def _read_stream(head: bytes, tail: bytes, text_chars: int) -> AnswerFacts:
    pieces: list[str] = []
    size = 0
    chunks = 0
    finish: str | None = None
    usage: tuple[int | None, int | None, int | None] = (None, None, None)
    events = head.split(b"\n")
    if tail:  # the middle is gone: the tail's first line may be cut, and chunks go uncounted
        events += tail.split(b"\n")[1:]
    for line in events:
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if not data or data == b"[DONE]":
            continue
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(doc, dict):
            continue
        if doc.get("usage"):
            usage = _usage(doc["usage"])
        choices = doc.get("choices")
        if not (isinstance(choices, list) and choices and isinstance(choices[0], dict)):
            continue
        first = choices[0]
        finish = _str(first.get("finish_reason")) or finish
        delta = first.get("delta")
        content = delta.get("content") if isinstance(delta, dict) else first.get("text")
        if isinstance(content, str) and content:
            chunks += 1
            if size < text_chars:
                pieces.append(content)
                size += len(content)
    prompt, completion, cached = usage
    counted = False
    if completion is None and not tail:
        completion, counted = chunks, True
    text = "".join(pieces)[:text_chars] if not tail or pieces else None
    return AnswerFacts(prompt, completion, cached, finish, text, counted)


def _scan(data: bytes) -> AnswerFacts:
    """A document too large to keep whole: its counts and finish reason by pattern."""
    completion = _USAGE.findall(data)
    prompt = _PROMPT.findall(data)
    finish = _FINISH.findall(data)
    return AnswerFacts(
        int(prompt[-1]) if prompt else None,
        int(completion[-1]) if completion else None,
        None,
        finish[-1].decode() if finish else None,
    )


def _usage(usage: object) -> tuple[int | None, int | None, int | None]:
    if not isinstance(usage, dict):
        return None, None, None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return _int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens")), _int(cached)


def _int(x: object) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) and x >= 0 else None


def _str(x: object) -> str | None:
    return x[:32] if isinstance(x, str) and x else None
