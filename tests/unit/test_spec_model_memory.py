"""`validate` refuses a group whose model (named by a local model directory) cannot fit its
instance's accelerators, with the estimate's numbers; sim and embedding models are untouched.

No runtime in the spec language has a `model_path` yet (the transformers and command
runtimes add one), so these tests put a stand-in params object with that attribute into a
loaded spec: the check is duck-typed on `<runtime block>.model_path` exactly so that it
applies to them unchanged."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sluice.spec import ModelDir, PlatformSpec, load_spec_file, load_spec_text, read_model_dir
from sluice.spec.checks import check_platform, model_path_of

QUICKSTART = Path(__file__).parents[2] / "examples" / "quickstart.yaml"
TEXT = QUICKSTART.read_text()

LLAMA3_8B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}
GPT2 = {"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
        "vocab_size": 50257}  # fmt: skip


def write_model(tmp_path: Path, config: dict[str, Any], name: str = "model") -> str:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    return str(d)


def with_model(path: str, **params: Any) -> PlatformSpec:
    """The quickstart with its `chat` group (pool `local`: 1 x 16 GiB per instance,
    max_concurrency 16) serving its model `demo-sim` from `path` instead."""
    spec = load_spec_text(TEXT).spec
    model = SimpleNamespace(  # memory_gb: the declared size the existing check sums
        runtime="transformers",
        transformers=SimpleNamespace(model_path=path, **params),
        memory_gb=1.0,
    )
    chat = spec.groups[0].model_copy(update={"models": {"demo-sim": model}})
    return spec.model_copy(update={"groups": [chat, *spec.groups[1:]]})


def test_a_model_too_big_for_its_instance_is_refused_with_the_numbers(tmp_path: Path) -> None:
    model = write_model(tmp_path, LLAMA3_8B)
    [(path, msg)] = check_platform(with_model(model, max_context=4096), read_model_dir)
    assert path == ("groups", 0, "resources")
    assert msg.startswith("model 'demo-sim' needs ")
    # 16 slots x 4096 tokens x 128 KiB = 8 GiB of KV on top of 15 GiB of weights.
    assert "weights 15.0 GiB (bf16), KV cache 8.0 GiB at context 4096 x concurrency 16" in msg
    assert "pool 'local' gives 16 GiB per instance (1 x 16 GiB virtual)" in msg
    assert "resources.accelerators: 2 (tensor parallel) fits" in msg
    # Without params the context is the config's own (8192): twice the KV.
    [(_, msg)] = check_platform(with_model(model), read_model_dir)
    assert "KV cache 16.0 GiB at context 8192 x concurrency 16" in msg


def test_a_model_that_fits_passes_and_params_dtype_is_used(tmp_path: Path) -> None:
    assert check_platform(with_model(write_model(tmp_path, GPT2)), read_model_dir) == []
    big = write_model(tmp_path, LLAMA3_8B, "llama")
    # int4 weights (5.2 GiB) and 1024 tokens a slot (2 GiB of KV) fit 16 GiB.
    assert check_platform(with_model(big, dtype="int4", max_context=1024), read_model_dir) == []
    # 'auto' means the checkpoint's own dtype: bf16, which does not fit.
    assert check_platform(with_model(big, dtype="auto", max_context=1024), read_model_dir) != []


def test_missing_directory_or_config_is_located_at_model_path(tmp_path: Path) -> None:
    at = ("groups", 0, "models", "demo-sim", "transformers", "model_path")
    [(path, msg)] = check_platform(with_model(str(tmp_path / "nope")), read_model_dir)
    assert path == at and "model directory not found" in msg
    (tmp_path / "empty").mkdir()
    [(path, msg)] = check_platform(with_model(str(tmp_path / "empty")), read_model_dir)
    assert path == at and "no config.json" in msg
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json")
    [(path, msg)] = check_platform(with_model(str(tmp_path / "bad")), read_model_dir)
    assert path == at and msg.startswith(f"{tmp_path / 'bad' / 'config.json'}: cannot read")
    incomplete = {k: v for k, v in LLAMA3_8B.items() if k != "vocab_size"}
    [(path, msg)] = check_platform(with_model(write_model(tmp_path, incomplete)), read_model_dir)
    assert path == at and "config.json: vocab_size: missing" in msg


def test_sim_and_embedding_models_are_not_read() -> None:
    calls: list[str] = []

    def reader(path: str) -> ModelDir:
        calls.append(path)
        return read_model_dir(path)

    spec = load_spec_file(QUICKSTART, read_model=reader).spec
    assert check_platform(spec, reader) == []
    assert calls == []
    assert all(model_path_of(m) is None for g in spec.groups for m in g.models.values())
    # Without a reader (specs from the store, the control API) nothing is read either.
    assert check_platform(with_model("/does/not/exist")) == []
