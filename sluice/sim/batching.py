"""A continuously batching generative server (vLLM-like), as one simulated instance.

The model
---------
An instance holds at most `max_seqs` admitted sequences and a KV cache of `kv_tokens`
tokens; the rest wait in an unbounded FIFO queue. An admitted sequence holds its prompt plus
the tokens it has generated so far in the KV cache. What the server's metrics show follows
vLLM: `num_requests_running` counts the sequences decoding or being prefilled, and
`num_requests_waiting` the queue plus the admitted sequences whose prefill has not begun
(`BatchingInstance.waiting_at`).

- **Admission** is FIFO: the head of the waiting queue is admitted while fewer than
  `max_seqs` sequences run and its tokens fit in the free KV cache with room for one more
  token per running sequence, itself included (`kv_used + need + running + 1 <= kv_tokens`;
  vLLM keeps a 1 % watermark of free blocks for the same reason: a sequence admitted into a
  cache with no room to grow would be preempted at once). An empty instance always admits
  its head (every request fits alone: `offer` refuses one whose `prompt + output` exceeds
  `kv_tokens`, as vLLM refuses a request longer than `max_model_len`). Nothing behind a
  blocked head is admitted (head-of-line, as vLLM's FCFS scheduler).
- **Prefill** of an admitted sequence takes `need / prefill_tps` seconds (`need` = its prompt,
  plus the tokens it had generated if it is re-admitted after a preemption) and *pauses the
  batch*: decoding resumes only when every admitted sequence has been prefilled; prefills
  run one after the other, so `b` sequences admitted together resume decoding after
  `b x prompt / prefill_tps`. This is vLLM's default scheduling without chunked prefill
  (prefills first, then decode steps); chunked prefill, which mixes a prefill's chunks into
  decode steps, is not modelled. Prefill produces no output token here: every output token
  comes from a decode step (so the slot model below is exactly one setting of this one).
- **Decoding**: every running, prefilled sequence gains one token per step; a step with `b`
  sequences holding `kv` tokens takes `step_s(b, kv) = step_base_s + step_per_seq_s x b +
  step_per_kv_token_s x kv` seconds. The model is *fluid*: between events the batch is
  constant, so all its sequences advance on one token clock `u` at `du/dt = 1 / step_s(b,
  kv(u))` with `kv(u) = kv0 + b x (u - u0)`, and the time for `n` tokens is the exact
  integral `n x step_s(b, kv0 + b x n / 2)`: the arithmetic series of a discrete run of `n`
  steps with each step's kv taken at its midpoint (a discrete engine taking kv at a step's
  start is faster by `step_per_kv_token_s x b / 2` per step: 0.02 % of a step with the
  defaults below). A request arriving between two steps joins at once rather than at the
  next step boundary (a difference of less than one step).
- **Preemption by recompute**: when the running sequences' growth fills the KV cache, the
  most recently admitted one is preempted (its cache freed) back to the *head* of the
  waiting queue, as vLLM's recompute preemption does (several in turn, the newest first, so
  that the older ones keep their order); when re-admitted, it is prefilled again with its
  prompt plus the tokens it had generated, and resumes where it stopped. The oldest running
  sequence is never preempted (alone, it fits), so the instance always makes progress.
- What callers feel: TTFT = arrival to first output token (the first one streamed: a
  preemption after it does not move it); TPOT = (latency - TTFT) / (output - 1), the mean
  time per output token after the first (NaN for a one-token answer, as vLLM's benchmark
  leaves those out); latency = arrival to last token.

`BatchingParams.slots(c, s)` is today's slot model (`sluice.sim.model`): infinite prefill
rate, no per-sequence or per-token step cost, an unbounded KV cache, so each of `c`
concurrent requests takes `output_tokens x s` whatever else runs. `LLAMA3_8B_H100` is an
illustrative vLLM-like setting.

The engine
----------
`BatchingInstance` is event-driven and exact for the fluid model, with no per-token
iteration: its events are a prefill's end, a sequence's last token, and the KV cache
filling up; each costs O(log b) (two heaps on the token clock, lazily invalidated).
Drive it like the fleet's event loop drives instances:

    eng = BatchingInstance(params)
    eng.offer(rid, prompt_tokens, output_tokens, now)   # an arrival at `now`
    t = eng.next_event_at()                             # when its state changes next
    done = eng.advance(t)                               # events up to t: Finished records

Call `advance(now)` before an `offer` at `now` (`offer` refuses a time past a pending
event); at equal times events run first, then the arrival. `next_event_at` changes after
every `offer` and `advance`: a caller that keeps it in a heap must re-read it then. `waiting`,
`running` and `kv_used` are what the server's /metrics would show (`waiting_at(t)`,
`running_at(t)` and `kv_used_at(t)` at a time between events). Results do not depend on
how often `advance` is called between events.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass
from heapq import heappop, heappush
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

__all__ = [
    "LLAMA3_8B_H100",
    "BatchingInstance",
    "BatchingParams",
    "Finished",
    "InstanceRun",
    "simulate_instance",
]

_INF = math.inf


@dataclass(frozen=True)
class BatchingParams:
    """One instance of a continuously batching server (module docstring for the model)."""

    max_seqs: int
    """sequences running at once (vLLM's max_num_seqs)"""
    kv_tokens: float
    """KV-cache capacity in tokens (math.inf: unbounded)"""
    prefill_tps: float
    """prompt tokens prefilled per second (math.inf: prefill takes no time)"""
    step_base_s: float
    """decode step time: the part paid whatever the batch (weights read once per step)"""
    step_per_seq_s: float = 0.0
    """decode step time per sequence in the batch"""
    step_per_kv_token_s: float = 0.0
    """decode step time per token the batch holds in its KV cache (attention reads)"""

    def __post_init__(self) -> None:
        if self.max_seqs < 1:
            raise ValueError(f"max_seqs must be >= 1, not {self.max_seqs}")
        if not self.kv_tokens > 0:
            raise ValueError(f"kv_tokens must be > 0, not {self.kv_tokens}")
        if not self.prefill_tps > 0:
            raise ValueError(f"prefill_tps must be > 0, not {self.prefill_tps}")
        costs = (self.step_base_s, self.step_per_seq_s, self.step_per_kv_token_s)
        if not all(0 <= c < _INF for c in costs):
            raise ValueError(f"step costs must be finite and >= 0, not {costs}")
        if self.step_base_s + self.step_per_seq_s <= 0:
            raise ValueError("a decode step must take time: step_base_s + step_per_seq_s > 0")

    def step_s(self, b: int, kv: float) -> float:
        """Seconds of one decode step of `b` sequences holding `kv` tokens."""
        return self.step_base_s + self.step_per_seq_s * b + self.step_per_kv_token_s * kv

    @classmethod
    def slots(cls, max_concurrency: int, seconds_per_token: float) -> BatchingParams:
        """The slot model (`sluice.sim.model`) as a batching server: `max_concurrency`
        independent slots, a request of `n` output tokens holding one for `n x
        seconds_per_token` seconds whatever the others do (no prefill time, no batch or
        context cost, no KV limit). A request of fixed service `x` seconds is `x /
        seconds_per_token` output tokens (the model accepts real counts >= 1)."""
        return cls(
            max_seqs=max_concurrency,
            kv_tokens=_INF,
            prefill_tps=_INF,
            step_base_s=seconds_per_token,
        )


LLAMA3_8B_H100 = BatchingParams(
    max_seqs=256,
    kv_tokens=400_000,
    prefill_tps=15_000.0,
    step_base_s=0.008,
    step_per_seq_s=5e-5,
    step_per_kv_token_s=4e-8,
)
"""Illustrative, not measured: a Llama-3-8B-class model (bf16) served by vLLM on one H100
80 GB, at the orders of magnitude public vLLM benchmarks commonly report and the hardware
implies. max_seqs 256 is vLLM's long-standing max_num_seqs default. KV cache: 32 layers x 8
KV heads x 128 dims x 2 (K and V) x 2 bytes = 128 KiB per token; about 50 GB left for it
(90 % of 80 GB less 16 GB of weights and activations) holds ~400k tokens. Prefill: 10k-20k
prompt tokens/s is the commonly reported range (compute-bound, ~16 GFLOP per token). Decode:
a step reads the 16 GB of weights (~5 ms at 3.35 TB/s) plus overheads, ~8 ms for one
sequence (~120 tokens/s); +0.05 ms per sequence; +128 KiB of KV read per token held
(~4e-8 s at 3.35 TB/s): 256 sequences of 1k tokens step in ~31 ms (~8k output tokens/s),
64 of 2k in ~16 ms, within the 10-30 ms commonly seen. `loadtest --fit` (issue 36) is meant
to replace such numbers by a measured instance's."""


class Finished(NamedTuple):
    """A request's last token: when, and what its caller felt."""

    req_id: int
    at_s: float
    """time of the last token (on the caller's clock)"""
    ttft_s: float
    """arrival to first output token"""
    tpot_s: float
    """mean time per output token after the first; NaN for a one-token answer"""
    latency_s: float
    """arrival to last token"""
    preemptions: int
    """times the request was preempted (and recomputed)"""


class _Seq:
    """A request in the instance; token counts are floats (the fluid model)."""

    __slots__ = ("arrival", "first_at", "g", "kc", "n", "output", "pre", "prompt", "rid")

    def __init__(self, rid: int, arrival: float, prompt: float, output: float) -> None:
        self.rid = rid
        self.arrival = arrival
        self.prompt = prompt
        self.output = output
        self.g = 0.0  # tokens generated when it last joined the batch (or was preempted)
        self.kc = 0.0  # prompt + g - u at its join: its KV is kc + u while it decodes
        self.n = -1  # admission number while decoding (heap entries carry it), else -1
        self.first_at = math.nan
        self.pre = 0


_FINISH = 0
_OVERFLOW = 1


class BatchingInstance:
    """One batching server on a virtual clock (module docstring): `offer` arrivals,
    `advance` through events, read `next_event_at`, `waiting`, `running`, `kv_used`."""

    def __init__(self, params: BatchingParams) -> None:
        self.params = params
        self._base = params.step_base_s
        self._ps = params.step_per_seq_s
        self._pk = params.step_per_kv_token_s
        self._cap = float(params.kv_tokens)
        self._max = params.max_seqs
        self._rate = float(params.prefill_tps)
        self._t = 0.0  # the state is current at _t (while decoding: the segment's start)
        self._u = 0.0  # token clock at _t; decoding sequence i holds kc_i + u tokens
        self._k = 0.0  # sum of kc over decoding sequences: they hold _k + _b * u
        self._b = 0  # decoding sequences
        self._run: dict[_Seq, None] = {}  # running (decoding or prefilling), admission order
        self._wait: deque[_Seq] = deque()
        self._pf: list[_Seq] = []  # admitted, awaiting the end of the prefill pause
        self._pf_start: list[float] = []  # when each one's prefill starts (nondecreasing)
        self._seen = 0.0  # the latest time given to offer or advance (the caller's clock)
        self._pf_kv = 0.0
        self._pf_end = 0.0
        self._fin: list[tuple[float, int, _Seq]] = []  # (u at last token, n, seq)
        self._first: list[tuple[float, int, _Seq]] = []  # (u at first token, n, seq)
        self._n = 0
        # the decode segment from (_t, _u): step time at _u and its slope per token of u
        self._a0 = 0.0
        self._beta = 0.0
        self._next = _INF
        self._ue = 0.0
        self._kind = _FINISH

    # -- observation ----------------------------------------------------------------------

    @property
    def now(self) -> float:
        """The time the instance's state is current at (its last event or admission)."""
        return self._t

    @property
    def waiting(self) -> int:
        """vLLM's num_requests_waiting at the latest time given to `offer` or `advance`
        (`waiting_at`)."""
        return self.waiting_at(self._seen)

    @property
    def running(self) -> int:
        """vLLM's num_requests_running at the latest time given to `offer` or `advance`
        (`running_at`)."""
        return self.running_at(self._seen)

    @property
    def admitted(self) -> int:
        """Sequences the model has admitted (KV cache reserved): decoding, prefilling, or
        queued for their prefill behind others'."""
        return len(self._run)

    def waiting_at(self, t: float) -> int:
        """Requests vLLM would count in num_requests_waiting at `t` (between `now` and
        `next_event_at()`): the waiting queue, plus the admitted sequences whose prefill has
        not begun by `t`.

        The model admits a request (reserves its KV cache) as soon as it fits, and runs the
        admitted prefills one after the other while the batch pauses. vLLM's scheduler
        (without chunked prefill: `Scheduler._schedule_prefills`; V1's scheduler alike)
        moves a request from its `waiting` queue to `running` only in the step that computes
        its prompt, within that step's token budget; one not yet scheduled stays in
        `waiting`, and num_requests_waiting is `len(scheduler.waiting)`. So a sequence
        queued behind other prefills is waiting, as vLLM reports it, and becomes running
        when its own prefill starts. Counting it as running (this model did, before) hides
        the server's queue exactly when prefill is the bottleneck: a burst admitted at once
        into an empty 256-sequence batch showed 1 prefilling and 255 "running"."""
        return len(self._wait) + self._pf_pending(t)

    def running_at(self, t: float) -> int:
        """Requests vLLM would count in num_requests_running at `t`: decoding, or with their
        prefill under way (`waiting_at` for those queued behind a prefill)."""
        return len(self._run) - self._pf_pending(t)

    def _pf_pending(self, t: float) -> int:
        """Admitted sequences whose prefill starts after `t` (starts are nondecreasing)."""
        starts = self._pf_start
        if not starts:
            return 0
        return len(starts) - bisect_right(starts, t)

    @property
    def kv_used(self) -> float:
        """KV-cache tokens held at `now`."""
        return self._k + self._b * self._u + self._pf_kv

    def kv_used_at(self, t: float) -> float:
        """KV-cache tokens held at `t` (between `now` and `next_event_at()`)."""
        if self._pf or not self._b:
            return self.kv_used
        return self._k + self._b * self._u_at(t) + self._pf_kv

    def kv_usage(self, t: float | None = None) -> float:
        """Fraction of the KV cache in use (vLLM's gpu_cache_usage_perc); 0 when unbounded."""
        used = self.kv_used if t is None else self.kv_used_at(t)
        return used / self._cap

    def next_event_at(self) -> float:
        """When the state changes next without an arrival (a prefill's end, a sequence's
        last token, the KV cache filling up); math.inf when idle."""
        return self._next

    # -- driving ----------------------------------------------------------------------------

    def offer(self, req_id: int, prompt_tokens: float, output_tokens: float, now: float) -> None:
        """A request arrives at `now` (after `advance(now)`): admitted at once if it can be,
        else it waits (FIFO)."""
        if now < self._t or now > self._next:
            raise ValueError(
                f"offer at {now} outside [{self._t}, {self._next}]: advance(now) first"
            )
        if not (prompt_tokens >= 0 and output_tokens >= 1):
            raise ValueError(
                f"request {req_id}: prompt_tokens >= 0 and output_tokens >= 1 needed, not "
                f"{prompt_tokens} and {output_tokens}"
            )
        if prompt_tokens + output_tokens > self._cap:
            raise ValueError(
                f"request {req_id}: {prompt_tokens} + {output_tokens} tokens exceed the KV "
                f"cache ({self._cap:g}); the server would refuse it (max_model_len)"
            )
        self._seen = max(self._seen, now)
        s = _Seq(req_id, now, float(prompt_tokens), float(output_tokens))
        wait = self._wait
        wait.append(s)
        if len(wait) > 1 or len(self._run) >= self._max:
            return  # behind a blocked head, or full
        if self._pf:
            self._admit(now)  # the batch is paused: the token clock stands still
        elif self._b:
            u = self._u_at(now)
            need = s.prompt + len(self._run) + 1
            if self._k + self._b * u + need > self._cap:
                return  # no room: it waits, and nothing moves
            self._resolve_first(u)
            self._t = now
            self._u = u
            self._admit(now)
        else:
            self._t = now
            self._admit(now)
        self._segment()

    def advance(self, now: float) -> list[Finished]:
        """Run every event at or before `now`; the requests that finished, in order."""
        self._seen = max(self._seen, now)
        out: list[Finished] = []
        while self._next <= now and self._next < _INF:
            if self._pf:
                self._prefilled()
            else:
                self._decode_event(out)
            self._segment()
        return out

    def clear(self) -> list[int]:
        """The instance dies: every request in it (running, then waiting) is dropped and
        returned; the instance is empty, at the same `now`."""
        lost = [s.rid for s in self._run] + [s.rid for s in self._wait]
        for s in self._run:
            s.n = -1
        self._run.clear()
        self._wait.clear()
        self._pf.clear()
        self._pf_start.clear()
        self._fin.clear()
        self._first.clear()
        self._u = self._k = self._pf_kv = 0.0
        self._b = 0
        self._next = _INF
        return lost

    # -- internals --------------------------------------------------------------------------

    def _u_at(self, t: float) -> float:
        """The token clock at `t` within the current decode segment."""
        dt = t - self._t
        if dt <= 0:
            return self._u
        a0 = self._a0
        du = 2.0 * dt / (a0 + math.sqrt(a0 * a0 + 2.0 * self._beta * dt))
        return min(self._u + du, self._ue)

    def _time_at(self, u: float) -> float:
        du = u - self._u
        return self._t + du * (self._a0 + 0.5 * self._beta * du)

    def _resolve_first(self, u: float) -> None:
        """First tokens reached by token clock `u` in the current segment get their time."""
        h = self._first
        while h and h[0][0] <= u:
            target, n, s = heappop(h)
            if s.n == n:
                s.first_at = self._time_at(target)

    def _segment(self) -> None:
        """The next event, after any change of state."""
        if self._pf:
            self._next = self._pf_end
            return
        b = self._b
        if not b:
            self._next = _INF
            return
        u = self._u
        self._a0 = a0 = self._base + self._ps * b + self._pk * (self._k + b * u)
        self._beta = beta = self._pk * b
        fin = self._fin
        while fin[0][1] != fin[0][2].n:
            heappop(fin)
        ue = fin[0][0]
        kind = _FINISH
        if b > 1:
            uk = (self._cap - self._k) / b
            if uk < ue:
                ue = max(uk, u)
                kind = _OVERFLOW
        self._ue = ue
        self._kind = kind
        du = ue - u
        self._next = self._t + du * (a0 + 0.5 * beta * du)

    def _admit(self, now: float) -> None:
        """Admit from the head of the waiting queue while it fits (module docstring)."""
        wait, run = self._wait, self._run
        while wait and len(run) < self._max:
            s = wait[0]
            need = s.prompt + s.g
            if run and self._k + self._b * self._u + self._pf_kv + need + len(run) + 1 > self._cap:
                return
            wait.popleft()
            run[s] = None
            dur = need / self._rate
            if dur > 0:
                if self._pf:
                    self._pf_start.append(self._pf_end)
                    self._pf_end += dur
                else:
                    self._pf_start.append(now)
                    self._pf_end = now + dur
                self._pf.append(s)
                self._pf_kv += need
            else:
                self._join(s)

    def _join(self, s: _Seq) -> None:
        """A prefilled sequence joins the decoding batch at the current token clock."""
        u = self._u
        self._n += 1
        n = s.n = self._n
        s.kc = s.prompt + s.g - u
        self._k += s.kc
        self._b += 1
        heappush(self._fin, (u + s.output - s.g, n, s))
        if s.first_at != s.first_at:  # NaN: no token yet
            heappush(self._first, (u + 1.0 - s.g, n, s))

    def _prefilled(self) -> None:
        """The prefill pause ends: the prefilled sequences join, decoding resumes."""
        self._t = self._pf_end
        for s in self._pf:
            self._join(s)
        self._pf.clear()
        self._pf_start.clear()
        self._pf_kv = 0.0

    def _decode_event(self, out: list[Finished]) -> None:
        """Last tokens at the segment's end, or the KV cache full: preempt the newest."""
        ue, t = self._ue, self._next
        self._resolve_first(ue)
        self._t, self._u = t, ue
        fin, run = self._fin, self._run
        finished = False
        while fin and fin[0][0] <= ue:
            _, n, s = heappop(fin)
            if s.n != n:
                continue
            finished = True
            self._k -= s.kc
            self._b -= 1
            del run[s]
            s.n = -1
            lat = t - s.arrival
            ttft = s.first_at - s.arrival
            tpot = (lat - ttft) / (s.output - 1.0) if s.output > 1.0 else math.nan
            out.append(Finished(s.rid, t, ttft, tpot, lat, s.pre))
        if self._kind == _OVERFLOW and not finished:
            self._preempt_newest()
        while self._b > 1 and self._k + self._b * ue >= self._cap:
            self._preempt_newest()
        if not self._b:  # empty: restart the token clock (no decoding sequence refers to it)
            self._u = self._k = 0.0
            self._fin.clear()
            self._first.clear()
        self._admit(t)

    def _preempt_newest(self) -> None:
        s, _ = self._run.popitem()  # no prefill pending while decoding: it decodes
        s.g = s.kc + self._u - s.prompt
        self._k -= s.kc
        self._b -= 1
        s.n = -1
        s.pre += 1
        self._wait.appendleft(s)


@dataclass(frozen=True)
class InstanceRun:
    """Per-request outcomes of `simulate_instance`, in the input's order."""

    finish_s: npt.NDArray[np.float64]
    ttft_s: npt.NDArray[np.float64]
    tpot_s: npt.NDArray[np.float64]
    """NaN for one-token answers"""
    latency_s: npt.NDArray[np.float64]
    preemptions: npt.NDArray[np.int64]


def simulate_instance(
    arrivals_s: npt.ArrayLike,
    prompt_tokens: npt.ArrayLike,
    output_tokens: npt.ArrayLike,
    params: BatchingParams,
) -> InstanceRun:
    """Every request on one instance with an unbounded FIFO waiting queue, in arrival order
    (stable at equal times); outcomes per request."""
    arr = np.asarray(arrivals_s, dtype=np.float64)
    prompt = np.asarray(prompt_tokens, dtype=np.float64)
    output = np.asarray(output_tokens, dtype=np.float64)
    n = arr.shape[0]
    if prompt.shape != (n,) or output.shape != (n,):
        raise ValueError("arrivals_s, prompt_tokens and output_tokens must be 1-d, one length")
    if not np.all(np.isfinite(arr)):
        raise ValueError("arrival times must be finite")
    finish = np.full(n, math.nan)
    ttft = np.full(n, math.nan)
    tpot = np.full(n, math.nan)
    lat = np.full(n, math.nan)
    pre = np.zeros(n, dtype=np.int64)

    def take(done: list[Finished]) -> None:
        for f in done:
            i = f.req_id
            finish[i] = f.at_s
            ttft[i] = f.ttft_s
            tpot[i] = f.tpot_s
            lat[i] = f.latency_s
            pre[i] = f.preemptions

    eng = BatchingInstance(params)
    arr_l: list[float] = arr.tolist()
    p_l: list[float] = prompt.tolist()
    o_l: list[float] = output.tolist()
    offer, advance = eng.offer, eng.advance
    for i in np.argsort(arr, kind="stable").tolist():
        t = arr_l[i]
        if eng._next <= t:
            take(advance(t))
        offer(i, p_l[i], o_l[i], t)
    take(advance(_INF))
    return InstanceRun(finish, ttft, tpot, lat, pre)
