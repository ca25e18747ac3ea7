"""The capacity test (O4): how much ONE instance sustains under a latency target, and the
autoscaling targets that follow from it.

The CLI pins a group to one instance and offers constant-rate open-loop load in steps; this
module judges each step (`judge_step`), picks the next rate (`RateSearch`: geometric growth
to the first failure, then bisection), names the knee (the highest rate that held) and turns
it into a `targets:` block (`recommend`). A step where the load generator fell behind says
nothing about the group: it fails as inconclusive, never passes silently.

Pure: the steps' measurements come in; nothing is sent or timed here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = [
    "HEADROOM",
    "KNEE_MARGIN",
    "MIN_QUEUE",
    "MIN_UTILIZATION",
    "SAME_RATE",
    "Knee",
    "Quantile",
    "RateSearch",
    "Recommendation",
    "StepMeasure",
    "StepVerdict",
    "compare_capacity",
    "judge_step",
    "knee_moved",
    "recommend",
]

Quantile = Literal["p50", "p95", "p99"]
Criterion = Literal["slo", "errors", "throughput", "generator"]

SAME_RATE = 0.05
"""Two capacity results whose knees differ by less than this share are the same: the
search's own resolution is 5%, so a smaller change is not a measured one."""
KNEE_MARGIN = 0.20
"""A load test whose knee is this much above or below the group's last one makes the
autoscaling targets set from that one stale (`knee_moved`): four times the search's 5 %
resolution, above the run-to-run spread of one instance's knee on a busy machine."""


def _json(value: object) -> Any:
    if isinstance(value, float):
        return round(value, 3) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json(v) for v in value]
    return value


@dataclass(frozen=True, slots=True)
class StepMeasure:
    """One constant-rate step as the load generator saw it."""

    offered_rps: float
    achieved_rps: float
    """2xx completions per second"""
    requests: int
    """sent"""
    errors: int
    """non-2xx or no answer, among sent"""
    shed: int
    """429/503 among errors"""
    unsent: int
    """the generator could not send them (its in-flight cap)"""
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    mean_latency_ms: float | None
    mean_in_flight: float
    """client-side concurrency by Little's law"""
    behind: bool
    """the generator fell behind its schedule"""

    def quantile_ms(self, quantile: Quantile) -> float | None:
        return {"p50": self.p50_ms, "p95": self.p95_ms, "p99": self.p99_ms}[quantile]

    def to_json(self) -> dict[str, Any]:
        return {k: _json(v) for k, v in asdict(self).items()}


@dataclass(frozen=True, slots=True)
class StepVerdict:
    """`why`: why it holds, or each failing criterion, in words with numbers. `criterion`:
    the one that decides a failure (the generator first: then nothing else is known)."""

    holds: bool
    why: str
    criterion: Criterion | None = None

    def to_json(self) -> dict[str, Any]:
        return {"holds": self.holds, "why": self.why, "criterion": self.criterion}


def judge_step(
    step: StepMeasure,
    slo_ms: float,
    quantile: Quantile = "p95",
    max_error_rate: float = 0.01,
    min_delivery: float = 0.95,
) -> StepVerdict:
    """Holds iff the latency quantile is within `slo_ms`, the error rate within
    `max_error_rate`, the 2xx throughput at least `min_delivery` x offered (an open-loop
    group that cannot keep up shows it here even while the latency of what did finish looks
    fine), and the generator kept to its schedule."""
    _check_judge(slo_ms, quantile, max_error_rate, min_delivery)
    at = f"at {step.offered_rps:.3g} rps"
    if step.behind or step.unsent > 0:
        return StepVerdict(
            False,
            f"inconclusive {at}: the load generator, not the group, fell behind its schedule "
            f"({step.unsent} unsent, behind={step.behind}); give it more in-flight room or "
            "CPU, or test from another machine",
            "generator",
        )
    if step.requests <= 0:
        return StepVerdict(False, f"inconclusive {at}: no request was sent", "generator")
    failed: list[tuple[Criterion, str]] = []
    lat = step.quantile_ms(quantile)
    if lat is None or lat > slo_ms:
        shown = "no successful answer" if lat is None else f"{lat:.0f} ms"
        failed.append(("slo", f"{quantile} {shown} over the {slo_ms:.0f} ms SLO"))
    error_rate = step.errors / step.requests
    if error_rate > max_error_rate:
        failed.append(
            (
                "errors",
                f"errors {error_rate:.1%} ({step.errors}/{step.requests}, {step.shed} shed) "
                f"over {max_error_rate:.1%}",
            )
        )
    delivery = step.achieved_rps / step.offered_rps if step.offered_rps > 0 else 1.0
    if delivery < min_delivery and _shortfall(step, delivery) > _count_noise(step):
        failed.append(
            (
                "throughput",
                f"throughput {step.achieved_rps:.3g} of {step.offered_rps:.3g} rps offered "
                f"({delivery:.0%} < {min_delivery:.0%}): the group does not keep up",
            )
        )
    if failed:
        return StepVerdict(False, f"fails {at}: " + "; ".join(w for _, w in failed), failed[0][0])
    return StepVerdict(
        True,
        f"holds {at}: {quantile} {lat:.0f} <= {slo_ms:.0f} ms, errors {error_rate:.1%}, "
        f"throughput {step.achieved_rps:.3g} rps ({delivery:.0%})",
    )


