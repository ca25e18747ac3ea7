"""What a load run measured, and the pure arithmetic over it (no I/O, no clock): the records
`sluice.tools.loadgen` fills in, and the summary and timeline that capacity tests and peak
drills read. Every time is an offset in seconds from the run's start; reports are in ms.

An outcome is *ok* when it is a complete 2xx answer (`status` 2xx and no `error`); every
other sent request is an *error*, a 2xx whose stream broke included. *Unsent* arrivals were
dropped by the generator itself (in-flight cap), so a slow target shows up as missing
requests instead of as latency the generator hid by sending late (coordinated omission).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sluice.policy.generator import BEHIND_LAG_S, ScheduleBounds, judge_schedule

__all__ = ["BEHIND_LAG_S", "MIN_SPAN_S", "LoadRun", "Outcome", "ScheduleBounds"]

MIN_SPAN_S = 1.0
"""The shortest span a whole-run rate is computed over: a schedule that is one burst (every
arrival at once) has no span of its own, and a rate over less than a second says little."""

SHED = frozenset({429, 503})


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one arrival."""

    at_s: float  # scheduled offset
    sent_s: float | None  # actual send offset; None: not sent (unsent)
    done_s: float | None  # when the answer ended (or failed)
    status: int | None  # HTTP status; None: no HTTP answer (connect error, timeout) or unsent
    ttft_s: float | None  # streaming: first content chunk after send; non-streaming: None
    itl_s: tuple[float, ...]  # streaming: gaps between content chunks (at most ~64 kept)
    output_tokens: int | None
    error: str | None  # "timeout", "connect: ...", "unsent: in-flight cap", "HTTP 503: ..."
    served_by: str | None = None  # response header x-sluice-group, if present
    prompt_tokens: int | None = None  # usage.prompt_tokens, when the answer reports it

    @property
    def ok(self) -> bool:
        """A complete 2xx answer."""
        return self.error is None and self.status is not None and 200 <= self.status < 300

    @property
    def status_key(self) -> str:
        """The `status` count this outcome falls under: its HTTP status, or "error" when no
        complete HTTP answer came (no answer, or a 2xx that broke off)."""
        if self.status is None or (self.error is not None and 200 <= self.status < 300):
            return "error"
        return str(self.status)


def _ms(values: Sequence[float] | np.ndarray[Any, Any], *qs: float) -> dict[str, float | None]:
    """Named quantiles (and "mean", "max") of seconds, in ms; None for no values."""
    arr = np.asarray(values, dtype=float)
    out: dict[str, float | None] = {}
    for q in qs:
        out[f"p{q:g}"] = float(np.percentile(arr, q) * 1000) if arr.size else None
    return out


def _full(values: Sequence[float]) -> dict[str, float | None]:
    arr = np.asarray(values, dtype=float)
    out = _ms(arr, 50, 95, 99)
    out["mean"] = float(arr.mean() * 1000) if arr.size else None
    out["max"] = float(arr.max() * 1000) if arr.size else None
    return out


