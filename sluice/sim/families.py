"""Seeded families of synthetic traffic, for tuning autoscaling that cannot overfit (issue 16).

The benchmark replays every policy on these families as well as on the real traces in
`../shared/traces`. The set is built so that each family stresses one thing, and a setting
that wins only on one real trace loses on some family:

- steady Poisson noise at several rates (`poisson-0.3` the cold edge where one instance
  idles, `poisson-1`, `poisson-4`, `poisson-16`): no trend to follow, so any scaling is
  reaction to noise; the benchmark holds a policy to <= 1.3x the oracle's cost on these
  (`Family.stationary`);
- long vs short requests at the same rate (`poisson-4-long` Mooncake-like prompts,
  `poisson-4-heavy` the short mix's mean output with a much heavier tail);
- slow change (`diurnal`, a compressed day), on/off bursts (`mmpp-onoff`), a flash crowd
  (`flash-crowd`) and a linear ramp up and down (`ramp`).

Arrivals: a homogeneous or non-homogeneous Poisson process, drawn by thinning (candidates at
the shape's peak rate, each kept with probability rate(t) / peak), or for `mmpp-onoff` a
two-state Markov-modulated Poisson process drawn state by state (exponential sojourns,
Poisson arrivals within each). Token counts: independent lognormals per request, see
`MIXES`. Pure numpy, no clock, no I/O; `numpy.random.default_rng([crc32(name), seed])`, so
the same name and seed give a byte-identical trace and different families draw independent
streams. Any family generates in a few milliseconds.

What they do not model: correlation between a request's input and output tokens or between
consecutive requests (sessions, prefix reuse); tenants, priorities or more than one model
(every request is tenant `""`, priority `normal`, model `""` like the Azure trace, so a
one-group spec prices it with the group's first model); self-similar or heavy-tailed
inter-arrival gaps beyond what the shapes give; failed requests; any feedback of latency on
arrivals (clients that retry or back off).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import numpy as np
import numpy.typing as npt

from sluice.core.errors import NotFound, SpecError, SpecIssue
from sluice.policy.routing import PRIORITIES
from sluice.sim.trace import Trace, load_trace

__all__ = [
    "FAMILIES",
    "FAMILY_PREFIX",
    "MIXES",
    "Arrivals",
    "Diurnal",
    "Family",
    "FlashCrowd",
    "OnOff",
    "Poisson",
    "Ramp",
    "TokenMix",
    "generate",
    "load_trace_or_family",
]

F64 = npt.NDArray[np.float64]


def _lognormal_fit(mean: float, median: float) -> tuple[float, float]:
    """(median, sigma) of the lognormal with this mean and median:
    median = exp(mu), mean = exp(mu + sigma^2 / 2), so sigma = sqrt(2 ln(mean / median))."""
    return median, math.sqrt(2.0 * math.log(mean / median))


@dataclass(frozen=True)
class TokenMix:
    """Input and output token counts: independent lognormals, rounded and clipped to
    [1, *_max]."""

    name: str
    description: str
    input_median: float
    input_sigma: float
    output_median: float
    output_sigma: float
    input_max: int
    output_max: int

    def draw(
        self, rng_in: np.random.Generator, rng_out: np.random.Generator, n: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        inp = rng_in.lognormal(math.log(self.input_median), self.input_sigma, n)
        out = rng_out.lognormal(math.log(self.output_median), self.output_sigma, n)
        return (
            np.clip(np.rint(inp), 1, self.input_max).astype(np.int64),
            np.clip(np.rint(out), 1, self.output_max).astype(np.int64),
        )


def _mix(
    name: str,
    description: str,
    inp: tuple[float, float],
    out: tuple[float, float],
    input_max: int,
    output_max: int,
) -> TokenMix:
    return TokenMix(name, description, inp[0], inp[1], out[0], out[1], input_max, output_max)


MIXES: Mapping[str, TokenMix] = MappingProxyType(
    {
        m.name: m
        for m in (
            # BurstGPT_1 first 400 (chat): input mean 520 / p50 314, output mean 277 / p50 230
            # -> input median 314, sigma 1.004; output median 230, sigma 0.610.
            _mix(
                "short",
                "chat-like (BurstGPT): short prompts, answers of a few hundred tokens",
                _lognormal_fit(520.0, 314.0),
                _lognormal_fit(277.0, 230.0),
                32_768,
                4_096,
            ),
            # Mooncake synthetic: input mean 15,325 / p50 11,587, output mean 149 / p50 69
            # -> input median 11,587, sigma 0.748; output median 69, sigma 1.241.
            _mix(
                "long",
                "Mooncake-like: long prompts (p50 11.6k tokens), short answers",
                _lognormal_fit(15_325.0, 11_587.0),
                _lognormal_fit(149.0, 69.0),
                131_072,
                4_096,
            ),
            # Not fitted to a trace: the short mix's inputs, and outputs with the short mix's
            # mean (277) at sigma 1.5, i.e. median 277 / exp(1.5^2 / 2) = 90.
            _mix(
                "heavy",
                "short prompts, outputs with the chat mean but a heavy tail (sigma 1.5)",
                _lognormal_fit(520.0, 314.0),
                (277.0 / math.exp(1.5**2 / 2.0), 1.5),
                32_768,
                16_384,
            ),
        )
    }
)
"""Token mixes by name. Fitted lognormals (`_lognormal_fit`) to the means and medians of
`../shared/traces/README.md`:

