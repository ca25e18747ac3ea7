"""`sluice loadtest GROUP --fit`: the batching model's time parameters, measured on one
pinned instance and fitted with their errors (`sluice.policy.batching_fit`).

How the measurement maps to the model (`sluice.sim.batching.BatchingParams`)
---------------------------------------------------------------------------
- **Step time against batch size.** Closed-loop streamed load at concurrencies 1, 2, 4, ...
  up to the group's `max_concurrency` (`--fit-levels` to choose), each for `--fit-step`
  seconds: every caller sends its next request the moment its answer ends, so the server
  runs `b` = concurrency sequences all the time. Every answer has `max_tokens` 32 and a
  short prompt (16 words). Only answers that *ended* within the level's time are used: after
  it the callers stop one by one, and an answer still running then shares its steps with
  fewer sequences than `b`. An answer's TPOT is its mean gap between content chunks, and
  that is a decode step at batch `b` holding about `b x (prompt + 16)` KV tokens.
- **Prefill.** At concurrency 1, requests cycle through two or three prompt lengths
  (`--fit-prompts`, default 128, 1024 and 4096 words; interleaved, so that drift of the
  machine is not taken for the prompt's effect; the first request is a warm-up and is left
  out). TTFT = prefill (`prompt / prefill_tps`) + the first decode step + what the gateway
  and the network add: its slope on prompt tokens is `1 / prefill_tps`, the intercept a step
  plus that overhead. Their TPOTs (batch 1, KV from 144 to 4112 tokens) are TPOT points too,
  and they are what lets the fit tell the KV-token term from the per-sequence one.
- Every prompt starts with a word of its own (`q17`), so a prefix cache (vLLM's automatic
  prefix caching) cannot skip the prefill of a prompt it saw before.

Its limits
----------
- **Prompt tokens** are the server's own count when its answer reports `usage.prompt_tokens`
  (the streamed answers ask for usage; vLLM counts the chat template too); a server that
  does not report it gets the prompt's word count, an estimate: the synthesized text is
  common short English words, about one token each in the usual tokenizers, without the
  template's few tokens. The report says which (`prompt_tokens_from`).
- **Chunk gaps are TPOT only if the server sends one token per chunk.** Each answer's chunks
  are counted against its `usage.completion_tokens`; where they differ (a server that
  batches tokens into chunks, or a proxy that coalesces them), that answer's TPOT is its
  time from first to last chunk over its tokens less one, and the report says how many
  answers differed (`chunks`). An answer of one token has no TPOT.
- Batch size is the concurrency offered, not a count read from the server: a server that
  holds requests back (fewer `max_seqs` than the concurrency, or a KV cache that cannot hold
  them all) runs smaller batches and the fit says less than it seems. Keep the levels within
  what the instance admits at once (the group's `max_concurrency` is the default top).
- The fit is of means over a few seconds per level; a busy client machine adds scatter, not
  bias, to the gaps (a late read of one chunk shortens the next gap), but TTFT carries the
  gateway's overhead, including any cost that grows with the body: the prefill rate is the
  looser of the estimates.
- `max_seqs` and `kv_tokens` are not measured here (the server's configuration says them).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sluice.core import SpecError, SpecIssue
from sluice.policy.batching_fit import FitError, TpotPoint, TtftPoint, fit_batching, tpot_point
from sluice.tools.loadgen import LoadLimits, LoadRun, LoadTarget, run_closed, synthesized_body
from sluice.tools.loadstats import Outcome

__all__ = ["FitOptions", "fit_budget_s", "fit_levels", "measure_fit"]

SWEEP_PROMPT_WORDS = 16
MAX_LEVELS = 12


@dataclass(frozen=True, slots=True)
class FitOptions:
    levels: tuple[int, ...] | None = None
    """concurrencies of the sweep; None: 1, 2, 4, ... and the group's max_concurrency"""
    level_s: float = 4.0
    prompts: tuple[int, ...] = (128, 1024, 4096)
    """prompt lengths (words) at concurrency 1"""
    per_prompt: int = 5
    max_tokens: int = 32
    timeout_s: float = 60.0

    def __post_init__(self) -> None:
        issues = []
        if not self.level_s > 0:
            issues.append(SpecIssue("--fit-step", "must be positive"))
        if len(set(self.prompts)) < 2 or min(self.prompts, default=0) < 1:
            issues.append(SpecIssue("--fit-prompts", "give at least two distinct lengths >= 1"))
        if self.levels is not None and (
            len(set(self.levels)) < 2 or min(self.levels) < 1 or len(self.levels) > MAX_LEVELS
        ):
            why = f"give 2 to {MAX_LEVELS} distinct concurrencies >= 1"
            issues.append(SpecIssue("--fit-levels", why))
        if self.max_tokens < 2:
            issues.append(SpecIssue("max_tokens", "an answer needs two tokens for a TPOT"))
        if issues:
            raise SpecError(issues)


