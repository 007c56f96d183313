"""``kplan profile``: resolve what to run, run it, measure the device, build the Profile.

``resolve`` turns the command's inputs into a validated ``ProfileRequest`` (InputError, exit 2,
for anything wrong) before anything heavy is imported; ``run_profile`` does the work.
"""

from __future__ import annotations

import datetime as dt
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kplan import __version__
from kplan.core import flags
from kplan.core.errors import InputError
from kplan.core.precision import DEFAULT_PRECISION, Precision, check_precision
from kplan.core.threads import threads_per_worker
from kplan.planner.profile import CodecTimes, Profile
from kplan.profiler.analyze import Analysis, analyze, gns_trajectory, measurements
from kplan.profiler.codec import CODEC_REPEATS
from kplan.profiler.device import DeviceFacts, measure_device
from kplan.profiler.examples import Example, get_example
from kplan.profiler.job import JobOutcome, JobSpec, Progress, run_job
from kplan.profiler.opgraph_trace import with_opgraph
from kplan.profiler.procs import ProcessTree
from kplan.profiler.schedule import ProfileSchedule, sweep_sizes

DEVICES = ("auto", "cpu", "cuda")
CPU_UNREPRESENTATIVE: tuple[Precision, ...] = ("tf32", "fp16")
"""Precisions a CPU can run but whose timings say nothing about them (no TF32, no fast fp16)."""


@dataclass(frozen=True)
class ProfileRequest:
    script: Path
    args: tuple[str, ...]
    name: str
    example: Example | None
    device: str  # "auto", "cpu" or "cuda"
    workers: int | None  # None: 2 on CPU, min(2, GPUs) on CUDA
    min_local_batch: int
    max_local_batch: int
    warmup_steps: int
    steps_per_batch: int
    gns_steps: int
    gns_batch: int | None  # local; None: base batch / workers, within the sweep
    base_batch: int
    dataset_size: int
    epochs: float
    startup_timeout_s: float = 180.0
    step_timeout_s: float = 120.0
    timeout_s: float = 1800.0
    allreduce_bench: bool = True
    measure_device: bool = True
    keep_workdir: bool = False
    precision: Precision = DEFAULT_PRECISION


@dataclass(frozen=True)
class ProfileResult:
    profile: Profile
    analysis: Analysis
    device: DeviceFacts | None
    workers: int
    schedule: ProfileSchedule
    job_wall_s: float
    wall_s: float
    workdir: Path | None  # kept logs, if any
    pids: dict[int, int] = field(default_factory=dict)


def check_options(
    *,
    workers: int | None,
    min_local_batch: int,
    max_local_batch: int | None,
    warmup_steps: int,
    steps_per_batch: int,
    gns_steps: int,
    gns_batch: int | None,
    base_batch: int | None,
    dataset_size: int | None,
    epochs: float | None,
    name: str | None,
    example: str | None,
    timeouts: Sequence[tuple[str, float]],
) -> None:
    """The one check of ``kplan profile``'s numbers and names (flag names in the messages)."""
    for flag, seconds in timeouts:
        flags.number(flag, seconds, low=1, low_open=False, high=flags.MAX_SECONDS,
                     hint="seconds, e.g. 600")  # fmt: skip
    flags.number("--epochs", epochs, high=flags.MAX_EPOCHS, hint="e.g. --epochs 1")
    flags.integer("--workers", workers, high=1024, hint="local workers, e.g. 2")
    for flag, count, low in (
        ("--min-local-batch", min_local_batch, 1),
        ("--max-local-batch", max_local_batch, 1),
        ("--gns-batch", gns_batch, 1),
        ("--base-batch", base_batch, 1),
        ("--steps", steps_per_batch, 1),
        ("--warmup-steps", warmup_steps, 0),
        ("--gns-steps", gns_steps, 0),
    ):
        flags.integer(flag, count, low=low, high=flags.MAX_BATCH)
    flags.integer("--dataset-size", dataset_size, high=flags.MAX_SAMPLES, hint="samples per epoch")
    flags.text("--name", name, hint="a short profile name")
    flags.text("--example", example, hint="see kplan profile --help")


