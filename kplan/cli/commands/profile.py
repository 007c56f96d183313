"""``kplan profile``: measure a training job (or a built-in example) and write its Profile."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from kplan.profiler.run import ProfileRequest

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


def _per_precision(path: Path, precision: str) -> Path:
    """``x.profile.json`` -> ``x.bf16.profile.json`` (``x.json`` -> ``x.bf16.json``)."""
    name = path.name
    for suffix in (".profile.json", ".json", ".csv"):
        if name.endswith(suffix):
            return path.with_name(f"{name[: -len(suffix)]}.{precision}{suffix}")
    return path.with_name(f"{name}.{precision}")


def profile(
    argv: Annotated[
        list[str] | None,
        typer.Argument(metavar="[SCRIPT] [-- ARGS...]", help="Training script and its arguments."),
    ] = None,
    *,
    example: Annotated[
        str | None,
        typer.Option("--example", "-e", help="Profile a built-in example instead of a script."),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="Profile JSON to write (default: NAME.profile.json)."),
    ] = None,
    measurements: Annotated[
        Path | None, typer.Option("--measurements", help="Also write the measurements CSV here.")
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option("--workers", "-w", help="Local workers (default: 2 on CPU, min(2, GPUs))."),
    ] = None,
    device: Annotated[str, typer.Option("--device", help="auto, cpu or cuda.")] = "auto",
    precision: Annotated[
        list[str] | None,
        typer.Option(
            "--precision",
            "-p",
            help="fp32, tf32, bf16 or fp16; repeat to profile several, one file each "
            "(default: fp32).",
        ),
    ] = None,
    min_local_batch: Annotated[
        int, typer.Option("--min-local-batch", help="Smallest swept per-worker batch.")
    ] = 1,
    max_local_batch: Annotated[
        int | None,
        typer.Option(
            "--max-local-batch",
            help="Largest swept per-worker batch (default: 64, or the example's); running out "
            "of memory stops the sweep earlier.",
        ),
    ] = None,
    steps: Annotated[int, typer.Option("--steps", help="Timed steps per batch size.")] = 5,
    warmup_steps: Annotated[
        int, typer.Option("--warmup-steps", help="Untimed steps per batch size.")
    ] = 2,
    gns_steps: Annotated[int, typer.Option("--gns-steps", help="Steps of the GNS run.")] = 20,
    gns_batch: Annotated[
        int | None,
        typer.Option(
            "--gns-batch", help="Per-worker batch of the GNS run (default: base/workers)."
        ),
    ] = None,
    base_batch: Annotated[
        int | None, typer.Option("--base-batch", help="Global batch size (required for a script).")
    ] = None,
    dataset_size: Annotated[
        int | None,
        typer.Option("--dataset-size", help="Samples per epoch (required for a script)."),
    ] = None,
    epochs: Annotated[
        float | None, typer.Option("--epochs", help="Epochs to plan for (default: 1).")
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="Profile name (default: script stem).")
    ] = None,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds for the whole job.")
    ] = 1800.0,
    startup_timeout: Annotated[
        float, typer.Option("--startup-timeout", help="Seconds until the first metrics record.")
    ] = 180.0,
    step_timeout: Annotated[
        float, typer.Option("--step-timeout", help="Longest silence between two records, s.")
    ] = 120.0,
    allreduce_bench: Annotated[
        bool,
        typer.Option(
            "--allreduce-bench/--no-allreduce-bench",
            help="Time an all-reduce of the gradient size after the job (2+ workers).",
        ),
    ] = True,
    keep_logs: Annotated[bool, typer.Option("--keep-logs", help="Keep the job's logs.")] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a JSON summary, no progress bar.")
    ] = False,
) -> None:
    from kplan.core import flags
    from kplan.core.extras import require_torch

    require_torch("profile")  # before anything imports it: one line and the install command
    from kplan.profiler.run import resolve

    for flag, seconds in (
        ("--timeout", timeout),
        ("--startup-timeout", startup_timeout),
        ("--step-timeout", step_timeout),
    ):
        flags.number(flag, seconds, high=flags.MAX_SECONDS, hint="seconds, e.g. 600")
    flags.number("--epochs", epochs, high=flags.MAX_EPOCHS, hint="e.g. --epochs 1")
    flags.integer("--workers", workers, high=1024, hint="local workers, e.g. 2")
    for flag, count, low in (
        ("--min-local-batch", min_local_batch, 1),
        ("--max-local-batch", max_local_batch, 1),
        ("--gns-batch", gns_batch, 1),
        ("--base-batch", base_batch, 1),
        ("--steps", steps, 1),
        ("--warmup-steps", warmup_steps, 0),
        ("--gns-steps", gns_steps, 0),
    ):
        flags.integer(flag, count, low=low, high=flags.MAX_BATCH)
    flags.integer("--dataset-size", dataset_size, high=flags.MAX_SAMPLES, hint="samples per epoch")
    flags.text("--name", name, hint="a short profile name")
    flags.text("--example", example, hint="see kplan profile --help")
    from kplan.core.precision import check_precision

    precisions = list(dict.fromkeys(check_precision(p) for p in precision or ["fp32"]))
    args = list(argv or [])
    script = None if example is not None or not args else args.pop(0)
    reqs = [
        resolve(
            script, example, args,
            device=device, workers=workers, min_local_batch=min_local_batch,
            max_local_batch=max_local_batch, warmup_steps=warmup_steps, steps_per_batch=steps,
            gns_steps=gns_steps, gns_batch=gns_batch, base_batch=base_batch,
            dataset_size=dataset_size, epochs=epochs, name=name,
            startup_timeout_s=startup_timeout, step_timeout_s=step_timeout, timeout_s=timeout,
            allreduce_bench=allreduce_bench, keep_workdir=keep_logs, precision=p,
        )
        for p in precisions
    ]  # fmt: skip
    from kplan.profiler.run import check_device

    for req in reqs:  # every precision against this machine before the first one runs
        check_device(req)
    several = len(reqs) > 1
    from kplan.core.files import check_writable

    jobs = []
    for req in reqs:
        out_path = out if out is not None else Path(f"{req.name}.profile.json")
        csv_path = measurements
        if several:
            out_path = _per_precision(out_path, req.precision)
            csv_path = None if csv_path is None else _per_precision(csv_path, req.precision)
        check_writable(out_path, "--out")
        if csv_path is not None:
            check_writable(csv_path, "--measurements")
        jobs.append((req, out_path, csv_path))
    summaries = [_run_one(req, out_path, csv_path, as_json) for req, out_path, csv_path in jobs]
    if as_json:
        typer.echo(json.dumps(summaries if several else summaries[0], indent=2))


def _run_one(req: ProfileRequest, out_path: Path, measurements: Path | None, as_json: bool) -> Any:
    """Profile one request, write its files; the summary (printed here unless ``as_json``)."""
    from kplan.profiler.output import write_measurements, write_profile
    from kplan.profiler.run import run_profile
    from kplan.profiler.summary import summary_dict

    if as_json:
        result = run_profile(req)
    else:
        from kplan.cli.render.profile import progress_bar

        with progress_bar(f"{req.name} ({req.precision})") as on_progress:
            result = run_profile(req, on_progress)
    write_profile(out_path, result.profile)
    if measurements is not None:
        write_measurements(measurements, result.profile.measurements)
    summary = summary_dict(result, out_path, measurements)
    if not as_json:
        from kplan.cli.render.profile import render_summary

        render_summary(summary)
    return summary


def register(app: typer.Typer) -> None:
    app.command("profile", help=_HELP, no_args_is_help=False)(profile)