def _check_judge(slo_ms: float, quantile: str, max_error_rate: float, delivery: float) -> None:
    if not slo_ms > 0:
        raise ValueError(f"slo_ms must be > 0, got {slo_ms}")
    if quantile not in ("p50", "p95", "p99"):
        raise ValueError(f"quantile must be p50, p95 or p99, got {quantile!r}")
    if not 0 <= max_error_rate < 1:
        raise ValueError(f"max_error_rate must be in [0, 1), got {max_error_rate}")
    if not 0 < delivery <= 1:
        raise ValueError(f"min_delivery must be in (0, 1], got {delivery}")


@dataclass(frozen=True, slots=True)
class Knee:
    """The highest offered rate that held, and what broke above it."""

    rate_rps: float
    concurrency: float
    """mean in flight at that rate"""
    latency_ms: float
    """the judged quantile there"""
    limited_by: str
    """slo | errors | throughput | generator | max_rps | max_steps"""
    failing: StepVerdict | None
    """the lowest failing step's verdict (None: no step failed)"""

    @property
    def lower_bound(self) -> bool:
        """The group's limit was not found (max_rps held, the steps ran out, or the generator
        gave out first): the instance sustains at least this much, maybe more."""
        return self.limited_by in ("max_rps", "max_steps", "generator")

    def to_json(self) -> dict[str, Any]:
        return {
            "rate_rps": _json(self.rate_rps),
            "concurrency": _json(self.concurrency),
            "latency_ms": _json(self.latency_ms),
            "limited_by": self.limited_by,
            "lower_bound": self.lower_bound,
            "failing": None if self.failing is None else self.failing.to_json(),
        }


def _shortfall(step: StepMeasure, delivery: float) -> float:
    """Requests that arrived in the step's window and did not finish in it."""
    return step.requests * (1.0 - delivery)


def _count_noise(step: StepMeasure) -> float:
    """Three standard deviations of the shortfall of a group that keeps up. Finished and
    arrived are counted over the same window, but the requests in flight at its two edges
    differ: each edge holds a Poisson number of requests with mean `mean_in_flight`
    (Little), so their difference has variance 2 x mean_in_flight. A short step of a few
    dozen requests misses 95 % delivery by this noise alone; a group that cannot keep up
    falls behind by (offered - capacity) x window, which outgrows it."""
    return 3.0 * math.sqrt(2.0 * max(step.mean_in_flight, 0.5))


