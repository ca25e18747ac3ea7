"""The `--report DIR` page of a simulation: index.html with PNG plots (load, desired and ready
instances, queue, latency percentiles over time; for batching instances, KV-cache use and
the servers' own queues over time) and the decision log. The page opens with the instance
model used (slots, or a batching server and its parameters) and, for batching instances,
the TTFT and TPOT percentiles."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from sluice.sim.result import SimResult

__all__ = ["write_report"]


def write_report(result: SimResult, out_dir: str | Path, summary: dict[str, Any]) -> Path:
    """Write index.html and its PNGs into `out_dir` (created); returns the page's path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tl = result.timeline
    t = result.column("t") if len(tl) else np.zeros(0)
    minutes = t / 60.0
    pngs: list[tuple[str, str]] = []

    def save(fig: Any, name: str, title: str) -> None:
        fig.tight_layout()
        fig.savefig(out / name, dpi=90)
        plt.close(fig)
        pngs.append((name, title))

    arrivals = np.diff(result.column("arrivals"), prepend=0.0) if len(tl) else np.zeros(0)
    dt = np.diff(t, prepend=t[0] - 1.0) if len(t) else np.zeros(0)
    rate = arrivals / np.maximum(dt, 1e-9)
    fig, ax = plt.subplots(figsize=(10, 3))
    ax.plot(minutes, rate, lw=0.5, color="#999", label="req/s (per tick)")
    ax.plot(minutes, _rolling(rate, 60), lw=1.2, color="#c33", label="req/s (60 s mean)")
    ax.set_xlabel("minutes")
    ax.set_ylabel("arrivals / s")
    ax.legend(loc="upper right")
    save(fig, "load.png", "Load")

    fig, ax = plt.subplots(figsize=(10, 3))
    ax.step(
        minutes, result.column("desired") if len(tl) else [], where="post", lw=1, label="desired"
    )
    ax.step(minutes, result.column("ready") if len(tl) else [], where="post", lw=1, label="ready")
    ax.step(
        minutes,
        result.column("alive") if len(tl) else [],
        where="post",
        lw=0.8,
        ls=":",
        label="alive (paid)",
    )
    ax.set_xlabel("minutes")
    ax.set_ylabel("instances")
    ax.legend(loc="upper right")
    save(fig, "instances.png", "Desired and ready instances")

    fig, ax = plt.subplots(figsize=(10, 3))
    ax.plot(minutes, result.column("queued") if len(tl) else [], lw=0.8, label="queued")
    ax.plot(minutes, result.column("in_flight") if len(tl) else [], lw=0.8, label="in flight")
    ax.set_xlabel("minutes")
    ax.set_ylabel("requests")
    ax.legend(loc="upper right")
    save(fig, "queue.png", "Gateway queue and in-flight requests")

    if result.ttft_s is not None and len(tl):
        fig, ax = plt.subplots(figsize=(10, 3))
        ax.plot(minutes, result.column("kv_cache_usage"), lw=0.8, label="KV-cache use (mean)")
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("KV-cache use")
        ax.set_xlabel("minutes")
        ax2 = ax.twinx()
        ax2.plot(
            minutes, result.column("server_waiting"), lw=0.8, color="#c33", label="server waiting"
        )
        ax2.set_ylabel("requests waiting in servers")
        ax.legend(loc="upper left")
        ax2.legend(loc="upper right")
        save(fig, "kv_cache.png", "KV-cache use and the servers' waiting queues")

    centers, pcts = _latency_over_time(result, 30.0)
    fig, ax = plt.subplots(figsize=(10, 3))
    for q, row in zip((50, 90, 99), pcts, strict=True):
        ax.plot(centers / 60.0, row, lw=1, label=f"p{q}")
    ax.set_yscale("log")
    ax.set_xlabel("minutes (by completion, 30 s buckets)")
    ax.set_ylabel("latency (s)")
    ax.legend(loc="upper right")
    save(fig, "latency.png", "Latency percentiles over time")

    rows = "\n".join(
        "<tr>"
        + "".join(
            f"<td>{html.escape(str(v))}</td>"
            for v in (
                d["t"],
                d["from"],
                d["to"],
                "yes" if d["changed"] else "sample",
                d["winner"],
                ", ".join(d["clipped_by"]),
                d["ready"],
                d["in_flight"],
                d["queued"],
                d["reason"],
                json.dumps(d["signals"]),
            )
        )
        + "</tr>"
        for d in result.decisions
    )
    model = summary.get("instance_model") or {}
    instances = (model.get("instances") or {}).get("text", "")
    callers = ""
    if result.ttft_s is not None:
        times = result.token_times()
        cells = "".join(
            f"<tr><th>{what}</th>"
            + "".join(f"<td>{_ms(times.get(f'{key}_p{q}_ms'))}</td>" for q in (50, 95, 99))
            + "</tr>"
            for what, key in (("TTFT", "ttft"), ("TPOT", "tpot"))
        )
        callers = (
            "<h2>What callers feel (ms)</h2><table><tr><th></th><th>p50</th><th>p95</th>"
            f"<th>p99</th></tr>{cells}</table>"
        )
    figs = "\n".join(
        f'<h2>{html.escape(title)}</h2><img src="{name}" alt="{html.escape(title)}">'
        for name, title in pngs
    )
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Sluice simulation: {html.escape(result.policy)}</title>
<style>body{{font-family:sans-serif;margin:1.5em}} table{{border-collapse:collapse;font-size:12px}}
td,th{{border:1px solid #ccc;padding:2px 6px}} img{{max-width:100%}}</style></head><body>
<h1>Simulation: policy {html.escape(result.policy)},
trace {html.escape(summary.get("trace", ""))}</h1>
<p>Instances: {html.escape(instances)}</p>
{callers}
<pre>{html.escape(json.dumps(summary, indent=2, default=str))}</pre>
{figs}
<h2>Decision log: {result.scale_events} count changes in all; shown: the first
{sum(1 for d in result.decisions if d["changed"])} changes and a sample of steady ticks</h2>
<table><tr><th>t (s)</th><th>from</th><th>to</th><th>changed</th><th>winner</th><th>clipped by</th>
<th>ready</th><th>in flight</th><th>queued</th><th>reason</th><th>signals</th></tr>
{rows}
</table></body></html>
"""
    path = out / "index.html"
    path.write_text(page, encoding="utf-8")
    return path


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _rolling(x: npt.NDArray[np.float64], n: int) -> npt.NDArray[np.float64]:
    if x.size == 0:
        return x
    kernel = np.ones(min(n, x.size)) / min(n, x.size)
    return np.convolve(x, kernel, mode="same")


def _latency_over_time(
    result: SimResult, bucket_s: float
) -> tuple[npt.NDArray[np.float64], list[npt.NDArray[np.float64]]]:
    done = result.done
    ok = done >= 0
    if not ok.any():
        return np.zeros(0), [np.zeros(0)] * 3
    t_done = done[ok]
    lat = t_done - result.workload.trace.t[ok]
    b = (t_done // bucket_s).astype(np.int64)
    order = np.argsort(b, kind="stable")
    b, lat = b[order], lat[order]
    keys, starts = np.unique(b, return_index=True)
    groups = np.split(lat, starts[1:])
    pcts = [np.array([np.percentile(g, q) for g in groups], dtype=np.float64) for q in (50, 90, 99)]
    return (keys + 0.5).astype(np.float64) * bucket_s, pcts
