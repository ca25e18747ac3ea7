"""A continuously batching server's capacity at the SLO (issue 36): the arrival rate one
instance serves while its typical request still meets the TTFT and TPOT bounds, from the
server's batching model (what `sluice loadtest --fit` fits, `sluice.policy.batching_fit`,
or a spec's `sim.batching` block) and the mean prompt and output lengths.

The model is `sluice.sim.batching`'s (prefill pauses the batch; a decode step of `b`
sequences holding `kv` tokens takes `c0 + c1 b + c2 kv`), read at steady state with Poisson
arrivals at `rate` to one instance, every request of `P` prompt and `O` output tokens:

- prefill: `S = P / prefill_tps` seconds a request; the prefill share `phi = rate x S`;
- decode: a sequence holds `K = P + O / 2` KV tokens on average; the mean time per output
  token `t` is a step over the share of time not prefilling, `t = step(b) / (1 - phi)`, with
  `b = rate x O x t` sequences decoding (Little's law over a request's `O` tokens), so
  `t = c0 / (1 - phi - (c1 + c2 K) x rate x O)` (closed form; no finite `t` past that pole);
- TPOT quantile: a request's `O - 1` tokens after its first take `step(b)` each plus the
  prefills of the requests arriving meanwhile, `N ~ Poisson(rate x (O - 1) x t)` of them
  (`scipy.stats.poisson`), each `S`: `tpot_q = step(b) + S x N_q / (O - 1)` (its mean is
  `t`: the two agree);
- TTFT quantile: a new request waits for the prefills ahead of it (prefill is FIFO and comes
  before decoding), an M/M/1 wait at utilization `phi` (`P(W > w) = phi x exp(-(1 - phi) w /
  S)`), then its own prefill and one decode step: `ttft_q = W_q + S + step(b)`;
- the KV cache holds `b x K <= kv_tokens`; at most `max_seqs` sequences run: `b <= max_seqs`.

`batching_capacity` is the largest rate at which the typical request meets every bound
with probability `q` (the SLO target), each of the `k` bounds on the caller's time (TTFT,
and TPOT for an answer of more than one token) at quantile `1 - (1 - q) / k`, so that
together they miss at most `1 - q` (Bonferroni: a request is in SLO when all hold); each
bound is nondecreasing in the rate (`scipy.optimize.brentq` on the first one to fail), and
it names the bound that sets it. What it leaves out: the spread of prompt and output
lengths (the typical request is the mean one; short answers feel a prefill more), arrival
bursts (the autoscaler's dispersion and envelope see those), preemption (the KV bound keeps
the mean occupancy under the cache) and chunked prefill (not modelled by the simulator
either). Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from scipy.optimize import brentq
from scipy.stats import poisson

from sluice.spec.runtimes import BatchingSpec

__all__ = ["BatchingServer", "ServerCapacity", "ServerModel", "batching_capacity"]

_XTOL = 1e-9
"""brentq's absolute tolerance on the rate (requests/s)"""


class BatchingServer(Protocol):
    """A batching server's parameters, as `sluice.sim.batching.BatchingParams` names them
    (math.inf: an unbounded KV cache or an instant prefill)."""

    @property
    def max_seqs(self) -> int: ...
    @property
    def kv_tokens(self) -> float: ...
    @property
    def prefill_tps(self) -> float: ...
    @property
    def step_base_s(self) -> float: ...
    @property
    def step_per_seq_s(self) -> float: ...
    @property
    def step_per_kv_token_s(self) -> float: ...


@dataclass(frozen=True, slots=True)
class ServerCapacity:
    """One instance's capacity at the SLO (module docstring), and what it is at that rate."""

    rps: float
    """requests per second one instance serves within the bounds; 0: not even one alone"""
    limit: str
    """the bound that sets it: 'ttft', 'tpot', 'kv_cache', 'max_seqs' or 'alone' (the
    typical request misses a bound on an idle instance: no rate serves it)"""
    batch: float
    """sequences decoding at that rate"""
    tpot_mean_s: float
    prefill_share: float