def resolve(
    script: str | None,
    example: str | None,
    args: Sequence[str] = (),
    *,
    device: str = "auto",
    workers: int | None = None,
    min_local_batch: int = 1,
    max_local_batch: int | None = None,
    warmup_steps: int = 2,
    steps_per_batch: int = 5,
    gns_steps: int = 20,
    gns_batch: int | None = None,
    base_batch: int | None = None,
    dataset_size: int | None = None,
    epochs: float | None = None,
    name: str | None = None,
    startup_timeout_s: float = 180.0,
    step_timeout_s: float = 120.0,
    timeout_s: float = 1800.0,
    allreduce_bench: bool = True,
    measure_device: bool = True,
    keep_workdir: bool = False,
    precision: str = DEFAULT_PRECISION,
) -> ProfileRequest:
    """Validate the inputs of ``kplan profile``; InputError naming the bad one."""
    check_options(
        workers=workers,
        min_local_batch=min_local_batch,
        max_local_batch=max_local_batch,
        warmup_steps=warmup_steps,
        steps_per_batch=steps_per_batch,
        gns_steps=gns_steps,
        gns_batch=gns_batch,
        base_batch=base_batch,
        dataset_size=dataset_size,
        epochs=epochs,
        name=name,
        example=example,
        timeouts=(
            ("--timeout", timeout_s),
            ("--startup-timeout", startup_timeout_s),
            ("--step-timeout", step_timeout_s),
        ),
    )
    path, ex, args = _script(
        script, example, args, dataset_size=dataset_size, base_batch=base_batch
    )
    checked = _device_precision(device, precision)
    max_b = (
        max_local_batch
        if max_local_batch is not None
        else (ex.max_local_batch if ex else default_max_local_batch(base_batch, min_local_batch))
    )
    sweep_sizes(min_local_batch, max_b)  # validates the range
    base = base_batch if base_batch is not None else (ex.base_batch if ex else 0)
    n = dataset_size if dataset_size is not None else (ex.dataset_size if ex else 0)
    if n < base:
        raise InputError(
            f"--dataset-size {n:,} is less than --base-batch {base:,}: one step would take "
            "more samples than an epoch has",
            hint="--dataset-size: samples per epoch; --base-batch: your global batch size",
        )
    return ProfileRequest(
        script=path,
        args=tuple(args),
        name=name or (ex.name if ex else path.stem),
        example=ex,
        device=device,
        workers=workers,
        min_local_batch=min_local_batch,
        max_local_batch=max_b,
        warmup_steps=warmup_steps,
        steps_per_batch=steps_per_batch,
        gns_steps=gns_steps,
        gns_batch=gns_batch,
        base_batch=base,
        dataset_size=n,
        epochs=epochs if epochs is not None else (ex.epochs if ex else 1.0),
        startup_timeout_s=startup_timeout_s,
        step_timeout_s=step_timeout_s,
        timeout_s=timeout_s,
        allreduce_bench=allreduce_bench,
        measure_device=measure_device,
        keep_workdir=keep_workdir,
        precision=checked,
    )


# The sweep's smallest default ceiling (a script whose base batch is smaller still sweeps this far).
MIN_SWEEP_CEILING = 64


def default_max_local_batch(base_batch: int | None, min_local_batch: int = 1) -> int:
    """The sweep's default ceiling for a script: its whole base batch (what one worker runs at
    the base batch: a local launch of any worker count then runs a measured batch per worker,
    not an extrapolated one), and at least ``MIN_SWEEP_CEILING``; running out of memory still
    stops the sweep earlier."""
    return max(MIN_SWEEP_CEILING, base_batch or 0, min_local_batch)


def _device_precision(device: str, precision: str) -> Precision:
    """The checked precision, one that ``device`` measures faithfully."""
    if device not in DEVICES:
        raise InputError(
            f"--device {device!r} is not one of {', '.join(DEVICES)}",
            hint="auto (the default) uses CUDA when one is visible, else the CPU",
        )
    checked = check_precision(precision)
    if device == "cpu" and checked in CPU_UNREPRESENTATIVE:
        raise InputError(
            f"--precision {checked} is not measured on a CPU (it would time "
            f"{'fp32' if checked == 'tf32' else 'emulated fp16'} math)",
            hint="profile fp32 or bf16 on a CPU; tf32 and fp16 on a GPU",
        )
    return checked