| mix | input median, sigma | output median, sigma | clip (in, out) | source |
|---|---|---|---|---|
| short | 314, 1.004 | 230, 0.610 | 32,768, 4,096 | BurstGPT_1: in 520/314, out 277/230 |
| long | 11,587, 0.748 | 69, 1.241 | 131,072, 4,096 | Mooncake: in 15,325/11,587, out 149/69 |
| heavy | 314, 1.004 | 90, 1.5 | 32,768, 16,384 | short's mean output, sigma 1.5 |

On the reference model (0.05 + 0.0002 in + 0.02 out s, clipped to [0.01, 30] s) a request
holds a slot for 5.7 s (short), 5.9 s (long) or 4.6 s (heavy, whose mean is cut by the 30 s
clip: 3 % of its requests hit it, against 0.1 % for short and 0.9 % for long) on average.
"""


@dataclass(frozen=True)
class Poisson:
    """Homogeneous Poisson arrivals at `rate` req/s."""

    rate: float

    @property
    def peak(self) -> float:
        return self.rate

    def rate_at(self, t: F64, duration_s: float) -> F64:
        return np.full(t.shape, self.rate)


@dataclass(frozen=True)
class Diurnal:
    """mean x (1 - swing x cos(2 pi t / period)): the trough at t = 0 and every period, the
    peak at half a period; the trace repeats the day when longer than one period."""

    mean: float
    swing: float
    period_s: float

    @property
    def peak(self) -> float:
        return self.mean * (1.0 + self.swing)

    def rate_at(self, t: F64, duration_s: float) -> F64:
        return self.mean * (1.0 - self.swing * np.cos(2.0 * np.pi * t / self.period_s))


@dataclass(frozen=True)
class FlashCrowd:
    """`base` req/s; at `onset` x the trace's duration the rate climbs linearly to
    `factor` x base over `rise_s`, holds `hold_s`, then falls linearly back over `decay_s`."""

    base: float
    factor: float
    onset: float
    rise_s: float
    hold_s: float
    decay_s: float

    @property
    def peak(self) -> float:
        return self.base * self.factor

    def start_s(self, duration_s: float) -> float:
        return self.onset * duration_s

    def rate_at(self, t: F64, duration_s: float) -> F64:
        t0 = self.start_s(duration_s)
        t1 = t0 + self.rise_s
        t2 = t1 + self.hold_s
        t3 = t2 + self.decay_s
        shape = np.interp(t, [t0, t1, t2, t3], [0.0, 1.0, 1.0, 0.0], left=0.0, right=0.0)
        return self.base * (1.0 + (self.factor - 1.0) * shape)


@dataclass(frozen=True)
class Ramp:
    """A triangle wave: `low` req/s rising linearly to `high` over `rise_s`, back down over
    `rise_s`, repeated when the trace is longer than 2 x rise_s."""

    low: float
    high: float
    rise_s: float

    @property
    def peak(self) -> float:
        return max(self.low, self.high)

    def rate_at(self, t: F64, duration_s: float) -> F64:
        phase = np.mod(t, 2.0 * self.rise_s) / self.rise_s
        up = np.where(phase < 1.0, phase, 2.0 - phase)
        return self.low + (self.high - self.low) * up


@dataclass(frozen=True)
class OnOff:
    """Two-state Markov-modulated Poisson process: `on_rate` req/s for exponential sojourns of
    mean `on_mean_s`, `off_rate` for sojourns of mean `off_mean_s`; the first state is drawn
    from the stationary distribution."""

    on_rate: float
    off_rate: float
    on_mean_s: float
    off_mean_s: float

    @property
    def on_fraction(self) -> float:
        return self.on_mean_s / (self.on_mean_s + self.off_mean_s)

    @property
    def mean_rate(self) -> float:
        p = self.on_fraction
        return p * self.on_rate + (1.0 - p) * self.off_rate


Shape = Poisson | Diurnal | FlashCrowd | Ramp
Arrivals = Shape | OnOff


@dataclass(frozen=True)
class Family:
    """One named, parametrised shape of traffic; `trace(seed)` draws a member of it."""

    name: str
    description: str
    """one line: what shape it is and why it is in the set"""
    stationary: bool
    """near-stationary arrival rate (the benchmark holds a policy to <= 1.3x the oracle's cost)"""
    duration_s: float
    arrivals: Arrivals
    mix: TokenMix

    def mean_rate(self, duration_s: float | None = None) -> float:
        """Expected arrivals per second over [0, duration) (the default duration unless
        given): the rate shape's average, or the on/off process's stationary mean."""
        d = self.duration_s if duration_s is None else duration_s
        a = self.arrivals
        if isinstance(a, OnOff):
            return a.mean_rate
        grid = (np.arange(100_000, dtype=np.float64) + 0.5) * (d / 100_000)
        return float(a.rate_at(grid, d).mean())

    def trace(
        self, seed: int = 0, *, duration_s: float | None = None, rate_scale: float = 1.0
    ) -> Trace:
        """Draw the family's trace for `seed`. `duration_s` cuts or extends it (shapes keep
        their time constants: diurnal and ramp repeat their period, the flash crowd starts at
        the same fraction of the duration); `rate_scale` multiplies every rate."""
        d = self.duration_s if duration_s is None else float(duration_s)
        if not (math.isfinite(d) and d > 0):
            raise ValueError(f"duration_s must be > 0, got {duration_s!r}")
        if not (math.isfinite(rate_scale) and rate_scale > 0):
            raise ValueError(f"rate_scale must be > 0, got {rate_scale!r}")
        ss = np.random.SeedSequence([zlib.crc32(self.name.encode()), seed])
        r_arr, r_in, r_out = (np.random.default_rng(s) for s in ss.spawn(3))
        a = self.arrivals
        if isinstance(a, OnOff):
            t = _onoff_times(a, d, rate_scale, r_arr)
        else:
            t = _thinned_times(a, d, rate_scale, r_arr)
        n = int(t.shape[0])
        inp, out = self.mix.draw(r_in, r_out, n)
        label = f"family:{self.name}@seed{seed}"
        extra = [f"x{rate_scale:g}"] if rate_scale != 1.0 else []
        if duration_s is not None:
            extra.append(f"{d:g}s")
        if extra:
            label += f"[{','.join(extra)}]"
        return Trace(
            name=label,
            t=t,
            input_tokens=inp,
            output_tokens=out,
            model=np.zeros(n, dtype=np.int32),
            models=("",),
            priority=np.full(n, PRIORITIES.index("normal"), dtype=np.int8),
            tenant=np.zeros(n, dtype=np.int32),
            tenants=("",),
        )


def _thinned_times(shape: Shape, duration_s: float, scale: float, rng: np.random.Generator) -> F64:
    """Non-homogeneous Poisson arrivals on [0, duration) by thinning a homogeneous process at
    the peak rate (exact for any rate function bounded by `peak`)."""
    peak = shape.peak * scale
    n = int(rng.poisson(peak * duration_s))
    t = np.sort(rng.uniform(0.0, duration_s, n))
    if isinstance(shape, Poisson):
        return np.ascontiguousarray(t, dtype=np.float64)
    keep = rng.uniform(0.0, peak, n) < shape.rate_at(t, duration_s) * scale
    return np.ascontiguousarray(t[keep], dtype=np.float64)


def _onoff_times(a: OnOff, duration_s: float, scale: float, rng: np.random.Generator) -> F64:
    """MMPP arrivals: alternate on/off sojourns until the duration is covered, then Poisson
    arrivals within each sojourn (count ~ Poisson(rate x length), times uniform)."""
    on = bool(rng.random() < a.on_fraction)
    cycle = a.on_mean_s + a.off_mean_s
    lengths: list[F64] = []
    covered = 0.0
    while covered < duration_s:
        k = int(2 * (duration_s - covered) / cycle) + 8  # sojourn pairs drawn per round
        pair = np.empty((k, 2))
        pair[:, 0] = rng.exponential(a.on_mean_s if on else a.off_mean_s, k)
        pair[:, 1] = rng.exponential(a.off_mean_s if on else a.on_mean_s, k)
        lengths.append(pair.ravel())  # whole pairs: every round starts in the first state
        covered += float(pair.sum())
    seg_len = np.concatenate(lengths)
    states = np.arange(seg_len.shape[0]) % 2 == (0 if on else 1)  # True where "on"
    seg_start = np.concatenate([[0.0], np.cumsum(seg_len)[:-1]])
    inside = seg_start < duration_s
    seg_start, seg_len, states = seg_start[inside], seg_len[inside], states[inside]
    seg_len = np.minimum(seg_len, duration_s - seg_start)
    rate = np.where(states, a.on_rate, a.off_rate) * scale
    counts = rng.poisson(rate * seg_len)
    seg = np.repeat(np.arange(seg_len.shape[0]), counts)
    t = seg_start[seg] + rng.random(seg.shape[0]) * seg_len[seg]
    t = np.sort(t[t < duration_s])
    return np.ascontiguousarray(t, dtype=np.float64)


_SHORT, _LONG, _HEAVY = MIXES["short"], MIXES["long"], MIXES["heavy"]

FAMILIES: Mapping[str, Family] = MappingProxyType(
    {
        f.name: f
        for f in (
            Family(
                "poisson-0.3",
                "Poisson 0.3 req/s, short mix: the cold edge, one instance mostly idle "
                "(scale-to-min and scale-from-min decisions on sparse noise)",
                True,
                3600.0,
                Poisson(0.3),
                _SHORT,
            ),
            Family(
                "poisson-1",
                "Poisson 1 req/s, short mix: steady noise on a fleet of about two instances",
                True,
                3600.0,
                Poisson(1.0),
                _SHORT,
            ),
            Family(
                "poisson-4",
                "Poisson 4 req/s, short mix: steady noise at the real traces' mean rate",
                True,
                1800.0,
                Poisson(4.0),
                _SHORT,
            ),
            Family(
                "poisson-16",
                "Poisson 16 req/s, short mix: steady noise on a fleet of ~25 instances",
                True,
                1200.0,
                Poisson(16.0),
                _SHORT,
            ),
            Family(
                "poisson-4-long",
                "Poisson 4 req/s, long (Mooncake-like) mix: prompt-dominated service times",
                True,
                1800.0,
                Poisson(4.0),
                _LONG,
            ),
            Family(
                "poisson-4-heavy",
                "Poisson 4 req/s, heavy-tailed outputs: a few slot-hogging requests in "
                "steady traffic",
                True,
                1800.0,
                Poisson(4.0),
                _HEAVY,
            ),
            Family(
                "diurnal",
                "sinusoidal rate 0.6-5.4 req/s (mean 3), period 1 h, 2 h: a compressed day, "
                "slow change a policy should track without lag or overshoot",
                False,
                7200.0,
                Diurnal(mean=3.0, swing=0.8, period_s=3600.0),
                _SHORT,
            ),
            Family(
                "mmpp-onoff",
                "on/off MMPP: 16 req/s for ~40 s, 0.5 req/s for ~120 s: bursts shorter than "
                "and comparable to the 30 s start-up (Azure-like burstiness)",
                False,
                3600.0,
                OnOff(on_rate=16.0, off_rate=0.5, on_mean_s=40.0, off_mean_s=120.0),
                _SHORT,
            ),
            Family(
                "flash-crowd",
                "2 req/s, then 8x within 10 s at a third of the trace, held 5 min, back over "
                "2 min: one sudden surge, then scale-down",
                False,
                1800.0,
                FlashCrowd(
                    base=2.0, factor=8.0, onset=1 / 3, rise_s=10.0, hold_s=300.0, decay_s=120.0
                ),
                _SHORT,
            ),
            Family(
                "ramp",
                "rate rising linearly 1 -> 12 req/s over 30 min, then back down: sustained "
                "trend in both directions",
                False,
                3600.0,
                Ramp(low=1.0, high=12.0, rise_s=1800.0),
                _SHORT,
            ),
        )
    }
)
"""The families by name, in a fixed order (cheapest first)."""


def generate(
    name: str, seed: int = 0, *, duration_s: float | None = None, rate_scale: float = 1.0
) -> Trace:
    """The trace of family `name` for `seed`, named `family:NAME@seedN` (see `Family.trace`).
    An unknown name raises `NotFound` listing the known ones."""
    fam = FAMILIES.get(name)
    if fam is None:
        known = ", ".join(FAMILIES)
        raise NotFound(f"no trace family named {name!r}; families: {known}", known=list(FAMILIES))
    return fam.trace(seed, duration_s=duration_s, rate_scale=rate_scale)


FAMILY_PREFIX = "family:"


def load_trace_or_family(ref: str | Path) -> Trace:
    """A trace file, or `family:NAME[@SEED]` for a generated one (`sluice simulate --trace`).
    A bad seed raises `SpecError` naming the fix; an unknown family `NotFound`."""
    text = str(ref)
    if not text.startswith(FAMILY_PREFIX):
        return load_trace(ref)
    name, _, seed = text.removeprefix(FAMILY_PREFIX).partition("@")
    seed = seed.removeprefix("seed")
    if seed and not seed.isdigit():
        fix = f"write {FAMILY_PREFIX}{name}@N with a whole number N >= 0 as the seed"
        raise SpecError([SpecIssue("--trace", f"bad seed {seed!r}: {fix}")])
    return generate(name, int(seed or 0))
