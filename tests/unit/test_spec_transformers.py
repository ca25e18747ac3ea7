"""The `transformers` runtime in the spec: its params block, and a model directory that
cannot be loaded reported at `validate` with file, line and field, not at launch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sluice.core import SpecError
from sluice.spec import load_spec_file, load_spec_text
from sluice.spec.hf import MEMORY_HEADROOM
from sluice.spec.models import ModelSpec

EXAMPLE = Path(__file__).parents[2] / "examples" / "transformers.yaml"
TEXT = EXAMPLE.read_text()
PLACEHOLDER = "/srv/models/your-model"


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def model_dir(root: Path, weights: int = 1000, dtype: str | None = "float32") -> Path:
    """A directory shaped like a saved model: config.json and a weights file of `weights`
    bytes (sparse: the checks read sizes, never tensors)."""
    root.mkdir(parents=True, exist_ok=True)
    config = {
        "model_type": "gpt2",
        "n_embd": 32,
        "n_layer": 2,
        "n_head": 2,
        "n_positions": 1024,
        "vocab_size": 215,
    } | ({"dtype": dtype} if dtype else {})
    (root / "config.json").write_text(json.dumps(config))
    with open(root / "model.safetensors", "wb") as out:
        out.truncate(weights)
    return root


def validate(text: str, tmp_path: Path) -> list[str]:
    spec = tmp_path / "platform.yaml"
    spec.write_text(text)
    with pytest.raises(SpecError) as caught:
        load_spec_file(spec)
    return [str(issue) for issue in caught.value.issues]


def test_the_example_is_valid_once_model_path_names_a_model(tmp_path: Path) -> None:
    spec = tmp_path / "platform.yaml"
    spec.write_text(TEXT.replace(PLACEHOLDER, str(model_dir(tmp_path / "m"))))
    model = load_spec_file(spec).spec.groups[0].models["local-lm"]
    assert model.runtime == "transformers" and model.transformers is not None
    assert model.transformers.max_new_tokens == 256


def test_the_placeholder_is_a_located_error_at_validate(tmp_path: Path) -> None:
    [msg] = validate(TEXT, tmp_path)
    line = line_of(TEXT, "model_path:")
    assert msg.startswith(
        f"{tmp_path / 'platform.yaml'}:{line}: "
        "groups[0].models.local-lm.transformers.model_path: model directory "
        f"{PLACEHOLDER} does not exist"
    )


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (lambda d: d.mkdir(), "has no config.json"),
        (lambda d: d.write_text("x"), "is not a directory"),
        (lambda d: (model_dir(d) / "model.safetensors").unlink(), "has no weight files"),
        (lambda d: (model_dir(d) / "config.json").write_text("[1]"), "is not a JSON object"),
        (lambda d: (model_dir(d) / "config.json").write_text("{"), "cannot read"),
    ],
)
def test_a_directory_that_is_not_a_model_is_refused(tmp_path: Path, make, problem: str) -> None:
    path = tmp_path / "model"
    make(path)
    [msg] = validate(TEXT.replace(PLACEHOLDER, str(path)), tmp_path)
    assert f":{line_of(TEXT, 'model_path:')}: groups[0].models.local-lm.transformers" in msg
    assert problem in msg


def test_a_stored_revision_loads_even_when_the_directory_has_gone() -> None:
    """load_spec_text (revisions read back from the store) does not look at the disk."""
    spec = load_spec_text(TEXT, "revision 3").spec
    assert spec.groups[0].models["local-lm"].memory_gb == 0.0  # nothing on disk to measure


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({"runtime": "transformers"}, "needs a 'transformers:' block with model_path"),
        (
            {"runtime": "sim", "transformers": {"model_path": "/m"}},
            "runtime is 'sim'; remove the 'transformers:' block",
        ),
        (
            {"runtime": "transformers", "transformers": {"model_path": "/m"}, "sim": {}},
            "runtime is 'transformers'; remove the 'sim:' block",
        ),
        ({"runtime": "transformers", "transformers": {"model_path": "models/m"}}, "absolute"),
        (
            {"runtime": "transformers", "transformers": {"model_path": "/m", "dtype": "int3"}},
            "dtype",
        ),
    ],
)
def test_params_block_matches_the_runtime(block: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModelSpec.model_validate(block)


def test_memory_default_is_the_weights_in_their_dtype_with_headroom(tmp_path: Path) -> None:
    gib = 2**30
    path = model_dir(tmp_path / "m", weights=gib)  # 1 GiB of float32 weights

    def memory(**params: object) -> float:
        spec = {"runtime": "transformers", "transformers": {"model_path": str(path), **params}}
        return ModelSpec.model_validate(spec).memory_gb

    assert memory() == pytest.approx(MEMORY_HEADROOM, abs=0.01)
    assert memory(dtype="bfloat16") == pytest.approx(MEMORY_HEADROOM / 2, abs=0.01)
    assert memory(memory_gb=3.5) == 3.5


def test_an_instance_too_small_for_the_weights_is_refused(tmp_path: Path) -> None:
    path = model_dir(tmp_path / "m", weights=10 * 2**30)  # 12 GiB with headroom
    [msg] = validate(TEXT.replace(PLACEHOLDER, str(path)), tmp_path)
    assert "models need 12 GiB but an instance gets 8 GiB" in msg