def fit_levels(opts: FitOptions, max_concurrency: int) -> tuple[int, ...]:
    """The sweep's concurrencies: the ones asked for, or powers of two up to the group's
    `max_concurrency` and that itself."""
    if opts.levels is not None:
        return tuple(sorted(set(opts.levels)))
    top = max(1, max_concurrency)
    levels = {1 << k for k in range(top.bit_length()) if 1 << k <= top} | {top}
    return tuple(sorted(levels))[-MAX_LEVELS:]


def fit_budget_s(opts: FitOptions, max_concurrency: int) -> float:
    """The longest the measurement can take (each level, and each request's timeout)."""
    levels = len(fit_levels(opts, max_concurrency))
    return levels * (opts.level_s + opts.timeout_s) + _prompt_phase_s(opts) + opts.timeout_s


def _prompt_phase_s(opts: FitOptions) -> float:
    return opts.level_s * (len(opts.prompts) + 1) * 2


def _body(
    model: str, words: int, max_tokens: int
) -> Callable[[int], tuple[str, Mapping[str, Any]]]:
    def make(k: int) -> tuple[str, Mapping[str, Any]]:
        path, body = synthesized_body(model, max(1, words - 1), max_tokens, stream=True)
        message = body["messages"][0]
        body["messages"] = [{**message, "content": f"q{k} {message['content']}"}]
        return path, body

    return make


@dataclass(frozen=True, slots=True)
class _Answer:
    """What one streamed answer says to the fit."""

    prompt_tokens: float
    ttft_s: float
    tpot_s: float | None
    chunks: int
    tokens: int


def _answer(o: Outcome, words: int) -> _Answer | None:
    if not o.ok or o.ttft_s is None or o.sent_s is None or o.done_s is None:
        return None
    chunks = len(o.itl_s) + 1  # every gap is kept: max_tokens is under loadgen's MAX_ITL
    tokens = o.output_tokens if o.output_tokens is not None else chunks
    prompt = float(o.prompt_tokens) if o.prompt_tokens is not None else float(words)
    if tokens < 2:
        tpot = None
    elif tokens == chunks:
        tpot = float(np.mean(o.itl_s))
    else:  # not one token a chunk: first to last chunk, over the tokens less one
        tpot = (o.done_s - o.sent_s - o.ttft_s) / (tokens - 1)
    return _Answer(prompt, o.ttft_s, tpot, chunks, tokens)


def _ms(values: Sequence[float]) -> float | None:
    return round(float(np.mean(values)) * 1000.0, 3) if values else None


def _errors(run: LoadRun) -> list[str]:
    return sorted({o.error or str(o.status) for o in run.outcomes if not o.ok})