def _script(
    script: str | None,
    example: str | None,
    args: Sequence[str],
    *,
    dataset_size: int | None,
    base_batch: int | None,
) -> tuple[Path, Example | None, tuple[str, ...]]:
    """The script to run (a user's, or the example's), the example, and the script's flags."""
    if (script is None) == (example is None):
        raise InputError(
            "give either a SCRIPT or --example NAME"
            if script is None
            else "give a SCRIPT or --example, not both",
            hint="e.g. `kplan profile train.py -- --lr 0.1` or `kplan profile --example "
            "mlp-regression`",
        )
    if example is not None:
        ex = get_example(example)
        return ex.path, ex, (*ex.args, *args)
    path = Path(str(script)).expanduser()
    if not path.exists():
        raise InputError(f"script {script!r} not found", hint="check the path")
    if not path.is_file() or path.suffix != ".py":
        raise InputError(
            f"{script!r} is not a Python script (.py)",
            hint="kplan profile runs a training script: `kplan profile train.py`",
        )
    missing = [
        f for f, v in (("--dataset-size", dataset_size), ("--base-batch", base_batch)) if v is None
    ]
    if missing:
        raise InputError(
            f"{' and '.join(missing)} required when profiling a script",
            hint="--dataset-size: samples per epoch; --base-batch: your global batch size",
        )
    return path.resolve(), None, tuple(args)


def _cuda_count(device: str) -> int:
    if device == "cpu":
        return 0
    import torch

    count = int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    if device == "cuda" and count == 0:
        raise InputError("--device cuda: no CUDA device is visible here", hint="use --device cpu")
    return count


def check_device(req: ProfileRequest) -> tuple[int, int]:
    """(CUDA devices, workers) of ``req`` on this machine, or InputError when this machine
    cannot run it: ``kplan profile`` asks this of every requested precision before any runs."""
    gpus = _cuda_count(req.device)
    workers = req.workers or (min(2, gpus) if gpus else 2)
    if gpus and workers > gpus:
        raise InputError(
            f"--workers {workers} is more than the {gpus} CUDA devices here",
            hint=f"use --workers {gpus} or fewer",
        )
    if not gpus and req.precision in CPU_UNREPRESENTATIVE:  # --device auto found no GPU
        raise InputError(
            f"--precision {req.precision}: no CUDA device here, and a CPU does not measure it",
            hint="profile fp32 or bf16 on a CPU; tf32 and fp16 on a GPU",
        )
    return gpus, workers