def _step(server: BatchingServer, b: float, kv_per_seq: float) -> float:
    return (
        server.step_base_s + (server.step_per_seq_s + server.step_per_kv_token_s * kv_per_seq) * b
    )


def _state(
    server: BatchingServer, rate: float, prompt: float, output: float
) -> tuple[float, float, float, float]:
    """(prefill seconds a request, prefill share, mean TPOT, sequences decoding) at `rate`;
    the TPOT is math.inf past the pole (the server cannot keep up)."""
    s = prompt / server.prefill_tps if server.prefill_tps != math.inf else 0.0
    phi = rate * s
    k = prompt + output / 2.0
    slack = 1.0 - phi - (server.step_per_seq_s + server.step_per_kv_token_s * k) * rate * output
    if slack <= 0.0:
        return s, phi, math.inf, math.inf
    t = server.step_base_s / slack
    return s, phi, t, rate * output * t


def _excess(
    server: BatchingServer,
    rate: float,
    prompt: float,
    output: float,
    ttft_s: float | None,
    tpot_s: float | None,
    q: float,
) -> list[tuple[str, float]]:
    """Each bound's excess at `rate` (> 0: broken), as (name, value / bound - 1)."""
    s, phi, t, b = _state(server, rate, prompt, output)
    k = prompt + output / 2.0
    out: list[tuple[str, float]] = []
    if ttft_s is not None:
        if phi >= 1.0 or t == math.inf:
            out.append(("ttft", math.inf))
        else:
            wait = 0.0
            if s > 0.0 and phi > 1.0 - q:
                wait = s / (1.0 - phi) * math.log(phi / (1.0 - q))
            out.append(("ttft", (wait + s + _step(server, b, k)) / ttft_s - 1.0))
    if tpot_s is not None and output > 1.0:
        if t == math.inf:
            out.append(("tpot", math.inf))
        else:
            n_q = float(poisson.ppf(q, rate * (output - 1.0) * t)) if s > 0.0 else 0.0
            tpot_q = _step(server, b, k) + s * n_q / (output - 1.0)
            out.append(("tpot", tpot_q / tpot_s - 1.0))
    if server.kv_tokens != math.inf:
        out.append(("kv_cache", b * k / server.kv_tokens - 1.0))
    out.append(("max_seqs", b / server.max_seqs - 1.0))
    return out


def _worst(
    server: BatchingServer,
    rate: float,
    prompt: float,
    output: float,
    ttft_s: float | None,
    tpot_s: float | None,
    q: float,
) -> tuple[str, float]:
    return max(_excess(server, rate, prompt, output, ttft_s, tpot_s, q), key=lambda e: e[1])


