"""Model runtimes by name: what `ModelSpec.runtime` selects for each model of an instance."""

from sluice.spec.models import ModelSpec
from sluice.worker.runtimes.base import (
    Completion,
    Embeddings,
    Endpoint,
    Runtime,
    TextRequest,
    TokenStream,
)
from sluice.worker.runtimes.embedding import EmbeddingRuntime
from sluice.worker.runtimes.sim import SimRuntime
from sluice.worker.runtimes.transformers import TransformersRuntime

__all__ = [
    "RUNTIMES",
    "Completion",
    "Embeddings",
    "Endpoint",
    "Runtime",
    "TextRequest",
    "TokenStream",
    "make_runtime",
]

RUNTIMES: dict[str, type[Runtime]] = {
    "sim": SimRuntime,
    "embedding": EmbeddingRuntime,
    "transformers": TransformersRuntime,
}


def make_runtime(model: str, spec: ModelSpec, instance_id: str) -> Runtime:
    return RUNTIMES[spec.runtime](model, spec, instance_id)
