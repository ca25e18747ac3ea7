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
    """A generation request: all the text the model reads, and the caller's token cap."""

    prompt: str
    max_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Completion:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str


@dataclass(frozen=True, slots=True)
class TokenStream:
    """A generation in progress: `pieces` yields text as the model produces it."""

    prompt_tokens: int
    finish_reason: str
    pieces: AsyncGenerator[str, None]


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

    async def complete(self, request: TextRequest) -> Completion:
        raise NotImplementedError(f"{type(self).__name__} does not generate text")

    async def stream(self, request: TextRequest) -> TokenStream:
        raise NotImplementedError(f"{type(self).__name__} does not generate text")

    async def embed(self, inputs: list[str]) -> Embeddings:
        raise NotImplementedError(f"{type(self).__name__} does not embed")