class RateSearch:
    """Which rate to offer next: grow geometrically from `start_rps` (x `growth`) until a
    step fails, then bisect between the highest holding rate and the lowest failing one
    until their gap is <= `resolution` x the holding rate, or `max_steps` steps were run, or
    `max_rps` holds. Growth finds the order of magnitude in a few steps; bisection then
    costs log2(gap / resolution) more. A failure below a rate that held (noise) wins: the
    knee is the highest hold below the lowest failure. While nothing has held, the search
    steps down instead (halving from the lowest failure, to no less than `min_rps`, by
    default start / 8): a start estimated from a probe on a busy machine can be too high,
    and a search that gave up on its first step would report no capacity at all."""

    def __init__(
        self,
        start_rps: float,
        *,
        max_rps: float,
        min_rps: float | None = None,
        growth: float = 1.5,
        resolution: float = 0.05,
        max_steps: int = 16,
        slo_ms: float,
        quantile: Quantile = "p95",
        max_error_rate: float = 0.01,
        min_delivery: float = 0.95,
    ) -> None:
        if not (math.isfinite(start_rps) and start_rps > 0):
            raise ValueError(f"start_rps must be > 0, got {start_rps}")
        if not (math.isfinite(max_rps) and max_rps >= start_rps):
            raise ValueError(f"max_rps must be >= start_rps ({start_rps}), got {max_rps}")
        min_rps = start_rps / 8 if min_rps is None else min_rps
        if not (math.isfinite(min_rps) and 0 < min_rps <= start_rps):
            raise ValueError(f"min_rps must be in (0, start_rps ({start_rps})], got {min_rps}")
        if not (math.isfinite(growth) and growth > 1):
            raise ValueError(f"growth must be > 1, got {growth}")
        if not 0 < resolution < 1:
            raise ValueError(f"resolution must be in (0, 1), got {resolution}")
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        _check_judge(slo_ms, quantile, max_error_rate, min_delivery)
        self.start_rps, self.max_rps, self.min_rps = start_rps, max_rps, min_rps
        self.growth = growth
        self.resolution, self.max_steps = resolution, max_steps
        self.slo_ms, self.quantile = slo_ms, quantile
        self.max_error_rate, self.min_delivery = max_error_rate, min_delivery
        self._steps: list[tuple[StepMeasure, StepVerdict]] = []

    @property
    def steps(self) -> list[tuple[StepMeasure, StepVerdict]]:
        return list(self._steps)

    def record(self, step: StepMeasure) -> StepVerdict:
        verdict = judge_step(
            step, self.slo_ms, self.quantile, self.max_error_rate, self.min_delivery
        )
        self._steps.append((step, verdict))
        return verdict

    def next_rate(self) -> float | None:
        """The rate to offer next; None: done (then `knee`)."""
        if not self._steps:
            return self.start_rps
        if len(self._steps) >= self.max_steps:
            return None
        hold, fail = self._bracket()
        if hold is None:
            assert fail is not None  # steps were run and none held
            lowest = fail[0].offered_rps
            return None if lowest <= self.min_rps else max(lowest / 2, self.min_rps)
        lo = hold[0].offered_rps
        if fail is None:
            return None if lo >= self.max_rps else min(lo * self.growth, self.max_rps)
        hi = fail[0].offered_rps
        return None if hi - lo <= self.resolution * lo else (lo + hi) / 2

    def knee(self) -> Knee | None:
        """None when no step held below the lowest failure (even `min_rps` failed, or the
        steps ran out first)."""
        hold, fail = self._bracket()
        if hold is None:
            return None
        step = hold[0]
        latency = step.quantile_ms(self.quantile)
        assert latency is not None  # a holding step met the SLO with it
        if step.mean_in_flight > 0:
            concurrency = step.mean_in_flight
        else:
            concurrency = step.achieved_rps * (step.mean_latency_ms or latency) / 1000.0
        limited_by: str
        if fail is not None:
            limited_by = fail[1].criterion or "slo"
        else:
            limited_by = "max_rps" if step.offered_rps >= self.max_rps else "max_steps"
        return Knee(
            step.offered_rps, concurrency, latency, limited_by, None if fail is None else fail[1]
        )

    def inconclusive(self) -> str | None:
        """Why the run says nothing of the group, or None when it does: the lowest failing
        step failed because the load generator fell behind its schedule (criterion
        "generator"), so every rate the search could still call the knee lies below a
        limit of the generator's, not the group's (a knee of 10 rps on an instance that
        holds 40, measured from a machine too busy to send 14 on time). A generator that
        fell behind only above a failure of the group's own does not matter: the knee is
        bracketed by that failure."""
        _, fail = self._bracket()
        if fail is None or fail[1].criterion != "generator":
            return None
        return (
            f"the load generator fell behind its schedule at {fail[0].offered_rps:.3g} rps, "
            "below any rate the group was seen to fail at: the result is the generator's "
            "limit, not the group's, so no knee and no targets come from it "
            "(rerun with more CPU or in-flight room, or from another machine)"
        )

    def _bracket(
        self,
    ) -> tuple[tuple[StepMeasure, StepVerdict] | None, tuple[StepMeasure, StepVerdict] | None]:
        """(highest hold below the lowest failure, lowest failure); either may be None."""
        fails = [s for s in self._steps if not s[1].holds]
        fail = min(fails, key=lambda s: s[0].offered_rps) if fails else None
        holds = [
            s
            for s in self._steps
            if s[1].holds and (fail is None or s[0].offered_rps < fail[0].offered_rps)
        ]
        hold = max(holds, key=lambda s: s[0].offered_rps) if holds else None
        return hold, fail


@dataclass(frozen=True, slots=True)
class Recommendation:
    """Per-instance operating point and the autoscaling `targets:` it implies."""

    rate_per_instance: float
    concurrency_per_instance: float
    queue_per_instance: float
    latency_p95_ms: float
    utilization: float
    notes: tuple[str, ...] = field(default=())

    def spec_targets(self) -> dict[str, float]:
        """The `autoscaling.targets` keys, rounded to what is worth writing down."""
        return {
            "utilization": round(self.utilization, 2),
            "queue_per_instance": round(self.queue_per_instance, 1),
            "latency_p95_ms": float(max(1, round(self.latency_p95_ms))),
        }

    def to_json(self) -> dict[str, Any]:
        out = {k: _json(v) for k, v in asdict(self).items()}
        out["spec_targets"] = self.spec_targets()
        return out


