"""The `transformers:` block of a model (a local Hugging Face model directory), and what
`validate` can learn about that directory from disk: does it look like a model, how big are
its weights.

Kept apart from `models.py` because it reads the file system: only
`modeldir.read_loadable_model_dir` (at `validate`, `apply -f`, `up -f`) and the memory
default touch the disk, never a validator, so a stored revision always parses even when its
model directory has since gone.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "DTYPE_BYTES",
    "MEMORY_HEADROOM",
    "TransformersParams",
    "model_dir_problem",
    "weights_bytes",
]

Dtype = Literal["auto", "float32", "float16", "bfloat16"]
Device = Literal["auto", "cpu", "cuda"]

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
"""Bytes per parameter of each dtype a `transformers` model may load in."""

MEMORY_HEADROOM = 1.2
"""The memory default is the weights (in the dtype they load in) x this: activations, the KV
cache of a few short requests and allocator slack. A long-context or high-concurrency group
should declare `memory_gb` (or use `sluice estimate`)."""

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


class TransformersParams(BaseModel):
    """A causal language model served by Hugging Face `transformers` inside Sluice's worker."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    model_path: str = Field(
        min_length=1,
        max_length=4096,
        description="absolute path of a local model directory (config.json, weights, "
        "tokenizer); read on the instance's machine, never fetched from the hub",
    )
    dtype: Dtype = Field(
        default="auto",
        description="auto: float32 on CPU, the checkpoint's own dtype on a GPU",
    )
    device: Device = Field(
        default="auto",
        description="auto: the first GPU the instance was given (CUDA_VISIBLE_DEVICES), else CPU",
    )
    max_new_tokens: int = Field(
        default=256,
        ge=1,
        le=100_000,
        description="cap on tokens generated per request (a request's max_tokens is lowered "
        "to it), and the default when a request sets none; the model's context caps it too",
    )
    cpu_threads: int = Field(
        default=1,
        ge=1,
        le=256,
        description="torch threads per instance on CPU (instances share the machine)",
    )
    memory_gb: float | None = Field(
        default=None,
        ge=0,
        description="declared memory; unset: the weight files' size in `dtype` x 1.2",
    )

    @field_validator("model_path")
    @classmethod
    def _absolute(cls, path: str) -> str:
        if "\0" in path or not os.path.isabs(path):
            raise ValueError(
                "model_path must be an absolute path (instances do not run in the directory "
                "you validate from); write it from /"
            )
        return path

    def estimated_memory_gb(self) -> float:
        """`memory_gb` if declared, else the weights on disk scaled to `dtype`, with headroom
        (0 when the directory cannot be read: `read_loadable_model_dir` reports that)."""
        if self.memory_gb is not None:
            return self.memory_gb
        size = weights_bytes(Path(self.model_path))
        if size == 0:
            return 0.0
        stored = _checkpoint_dtype(Path(self.model_path))
        if self.dtype != "auto" and stored in DTYPE_BYTES:
            size = size * DTYPE_BYTES[self.dtype] // DTYPE_BYTES[stored]
        gib = size * MEMORY_HEADROOM / 2**30
        return math.ceil(gib * 100) / 100  # to 0.01 GiB, rounded up


def weights_bytes(directory: Path) -> int:
    """Total size of the weight files directly in `directory` (0 if it cannot be listed)."""
    try:  # (ValueError: a path the OS cannot even name, e.g. one with a lone surrogate)
        entries = list(os.scandir(directory))
    except (OSError, ValueError):
        return 0
    total = 0
    for entry in entries:
        try:
            if entry.name.endswith(_WEIGHT_SUFFIXES) and entry.is_file():
                total += entry.stat().st_size
        except OSError:
            continue
    return total


def _checkpoint_dtype(directory: Path) -> str | None:
    """The dtype config.json says the weights were saved in (`dtype`, formerly
    `torch_dtype`), if it says."""
    try:
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    dtype = config.get("dtype") or config.get("torch_dtype")
    return dtype if isinstance(dtype, str) else None


def model_dir_problem(path: str) -> str | None:
    """Why `path` cannot be loaded as a model directory, with the fix; None if it looks
    loadable (a directory with a config.json object and at least one weight file)."""
    directory = Path(path)
    try:
        exists, is_dir = directory.exists(), directory.is_dir()  # (False for unnameable paths)
    except OSError as exc:  # too long, a loop of links, no permission on a parent...
        return f"cannot look at {path}: {exc.strerror}"
    if not exists:
        return f"model directory {path} does not exist; point model_path at a local model"
    if not is_dir:
        return f"{path} is not a directory; model_path names the model's directory"
    config = directory / "config.json"
    try:
        parsed = json.loads(config.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return (
            f"{path} has no config.json, so it is not a Hugging Face model directory; "
            "save the model with save_pretrained or download it complete"
        )
    except (OSError, ValueError) as exc:
        return f"cannot read {config}: {exc}"
    if not isinstance(parsed, dict):
        return f"{config} is not a JSON object"
    if weights_bytes(directory) == 0:
        return (
            f"{path} has no weight files (*.safetensors, *.bin); "
            "the download is incomplete or the weights live elsewhere"
        )
    return None
