"""What `sluice loadtest` and `sluice drill` leave besides their JSON: plots (latency and
throughput against offered rate; a drill's timeline). The recommendation as an edit of the
group's spec is `sluice.spec.edit.spec_with_targets`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["write_drill_plot", "write_loadtest_plot"]


def write_loadtest_plot(report: dict[str, Any], out_dir: Path) -> Path:
    """loadtest.png: latency quantiles and achieved throughput against the offered rate,
    with the SLO and the knee marked."""
    plt = _pyplot()
    steps = sorted(report["steps"], key=lambda s: s["offered_rps"])
    offered = [s["offered_rps"] for s in steps]
    fig, (lat, thr) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    for q in ("p50_ms", "p95_ms", "p99_ms"):
        lat.plot(offered, [s[q] for s in steps], marker="o", label=q.removesuffix("_ms"))
    lat.axhline(report["slo_ms"], color="red", linestyle="--", label=f"SLO {report['slo_ms']:g} ms")
    lat.set_ylabel("latency (ms)")
    lat.set_yscale("log")
    thr.plot(offered, [s["achieved_rps"] for s in steps], marker="o", label="achieved")
    thr.plot(offered, offered, color="grey", linestyle=":", label="offered")
    thr.set_ylabel("requests / s")
    thr.set_xlabel("offered rate (requests / s, one instance)")
    knee = report.get("knee")
    for ax in (lat, thr):
        if knee:
            ax.axvline(knee["rate_rps"], color="green", label=f"knee {knee['rate_rps']:.1f} rps")
        ax.legend(loc="best", fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{report['group']} ({report['version']}): one instance")
    return _save(fig, out_dir / "loadtest.png")


def write_drill_plot(report: dict[str, Any], out_dir: Path) -> Path:
    """drill.png: offered and answered rate, instances desired and ready, and the queue over
    the drill, with the peak and the milestones marked."""
    plt = _pyplot()
    tl = report["timeline"]
    t = [s["t_s"] for s in tl]
    fig, (rate, inst, queue) = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    rate.plot(t, [s["offered_rps"] for s in tl], label="offered", color="grey")
    rate.plot(t, [s["completed"] for s in tl], label="answered 2xx")
    rate.plot(t, [s["shed"] for s in tl], label="shed", color="red")
    rate.set_ylabel("requests / s")
    inst.step(t, [s["desired"] for s in tl], where="post", label="desired")
    inst.step(t, [s["ready"] for s in tl], where="post", label="ready")
    inst.set_ylabel("instances")
    queue.plot(t, [s["queued"] for s in tl], label="queued at the gateway")
    queue.set_ylabel("requests")
    queue.set_xlabel("seconds since the drill began")
    plan, marks = report["plan"], report["judgement"]["milestones"]
    for ax in (rate, inst, queue):
        ax.axvspan(plan["peak_start_s"], plan["peak_end_s"], color="orange", alpha=0.1)
        if marks.get("first_scale_up_s") is not None:
            ax.axvline(plan["peak_start_s"] + marks["first_scale_up_s"], color="green", ls="--")
        ax.legend(loc="upper left", fontsize=8)
        ax.grid(alpha=0.3)
    verdict = report["judgement"]["verdict"]
    fig.suptitle(f"drill of {report['group']} ({report['mode']}): {verdict}")
    return _save(fig, out_dir / "drill.png")


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    _pyplot().close(fig)
    return path
