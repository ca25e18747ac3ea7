"""`sluice estimate MODEL_DIR`: how much accelerator memory a local Hugging Face model needs
(weights + KV cache at a context and concurrency + overhead), and with `-f SPEC` which of the
spec's pools to put it on. The numbers are those `sluice validate` refuses a group with."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from sluice.cli.common import JsonOpt, out, run
from sluice.core import SpecError, SpecIssue
from sluice.spec import (
    ModelConfigError,
    estimate_memory,
    load_spec_file,
    pool_fits,
    read_model_dir,
)
from sluice.spec.hfconfig import normalise_dtype
from sluice.spec.memory import BYTES_PER_ELEMENT

__all__ = ["estimate"]


def estimate(
    model_dir: Annotated[Path, typer.Argument(help="local Hugging Face model directory")],
    max_context: Annotated[
        int | None,
        typer.Option(
            "--max-context", min=1, help="tokens per sequence (default: the config's maximum)"
        ),
    ] = None,
    concurrency: Annotated[
        int, typer.Option("--concurrency", min=1, help="sequences held at once (per instance)")
    ] = 1,
    dtype: Annotated[
        str | None,
        typer.Option(
            "--dtype", help="weights: fp32, bf16, fp16, int8, fp8, int4 (default: config)"
        ),
    ] = None,
    kv_dtype: Annotated[
        str | None,
        typer.Option("--kv-dtype", help="KV cache dtype (default: the activations', e.g. bf16)"),
    ] = None,
    file: Annotated[
        Path | None, typer.Option("-f", "--file", help="spec YAML: recommend one of its pools")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Estimate a model's accelerator memory from its config.json; recommend a pool."""

    def do() -> dict[str, Any]:
        weights = _dtype_option("--dtype", dtype)
        kv = _dtype_option("--kv-dtype", kv_dtype)
        mdir = read_model_dir(model_dir)
        # The checkpoint's bytes are exact, but only for the dtype it was saved in.
        options: dict[str, Any] = {
            "max_context": max_context,
            "concurrency": concurrency,
            "dtype": weights,
            "kv_dtype": kv,
            "weight_bytes": mdir.weight_bytes if weights is None else None,
        }
        try:
            est = estimate_memory(mdir.config, **options)
            fits = (
                pool_fits(mdir.config, load_spec_file(file).spec.pools, **options) if file else []
            )
        except ModelConfigError as exc:
            config = str(Path(mdir.path) / "config.json")
            raise SpecError([SpecIssue(exc.field, exc.message, config)]) from None
        best = fits[0] if fits and fits[0].accelerators is not None else None
        return {
            "model_dir": mdir.path,
            "weights_source": "files" if options["weight_bytes"] is not None else "config",
            **est.to_json(),
            "pools": [f.to_json() for f in fits],
            "recommended": best.to_json() if best is not None else None,
        }

    run(as_json, do, _render)


def _dtype_option(flag: str, value: str | None) -> str | None:
    if value is None:
        return None
    name = normalise_dtype(value)
    if name is None or name not in BYTES_PER_ELEMENT:
        allowed = ", ".join(BYTES_PER_ELEMENT)
        raise SpecError([SpecIssue(flag, f"unknown dtype {value!r}; one of {allowed}")])
    return name


def _render(r: dict[str, Any]) -> None:
    g = r["gib"]
    params = f"{r['params'] / 1e9:.2f}B params"
    if r["active_params"] != r["params"]:
        params += f" ({r['active_params'] / 1e9:.2f}B active a token)"
    if r["weights_source"] == "files":
        weights_how = f"{params}; size of the safetensors files"
    else:
        weights_how = f"{params} x {BYTES_PER_ELEMENT[r['dtype']]:g} B ({r['dtype']})"
        if r["dtype"] not in ("fp32", "fp16", "bf16"):
            weights_how += f"; embeddings and LM head in {r['activation_dtype']}"
    kib = r["kv_bytes_per_token"] / 1024
    table = Table(title=f"{r['model_dir']} ({r['model_type']})")
    table.add_column("component")
    table.add_column("GiB", justify="right")
    table.add_column("how")
    rows = [
        ("weights", g["weights"], weights_how),
        (
            "KV cache",
            g["kv_cache"],
            f"{kib:g} KiB/token ({r['kv_dtype']}) x context {r['max_context']} x "
            f"concurrency {r['concurrency']}",
        ),
        ("activations", g["activations"], f"one forward pass of {r['prefill_tokens']} tokens"),
        ("runtime", g["runtime"], "CUDA context, workspaces, graphs: 1 GiB a device"),
        (
            "headroom",
            g["headroom"],
            f"vLLM uses at most gpu_memory_utilization = {r['utilization']:g} of a device",
        ),
    ]
    for name, value, how in rows:
        table.add_row(name, f"{value:.2f}", how)
    table.add_row("[bold]total[/bold]", f"[bold]{g['total']:.2f}[/bold]", "one instance")
    out.print(table)
    if not r["pools"]:
        out.print(f"fits one accelerator with >= {g['per_device']:.1f} GiB; -f SPEC picks a pool")
        return
    pools = Table(title="pools")
    for col in ("pool", "accelerator", "GiB each", "accelerators", "GiB a device", "note"):
        pools.add_column(col)
    for f in r["pools"]:
        n = f["accelerators"]
        note = f["reason"] or ("tensor parallel" if f["tensor_parallel"] else "")
        per = f"{f['per_device_gib']:.1f}" if f["per_device_gib"] is not None else "-"
        pools.add_row(f["pool"], f["accelerator"], f"{f['memory_gb']:g}", str(n or "-"), per, note)
    out.print(pools)
    best = r["recommended"]
    if best is None:
        out.print("[red]no pool in the spec can hold this model[/red]")
    elif best["tensor_parallel"]:
        out.print(
            f"recommended: pool {best['pool']!r}, {best['accelerators']} accelerators an "
            f"instance (tensor parallel across {best['accelerators']})"
        )
    else:
        out.print(f"recommended: pool {best['pool']!r}, 1 accelerator an instance")
