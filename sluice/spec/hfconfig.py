"""A Hugging Face `config.json`, read into the few numbers memory depends on (pure: a dict in).

Field names differ by family; `model_shape` accepts the common ones and says which field it
missed, so that an estimate never rests on a silently guessed width:

    what              llama / mistral / qwen2 / mixtral     gpt2
    width             hidden_size                           n_embd
    layers            num_hidden_layers                     n_layer
    attention heads   num_attention_heads                   n_head
    KV heads          num_key_value_heads (GQA; else heads)  = heads
    head width        head_dim (else width / heads)          width / heads
    MLP width         intermediate_size (3 matrices, gated)  n_inner or 4 x width (2 matrices)
    experts (MoE)     num_local_experts | num_experts | n_routed_experts, num_experts_per_tok,
                      moe_intermediate_size, shared_expert_intermediate_size | n_shared_experts
    context           max_position_embeddings               n_positions (also learned rows)
    tied LM head      tie_word_embeddings (absent: untied)  always tied
    dtype             torch_dtype | dtype                   (absent: float32, as HF loads it)

A multimodal config (`text_config` inside) is read from its language model; the vision tower
is not counted (pass the real weight bytes from the files for that).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ModelConfigError",
    "ModelShape",
    "ParamCount",
    "model_shape",
    "normalise_dtype",
    "parameter_count",
]


class ModelConfigError(ValueError):
    """config.json lacks (or mistypes) a field the estimate needs; `field` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class ModelShape:
    """The architecture numbers memory depends on. Widths are in elements, not bytes."""

    model_type: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    """Width of a dense MLP (or of the dense layers of a MoE that has some)."""
    vocab: int
    tied_embeddings: bool
    gated_mlp: bool
    """SwiGLU-style MLP (gate, up, down: 3 matrices) rather than GPT-2's (fc, proj: 2)."""
    experts: int
    """Routed experts per MoE layer; 0 for a dense model."""
    experts_per_token: int
    expert_intermediate: int
    shared_intermediate: int
    """Width of the always-on shared expert(s) in a MoE layer (Qwen2-MoE, DeepSeek); 0: none."""
    dense_layers: int
    """Leading layers with a dense MLP in a MoE (DeepSeek's first_k_dense_replace)."""
    learned_positions: int
    """Rows of a learned position table (GPT-2's wpe); 0 for rotary models."""
    max_context: int | None
    """Longest sequence the model was configured for, in tokens (None: config is silent)."""
    dtype: str | None
    """The config's torch_dtype / dtype, normalised (`bf16`, `fp16`, `fp32`, ...)."""
    weight_bits: float | None
    """Bits per weight from a `quantization_config` (AWQ/GPTQ 4, fp8 8); None: unquantized."""

    @property
    def kv_width(self) -> int:
        """Elements of K (or of V) one token stores per layer: kv_heads x head_dim."""
        return self.kv_heads * self.head_dim


@dataclass(frozen=True)
class ParamCount:
    """Parameters, in elements. `active` is what one token passes through (MoE: top-k)."""

    total: int
    active: int
    embedding: int
    """Input embeddings, position table and an untied LM head: the part that quantizers
    (AWQ, GPTQ, bitsandbytes) leave in 16-bit."""


_DTYPES = {
    "float32": "fp32",
    "float": "fp32",
    "fp32": "fp32",
    "float16": "fp16",
    "half": "fp16",
    "fp16": "fp16",
    "bfloat16": "bf16",
    "bf16": "bf16",
    "int8": "int8",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "fp8": "fp8",
    "int4": "int4",
}


def normalise_dtype(name: str) -> str | None:
    """'torch.bfloat16' / 'bfloat16' / 'bf16' -> 'bf16'; None for a name we do not know."""
    return _DTYPES.get(name.strip().lower().removeprefix("torch."))


