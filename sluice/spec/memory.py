"""How much accelerator memory a model needs, which pool fits it, and whether a group can start.

Pure: a parsed config.json (and optionally the real weight bytes) in, numbers out. It lives
in `spec` rather than `policy` because `spec.checks` refuses a group with it (G2), and
`spec` sits below `policy` in the layers.

The model, per accelerator of an instance sharded over N (tensor parallel):

    weights      parameters x bytes per dtype / N  (or the safetensors bytes / N)
    KV cache     2 (K and V) x layers x ceil(kv_heads / N) x head_dim x bytes
                 x max_context x concurrency   (every slot at full context: the worst case
                 the gateway can send, since it admits `max_concurrency` per instance)
    activations  the peak of one forward pass over a prefill chunk of
                 min(context x concurrency, 8192) tokens (vLLM's default chunked-prefill
                 budget, max_num_batched_tokens, for its server on large GPUs): per token
                 q/k/v, two hidden-wide buffers and the MLP's gate, up and activated outputs;
                 plus fp32 logits and probabilities for one row per sequence
    runtime      1 GiB fixed: CUDA context, cuBLAS/NCCL workspaces, CUDA-graph pool
    headroom     (sum above) x (1/0.9 - 1): vLLM claims at most gpu_memory_utilization
                 (default 0.9) of each device and sizes its KV cache from what its profiling
                 run leaves inside that share, so a device must hold the sum / 0.9

"overhead" in messages is activations + runtime + headroom. Llama-3-8B at 8192 x 1 in bf16:
weights 14.96 GiB, KV 1.0 GiB (128 KiB a token), overhead about 3.8 GiB.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sluice.spec.hfconfig import ModelConfigError, ModelShape, model_shape, parameter_count
from sluice.spec.models import PoolSpec, ResourcesSpec

__all__ = [
    "BYTES_PER_ELEMENT",
    "GIB",
    "MemoryEstimate",
    "PoolFit",
    "estimate_memory",
    "group_memory_problem",
    "pool_fits",
]

GIB = 1024**3
BYTES_PER_ELEMENT: dict[str, float] = {
    "fp32": 4.0,
    "fp16": 2.0,
    "bf16": 2.0,
    "int8": 1.0,
    "fp8": 1.0,
    "int4": 0.5,
}
_FLOAT = ("fp32", "fp16", "bf16")

UTILIZATION = 0.9
"""vLLM's default gpu_memory_utilization: the share of each device it will ever use."""
RUNTIME_BYTES = 1 * GIB
"""Per device, outside tensors: CUDA context (~0.5 GiB), workspaces, CUDA-graph pool."""
PREFILL_CHUNK = 8192
"""Tokens in one forward pass (vLLM's default max_num_batched_tokens on >= 70 GiB GPUs)."""
LOGIT_COPIES = 2
"""fp32 logits and the probabilities the sampler computes from them, one row a sequence."""
_MAX_DEVICES = 64  # ResourcesSpec.accelerators allows up to 64 per instance


