"""The contract between the HTTP layer and a model runtime.

The server parses OpenAI requests into the small values below and asks a runtime to do the
work; a runtime never sees HTTP. `endpoints` says which APIs a runtime serves so the server
can refuse the others (with a 400) before it starts a response.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar

from sluice.spec.models import ModelSpec

__all__ = ["Completion", "Embeddings", "Endpoint", "Runtime", "TextRequest", "TokenStream"]


class Endpoint(StrEnum):
    CHAT = "chat"
    COMPLETIONS = "completions"
    EMBEDDINGS = "embeddings"


@dataclass(frozen=True, slots=True)
class TextRequest:
    """A generation request: all the text the model reads, the caller's token cap, and the
    sampling controls a real model honours (the sim ignores them)."""

    prompt: str
    max_tokens: int | None = None
    messages: tuple[tuple[str, str], ...] | None = None
    """A chat request's (role, text) turns, for a chat template; `prompt` joins their text."""
    temperature: float | None = None
    """None: the runtime's default (1.0, as OpenAI); 0: greedy."""
    top_p: float | None = None
    seed: int | None = None
    """Same seed, same request, same model: same text. None: a fresh draw each time."""
    stop: tuple[str, ...] = ()
    """Generation ends before the first of these; the stop text is not returned."""


@dataclass(frozen=True, slots=True)
class Completion:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str


@dataclass(slots=True)
class TokenStream:
    """A generation in progress: `pieces` yields text as the model produces it.

    A runtime that learns how the generation ended only at its end (a real model: a stop
    string, EOS, the cap) updates `finish_reason` and sets `completion_tokens` before `pieces`
    is exhausted; `completion_tokens` None means one piece per token (the sim).
    """

    prompt_tokens: int
    finish_reason: str
    pieces: AsyncGenerator[str, None]
    completion_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Embeddings:
    vectors: list[list[float]]
    prompt_tokens: int


class Runtime(ABC):
    """One model of an instance. `load` runs once in the background; the rest only after it."""

    endpoints: ClassVar[frozenset[Endpoint]]

    def __init__(self, model: str, spec: ModelSpec, instance_id: str) -> None:
        self.model = model
        self.spec = spec
        self.instance_id = instance_id

    @abstractmethod
    async def load(self) -> None:
        """Bring the model into memory; the instance is not ready until this returns."""

    def inject_fault(self) -> None:
        """Raise a SluiceError to fail this request before any byte goes out (so streams get a
        real HTTP error too). Real runtimes never do; the sim does for `error_rate`."""
        return None

    async def admit(self, request: TextRequest) -> None:
        """Refuse (raise a SluiceError) a request this model cannot serve, e.g. a prompt
        longer than its context, while an HTTP error can still be sent (before a stream's
        head goes out). Called before a concurrency slot is taken: keep it cheap."""
        return None

    async def complete(self, request: TextRequest) -> Completion:
        raise NotImplementedError(f"{type(self).__name__} does not generate text")

    async def stream(self, request: TextRequest) -> TokenStream:
        raise NotImplementedError(f"{type(self).__name__} does not generate text")

    async def embed(self, inputs: list[str]) -> Embeddings:
        raise NotImplementedError(f"{type(self).__name__} does not embed")
