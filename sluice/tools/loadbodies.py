"""What a load run sends: request bodies from a JSONL samples file, or synthesized from a
trace row's token counts (`sluice.tools.loadgen` sends them)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from sluice.core.errors import SpecError, SpecIssue

__all__ = ["KIND_PATHS", "load_bodies", "synthesized_body"]

KIND_PATHS = (
    ("messages", "/v1/chat/completions"),
    ("prompt", "/v1/completions"),
    ("input", "/v1/embeddings"),
)
"""A body's kind by its key, and the path it is sent to."""
MAX_ISSUES = 20  # a file of bad lines reports the first few, not thousands


def load_bodies(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """JSONL samples: one OpenAI request body per line -> (path, body). Kind by key:
    `messages` -> chat, `prompt` -> completion, `input` -> embeddings; an `id` key is
    dropped. A bad line raises SpecError naming the file and line number and the fix; an
    empty file too."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError([SpecIssue("", f"cannot read the samples: {exc}", str(path))]) from None
    bodies: list[tuple[str, dict[str, Any]]] = []
    issues: list[SpecIssue] = []
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip() or len(issues) >= MAX_ISSUES:
            continue
        try:
            body = json.loads(raw)
        except json.JSONDecodeError as exc:
            message = f"not valid JSON: {exc.msg} (column {exc.colno}); write one body a line"
            issues.append(SpecIssue("", message, str(path), number))
            continue
        if not isinstance(body, dict):
            message = "each line must be a JSON object (one OpenAI request body)"
            issues.append(SpecIssue("", message, str(path), number))
            continue
        paths = [p for key, p in KIND_PATHS if key in body]
        if len(paths) != 1:
            message = (
                "give exactly one of 'messages' (chat), 'prompt' (completion), 'input' (embeddings)"
            )
            issues.append(SpecIssue("", message, str(path), number))
            continue
        body.pop("id", None)
        bodies.append((paths[0], body))
    if not bodies and not issues:
        message = "no requests in the file: write one OpenAI request body (JSON) a line"
        issues.append(SpecIssue("", message, str(path)))
    if issues:
        raise SpecError(issues)
    return bodies


# Common short English words: about one token each in the usual tokenizers.
_WORDS = "the of and to in is it that for on was with as at by be this from or an"


@functools.lru_cache(maxsize=256)
def _prompt(length: int) -> str:
    words = _WORDS.split()
    return " ".join(words[i % len(words)] for i in range(length))


def synthesized_body(
    model: str, input_tokens: int, output_tokens: int, stream: bool = False
) -> tuple[str, dict[str, Any]]:
    """A chat request of about `input_tokens` words of prompt and `max_tokens =
    output_tokens` (a trace row's token counts); `max_tokens` is a cap, so a model may answer
    shorter."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": _prompt(max(1, input_tokens))}],
        "max_tokens": max(1, output_tokens),
    }
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return "/v1/chat/completions", body