def measure_fit(
    target: LoadTarget,
    model: str,
    max_concurrency: int,
    opts: FitOptions,
    say: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Measure (module docstring) and fit; the document stored as the report's `fit`. A fit
    the points cannot support has `error` (what to measure) beside what was measured."""
    tpot: list[TpotPoint] = []
    ttft: list[TtftPoint] = []
    answers: list[_Answer] = []
    levels_doc: list[dict[str, Any]] = []
    errors: set[str] = set()
    for c in fit_levels(opts, max_concurrency):
        limits = LoadLimits(
            max_requests=100_000, max_duration_s=opts.level_s, max_in_flight=c,
            timeout_s=opts.timeout_s,
        )  # fmt: skip
        body = _body(model, SWEEP_PROMPT_WORDS, opts.max_tokens)
        run = asyncio.run(run_closed(target, body, c, limits))
        errors.update(_errors(run))
        within = [o for o in run.outcomes if o.done_s is not None and o.done_s <= opts.level_s]
        used = [a for o in within if (a := _answer(o, SWEEP_PROMPT_WORDS)) is not None]
        answers.extend(used)
        for a in used:
            if a.tpot_s is not None:
                tpot.append(tpot_point(c, a.prompt_tokens, a.tokens, a.tpot_s))
        tpots = [a.tpot_s for a in used if a.tpot_s is not None]
        levels_doc.append(
            {
                "concurrency": c,
                "requests": len(run.outcomes),
                "used": len(tpots),
                "errors": sum(1 for o in run.outcomes if not o.ok),
                "tpot_ms": _ms(tpots),
                "ttft_ms": _ms([a.ttft_s for a in used]),
            }
        )
        say(f"concurrency {c:3d}: TPOT {_show(levels_doc[-1]['tpot_ms'])} over {len(tpots)}")

    prompts = list(opts.prompts)
    count = 1 + len(prompts) * opts.per_prompt

    def cycled(k: int) -> tuple[str, Mapping[str, Any]]:
        return _body(model, prompts[k % len(prompts)], opts.max_tokens)(k)

    limits = LoadLimits(
        max_requests=count, max_duration_s=_prompt_phase_s(opts), max_in_flight=1,
        timeout_s=opts.timeout_s,
    )  # fmt: skip
    run = asyncio.run(run_closed(target, cycled, 1, limits))
    errors.update(_errors(run))
    by_prompt: dict[int, list[_Answer]] = {p: [] for p in prompts}
    for k, o in enumerate(run.outcomes):
        words = prompts[k % len(prompts)]
        a = _answer(o, words)
        if k == 0 or a is None:  # the first is a warm-up
            continue
        by_prompt[words].append(a)
        answers.append(a)
        ttft.append(TtftPoint(a.prompt_tokens, a.ttft_s))
        if a.tpot_s is not None:
            tpot.append(tpot_point(1, a.prompt_tokens, a.tokens, a.tpot_s))
    prompts_doc = [
        {
            "words": p,
            "prompt_tokens": _mean([a.prompt_tokens for a in got]),
            "requests": len(got),
            "ttft_ms": _ms([a.ttft_s for a in got]),
            "tpot_ms": _ms([a.tpot_s for a in got if a.tpot_s is not None]),
        }
        for p, got in by_prompt.items()
    ]
    for d in prompts_doc:
        say(f"prompt {d['words']:5d} words: TTFT {_show(d['ttft_ms'])} over {d['requests']}")
    differ = sum(1 for a in answers if a.tokens != a.chunks)
    reported = sum(1 for o in run.outcomes if o.prompt_tokens is not None)
    doc: dict[str, Any] = {
        "max_tokens": opts.max_tokens,
        "level_s": opts.level_s,
        "levels": levels_doc,
        "prompts": prompts_doc,
        "prompt_tokens_from": "usage" if reported else "estimate (words)",
        "chunks": {
            "answers": len(answers),
            "not_one_token_each": differ,
            "tokens_per_chunk": _mean([a.tokens / a.chunks for a in answers]),
            "note": "one token per chunk: TPOT is the mean chunk gap"
            if not differ
            else f"{differ} answers had chunks of several tokens: their TPOT is first to last "
            "chunk over their tokens less one",
        },
        "errors": sorted(errors)[:10],
    }
    try:
        doc.update(fit_batching(tpot, ttft).to_json())
    except FitError as exc:
        doc["error"] = str(exc)
    return doc


def _mean(values: Sequence[float]) -> float | None:
    return round(float(np.mean(values)), 3) if values else None


def _show(ms: float | None) -> str:
    return "-" if ms is None or math.isnan(ms) else f"{ms:.1f} ms"
