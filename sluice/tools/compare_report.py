"""The `--report DIR` page of `sluice compare`: index.html, PNG plots (output lengths,
similarity, latency per side) and the worst-differing items with both outputs side by side,
plus compare.json, the same document `--json` prints (the archived artifact)."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

__all__ = ["write_compare_report"]

_COLORS = {"a": "#3465a4", "b": "#cc0000"}
_SHOWN_CHARS = 2000
"""Outputs longer than this are cut on the page (compare.json keeps them whole)."""


def write_compare_report(result: dict[str, Any], out_dir: Path) -> Path:
    """Write compare.json, index.html and its PNGs into `out_dir` (created); returns the page."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "compare.json").write_text(json.dumps(result, indent=1) + "\n")
    rows: list[dict[str, Any]] = result["items"]
    pngs: list[tuple[str, str]] = []

    def save(fig: Any, name: str, title: str) -> None:
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=90)
        plt.close(fig)
        pngs.append((name, title))

    def side_values(side: str, key: str) -> list[float]:
        return [r[side][key] for r in rows if r[side][key] is not None and not r[side]["error"]]

    if any(r["kind"] != "embedding" for r in rows):
        fig, ax = plt.subplots(figsize=(8, 3))
        lengths = {side: side_values(side, "output_tokens") for side in ("a", "b")}
        both = lengths["a"] + lengths["b"]
        shared = (min(both), max(both) + 1) if both else None  # same bins, or it misleads
        for side, values in lengths.items():
            if values:
                ax.hist(
                    values,
                    bins=20,
                    range=shared,
                    alpha=0.5,
                    color=_COLORS[side],
                    label=_label(result, side),
                )
        ax.set_xlabel("output tokens")
        ax.set_ylabel("items")
        ax.legend(loc="upper right")
        save(fig, "lengths.png", "Output length (tokens) per side")

    scores = [r["similarity"] for r in rows if r["similarity"] is not None]
    if scores:
        fig, ax = plt.subplots(figsize=(8, 3))
        ax.hist(scores, bins=20, range=(min(0.0, min(scores)), 1.0), color="#555")
        ax.set_xlabel("similarity (text: SequenceMatcher ratio; embeddings: cosine)")
        ax.set_ylabel("items")
        save(fig, "similarity.png", "Similarity per item")

    fig, ax = plt.subplots(figsize=(8, 3))
    for side in ("a", "b"):
        latencies = sorted(side_values(side, "latency_s"))
        if latencies:
            share = [(i + 1) / len(latencies) for i in range(len(latencies))]
            ax.step(latencies, share, where="post", color=_COLORS[side], label=_label(result, side))
    ax.set_xlabel("latency, s")
    ax.set_ylabel("share of answers")
    ax.legend(loc="lower right")
    save(fig, "latency.png", "Latency CDF per side")

    page = _page(result, pngs)
    path = out_dir / "index.html"
    path.write_text(page)
    return path


def _label(result: dict[str, Any], side: str) -> str:
    return f"{side}: {result[side]['target']}"


def _cut(text: str | None) -> str:
    if text is None:
        return ""
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + " …"


def _page(result: dict[str, Any], pngs: list[tuple[str, str]]) -> str:
    esc = html.escape
    worst_rows = []
    for row in result["worst"]:
        cells = []
        for side in ("a", "b"):
            answer = row[side]
            shown = answer["error"] or _cut(answer["text"])
            if row["kind"] == "embedding":
                shown = "(vector)"
            cells.append(f"<td><pre>{esc(shown)}</pre></td>")
        score = "-" if row["similarity"] is None else f"{row['similarity']:.3f}"
        worst_rows.append(
            f"<tr><td>{esc(row['id'])}<br>line {row['line']}</td><td>{score}</td>"
            f"{''.join(cells)}</tr>"
        )
    failed = [r for r in result["items"] if r["a"]["error"] or r["b"]["error"]]
    failed_rows = [
        f"<tr><td>{esc(r['id'])}</td><td>{r['a']['status']}</td><td>{esc(r['a']['error'] or '')}"
        f"</td><td>{r['b']['status']}</td><td>{esc(r['b']['error'] or '')}</td></tr>"
        for r in failed[:100]
    ]
    plots = "\n".join(
        f'<h2>{esc(title)}</h2><img src="{name}" alt="{esc(title)}">' for name, title in pngs
    )
    summary = json.dumps(result["summary"], indent=2)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Sluice compare</title>
<style>body{{font-family:sans-serif;margin:2em}} td{{vertical-align:top;border-top:1px solid #ccc;
padding:4px}} pre{{white-space:pre-wrap;max-width:40em;margin:0}}</style></head><body>
<h1>Compare: a = {esc(result["a"]["target"])}, b = {esc(result["b"]["target"])}</h1>
<p>suite {esc(result["suite"]["path"])} ({result["suite"]["items"]} items,
sha256 {esc(result["suite"]["sha256"][:12])}), schema {esc(result["schema"])}</p>
<pre>{esc(summary)}</pre>
{plots}
<h2>Worst-differing items</h2>
<table><tr><th>item</th><th>similarity</th><th>a</th><th>b</th></tr>
{"".join(worst_rows)}</table>
<h2>Failed requests ({len(failed)})</h2>
<table><tr><th>item</th><th>a status</th><th>a error</th><th>b status</th><th>b error</th></tr>
{"".join(failed_rows)}</table>
</body></html>
"""
