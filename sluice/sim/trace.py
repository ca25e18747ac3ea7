"""Request traces: the shared CSV format (`t_s,input_tokens,output_tokens,model[,tenant,priority]`),
loaded into arrays, with windowing, time scaling and rate scaling for what-if studies. An
optional `group` column splits one file into a trace per group (the fleet simulator).

A bad file raises `SpecError` whose issue names the file, the line and the fix, exactly like
a bad spec (exit code 2).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from sluice.core.errors import NotFound, SpecError, SpecIssue
from sluice.policy.routing import PRIORITIES

__all__ = [
    "GROUP_COLUMN",
    "REQUIRED_COLUMNS",
    "Trace",
    "has_group_column",
    "load_group_traces",
    "load_trace",
    "trace_from_rows",
]

REQUIRED_COLUMNS = ("t_s", "input_tokens", "output_tokens", "model")
GROUP_COLUMN = "group"
_T = TypeVar("_T")
_FIX = "rows are `t_s,input_tokens,output_tokens,model[,tenant,priority]` (see traces/README.md)"


@dataclass(frozen=True)
class Trace:
    """Arrivals sorted by time. `model` and `priority` index `models` and `PRIORITIES`."""

    name: str
    t: npt.NDArray[np.float64]
    """arrival time, seconds from the start of the trace (after windowing and scaling)"""
    input_tokens: npt.NDArray[np.int64]
    output_tokens: npt.NDArray[np.int64]
    model: npt.NDArray[np.int32]
    models: tuple[str, ...]
    priority: npt.NDArray[np.int8]
    tenant: npt.NDArray[np.int32]
    tenants: tuple[str, ...]

    def __len__(self) -> int:
        return int(self.t.shape[0])

    @property
    def span_s(self) -> float:
        return float(self.t[-1]) if len(self) else 0.0

    def transform(
        self,
        *,
        start: float = 0.0,
        duration: float | None = None,
        speedup: float = 1.0,
        rate_scale: float = 1.0,
        seed: int = 0,
    ) -> Trace:
        """What-if variants. Order: window [start, start+duration) in original seconds (then
        shifted to 0), divide times by `speedup`, then scale the rate: `rate_scale` < 1 keeps
        each request with that probability; > 1 emits each request floor(r) or ceil(r) times
        (the fraction by chance), the copies at t + U[0, 1) s so they do not all land on the
        same instant. Seeded, so the same arguments give the same trace."""
        if speedup <= 0 or rate_scale <= 0:
            raise ValueError("speedup and rate_scale must be > 0")
        t = self.t
        keep = t >= start
        if duration is not None:
            keep &= t < start + duration
        idx = np.nonzero(keep)[0]
        new_t = (t[idx] - start) / speedup
        if rate_scale != 1.0:
            rng = np.random.default_rng(seed)
            whole = math.floor(rate_scale)
            frac = rate_scale - whole
            copies = np.full(idx.shape[0], whole, dtype=np.int64)
            if frac > 0:
                copies += rng.random(idx.shape[0]) < frac
            rep_idx = np.repeat(idx, copies)
            rep_t = np.repeat(new_t, copies)
            first = np.zeros(rep_idx.shape[0], dtype=bool)
            starts = np.cumsum(copies) - copies
            first[starts[copies > 0]] = True
            jitter = rng.random(rep_idx.shape[0])
            rep_t = np.where(first, rep_t, rep_t + jitter)
            order = np.argsort(rep_t, kind="stable")
            idx, new_t = rep_idx[order], rep_t[order]
        return Trace(
            name=self.name,
            t=np.ascontiguousarray(new_t, dtype=np.float64),
            input_tokens=self.input_tokens[idx],
            output_tokens=self.output_tokens[idx],
            model=self.model[idx],
            models=self.models,
            priority=self.priority[idx],
            tenant=self.tenant[idx],
            tenants=self.tenants,
        )


def trace_from_rows(rows: Iterable[Sequence[object]], name: str = "<rows>") -> Trace:
    """A trace from `(t_s, input_tokens, output_tokens[, model[, tenant[, priority]]])`
    tuples (tests and generated loads). Sorted by time."""
    ts: list[float] = []
    ins: list[int] = []
    outs: list[int] = []
    models: list[str] = []
    tenants: list[str] = []
    prios: list[str] = []
    for row in rows:
        ts.append(float(row[0]))  # type: ignore[arg-type]
        ins.append(int(row[1]))  # type: ignore[call-overload]
        outs.append(int(row[2]))  # type: ignore[call-overload]
        models.append(str(row[3]) if len(row) > 3 else "")
        tenants.append(str(row[4]) if len(row) > 4 else "")
        prios.append(str(row[5]) if len(row) > 5 and row[5] else "normal")
    return _build(name, ts, ins, outs, models, tenants, prios)


def load_trace(path: str | Path) -> Trace:
    """Read a trace CSV (header required). Rows need not be sorted; they are sorted by t_s."""
    return _read(path)[0]


def has_group_column(path: str | Path) -> bool:
    """Whether the file is a readable CSV whose header names a `group` column."""
    try:
        with Path(path).open(newline="", encoding="utf-8") as fh:
            header = next(csv.reader(fh), None)
    except (OSError, UnicodeDecodeError):
        return False
    return header is not None and GROUP_COLUMN in (h.strip() for h in header)


def load_group_traces(path: str | Path, known: Collection[str]) -> dict[str, Trace]:
    """One trace per value of the `group` column, each named `FILE[GROUP]`. A missing
    column, an empty value or a group not in `known` is a `SpecError` naming the line."""
    _, groups, lines = _read(path, with_group=True)
    src = str(path)
    if groups is None:
        fix = f"add a `{GROUP_COLUMN}` column naming each row's group, or pass --trace GROUP=FILE"
        raise SpecError([SpecIssue("header", f"no {GROUP_COLUMN} column; {fix}", src, 1)])
    names = ", ".join(sorted(known)) or "none"
    for value, line in lines.items():
        if value not in known:
            what = f"empty {GROUP_COLUMN}" if not value else f"no group named {value!r} in the spec"
            fix = f"every row's {GROUP_COLUMN} must be one of the spec's groups: {names}"
            raise SpecError([SpecIssue(GROUP_COLUMN, f"{what}; {fix}", src, line)])
    return groups


def _read(
    path: str | Path, with_group: bool = False
) -> tuple[Trace, dict[str, Trace] | None, dict[str, int]]:
    """The whole trace; with `with_group`, also one trace per `group` value (None without
    the column) and the first line of each value."""
    p = Path(path)
    src = str(p)
    try:
        fh = p.open(newline="", encoding="utf-8")
    except FileNotFoundError:
        raise NotFound(f"trace file not found: {p}", file=str(p)) from None
    except OSError as exc:
        raise SpecError([SpecIssue("", f"cannot read trace: {exc.strerror}", src)]) from None
    with fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            raise SpecError([SpecIssue("header", f"empty trace file; {_FIX}", src, 1)])
        cols = [h.strip() for h in header]
        missing = [c for c in REQUIRED_COLUMNS if c not in cols]
        if missing:
            raise SpecError(
                [SpecIssue("header", f"missing column(s) {', '.join(missing)}; {_FIX}", src, 1)]
            )
        it, ii, io, im = (cols.index(c) for c in REQUIRED_COLUMNS)
        itn = cols.index("tenant") if "tenant" in cols else -1
        ipr = cols.index("priority") if "priority" in cols else -1
        igr = cols.index(GROUP_COLUMN) if with_group and GROUP_COLUMN in cols else -1
        width = len(cols)
        ts: list[float] = []
        ins: list[int] = []
        outs: list[int] = []
        models: list[str] = []
        tenants: list[str] = []
        prios: list[str] = []
        groups: list[str] = []
        first: dict[str, int] = {}
        for line, row in enumerate(reader, start=2):
            if not row:
                continue
            if len(row) != width:
                raise SpecError(
                    [
                        SpecIssue(
                            "row", f"{len(row)} fields, the header has {width}; {_FIX}", src, line
                        )
                    ]
                )
            try:
                t = float(row[it])
                a = int(row[ii])
                b = int(row[io])
            except ValueError:
                raise SpecError(
                    [
                        SpecIssue(
                            "row",
                            f"not a number in {row!r}: t_s is seconds (float), "
                            "token counts are integers",
                            src,
                            line,
                        )
                    ]
                ) from None
            if not math.isfinite(t) or t < 0 or a < 0 or b < 0:
                raise SpecError(
                    [
                        SpecIssue(
                            "row",
                            f"negative or non-finite value in {row!r}; times and "
                            "token counts must be >= 0",
                            src,
                            line,
                        )
                    ]
                )
            prio = row[ipr].strip() if ipr >= 0 else ""
            if prio and prio not in PRIORITIES:
                raise SpecError(
                    [
                        SpecIssue(
                            "priority",
                            f"unknown priority {prio!r}; use one of "
                            f"{', '.join(PRIORITIES)} or leave it empty",
                            src,
                            line,
                        )
                    ]
                )
            ts.append(t)
            ins.append(a)
            outs.append(b)
            models.append(row[im].strip())
            tenants.append(row[itn].strip() if itn >= 0 else "")
            prios.append(prio or "normal")
            if igr >= 0:
                groups.append(row[igr].strip())
                first.setdefault(groups[-1], line)
    whole = _build(p.name, ts, ins, outs, models, tenants, prios)
    if igr < 0:
        return whole, None, first
    rows_of: dict[str, list[int]] = {}
    for j, name in enumerate(groups):
        rows_of.setdefault(name, []).append(j)
    split = {
        name: _build(
            f"{p.name}[{name}]",
            *(_pick(ts, sel), _pick(ins, sel), _pick(outs, sel)),
            *(_pick(models, sel), _pick(tenants, sel), _pick(prios, sel)),
        )
        for name, sel in rows_of.items()
    }
    return whole, split, first


def _pick(xs: list[_T], sel: list[int]) -> list[_T]:
    return [xs[j] for j in sel]


def _build(
    name: str,
    ts: list[float],
    ins: list[int],
    outs: list[int],
    models: list[str],
    tenants: list[str],
    prios: list[str],
) -> Trace:
    model_names = tuple(sorted(set(models)))
    tenant_names = tuple(sorted(set(tenants)))
    m_index = {m: i for i, m in enumerate(model_names)}
    tn_index = {tn: i for i, tn in enumerate(tenant_names)}
    p_index = {p: i for i, p in enumerate(PRIORITIES)}
    t = np.asarray(ts, dtype=np.float64)
    order = np.argsort(t, kind="stable")
    return Trace(
        name=name,
        t=t[order],
        input_tokens=np.asarray(ins, dtype=np.int64)[order],
        output_tokens=np.asarray(outs, dtype=np.int64)[order],
        model=np.asarray([m_index[m] for m in models], dtype=np.int32)[order],
        models=model_names,
        priority=np.asarray([p_index[p] for p in prios], dtype=np.int8)[order],
        tenant=np.asarray([tn_index[x] for x in tenants], dtype=np.int32)[order],
        tenants=tenant_names,
    )