@dataclass(frozen=True)
class MemoryEstimate:
    """Accelerator memory of one instance, in bytes, summed over its `devices`.

    `per_device_bytes` is what each device must hold (shards are even, so totals are
    devices x per-device, except KV heads that tensor parallel replicates)."""

    model_type: str
    params: int
    active_params: int
    dtype: str
    """Weights: the dtype used, or 'files' when the safetensors bytes were given."""
    kv_dtype: str
    activation_dtype: str
    """What the model computes in (and keeps embeddings in when its weights are quantized)."""
    max_context: int
    concurrency: int
    devices: int
    weights_bytes: int
    kv_bytes_per_token: int
    """K and V of one token across all layers and devices (Llama-3-8B bf16: 131072)."""
    kv_bytes: int
    activation_bytes: int
    runtime_bytes: int
    headroom_bytes: int
    per_device_bytes: int
    utilization: float

    @property
    def overhead_bytes(self) -> int:
        return self.activation_bytes + self.runtime_bytes + self.headroom_bytes

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.overhead_bytes

    def fits(self, memory_gib: float) -> bool:
        """Whether each of `devices` accelerators of `memory_gib` GiB holds its share."""
        return self.per_device_bytes <= memory_gib * GIB

    def summary(self) -> str:
        """'31.2 GiB: weights 15.0 GiB, KV 16.0 GiB at context 8192 x concurrency 16,
        overhead 2.8 GiB' (the numbers a refusal shows)."""
        each = f" ({_gib(self.per_device_bytes)} on each of {self.devices})" * (self.devices > 1)
        return (
            f"{_gib(self.total_bytes)}{each}: weights {_gib(self.weights_bytes)} "
            f"({self.dtype}), KV cache {_gib(self.kv_bytes)} at context {self.max_context} x "
            f"concurrency {self.concurrency}, overhead {_gib(self.overhead_bytes)}"
        )

    def to_json(self) -> dict[str, Any]:
        gib = {
            "weights": self.weights_bytes,
            "kv_cache": self.kv_bytes,
            "activations": self.activation_bytes,
            "runtime": self.runtime_bytes,
            "headroom": self.headroom_bytes,
            "overhead": self.overhead_bytes,
            "total": self.total_bytes,
            "per_device": self.per_device_bytes,
        }
        return {
            "model_type": self.model_type,
            "params": self.params,
            "active_params": self.active_params,
            "dtype": self.dtype,
            "kv_dtype": self.kv_dtype,
            "activation_dtype": self.activation_dtype,
            "max_context": self.max_context,
            "concurrency": self.concurrency,
            "devices": self.devices,
            "utilization": self.utilization,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "prefill_tokens": min(self.max_context * self.concurrency, PREFILL_CHUNK),
            "bytes": gib,
            "gib": {k: round(v / GIB, 3) for k, v in gib.items()},
        }


def estimate_memory(
    config: Mapping[str, Any],
    *,
    max_context: int | None = None,
    concurrency: int = 1,
    dtype: str | None = None,
    kv_dtype: str | None = None,
    weight_bytes: int | None = None,
    devices: int = 1,
    utilization: float = UTILIZATION,
) -> MemoryEstimate:
    """Estimate one instance's accelerator memory (bytes) from a parsed config.json.

    `max_context`: tokens per sequence (default: the config's max_position_embeddings);
    `concurrency`: sequences held at once; `dtype`: weights' dtype (default: the config's;
    int4/int8/fp8 keep the embeddings and activations in 16-bit); `kv_dtype`: default the
    activation dtype; `weight_bytes`: the real checkpoint size, which wins over the
    parameter count; `devices`: tensor-parallel degree. Raises ModelConfigError.
    """
    if concurrency < 1 or devices < 1 or not 0 < utilization <= 1:
        raise ValueError("concurrency and devices must be >= 1, utilization in (0, 1]")
    shape = model_shape(config)
    context = max_context or shape.max_context
    if context is None or context < 1:
        raise ModelConfigError(
            "max_position_embeddings", "config.json does not give a context length; pass one"
        )
    counted = parameter_count(shape)
    weights_dtype, compute = _dtypes(shape, dtype)
    kv_name = kv_dtype or compute
    if kv_name not in BYTES_PER_ELEMENT:
        raise ValueError(f"unknown KV dtype {kv_name!r}; one of {', '.join(BYTES_PER_ELEMENT)}")
    if weight_bytes is not None:
        weights, weights_dtype = float(weight_bytes), "files"
    else:
        quantized = counted.total - counted.embedding
        weights = quantized * _weight_bytes(shape, weights_dtype)
        weights += counted.embedding * BYTES_PER_ELEMENT[compute]
    n = devices
    kv_heads_each = math.ceil(shape.kv_heads / n)  # beyond kv_heads, devices hold copies
    kv_token_each = 2 * shape.layers * kv_heads_each * shape.head_dim * BYTES_PER_ELEMENT[kv_name]
    tokens = context * concurrency
    kv_each = kv_token_each * tokens
    act_each = _activations(shape, n, min(tokens, PREFILL_CHUNK), concurrency, compute)
    used_each = weights / n + kv_each + act_each + RUNTIME_BYTES
    headroom_each = used_each * (1 / utilization - 1)
    return MemoryEstimate(
        model_type=shape.model_type,
        params=counted.total,
        active_params=counted.active,
        dtype=weights_dtype,
        kv_dtype=kv_name,
        activation_dtype=compute,
        max_context=context,
        concurrency=concurrency,
        devices=n,
        weights_bytes=round(weights),
        kv_bytes_per_token=round(kv_token_each * n),
        kv_bytes=round(kv_each * n),
        activation_bytes=round(act_each * n),
        runtime_bytes=RUNTIME_BYTES * n,
        headroom_bytes=round(headroom_each * n),
        per_device_bytes=math.ceil(used_each + headroom_each),
        utilization=utilization,
    )