@dataclass(slots=True)
class LoadRun:
    """The outcomes of one run, in schedule order, and where its offsets sit in wall time."""

    outcomes: list[Outcome]
    started_at: float  # unix time (time.time()) of offset 0
    duration_s: float  # offset of the last event

    def summary(
        self,
        since_s: float = 0.0,
        until_s: float | None = None,
        bounds: ScheduleBounds | None = None,
    ) -> dict[str, Any]:
        """A JSON-safe summary of the arrivals scheduled in [since_s, until_s); `behind`
        (with `behind_reason`) says whether the generator kept its schedule there
        (`sluice.policy.generator.judge_schedule` under `bounds`, None: the defaults)."""
        window = [
            o for o in self.outcomes if o.at_s >= since_s and (until_s is None or o.at_s < until_s)
        ]
        first = min((o.at_s for o in window), default=0.0)
        last = max((o.at_s for o in window), default=0.0)
        if until_s is not None:
            span = max(until_s - since_s, 1e-9)
            start, end = since_s, since_s + span
        else:
            span = max(last - first, MIN_SPAN_S)
            start, end = first, first + span
        sent = [o for o in window if o.sent_s is not None]
        ok = [o for o in sent if o.ok]
        unsent = len(window) - len(sent)
        sends_in = sum(1 for o in self.outcomes if o.sent_s is not None and start <= o.sent_s < end)
        keeping = judge_schedule(
            [o.at_s for o in window],
            [o.sent_s for o in window],
            window=(start, end),
            sends_in_window=sends_in,
            bounds=bounds,
        )
        lag = {"p50": keeping.lag_p50_ms, "p99": keeping.lag_p99_ms, "max": keeping.lag_max_ms}
        busy = sum(_done(o) - o.sent_s for o in sent if o.sent_s is not None)
        return {
            "requests": len(window),
            "sent": len(sent),
            "unsent": unsent,
            "ok": len(ok),
            "errors": len(sent) - len(ok),
            "shed": sum(1 for o in sent if o.status in SHED),
            "status": dict(sorted(Counter(o.status_key for o in sent).items())),
            "error_rate": (len(sent) - len(ok)) / len(sent) if sent else 0.0,
            "offered_rps": len(window) / span,
            "achieved_rps": len(ok) / span,
            "latency_ms": _full([_latency(o) for o in ok]),
            "latency_from_schedule_ms": _ms([_done(o) - o.at_s for o in ok], 50, 99),
            "ttft_ms": _ms([o.ttft_s for o in ok if o.ttft_s is not None], 50, 95),
            "itl_ms": _ms([gap for o in ok for gap in o.itl_s], 50, 95),
            "output_tokens": sum(o.output_tokens or 0 for o in ok),
            "mean_in_flight": busy / span,
            "lag_ms": lag,
            "send_share": keeping.send_share,
            "behind": not keeping.kept,
            "behind_reason": keeping.reason,
            "served_by": dict(sorted(Counter(o.served_by for o in sent if o.served_by).items())),
        }

    def timeline(self, bin_s: float = 1.0) -> list[dict[str, Any]]:
        """One row per `bin_s` from offset 0 to the last event: arrivals scheduled and sent
        in the bin, answers ending in it (ok, errors, shed, p95 of the ok ones), and the
        requests in flight at its end."""
        if bin_s <= 0:
            raise ValueError("bin_s must be positive")
        outs = self.outcomes
        end = max([self.duration_s, *(o.at_s for o in outs)], default=0.0)
        bins = int(end // bin_s) + 1
        nan = float("nan")
        sent_at = np.array([nan if o.sent_s is None else o.sent_s for o in outs], dtype=float)
        done_at = np.array(
            [nan if o.sent_s is None or o.done_s is None else o.done_s for o in outs], dtype=float
        )

        def per_bin(times: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
            idx = np.floor(times[~np.isnan(times)] / bin_s).astype(int)
            return np.bincount(np.clip(idx, 0, bins - 1), minlength=bins)

        ok = np.array([o.ok for o in outs], dtype=bool)
        shed = np.array([o.status in SHED for o in outs], dtype=bool)
        scheduled = per_bin(np.array([o.at_s for o in outs], dtype=float))
        sent_n = per_bin(sent_at)
        ok_n = per_bin(np.where(ok, done_at, nan))
        err_n = per_bin(np.where(ok, nan, done_at))
        shed_n = per_bin(np.where(shed, done_at, nan))
        sent_sorted = np.sort(sent_at[~np.isnan(sent_at)])
        done_sorted = np.sort(done_at[~np.isnan(done_at)])
        ok_lat: dict[int, list[float]] = {}
        for o in outs:
            if o.ok:
                b = min(int(_done(o) // bin_s), bins - 1)
                ok_lat.setdefault(b, []).append(_latency(o))
        rows = []
        for b in range(bins):
            lo, hi = b * bin_s, (b + 1) * bin_s
            in_flight = np.searchsorted(sent_sorted, hi, "right") - np.searchsorted(
                done_sorted, hi, "right"
            )
            rows.append(
                {
                    "t_s": lo,
                    "scheduled": int(scheduled[b]),
                    "sent": int(sent_n[b]),
                    "ok": int(ok_n[b]),
                    "errors": int(err_n[b]),
                    "shed": int(shed_n[b]),
                    "p95_ms": _ms(ok_lat.get(b, []), 95)["p95"],
                    "in_flight": int(in_flight),
                }
            )
        return rows


def _done(o: Outcome) -> float:
    return o.done_s if o.done_s is not None else o.at_s


def _latency(o: Outcome) -> float:
    """Send to end of answer (an ok outcome always has both)."""
    return _done(o) - (o.sent_s if o.sent_s is not None else o.at_s)
