"""``kplan profile``: measure a training job (or a built-in example) and write its Profile."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

_HELP = (
    "Measure a training job on this machine and write its Profile JSON.\n\n"
    "Runs SCRIPT (a training script on kplan.runtime; its own flags go after --) or a built-in "
    "example with local workers: a sweep of per-worker batch sizes, the compute-time fit, "
    "gradient bytes, all-reduce time, the gradient noise scale, and this device's fp32 TFLOP/s "
    "and memory bandwidth. `kplan estimate --profile FILE` plans with the result.\n\n"
    "--precision runs the job in fp32, tf32, bf16 or fp16 (loss scaling) and records it in the "
    "profile; repeat it on a GPU to measure several, one profile each (NAME.PRECISION.profile."
    "json). A CPU measures fp32 and bf16 only."
)

# The flags, one type each (their help is what `kplan profile --help` prints).
_Argv = Annotated[
    list[str] | None,
    typer.Argument(metavar="[SCRIPT] [-- ARGS...]", help="Training script and its arguments."),
]
_Example = Annotated[
    str | None,
    typer.Option("--example", "-e", help="Profile a built-in example instead of a script."),
]
_Out = Annotated[
    Path | None,
    typer.Option("--out", "-o", help="Profile JSON to write (default: NAME.profile.json)."),
]
_Measurements = Annotated[
    Path | None, typer.Option("--measurements", help="Also write the measurements CSV here.")
]
_Workers = Annotated[
    int | None,
    typer.Option("--workers", "-w", help="Local workers (default: 2 on CPU, min(2, GPUs))."),
]
_Device = Annotated[str, typer.Option("--device", help="auto, cpu or cuda.")]
_Precision = Annotated[
    list[str] | None,
    typer.Option(
        "--precision",
        "-p",
        help="fp32, tf32, bf16 or fp16; repeat to profile several, one file each (default: fp32).",
    ),
]
_MinLocal = Annotated[
    int, typer.Option("--min-local-batch", help="Smallest swept per-worker batch.")
]
_MaxLocal = Annotated[
    int | None,
    typer.Option(
        "--max-local-batch",
        help="Largest swept per-worker batch (default: the script's --base-batch, at least "
        "64, or the example's): a local launch then runs a measured batch per worker; running "
        "out of memory stops the sweep earlier.",
    ),
]
_Steps = Annotated[int, typer.Option("--steps", help="Timed steps per batch size.")]
_Warmup = Annotated[int, typer.Option("--warmup-steps", help="Untimed steps per batch size.")]
_GnsSteps = Annotated[int, typer.Option("--gns-steps", help="Steps of the GNS run.")]
_GnsBatch = Annotated[
    int | None,
    typer.Option("--gns-batch", help="Per-worker batch of the GNS run (default: base/workers)."),
]
_BaseBatch = Annotated[
    int | None, typer.Option("--base-batch", help="Global batch size (required for a script).")
]
_DatasetSize = Annotated[
    int | None, typer.Option("--dataset-size", help="Samples per epoch (required for a script).")
]
_Epochs = Annotated[float | None, typer.Option("--epochs", help="Epochs to plan for (default: 1).")]
_Name = Annotated[str | None, typer.Option("--name", help="Profile name (default: script stem).")]
_Timeout = Annotated[float, typer.Option("--timeout", help="Seconds for the whole job.")]
_StartupTimeout = Annotated[
    float, typer.Option("--startup-timeout", help="Seconds until the first metrics record.")
]
_StepTimeout = Annotated[
    float, typer.Option("--step-timeout", help="Longest silence between two records, s.")
]
_Allreduce = Annotated[
    bool,
    typer.Option(
        "--allreduce-bench/--no-allreduce-bench",
        help="Time an all-reduce of the gradient size after the job (2+ workers).",
    ),
]
_KeepLogs = Annotated[bool, typer.Option("--keep-logs", help="Keep the job's logs.")]
_Json = Annotated[bool, typer.Option("--json", help="Print a JSON summary, no progress bar.")]


def profile(
    argv: _Argv = None,
    *,
    example: _Example = None,
    out: _Out = None,
    measurements: _Measurements = None,
    workers: _Workers = None,
    device: _Device = "auto",
    precision: _Precision = None,
    min_local_batch: _MinLocal = 1,
    max_local_batch: _MaxLocal = None,
    steps: _Steps = 5,
    warmup_steps: _Warmup = 2,
    gns_steps: _GnsSteps = 20,
    gns_batch: _GnsBatch = None,
    base_batch: _BaseBatch = None,
    dataset_size: _DatasetSize = None,
    epochs: _Epochs = None,
    name: _Name = None,
    timeout: _Timeout = 1800.0,
    startup_timeout: _StartupTimeout = 180.0,
    step_timeout: _StepTimeout = 120.0,
    allreduce_bench: _Allreduce = True,
    keep_logs: _KeepLogs = False,
    as_json: _Json = False,
) -> None:
    from kplan.core.extras import require_torch

    require_torch("profile")  # before anything imports it: one line and the install command
    from kplan.app import profiling
    from kplan.cli.render.profile import progress_bar, render_summary
    from kplan.core.precision import check_precision

    summaries = profiling.profile(
        argv or [], example,
        precisions=list(dict.fromkeys(check_precision(p) for p in precision or ["fp32"])),
        out=out, measurements=measurements,
        progress=None if as_json else progress_bar,
        on_summary=(lambda s: None) if as_json else render_summary,
        device=device, workers=workers, min_local_batch=min_local_batch,
        max_local_batch=max_local_batch, warmup_steps=warmup_steps, steps_per_batch=steps,
        gns_steps=gns_steps, gns_batch=gns_batch, base_batch=base_batch,
        dataset_size=dataset_size, epochs=epochs, name=name,
        startup_timeout_s=startup_timeout, step_timeout_s=step_timeout, timeout_s=timeout,
        allreduce_bench=allreduce_bench, keep_workdir=keep_logs,
    )  # fmt: skip
    if as_json:
        docs = [asdict(s) for s in summaries]  # tuples print as JSON lists
        typer.echo(json.dumps(docs if len(docs) > 1 else docs[0], indent=2))


def register(app: typer.Typer) -> None:
    app.command("profile", help=_HELP, no_args_is_help=False)(profile)
