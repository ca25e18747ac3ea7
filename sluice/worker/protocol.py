"""OpenAI wire format: request bodies in, response bodies and stream chunks out.

Only what the official `openai` client needs to round-trip. The sampling fields
(`temperature`, `top_p`, `seed`, `stop`) are checked and handed to the runtime, which may
ignore them (the sim does not sample); other unknown request fields (e.g. `logit_bias`) are
accepted and ignored, as a model server that does not support them would.
"""

from __future__ import annotations

import base64
import json
import struct
import time
import uuid
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sluice.core.errors import SluiceError
from sluice.worker.runtimes import Completion, Embeddings, TextRequest

__all__ = [
    "BadRequest",
    "ChatRequest",
    "ChunkWriter",
    "CompletionRequest",
    "EmbeddingRequest",
    "chat_response",
    "completion_response",
    "embedding_response",
    "parse",
    "sse",
]

MAX_TOKENS = 100_000
MAX_STOPS = 4
"""Stop strings per request, as OpenAI allows."""
MAX_STOP_CHARS = 1000
"""Longest stop string: a stream holds back a tail as long as the longest one, and checks it
after every token."""
SSE_DONE = b"data: [DONE]\n\n"


class BadRequest(SluiceError):
    """The request is malformed or asks for something this model cannot do."""

    http_status = 400
    code = "invalid_request"


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Body):
    include_usage: bool = False


_Stop = Annotated[str, Field(max_length=MAX_STOP_CHARS)]


class _GenerationRequest(_Body):
    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    n: int = Field(default=1, ge=1, le=1, description="one choice per request")
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)
    stop: _Stop | Annotated[list[_Stop], Field(max_length=MAX_STOPS)] | None = None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def prompt_text(self) -> str:
        """All the text the model reads."""
        raise NotImplementedError

    def token_limit(self) -> int | None:
        return self.max_tokens

    def messages_text(self) -> tuple[tuple[str, str], ...] | None:
        """A chat's (role, text) turns; None for a text completion."""
        return None

    def stop_strings(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return tuple(stop for stop in stops if stop)

    def text_request(self) -> TextRequest:
        """What the runtime is asked to generate."""
        return TextRequest(
            self.prompt_text(),
            self.token_limit(),
            messages=self.messages_text(),
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            stop=self.stop_strings(),
        )


class ContentPart(_Body):
    type: str
    text: str | None = None


class ChatMessage(_Body):
    role: str
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return " ".join(part.text for part in self.content if part.text)


class ChatRequest(_GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)

    def prompt_text(self) -> str:
        return "\n".join(message.text() for message in self.messages)

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def messages_text(self) -> tuple[tuple[str, str], ...]:
        return tuple((message.role, message.text()) for message in self.messages)


class CompletionRequest(_GenerationRequest):
    prompt: str | list[str] = Field(description="a string, or a list holding one string")

    def prompt_text(self) -> str:
        if isinstance(self.prompt, str):
            return self.prompt
        if len(self.prompt) != 1:
            raise BadRequest("prompt: only one prompt per request is supported")
        return self.prompt[0]


class EmbeddingRequest(_Body):
    model: str
    input: str | list[str]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)

    def inputs(self) -> list[str]:
        inputs = [self.input] if isinstance(self.input, str) else self.input
        if not inputs:
            raise BadRequest("input: must not be empty")
        return inputs


_Parsed = TypeVar("_Parsed", bound=BaseModel)


def parse(kind: type[_Parsed], body: dict[str, Any]) -> _Parsed:
    """Validate `body`, turning pydantic's report into one readable 400 message."""
    try:
        return kind.model_validate(body)
    except ValidationError as exc:
        problems = [
            f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}"
            for err in exc.errors()[:5]
        ]
        raise BadRequest("; ".join(problems)) from None


def sse(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def chat_response(model: str, fingerprint: str, result: Completion) -> dict[str, Any]:
    return {
        "id": _new_id("chatcmpl"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": fingerprint,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": result.text},
                "logprobs": None,
                "finish_reason": result.finish_reason,
            }
        ],
        "usage": _usage(result.prompt_tokens, result.completion_tokens),
    }


def completion_response(model: str, fingerprint: str, result: Completion) -> dict[str, Any]:
    return {
        "id": _new_id("cmpl"),
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": fingerprint,
        "choices": [
            {
                "index": 0,
                "text": result.text,
                "logprobs": None,
                "finish_reason": result.finish_reason,
            }
        ],
        "usage": _usage(result.prompt_tokens, result.completion_tokens),
    }


def _encode_vector(vector: list[float], encoding: str) -> list[float] | str:
    if encoding == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


def embedding_response(model: str, result: Embeddings, encoding: str) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": _encode_vector(vector, encoding)}
            for i, vector in enumerate(result.vectors)
        ],
        "model": model,
        "usage": {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens},
    }


class ChunkWriter:
    """The stream chunks of one chat or text completion, sharing id, created and model."""

    def __init__(self, chat: bool, model: str, fingerprint: str, include_usage: bool) -> None:
        self.chat = chat
        self.include_usage = include_usage
        self._head: dict[str, Any] = {
            "id": _new_id("chatcmpl" if chat else "cmpl"),
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": fingerprint,
        }
        if include_usage:
            self._head["usage"] = None

    def _chunk(self, text: str | None, finish_reason: str | None) -> bytes:
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            choice["delta"] = {} if text is None else {"content": text}
        else:
            choice["text"] = text or ""
        choice["logprobs"] = None
        choice["finish_reason"] = finish_reason
        return sse({**self._head, "choices": [choice]})

    def opening(self) -> bytes | None:
        """Chat streams announce the assistant role first; text completions do not."""
        if not self.chat:
            return None
        return sse(
            {
                **self._head,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
            }
        )

    def piece(self, text: str) -> bytes:
        return self._chunk(text, None)

    def finish(self, finish_reason: str) -> bytes:
        return self._chunk(None, finish_reason)

    def usage(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        return sse({**self._head, "choices": [], "usage": _usage(prompt_tokens, completion_tokens)})
