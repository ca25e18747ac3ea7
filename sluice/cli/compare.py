"""`sluice compare`: the same fixed suite to two versions, and how their answers differ (C5).
The engine is `sluice.tools.compare`; this module only reads options and prints. Given a
threshold (`--min-exact-match`, `--min-similarity`, `--min-cosine`, `--max-error-rate`), the
report carries a verdict (`sluice.policy.compare_gate`) and a failed one exits 8."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from sluice.cli.common import gateway_endpoint, out, run
from sluice.core import verdict_exit

__all__ = ["compare"]


def compare(
    suite: Annotated[Path, typer.Option("--suite", help="JSONL: one OpenAI request body per line")],
    a: Annotated[str, typer.Option("--a", help="baseline: group:NAME or http://host:port")],
    b: Annotated[str, typer.Option("--b", help="candidate: group:NAME or http://host:port")],
    report: Annotated[
        Path | None, typer.Option("--report", help="write index.html, PNGs, compare.json here")
    ] = None,
    endpoint: Annotated[
        str | None, typer.Option("--endpoint", help="gateway URL (default: from control.json)")
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key", help="operator tenant's key ($SLUICE_API_KEY)", show_default=False
        ),
    ] = None,
    concurrency: Annotated[
        int, typer.Option("--concurrency", min=1, max=256, help="in-flight requests per target")
    ] = 4,
    timeout: Annotated[
        float, typer.Option("--timeout", min=0.1, help="seconds per request")
    ] = 120.0,
    worst: Annotated[int, typer.Option("--worst", min=0, help="how many worst items")] = 10,
    min_exact_match: Annotated[
        float | None,
        typer.Option("--min-exact-match", min=0, max=1, help="gate: share of equal outputs"),
    ] = None,
    min_similarity: Annotated[
        float | None,
        typer.Option("--min-similarity", min=0, max=1, help="gate: mean text similarity"),
    ] = None,
    min_cosine: Annotated[
        float | None,
        typer.Option("--min-cosine", min=0, max=1, help="gate: mean embedding cosine"),
    ] = None,
    max_error_rate: Annotated[
        float | None,
        typer.Option("--max-error-rate", min=0, max=1, help="gate: share of items not compared"),
    ] = None,
    home: Annotated[str | None, typer.Option("--home", help="state directory")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document")] = False,
) -> None:
    """Send one suite to two targets and report exact matches, similarity, lengths, latency;
    with thresholds, a verdict too (exit 8 when one is not met)."""
    from sluice.policy.compare_gate import CompareThresholds, judge_compare
    from sluice.tools import CompareOptions, parse_target, write_compare_report
    from sluice.tools import compare as run_compare

    thresholds = CompareThresholds(min_exact_match, min_similarity, min_cosine, max_error_rate)

    def do() -> dict[str, Any]:
        gateway = endpoint
        if gateway is None and (a.startswith("group:") or b.startswith("group:")):
            gateway = gateway_endpoint(home)
        options = CompareOptions(
            api_key=api_key or os.environ.get("SLUICE_API_KEY") or None,
            concurrency=concurrency,
            timeout_s=timeout,
            worst=worst,
        )
        target_a = parse_target(a, "--a", gateway)
        target_b = parse_target(b, "--b", gateway)
        result = asyncio.run(run_compare(suite, target_a, target_b, options))
        if thresholds.any:
            result["gate"] = judge_compare(result["summary"], thresholds).to_json()
        if report is not None:
            result["report"] = str(write_compare_report(result, report))
        return result

    def render(r: dict[str, Any]) -> None:
        s = r["summary"]
        text = s["text"]
        out.print(
            f"{s['items']} items, {s['compared']} compared; errors a={s['errors']['a']} "
            f"b={s['errors']['b']}; exact match {_pct(s['exact_match_rate'])}",
            soft_wrap=True,
        )
        if text["compared"]:
            ks = text["length_ks"]
            out.print(
                f"text: similarity mean {_num(text['similarity']['mean'])}, median "
                f"{_num(text['similarity']['median'])}; output tokens p50 "
                f"a={_num(text['output_tokens']['a']['p50'])} "
                f"b={_num(text['output_tokens']['b']['p50'])}; length KS "
                f"{_num(ks and ks['statistic'])}",
                soft_wrap=True,
            )
        if s["embedding"]["compared"]:
            out.print(f"embeddings: cosine mean {_num(s['embedding']['cosine']['mean'])}")
        lat = s["latency_s"]
        out.print(
            f"latency p50/p95 a={_num(lat['a']['p50'])}/{_num(lat['a']['p95'])} s, "
            f"b={_num(lat['b']['p50'])}/{_num(lat['b']['p95'])} s"
        )
        for row in r["worst"][:5]:
            out.print(
                f"  worst: {row['id']} (line {row['line']}) similarity {_num(row['similarity'])}",
                soft_wrap=True,
                highlight=False,
            )
        if "report" in r:
            out.print(f"report: {r['report']}")
        gate = r.get("gate")
        if gate is not None:
            color = "green" if gate["verdict"] == "pass" else "red"
            out.print(f"verdict: [{color}]{gate['verdict']}[/{color}]")
            for why in gate["reasons"]:
                out.print(f"  - {why}", soft_wrap=True, highlight=False)

    def exit_code(r: dict[str, Any]) -> int:
        gate = r.get("gate")
        return 0 if gate is None else verdict_exit(gate["verdict"])

    run(as_json, do, render, exit_code)


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"