def model_shape(config: Mapping[str, Any]) -> ModelShape:
    """Read a parsed config.json. Raises ModelConfigError naming the first missing field."""
    text = config.get("text_config")
    if isinstance(text, Mapping) and "hidden_size" not in config and "n_embd" not in config:
        # Multimodal wrapper: the language model's numbers live one level down; its dtype
        # is often only on the outside.
        inner = dict(text)
        for key in ("torch_dtype", "dtype", "quantization_config", "tie_word_embeddings"):
            if key in config and key not in inner:
                inner[key] = config[key]
        config = inner
    model_type = str(config.get("model_type") or "unknown")
    gpt2 = "n_embd" in config and "hidden_size" not in config
    hidden = _int(config, "n_embd" if gpt2 else "hidden_size")
    layers = _int(config, "n_layer" if gpt2 else "num_hidden_layers")
    heads = _int(config, "n_head" if gpt2 else "num_attention_heads")
    kv_heads = _int(config, "num_key_value_heads", default=heads) if not gpt2 else heads
    head_dim = _int(config, "head_dim", default=0) or hidden // heads
    if gpt2:
        intermediate = _int(config, "n_inner", default=0) or 4 * hidden
    else:
        intermediate = _int(config, "intermediate_size")
    experts = 0
    for key in ("num_local_experts", "num_experts", "n_routed_experts"):
        experts = _int(config, key, default=0)
        if experts:
            break
    per_token = _int(config, "num_experts_per_tok", default=2 if experts else 0)
    expert_width = _int(config, "moe_intermediate_size", default=0) or intermediate
    shared = _int(config, "shared_expert_intermediate_size", default=0)
    if not shared and experts:
        shared = _int(config, "n_shared_experts", default=0) * expert_width
    positions_key = "n_positions" if gpt2 else "max_position_embeddings"
    max_context = _int(config, positions_key, default=0) or None
    dtype_name = config.get("torch_dtype") or config.get("dtype")
    dtype = normalise_dtype(dtype_name) if isinstance(dtype_name, str) else None
    if dtype is None and dtype_name is None:
        dtype = "fp32"  # what transformers loads a config without a dtype as
    return ModelShape(
        model_type=model_type,
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=intermediate,
        vocab=_int(config, "vocab_size"),
        tied_embeddings=bool(config.get("tie_word_embeddings", gpt2 or model_type == "gpt2")),
        gated_mlp=not gpt2,
        experts=experts,
        experts_per_token=min(per_token, experts),
        expert_intermediate=expert_width if experts else 0,
        shared_intermediate=shared,
        dense_layers=min(_int(config, "first_k_dense_replace", default=0), layers),
        learned_positions=(max_context or 0) if gpt2 else 0,
        max_context=max_context,
        dtype=dtype,
        weight_bits=_weight_bits(config.get("quantization_config")),
    )


def parameter_count(shape: ModelShape) -> ParamCount:
    """Parameters from the architecture: embeddings, attention, MLP / experts, norms.

    Per layer: attention q and o (hidden x heads*head_dim each) plus k and v
    (hidden x kv_heads*head_dim each); a gated MLP is 3 x hidden x width, GPT-2's 2 x; a MoE
    layer holds every expert (the router adds hidden x experts). GPT-2 also has biases and
    LayerNorm bias terms, which we count because its published 124M includes them.
    Llama-2-7B: 32 x (67.1M + 135.3M) + 2 x 131M = 6.74B.
    """
    h, q = shape.hidden, shape.heads * shape.head_dim
    attention = 2 * h * q + 2 * h * shape.kv_width
    matrices = 3 if shape.gated_mlp else 2
    dense_mlp = matrices * h * shape.intermediate
    norms = 2 * h
    if not shape.gated_mlp:  # GPT-2: biases on every projection, LayerNorm has a bias too
        attention += q + 2 * shape.kv_width + h
        dense_mlp += shape.intermediate + h
        norms *= 2
    dense_layer = attention + dense_mlp + norms
    if shape.experts:
        expert = matrices * h * shape.expert_intermediate
        shared = matrices * h * shape.shared_intermediate
        router = h * shape.experts
        moe_layers = shape.layers - shape.dense_layers
        moe_total = attention + norms + router + shared + shape.experts * expert
        moe_active = attention + norms + router + shared + shape.experts_per_token * expert
        layers_total = shape.dense_layers * dense_layer + moe_layers * moe_total
        layers_active = shape.dense_layers * dense_layer + moe_layers * moe_active
    else:
        layers_total = layers_active = shape.layers * dense_layer
    embedding = shape.vocab * h + shape.learned_positions * h
    head = 0 if shape.tied_embeddings else shape.vocab * h
    final_norm = h if shape.gated_mlp else 2 * h
    fixed = embedding + head + final_norm
    return ParamCount(
        total=layers_total + fixed, active=layers_active + fixed, embedding=embedding + head
    )


def _int(config: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = config.get(key)
    if value is None:
        if default is None:
            raise ModelConfigError(key, "missing from config.json; the estimate needs it")
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ModelConfigError(key, f"expected a non-negative integer, got {value!r}")
    return value


def _weight_bits(quant: Any) -> float | None:
    """Bits per stored weight for the common quantization configs (AWQ/GPTQ `bits`,
    bitsandbytes `load_in_4bit` / `load_in_8bit`, fp8 checkpoints)."""
    if not isinstance(quant, Mapping):
        return None
    bits = quant.get("bits") or quant.get("w_bit")
    if isinstance(bits, int) and not isinstance(bits, bool) and 0 < bits <= 16:
        return float(bits)
    if quant.get("load_in_4bit"):
        return 4.0
    if quant.get("load_in_8bit") or str(quant.get("quant_method", "")).lower() == "fp8":
        return 8.0
    return None
