"""The memory estimate against published numbers of known models (configs written inline, as
their config.json on the Hugging Face hub has them; no hub access), and the pool it picks."""

from __future__ import annotations

from typing import Any

import pytest

from sluice.spec import ModelConfigError, PoolSpec, estimate_memory, pool_fits
from sluice.spec.memory import GIB, group_memory_problem
from sluice.spec.models import ResourcesSpec

LLAMA2_7B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "max_position_embeddings": 4096,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "vocab_size": 32000,
}
LLAMA3_8B: dict[str, Any] = {
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
MIXTRAL_8X7B: dict[str, Any] = {
    "model_type": "mixtral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "num_attention_heads": 32,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 32000,
}
QWEN2_7B: dict[str, Any] = {
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "max_position_embeddings": 131072,
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 152064,
}
QWEN15_MOE_A27B: dict[str, Any] = {
    "model_type": "qwen2_moe",
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632,
    "num_experts": 60,
    "num_experts_per_tok": 4,
    "max_position_embeddings": 8192,
    "num_attention_heads": 16,
    "num_hidden_layers": 24,
    "num_key_value_heads": 16,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
}
GPT2: dict[str, Any] = {  # openai-community/gpt2: no dtype, no n_inner
    "model_type": "gpt2",
    "n_ctx": 1024,
    "n_embd": 768,
    "n_head": 12,
    "n_inner": None,
    "n_layer": 12,
    "n_positions": 1024,
    "vocab_size": 50257,
}


def near(value: float, published: float, within: float) -> bool:
    return abs(value - published) <= within * published


@pytest.mark.parametrize(
    ("config", "total", "active"),
    [
        (LLAMA2_7B, 6.74e9, 6.74e9),
        (LLAMA3_8B, 8.03e9, 8.03e9),
        (MIXTRAL_8X7B, 46.7e9, 12.9e9),  # Mistral's announcement: 46.7B total, 12.9B a token
        (QWEN2_7B, 7.62e9, 7.62e9),  # Qwen2-7B model card: 7.6B (7,615,616,512)
        (QWEN15_MOE_A27B, 14.3e9, 2.7e9),  # Qwen1.5-MoE-A2.7B: 14.3B total, 2.7B activated
        (GPT2, 124.4e6, 124.4e6),  # 124,439,808 in transformers
    ],
)
def test_parameter_counts_match_the_published_ones(
    config: dict[str, Any], total: float, active: float
) -> None:
    est = estimate_memory(config)
    assert near(est.params, total, 0.01), est.params
    assert near(est.active_params, active, 0.02), est.active_params


def test_llama2_7b_weights_in_bf16_are_12_6_gib() -> None:
    est = estimate_memory(LLAMA2_7B, dtype="bf16")
    assert near(est.weights_bytes / GIB, 12.55, 0.01)
    assert est.dtype == "bf16"
    # Full MHA (32 KV heads x 128): 512 KiB a token; 4096 tokens of context = 2 GiB.
    assert est.kv_bytes_per_token == 512 * 1024
    assert est.kv_bytes == 2 * GIB
    assert est.max_context == 4096  # the config's max_position_embeddings


def test_dtype_sets_bytes_per_weight() -> None:
    sizes = {d: estimate_memory(LLAMA2_7B, dtype=d).weights_bytes for d in ("fp32", "fp16")}
    assert sizes["fp32"] == 2 * sizes["fp16"]
    # int8 / int4 quantize the layers; embeddings and LM head (262M) stay 16-bit.
    emb = 2 * 32000 * 4096
    layers = 6_738_415_616 - emb
    assert estimate_memory(LLAMA2_7B, dtype="int8").weights_bytes == layers + 2 * emb
    assert estimate_memory(LLAMA2_7B, dtype="int4").weights_bytes == layers // 2 + 2 * emb


def test_awq_4bit_config_is_near_the_published_checkpoint() -> None:
    # TheBloke/Llama-2-7B-AWQ: model.safetensors is 3.89 GB (4-bit weights plus scales).
    awq = {**LLAMA2_7B, "quantization_config": {"quant_method": "awq", "bits": 4}}
    est = estimate_memory(awq)
    assert est.dtype == "int4" and est.kv_dtype == est.activation_dtype == "fp16"
    assert near(est.weights_bytes, 3.89e9, 0.05), est.weights_bytes


def test_llama3_8b_gqa_kv_is_128_kib_a_token() -> None:
    est = estimate_memory(LLAMA3_8B, max_context=8192, concurrency=4)
    assert est.kv_bytes_per_token == 128 * 1024  # 2 x 32 layers x 8 KV heads x 128 x 2 B
    assert est.kv_bytes == 4 * GIB
    assert near(est.weights_bytes / GIB, 14.96, 0.01)
    fp8 = estimate_memory(LLAMA3_8B, max_context=8192, concurrency=4, kv_dtype="fp8")
    assert fp8.kv_bytes == 2 * GIB


def test_overhead_is_what_vllm_leaves_at_0_9_utilization() -> None:
    est = estimate_memory(LLAMA3_8B, max_context=8192)
    used = est.weights_bytes + est.kv_bytes + est.activation_bytes + est.runtime_bytes
    assert est.runtime_bytes == GIB
    assert est.per_device_bytes * 0.9 == pytest.approx(used, rel=1e-6)
    # Activations: vLLM's profiling reports ~1.2 GiB peak for this model at 8192 tokens.
    assert 0.5 * GIB < est.activation_bytes < 1.5 * GIB
    assert est.total_bytes == pytest.approx(used / 0.9, rel=1e-6)
    assert est.overhead_bytes == est.total_bytes - est.weights_bytes - est.kv_bytes


def test_real_weight_bytes_win_over_the_count() -> None:
    est = estimate_memory(LLAMA3_8B, weight_bytes=16_060_522_496)  # the safetensors index
    assert est.weights_bytes == 16_060_522_496 and est.dtype == "files"


def test_tensor_parallel_shards_weights_and_replicates_kv_past_the_kv_heads() -> None:
    one = estimate_memory(LLAMA3_8B, max_context=8192, concurrency=8)
    eight = estimate_memory(LLAMA3_8B, max_context=8192, concurrency=8, devices=8)
    assert eight.weights_bytes == one.weights_bytes
    assert eight.kv_bytes == one.kv_bytes  # 8 KV heads, one per device
    assert eight.per_device_bytes < one.per_device_bytes / 4
    sixteen = estimate_memory(LLAMA3_8B, max_context=8192, concurrency=8, devices=16)
    assert sixteen.kv_bytes == 2 * one.kv_bytes  # each head held by two devices


def test_mixtral_on_80_gib_needs_two_devices() -> None:
    est = estimate_memory(MIXTRAL_8X7B, max_context=32768)
    assert near(est.weights_bytes / GIB, 87.0, 0.01)
    [h100] = pool_fits(MIXTRAL_8X7B, [PoolSpec(name="h100", count=8, memory_gb=80)])
    assert h100.accelerators == 2
    lone = PoolSpec(name="lone", count=1, memory_gb=80)
    [fit] = pool_fits(MIXTRAL_8X7B, [lone])
    assert fit.accelerators is None and "has 80 GiB" in fit.reason
    [empty] = pool_fits(GPT2, [PoolSpec(name="empty", count=0, memory_gb=80)])
    assert empty.accelerators is None and empty.reason == "empty pool"


def test_multimodal_config_reads_its_language_model() -> None:
    wrapped = {"model_type": "llava", "torch_dtype": "bfloat16", "text_config": LLAMA3_8B}
    assert estimate_memory(wrapped).params == estimate_memory(LLAMA3_8B).params


def test_missing_field_is_named() -> None:
    broken = {k: v for k, v in LLAMA3_8B.items() if k != "num_hidden_layers"}
    with pytest.raises(ModelConfigError) as caught:
        estimate_memory(broken)
    assert caught.value.field == "num_hidden_layers"
    no_context = {k: v for k, v in LLAMA3_8B.items() if k != "max_position_embeddings"}
    with pytest.raises(ModelConfigError, match="context length"):
        estimate_memory(no_context)
    assert estimate_memory(no_context, max_context=2048).max_context == 2048


POOLS = [
    PoolSpec(name="train", count=8, memory_gb=141, purpose="training"),
    PoolSpec(name="h100", count=8, memory_gb=80, price_per_hour=4.0),
    PoolSpec(name="l40s", count=4, memory_gb=48, price_per_hour=1.5),
    PoolSpec(name="l4", count=8, memory_gb=24, price_per_hour=0.8),
]


def test_the_smallest_tier_that_holds_it_is_recommended() -> None:
    # Llama-3-8B, 16 x 8192 tokens: 16 GiB of KV + 15 GiB of weights: ~37 GiB.
    fits = pool_fits(LLAMA3_8B, POOLS, max_context=8192, concurrency=16)
    order = [(f.pool, f.accelerators) for f in fits]
    # l40s (1 x 48) and l4 (2 x 24) both give 48 GiB; one device beats tensor parallel.
    assert order == [("l40s", 1), ("l4", 2), ("h100", 1), ("train", None)]
    assert fits[-1].reason == "training pool"
    # GPT-2 fits anywhere: the smallest, cheapest accelerator.
    assert pool_fits(GPT2, POOLS)[0].pool == "l4"


def test_group_refusal_has_the_numbers_and_the_fixes() -> None:
    l4 = POOLS[3]
    msg = group_memory_problem(
        LLAMA3_8B, ResourcesSpec(pool="l4", memory_gb=24), l4, concurrency=16, max_context=8192
    )
    assert msg is not None
    # (15.0 + 16.0 + 0.9 activations + 1 runtime) / 0.9 = 36.5
    assert msg.startswith("needs 36.5 GiB: "), msg
    assert "weights 15.0 GiB (bf16)" in msg
    assert "KV cache 16.0 GiB at context 8192 x concurrency 16" in msg
    assert "overhead" in msg and "pool 'l4' gives 24 GiB per instance (1 x 24 GiB" in msg
    assert "resources.accelerators: 2 (tensor parallel) fits" in msg
    assert "max_concurrency <= 4 fits" in msg
    two = ResourcesSpec(pool="l4", accelerators=2, memory_gb=48)
    assert group_memory_problem(LLAMA3_8B, two, l4, concurrency=16, max_context=8192) is None
    # The concurrency it names is the largest that fits.
    one = ResourcesSpec(pool="l4", memory_gb=24)
    assert group_memory_problem(LLAMA3_8B, one, l4, concurrency=4, max_context=8192) is None
    assert group_memory_problem(LLAMA3_8B, one, l4, concurrency=5, max_context=8192) is not None
