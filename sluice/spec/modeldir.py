"""Read a local Hugging Face model directory for the memory estimate (the I/O edge of
`spec.memory`): its config.json, and the checkpoint's real size when the files say it.

The size comes from `model.safetensors.index.json` (`metadata.total_size`, the tensor bytes)
or else from the `*.safetensors` files themselves (tensor bytes plus a small JSON header);
it is exact where the parameter count is an estimate, and it counts what the config cannot
describe (a vision tower, quantization scales).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice.core.errors import NotFound, SpecError, SpecIssue
from sluice.spec.hf import model_dir_problem

__all__ = ["MAX_CONFIG_BYTES", "ModelDir", "read_loadable_model_dir", "read_model_dir"]

MAX_CONFIG_BYTES = 4 * 1024 * 1024
"""A config.json is a few KiB; refuse to parse a large file by mistake (4 MiB)."""


@dataclass(frozen=True)
class ModelDir:
    """What the estimate needs from a model directory."""

    path: str
    config: Mapping[str, Any]
    weight_bytes: int | None
    """Bytes of the safetensors checkpoint; None when there is none to measure."""


def read_model_dir(path: str | Path) -> ModelDir:
    """Raises NotFound (exit 4) for a missing directory or config.json, SpecError naming
    config.json for one that is not a JSON object."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise NotFound(f"model directory not found: {root}", path=str(root))
    config_path = root / "config.json"
    if not config_path.is_file():
        raise NotFound(
            f"no config.json in model directory {root} (a Hugging Face model directory has "
            "one beside its weights)",
            path=str(config_path),
        )
    try:
        if config_path.stat().st_size > MAX_CONFIG_BYTES:
            raise ValueError(f"larger than {MAX_CONFIG_BYTES} bytes")
        config = json.loads(config_path.read_text(encoding="utf-8"))
        if not isinstance(config, dict):
            raise ValueError("expected a JSON object")
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else str(exc)
        issue = SpecIssue("", f"cannot read config.json: {why}", str(config_path))
        raise SpecError([issue]) from None
    return ModelDir(str(root), config, _weight_bytes(root))


def read_loadable_model_dir(path: str | Path) -> ModelDir:
    """`read_model_dir` for a model a runtime will load: also refuses, saying why, a
    directory with no weight files or one the OS cannot look at (`spec.hf`)."""
    why = model_dir_problem(str(path))
    if why is not None:
        raise NotFound(why, path=str(path))
    return read_model_dir(path)


def _weight_bytes(root: Path) -> int | None:
    index = root / "model.safetensors.index.json"
    if index.is_file() and index.stat().st_size <= MAX_CONFIG_BYTES:
        try:
            total = json.loads(index.read_text(encoding="utf-8")).get("metadata", {})
            size = total.get("total_size") if isinstance(total, dict) else None
        except (OSError, ValueError, AttributeError):
            size = None
        if isinstance(size, int) and not isinstance(size, bool) and size > 0:
            return size
    files = sorted(root.glob("*.safetensors"))
    if not files:
        return None
    return sum(f.stat().st_size for f in files)