@dataclass(frozen=True)
class PoolFit:
    """How `pool` would host the model: the fewest accelerators per instance that fit
    (`accelerators` > 1 means tensor parallel across that many), or why none do."""

    pool: str
    accelerator: str
    memory_gb: float
    accelerators: int | None
    estimate: MemoryEstimate | None
    reason: str = ""

    @property
    def instance_gib(self) -> float:
        """Memory one instance gets there: accelerators x per-accelerator GiB."""
        return (self.accelerators or 0) * self.memory_gb

    def to_json(self) -> dict[str, Any]:
        return {
            "pool": self.pool,
            "accelerator": self.accelerator,
            "memory_gb": self.memory_gb,
            "accelerators": self.accelerators,
            "tensor_parallel": self.accelerators is not None and self.accelerators > 1,
            "instance_gib": self.instance_gib,
            "per_device_gib": (
                round(self.estimate.per_device_bytes / GIB, 3) if self.estimate else None
            ),
            "reason": self.reason,
        }


def pool_fits(
    config: Mapping[str, Any], pools: Sequence[PoolSpec], **options: Any
) -> list[PoolFit]:
    """Every pool's fit, best first: fitting pools by the memory one instance would take
    there (accelerators x memory_gb: the smallest tier that holds it), then fewer devices
    (no tensor parallel when one is enough), then price; pools that cannot, last.

    `options` are estimate_memory's (max_context, concurrency, dtype, ...), never devices.
    Tensor parallel degrees tried: powers of two up to the pool's count (and 64) that divide
    the attention heads, as vLLM requires."""
    shape = model_shape(config)
    fits = [_pool_fit(config, shape, p, options) for p in pools]

    def rank(f: PoolFit) -> tuple[bool, float, int, float, str]:
        price = next(p.price_per_hour for p in pools if p.name == f.pool)
        n = f.accelerators or 0
        return f.accelerators is None, f.instance_gib, n, price * n, f.pool

    return sorted(fits, key=rank)


def group_memory_problem(
    config: Mapping[str, Any],
    resources: ResourcesSpec,
    pool: PoolSpec,
    *,
    concurrency: int,
    max_context: int | None = None,
    dtype: str | None = None,
    weight_bytes: int | None = None,
) -> str | None:
    """Why an instance with `resources` on `pool` cannot hold this model at `concurrency`
    sequences of `max_context` tokens, with the numbers and a fix; None when it can."""
    n = resources.accelerators
    options: dict[str, Any] = {
        "max_context": max_context,
        "dtype": dtype,
        "weight_bytes": weight_bytes,
    }
    est = estimate_memory(config, concurrency=concurrency, devices=n, **options)
    if est.fits(pool.memory_gb):
        return None
    fixes = []
    more = _fewest_devices(
        config, model_shape(config), pool, {**options, "concurrency": concurrency}
    )
    if more is not None and more.accelerators is not None:
        fixes.append(f"resources.accelerators: {more.accelerators} (tensor parallel) fits")
    lower = _most_concurrency(config, pool, n, concurrency, options)
    if lower:
        fixes.append(f"max_concurrency <= {lower} fits")
    fixes.append(f"or a pool with >= {_gib(est.per_device_bytes)} per accelerator")
    return (
        f"needs {est.summary()}; pool {pool.name!r} gives {n * pool.memory_gb:g} GiB "
        f"per instance ({n} x {pool.memory_gb:g} GiB {pool.accelerator}); " + ", ".join(fixes)
    )