def plan_schedule(req: ProfileRequest, workers: int) -> ProfileSchedule:
    sizes = sweep_sizes(req.min_local_batch, req.max_local_batch)
    gns_batch = req.gns_batch or max(1, req.base_batch // workers)
    gns_batch = min(max(gns_batch, sizes[0]), sizes[-1])
    return ProfileSchedule(sizes, req.warmup_steps, req.steps_per_batch, gns_batch, req.gns_steps)


def run_profile(
    req: ProfileRequest,
    on_progress: Callable[[Progress], None] = lambda p: None,
    on_start: Callable[[ProcessTree], None] = lambda t: None,
) -> ProfileResult:
    """Run the job and the device benchmarks; return the Profile and what went into it."""
    import time

    start = time.monotonic()
    gpus, workers = check_device(req)
    schedule = plan_schedule(req, workers)
    spec = JobSpec(
        script=req.script,
        args=req.args,
        workers=workers,
        schedule=schedule,
        cpu_only=gpus == 0,
        allreduce_bench=req.allreduce_bench,
        startup_timeout_s=req.startup_timeout_s,
        step_timeout_s=req.step_timeout_s,
        timeout_s=req.timeout_s,
        precision=req.precision,
    )
    workdir = Path(tempfile.mkdtemp(prefix="kplan-profile-"))
    keep = True  # kept unless everything succeeds, so a failure's logs stay readable
    try:
        outcome = run_job(spec, workdir, on_progress, on_start)
        analysis = analyze(outcome.records, schedule.warmup_steps, schedule.steps_per_batch)
        on_progress(Progress("device", 0, 1, None))
        facts = measure_device("cuda" if gpus else "cpu") if req.measure_device else None
        on_progress(Progress("device", 1, 1, None))
        profile = build_profile(
            req=req, a=analysis, facts=facts, outcome=outcome, schedule=schedule, gpus=gpus
        )
        profile = with_opgraph(profile, workdir)
        keep = req.keep_workdir
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return ProfileResult(
        profile=profile,
        analysis=analysis,
        device=facts,
        workers=workers,
        schedule=schedule,
        job_wall_s=outcome.wall_s,
        wall_s=time.monotonic() - start,
        workdir=workdir if keep else None,
        pids=outcome.pids,
    )


def build_profile(
    *,
    req: ProfileRequest,
    a: Analysis,
    facts: DeviceFacts | None,
    outcome: JobOutcome,
    schedule: ProfileSchedule,
    gpus: int,
) -> Profile:
    gpu = facts.gpu if facts else ("cuda" if gpus else "cpu")
    described = facts.description if facts else gpu
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    provenance = (
        f"kplan {__version__} profile of {req.script.name} on {described}, "
        f"{a.world_size} local worker(s) x {threads_per_worker(a.world_size)} CPU thread(s), "
        f"{when}; precision {req.precision}; "
        f"sweep {list(schedule.local_batches)} x {schedule.steps_per_batch} timed steps; "
        f"GNS over {a.gns_steps} steps at local batch {schedule.gns_batch}"
    )
    if a.allreduce is not None:
        provenance += (
            f"; all-reduce of {a.allreduce.nbytes} B over {a.allreduce.world_size} "
            f"{a.allreduce.backend} workers: {a.allreduce.seconds * 1e3:.2f} ms"
        )
    codec = None
    if a.codec is not None:
        if a.codec.seconds:
            codec = CodecTimes(a.codec.seconds, a.codec.device, a.codec.how)
            provenance += (
                "; codec "
                + ", ".join(f"{k} {v * 1e3:.3g} ms" for k, v in a.codec.seconds)
                + f" (median of {CODEC_REPEATS} on {a.codec.device})"
            )
        if a.codec.skipped:
            provenance += f"; codec {a.codec.skipped}"
    if a.forward_share is not None:
        provenance += (
            f"; forward and input {a.forward_share:.0%} of the compute "
            "(backward passes timed apart in the sweep)"
        )
    mem = a.memory_fit
    if mem is not None and not gpus:
        provenance += (
            "; memory per sample estimated from the tensors autograd saves for backward (CPU)"
        )
    return Profile(
        name=req.name,
        provenance=provenance,
        gpu=gpu,
        gpus_per_node=max(1, gpus) if gpus else a.world_size,
        gradient_bytes=float(a.gradient_bytes),
        base_global_batch=req.base_batch,
        max_local_batch=a.max_local_batch,
        dataset_size=req.dataset_size,
        epochs=req.epochs,
        measurements=measurements(a, gpu),
        gns=gns_trajectory(a),
        device_memory_gb=facts.memory_gb if facts else None,
        static_memory_gb=max(mem.intercept, 0.0) / 1e9 if mem else None,
        per_sample_memory_gb=max(mem.slope, 0.0) / 1e9 if mem else None,
        measured_fp32_tflops=facts.fp32_tflops if facts else None,
        measured_mem_bw_gbs=facts.mem_bw_gbs if facts else None,
        precision=req.precision,
        max_local_limit=a.max_local_limit,
        gradient_shapes=a.gradient_shapes,
        codec=codec,
        forward_share=a.forward_share,
        startup_s=outcome.first_record_s,
        shutdown_s=outcome.shutdown_s,
        cpu_threads=threads_per_worker(a.world_size),  # what job_env gave each worker
    )
