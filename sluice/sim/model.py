"""The simulated instance model of one group, read from its spec: slots, launch -> ready time,
per-request service times (the `sim` runtime's formulas), the SLO, queue limits and price.

One instance model serves every simulated path (`sluice.sim.fleet`, and so the one-group
studies, the oracle's and the causal reference's runs), in one of two settings:

- **slots** (the default): `max_concurrency` independent slots, each request holding one
  for its service time whatever else runs. Service times follow
  `sluice.worker.runtimes.sim.service_seconds` (fixed, lognormal, or `a + b*input_tokens +
  c*output_tokens`), computed for a whole trace at once with numpy, and then clipped to
  [`SERVICE_MIN_S`, `SERVICE_MAX_S`] = [0.01, 30] s: a simulator bound (the spec has no
  field for it yet), so that a token-count outlier cannot hold a slot for minutes.
- **batching** (the `sim` params' `batching:` block): each instance is a continuously
  batching server (`sluice.sim.batching`): what a request takes depends on what else runs,
  and TTFT, TPOT and KV-cache use come out of it. A request's tokens are clipped as the
  server requires (`batch_tokens`); its "service time" (the SLO's slowdown bound, the
  work floor, the wait in the summary) is its latency alone on an idle instance
  (`alone_seconds`), and `service_time` is not read.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from sluice.core.errors import SpecError, SpecIssue
from sluice.policy.autoscale.batching import ServerModel
from sluice.sim.batching import BatchingParams
from sluice.spec.autoscaling import SloSpec
from sluice.spec.models import GroupSpec, ModelSpec, PlatformSpec
from sluice.spec.runtimes import (
    BatchingSpec,
    FixedServiceTime,
    LinearServiceTime,
    LognormalServiceTime,
    ServiceTime,
    SimParams,
)

__all__ = [
    "SERVICE_MAX_S",
    "SERVICE_MIN_S",
    "InstanceModel",
    "alone_seconds",
    "batch_tokens",
    "batching_params",
    "describe_instances",
    "group_batching",
    "nominal_seconds",
    "pick_group",
    "with_fitted_batching",
]

SERVICE_MIN_S = 0.01
SERVICE_MAX_S = 30.0


@dataclass(frozen=True)
class InstanceModel:
    """Everything the simulator needs to know about one group's simulated instances."""

    group: GroupSpec
    slots: int
    """max_concurrency: independent slots per instance (no slowdown when busy)"""
    startup_s: float
    """launch -> ready: the models' start-up plus warm-up passes"""
    service: dict[str, ServiceTime]
    """model id -> service-time model; a trace model not served falls back to `default_model`"""
    default_model: str
    slo: SloSpec
    price_per_hour: float
    """per instance (pool price x accelerators)"""
    min_instances: int
    max_instances: int
    interval_s: float
    """decision tick"""
    seed: int
    platform: PlatformSpec | None = field(default=None, repr=False, compare=False)
    """the spec the model was read from: a one-group run puts the group alone on its pool,
    under the spec's budget and schedule templates (`sluice.sim.single.alone`)"""
    batching: BatchingParams | None = None
    """the instances as batching servers (the models' `sim.batching`); None: slots"""

    @classmethod
    def from_spec(
        cls, spec: PlatformSpec, group: GroupSpec, slo_ms: float | None = None
    ) -> InstanceModel:
        service: dict[str, ServiceTime] = {}
        startup = 0.0
        seed = 0
        batching = group_batching(group)
        for mid, m in group.models.items():
            params = m.sim or SimParams()
            if m.runtime != "sim":
                raise SpecError(
                    [
                        SpecIssue(
                            f"groups.{group.name}.models.{mid}.runtime",
                            f"runtime {m.runtime!r} cannot be simulated as written; simulate it as "
                            "the server `sluice loadtest GROUP --fit` measured (`sluice "
                            "simulate --fit`), or use runtime: sim with a service_time model",
                        )
                    ]
                )
            service[mid] = params.service_time
            if batching is not None:
                nominal = float(
                    alone_seconds(batching, np.zeros(1), np.full(1, 1.0 * params.output_tokens))[0]
                )
            else:
                nominal = nominal_seconds(params.service_time, params.output_tokens)
            startup += params.startup_s + group.warmup.requests * nominal
            seed = params.seed
        if slo_ms is not None:
            slo = SloSpec(latency_ms=slo_ms, target=group.slo.target if group.slo else 0.99)
        elif group.slo is not None:
            slo = group.slo
        else:
            raise SpecError(
                [
                    SpecIssue(
                        f"groups.{group.name}.slo",
                        "the group has no slo; add e.g. `slo: {latency_ms: 2000}` or "
                        "`slo: {slowdown: 2, slack_s: 1}`, or pass --slo-ms",
                    )
                ]
            )
        if batching is None and not slo.has_latency_bound:
            raise SpecError(
                [
                    SpecIssue(
                        f"groups.{group.name}.slo",
                        "ttft_ms / tpot_ms are judged on batching instances only (slots give "
                        "no first token before the last); add a `sim.batching:` block to the "
                        "group's models, or give `latency_ms` or `slowdown` too",
                    )
                ]
            )
        pool = spec.pool(group.resources.pool)
        price = (pool.price_per_hour if pool else 0.0) * group.resources.accelerators
        auto = group.autoscaling
        return cls(
            group=group,
            slots=group.max_concurrency,
            startup_s=startup,
            service=service,
            default_model=next(iter(group.models)),
            slo=slo,
            price_per_hour=price,
            min_instances=auto.min if auto else group.replicas,
            max_instances=auto.max if auto else group.replicas,
            interval_s=auto.interval_s if auto else 1.0,
            seed=seed,
            platform=spec,
            batching=batching,
        )

    def service_times(
        self,
        models: tuple[str, ...],
        model_idx: npt.NDArray[np.int32],
        input_tokens: npt.NDArray[np.int64],
        output_tokens: npt.NDArray[np.int64],
        seed: int,
    ) -> npt.NDArray[np.float64]:
        """Seconds each request holds a slot, clipped to [SERVICE_MIN_S, SERVICE_MAX_S]; for
        a batching model, each request's latency alone on an idle instance (`alone_seconds`
        of its `batch_tokens`, not clipped)."""
        if self.batching is not None:
            prompt, output = batch_tokens(self.batching, input_tokens, output_tokens)
            return alone_seconds(self.batching, prompt, output)
        out = np.empty(model_idx.shape[0], dtype=np.float64)
        rng = np.random.default_rng(seed)
        for i, name in enumerate(models):
            st = self.service.get(name) or self.service[self.default_model]
            sel = model_idx == i
            n = int(sel.sum())
            if n == 0:
                continue
            match st:
                case FixedServiceTime(seconds=s):
                    out[sel] = s
                case LognormalServiceTime(median_s=med, sigma=sigma):
                    out[sel] = rng.lognormal(math.log(med), sigma, n)
                case LinearServiceTime(a=a, b=b, c=c):
                    out[sel] = a + b * input_tokens[sel] + c * output_tokens[sel]
        return np.clip(out, SERVICE_MIN_S, SERVICE_MAX_S)

    def slo_limits(self, service: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """Per-request latency bound in seconds: the fixed bound and/or the slowdown bound
        (`slowdown` x service + `slack_s`); with both, the tighter one."""
        limit = np.full(service.shape[0], np.inf)
        if self.slo.latency_ms is not None:
            limit = np.minimum(limit, self.slo.latency_ms / 1000.0)
        if self.slo.slowdown is not None:
            limit = np.minimum(limit, self.slo.slowdown * service + self.slo.slack_s)
        return limit

    def describe(self) -> dict[str, object]:
        """The instance model in words and numbers (printed with every benchmark row)."""
        slo = self.slo
        parts = []
        if slo.latency_ms is not None:
            parts.append(f"latency <= {slo.latency_ms:g} ms")
        if slo.slowdown is not None:
            parts.append(f"latency <= {slo.slowdown:g} x service + {slo.slack_s:g} s")
        if slo.ttft_ms is not None:
            parts.append(f"TTFT <= {slo.ttft_ms:g} ms")
        if slo.tpot_ms is not None:
            parts.append(f"TPOT <= {slo.tpot_ms:g} ms")
        b = self.batching
        instances = describe_instances(b, self.slots)
        return {
            "group": self.group.name,
            "instances": instances,
            "slots_per_instance": self.slots,
            "startup_s": self.startup_s,
            "service_time": (
                {k: v.model_dump(mode="json") for k, v in self.service.items()}
                if b is None
                else "latency alone on an idle instance"
            ),
            "service_clip_s": [SERVICE_MIN_S, SERVICE_MAX_S] if b is None else None,
            "slo": " and ".join(parts),
            "slo_target": slo.target,
            "min": self.min_instances,
            "max": self.max_instances,
            "price_per_instance_hour": self.price_per_hour,
            "queue": self.group.queue.model_dump(mode="json"),
        }


def describe_instances(b: BatchingParams | None, slots: int) -> dict[str, object]:
    """Which instance model a group runs, in words (`text`) and numbers (`params`)."""
    if b is None:
        return {
            "kind": "slots",
            "text": f"{slots} independent slots per instance, each request its service time",
        }
    kv = "an unbounded KV cache" if b.kv_tokens == math.inf else f"{b.kv_tokens:g} KV tokens"
    pf = "instant prefill" if b.prefill_tps == math.inf else f"prefill {b.prefill_tps:g} tok/s"
    step = f"{b.step_base_s:g} s + {b.step_per_seq_s:g} s/seq + {b.step_per_kv_token_s:g} s/token"
    return {
        "kind": "batching",
        "text": f"a continuously batching server: {b.max_seqs} sequences, {kv}, {pf}, "
        f"decode step {step}; the gateway sends each instance up to {slots}",
        "params": {k: None if v == math.inf else v for k, v in dataclasses.asdict(b).items()},
    }


def batching_params(spec: BatchingSpec) -> BatchingParams:
    """The simulator's `BatchingParams` of a spec's `batching:` block, read as the policy
    reads it (`ServerModel.from_spec`: unset is an unbounded KV cache, an instant prefill)."""
    return BatchingParams(**dataclasses.asdict(ServerModel.from_spec(spec)))


def group_batching(group: GroupSpec) -> BatchingParams | None:
    """The group's batching server: one per instance, so every `sim` model of the group
    declares the same `batching:` block, or none does."""
    blocks = {mid: m.sim.batching if m.sim else None for mid, m in group.models.items()}
    kinds = set(blocks.values())
    if len(kinds) > 1:
        first = next(iter(blocks))
        other = next(mid for mid, b in blocks.items() if b != blocks[first])
        raise SpecError(
            [
                SpecIssue(
                    f"groups.{group.name}.models.{other}.sim.batching",
                    f"differs from model {first!r}'s: an instance is one batching server, so "
                    "every model of the group declares the same batching block (or none does)",
                )
            ]
        )
    only = kinds.pop() if kinds else None
    return None if only is None else batching_params(only)


def batch_tokens(
    params: BatchingParams,
    input_tokens: npt.NDArray[np.int64],
    output_tokens: npt.NDArray[np.int64],
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Each request's (prompt, output) tokens as a batching server takes them: at least one
    output token; a request longer than the KV cache keeps its answer (up to the cache less
    one token) and loses the prompt's head (a server truncating prompts to its context)."""
    output = np.clip(output_tokens.astype(np.float64), 1.0, max(1.0, params.kv_tokens - 1.0))
    prompt = np.clip(input_tokens.astype(np.float64), 0.0, None)
    if params.kv_tokens != math.inf:
        prompt = np.minimum(prompt, params.kv_tokens - output)
    return prompt, output


def alone_seconds(
    params: BatchingParams, prompt: npt.NDArray[np.float64], output: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """Each request's latency alone on an idle batching instance: its prefill, then `output`
    steps of one sequence, each at its midpoint's KV (`sluice.sim.batching`'s closed form)."""
    prefill = prompt / params.prefill_tps if params.prefill_tps != math.inf else 0.0
    step = params.step_base_s + params.step_per_seq_s
    return prefill + output * (step + params.step_per_kv_token_s * (prompt + output / 2.0))


def nominal_seconds(st: ServiceTime, output_tokens: int) -> float:
    """A typical request's service time under `st` (the median; `output_tokens` long)."""
    match st:
        case FixedServiceTime(seconds=s):
            return s
        case LognormalServiceTime(median_s=med):
            return med
        case LinearServiceTime(a=a, b=b, c=c):
            return a + b + c * output_tokens


def with_fitted_batching(
    spec: PlatformSpec, report: Mapping[str, Any], source: str
) -> tuple[PlatformSpec, dict[str, Any]]:
    """The spec with the load-tested group's instances as the batching server `sluice
    loadtest --fit` measured (`report`: that load test's report, `fit.params` under
    `BatchingParams`' names): each of the group's models becomes a `sim` model with that
    `batching:` block, so a `command` or `external` group is simulated on what its real
    server did. What the fit does not measure: `max_seqs` is the group's `max_concurrency`
    (the gateway never sends more), the KV cache is unbounded, a prompt's prefill is free
    where the fit could not tell its rate; new instances take the start-up the load test saw
    (`fit.startup_s`), else the group's declared one. Returns the spec and what was used."""

    def refuse(why: str) -> SpecError:
        return SpecError([SpecIssue("--fit", f"{source}: {why}")])

    fit, name = report.get("fit"), report.get("group")
    if not (isinstance(fit, Mapping) and isinstance(fit.get("params"), Mapping)) or not isinstance(
        name, str
    ):
        fix = "give the JSON of `sluice loadtest GROUP --fit --json` or of its stored run"
        raise refuse(f"no fitted batching model in it; {fix}")
    g, params = spec.group(name), fit["params"]
    if g is None:
        raise refuse(f"it fits group {name!r}, which this spec does not have")
    if params.get("step_base_s") is None:
        raise refuse(f"the fit has no step time ({fit.get('error', 'not fitted')})")
    batching = BatchingSpec(
        max_seqs=g.max_concurrency,
        prefill_tps=params.get("prefill_tps"),
        step_base_s=params["step_base_s"],
        step_per_seq_s=params.get("step_per_seq_s") or 0.0,
        step_per_kv_token_s=params.get("step_per_kv_token_s") or 0.0,
    )
    startup = fit.get("startup_s") or g.declared_startup_s()
    models = {
        mid: ModelSpec(
            runtime="sim",
            version=m.version,
            sim=SimParams(startup_s=startup, batching=batching),
        )
        for mid, m in g.models.items()
    }
    fitted = g.model_copy(update={"models": models})
    groups = [fitted if x.name == name else x for x in spec.groups]
    used = {
        "group": name,
        "from": source,
        "version": report.get("version"),
        "startup_s": startup,
        "batching": batching.model_dump(mode="json"),
    }
    return spec.model_copy(update={"groups": groups}), used


def pick_group(spec: PlatformSpec, name: str | None, source: str = "<spec>") -> GroupSpec:
    """The group to simulate: `name`, else the first group with autoscaling, else the first."""
    if name is not None:
        g = spec.group(name)
        if g is None:
            names = ", ".join(x.name for x in spec.groups) or "none"
            raise SpecError(
                [SpecIssue("groups", f"no group named {name!r}; groups: {names}", source)]
            )
        return g
    if not spec.groups:
        raise SpecError([SpecIssue("groups", "the spec has no groups to simulate", source)])
    return next((g for g in spec.groups if g.autoscaling is not None), spec.groups[0])