def _dtypes(shape: ModelShape, dtype: str | None) -> tuple[str, str]:
    """(weights dtype, activation dtype). Quantized weights still compute in 16 bits."""
    if dtype is not None and dtype not in BYTES_PER_ELEMENT:
        raise ValueError(f"unknown dtype {dtype!r}; one of {', '.join(BYTES_PER_ELEMENT)}")
    stored = shape.dtype if shape.dtype in _FLOAT else "bf16"
    if dtype is None:
        if shape.weight_bits is not None:
            return ("int4" if shape.weight_bits <= 4 else "int8"), stored
        return (shape.dtype or "bf16"), stored
    return dtype, dtype if dtype in _FLOAT else stored


def _weight_bytes(shape: ModelShape, dtype: str) -> float:
    """Bytes per quantizable weight: a config's own bit width (e.g. 3-bit GPTQ) when the
    dtype came from it, else the table."""
    if shape.weight_bits is not None and dtype in ("int4", "int8") and shape.weight_bits < 8:
        return shape.weight_bits / 8
    return BYTES_PER_ELEMENT[dtype]


def _activations(shape: ModelShape, n: int, chunk: int, seqs: int, dtype: str) -> float:
    """Peak bytes of one forward pass on one of `n` devices (see the module docstring)."""
    if shape.experts:
        mlp = shape.experts_per_token * shape.expert_intermediate + shape.shared_intermediate
    else:
        mlp = shape.intermediate
    mlp_buffers = 3 if shape.gated_mlp else 2  # gate+up (fused) and the activated output
    qkv = shape.heads * shape.head_dim + 2 * shape.kv_width
    per_token = (qkv + mlp_buffers * mlp) / n + 2 * shape.hidden
    logits = min(seqs, chunk) * shape.vocab * 4 * LOGIT_COPIES
    return chunk * per_token * BYTES_PER_ELEMENT[dtype] + logits


def _pool_fit(
    config: Mapping[str, Any], shape: ModelShape, pool: PoolSpec, options: Mapping[str, Any]
) -> PoolFit:
    if pool.purpose != "inference":
        return PoolFit(pool.name, pool.accelerator, pool.memory_gb, None, None, "training pool")
    if pool.count == 0:
        return PoolFit(pool.name, pool.accelerator, pool.memory_gb, None, None, "empty pool")
    fit = _fewest_devices(config, shape, pool, options)
    if fit is not None:
        return fit
    n = _degrees(shape, pool)[-1]  # the widest tensor parallel it allows
    est = estimate_memory(config, devices=n, **options)
    why = (
        f"needs {_gib(est.per_device_bytes)} on each of {n} accelerator(s), "
        f"has {pool.memory_gb:g} GiB (pool count {pool.count})"
    )
    return PoolFit(pool.name, pool.accelerator, pool.memory_gb, None, None, why)


def _fewest_devices(
    config: Mapping[str, Any], shape: ModelShape, pool: PoolSpec, options: Mapping[str, Any]
) -> PoolFit | None:
    for n in _degrees(shape, pool):
        est = estimate_memory(config, devices=n, **options)
        if est.fits(pool.memory_gb):
            return PoolFit(pool.name, pool.accelerator, pool.memory_gb, n, est)
    return None


def _degrees(shape: ModelShape, pool: PoolSpec) -> list[int]:
    """Tensor-parallel sizes vLLM accepts here: powers of two dividing the heads."""
    limit = min(pool.count, _MAX_DEVICES)
    out, n = [], 1
    while n <= limit:
        if shape.heads % n == 0:
            out.append(n)
        n *= 2
    return out


def _most_concurrency(
    config: Mapping[str, Any], pool: PoolSpec, n: int, now: int, options: Mapping[str, Any]
) -> int:
    """The largest concurrency below `now` that fits n devices of `pool` (0: not even 1).
    The need grows with concurrency, so bisect."""
    lo, hi = 0, now - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if estimate_memory(config, concurrency=mid, devices=n, **options).fits(pool.memory_gb):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"