MIN_UTILIZATION = 0.01
"""The floor of a recommended utilization target (the spec needs it > 0)."""
MIN_QUEUE = 0.5
"""The spec's default queue_per_instance, and the floor of a recommended one."""
HEADROOM = 0.8
"""The share of its capacity an instance is planned to run at (`recommend`)."""


def recommend(
    knee: Knee, *, max_concurrency: int, slo_ms: float, headroom: float = HEADROOM
) -> Recommendation:
    """Targets for an instance measured to hold `knee`.

    headroom 0.8: the knee is measured AT the SLO (the next step broke it), so the targets
    sit at 80% of it, leaving the time a scale-up takes to land (Knative's default
    container-concurrency-target-percentage is 70% of a hard limit that is not an SLO
    point; ours is already one, so less margin is needed).

    queue_per_instance: what was waiting beyond the instance's `max_concurrency` slots at
    the knee, while the SLO still held (knee.concurrency - max_concurrency), x headroom,
    floored at the spec's 0.5. It is measured; deriving it from (slo - latency at the knee)
    / service time is not, because at the knee that slack is ~0 by construction.

    latency_p95_ms: headroom x the lower of the SLO and the knee's latency. The knee's
    latency is the highest the instance showed while holding; just above it latency may
    jump past the SLO at once, so a gate at 0.8 x SLO could open only after the cliff.
    A gate too low merely stays open (the count still comes from the queueing model), a gate
    too high blocks a needed scale-up. (It is the judged quantile, p95 by default.)
    """
    if max_concurrency < 1:
        raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
    if not slo_ms > 0:
        raise ValueError(f"slo_ms must be > 0, got {slo_ms}")
    if not 0 < headroom <= 1:
        raise ValueError(f"headroom must be in (0, 1], got {headroom}")
    notes: list[str] = []
    if knee.lower_bound:
        notes.append(
            f"the knee is a lower bound (search ended by {knee.limited_by}): the instance "
            "may sustain more, these targets scale up early"
        )
    concurrency = knee.concurrency * headroom
    raw_util = concurrency / max_concurrency
    if raw_util > 1:
        notes.append(
            f"{knee.concurrency:.1f} in flight at the knee exceeds max_concurrency "
            f"{max_concurrency}: the extra waited in a queue"
        )
    queue = max(MIN_QUEUE, (knee.concurrency - max_concurrency) * headroom)
    return Recommendation(
        rate_per_instance=knee.rate_rps * headroom,
        concurrency_per_instance=concurrency,
        queue_per_instance=queue,
        latency_p95_ms=headroom * min(slo_ms, knee.latency_ms),
        utilization=min(1.0, max(MIN_UTILIZATION, raw_util)),
        notes=tuple(notes),
    )


def knee_moved(
    previous: Mapping[str, Any], new: Mapping[str, Any], margin: float = KNEE_MARGIN
) -> dict[str, Any] | None:
    """`compare_capacity(previous, new)` when the knee's rate moved by at least `margin`
    either way; None when it did not, or when either result has no knee to compare."""
    try:
        compared = compare_capacity(previous, new)
    except ValueError:
        return None
    return compared if abs(compared["rate_change"]) >= margin else None


def compare_capacity(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """Two stored results ({"version", "knee": {"rate_rps", "concurrency", "latency_ms"}})
    compared: relative changes (new / old - 1; None where old is 0) and whether the new
    version is faster, slower or the same (|rate change| < SAME_RATE)."""

    def knee_of(result: Mapping[str, Any], name: str) -> tuple[float, float, float]:
        knee = result.get("knee")
        if not isinstance(knee, Mapping):
            raise ValueError(f"{name}: no 'knee' in the stored result")
        try:
            return (
                float(knee["rate_rps"]),
                float(knee["concurrency"]),
                float(knee["latency_ms"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{name}: knee needs rate_rps, concurrency, latency_ms") from exc

    def change(a: float, b: float) -> float | None:
        return None if a == 0 else round(b / a - 1, 4)

    o, n = knee_of(old, "old"), knee_of(new, "new")
    if o[0] <= 0:
        raise ValueError(f"old: knee rate_rps must be > 0, got {o[0]}")
    rate = n[0] / o[0] - 1
    verdict = "same" if abs(rate) < SAME_RATE else "faster" if rate > 0 else "slower"
    return {
        "old_version": old.get("version"),
        "new_version": new.get("version"),
        "rate_change": round(rate, 4),
        "concurrency_change": change(o[1], n[1]),
        "latency_change": change(o[2], n[2]),
        "verdict": verdict,
    }
