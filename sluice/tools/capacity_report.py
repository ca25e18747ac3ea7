"""What `sluice loadtest` and `sluice drill` leave besides their JSON: plots (latency and
throughput against offered rate; a drill's timeline), and the load test's recommendation as
an edit of the group's spec, ready to propose."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

__all__ = ["spec_with_targets", "write_drill_plot", "write_loadtest_plot"]


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


def spec_with_targets(yaml_text: str, group: str, targets: dict[str, float]) -> str:
    """The spec with `group`'s `autoscaling.targets` set to `targets`, everything else as
    written (comments and order kept: ruamel's round trip, so the proposal's diff shows only
    what changed)."""
    from ruamel.yaml import YAML
    from ruamel.yaml.util import load_yaml_guess_indent

    _, sequence, dash = load_yaml_guess_indent(yaml_text)  # "  - key": 4 and 2
    sequence, dash = sequence or 2, dash or 0
    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096  # never fold a long line that was written on one
    yaml.indent(mapping=max(sequence - dash, 2), sequence=sequence, offset=dash)
    doc = yaml.load(yaml_text)
    found = [g for g in doc.get("groups") or [] if g.get("name") == group]
    if not found:
        raise ValueError(f"the live spec has no group named {group!r}")
    autoscaling = found[0].get("autoscaling")
    if autoscaling is None:
        raise ValueError(f"group {group!r} has no autoscaling block to set targets in")
    current = autoscaling.setdefault("targets", {})
    for key, value in targets.items():
        current[key] = value
    out = io.StringIO()
    yaml.dump(doc, out)
    return out.getvalue()


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