def batching_capacity(
    server: BatchingServer,
    prompt_tokens: float,
    output_tokens: float,
    ttft_s: float | None,
    tpot_s: float | None,
    quantile: float = 0.99,
) -> ServerCapacity:
    """The largest arrival rate (requests/s) one instance of `server` serves while a request
    of the mean `prompt_tokens` and `output_tokens` meets `ttft_s` and `tpot_s` (None: no
    such bound) together with probability `quantile`, and the bound that sets it (module
    docstring). Raises ValueError for lengths or bounds that are not positive finite
    numbers."""
    if not (math.isfinite(prompt_tokens) and prompt_tokens >= 0):
        raise ValueError(f"prompt_tokens must be a finite number >= 0, not {prompt_tokens}")
    if not (math.isfinite(output_tokens) and output_tokens >= 1):
        raise ValueError(f"output_tokens must be a finite number >= 1, not {output_tokens}")
    for name, bound in (("ttft_s", ttft_s), ("tpot_s", tpot_s)):
        if bound is not None and not (math.isfinite(bound) and bound > 0):
            raise ValueError(f"{name} must be a positive finite number, not {bound}")
    if not 0 < quantile < 1:
        raise ValueError(f"quantile must be in (0, 1), not {quantile}")
    p, o = prompt_tokens, output_tokens
    bounds = (ttft_s is not None) + (tpot_s is not None and o > 1.0)
    q = 1.0 - (1.0 - quantile) / bounds if bounds > 1 else quantile
    excess0 = _worst(server, 0.0, p, o, ttft_s, tpot_s, q)[1]
    if excess0 > 0:
        _, phi, t, b = _state(server, 0.0, p, o)
        return ServerCapacity(0.0, "alone", b, t, phi)
    # the rate past which no finite TPOT exists: the pole of the closed form
    s = p / server.prefill_tps if server.prefill_tps != math.inf else 0.0
    per_rate = s + (server.step_per_seq_s + server.step_per_kv_token_s * (p + o / 2.0)) * o
    hi = 1.0 / per_rate if per_rate > 0 else server.max_seqs / (o * server.step_base_s)
    # a bracket just inside the pole (or at max_seqs' bound when there is none), where some
    # bound is broken: the max_seqs bound is, at b = max_seqs there or beyond
    hi_in = hi * (1.0 - 1e-12)
    limit, excess_hi = _worst(server, hi_in, p, o, ttft_s, tpot_s, q)
    if excess_hi <= 0:  # nothing but the pole binds (e.g. max_seqs beyond it)
        rate = hi_in
    else:

        def f(r: float) -> float:
            e = _worst(server, r, p, o, ttft_s, tpot_s, q)[1]
            return e if math.isfinite(e) else 1.0

        rate = float(brentq(f, 0.0, hi_in, xtol=_XTOL))
        # brentq ends within _XTOL of the crossing on either side: take the feasible side
        while f(rate) > 0 and rate > 0:
            rate = max(0.0, rate - _XTOL)
        limit = _worst(server, min(rate + 2 * _XTOL, hi_in), p, o, ttft_s, tpot_s, q)[0]
    _, phi, t, b = _state(server, rate, p, o)
    return ServerCapacity(rate, limit, b, t, phi)


@dataclass(frozen=True, slots=True)
class ServerModel:
    """A group's batching server as the policy sizes it (a `BatchingServer`): from a spec's
    `sim.batching` block (`from_spec`) or the parameters `sluice loadtest --fit` stored
    (`from_fit`)."""

    max_seqs: int
    kv_tokens: float
    prefill_tps: float
    step_base_s: float
    step_per_seq_s: float = 0.0
    step_per_kv_token_s: float = 0.0

    @classmethod
    def from_spec(cls, block: BatchingSpec) -> ServerModel:
        """A `batching:` block (unset: an unbounded KV cache, an instant prefill)."""
        return cls(
            max_seqs=block.max_seqs,
            kv_tokens=math.inf if block.kv_tokens is None else block.kv_tokens,
            prefill_tps=math.inf if block.prefill_tps is None else block.prefill_tps,
            step_base_s=block.step_base_s,
            step_per_seq_s=block.step_per_seq_s,
            step_per_kv_token_s=block.step_per_kv_token_s,
        )

    @classmethod
    def from_fit(cls, params: Mapping[str, float | None], max_seqs: int) -> ServerModel | None:
        """The fitted parameters (`BatchingFit.params()`, a load test report's
        `fit.params`) with `max_seqs` sequences (the gateway sends no more than the group's
        `max_concurrency`); what the fit does not measure as `sluice.sim.model.
        with_fitted_batching` takes it: an unbounded KV cache, an instant prefill where its
        rate was not identified. None without a step time."""
        base = params.get("step_base_s")
        if base is None or not base > 0:
            return None
        tps = params.get("prefill_tps")
        return cls(
            max_seqs=max_seqs,
            kv_tokens=math.inf,
            prefill_tps=math.inf if tps is None else tps,
            step_base_s=base,
            step_per_seq_s=params.get("step_per_seq_s") or 0.0,
            step_per_kv_token_s=params.get("step_per_kv_token_s") or 0.0,
        )
