"""Rich rendering for ``kplan profile``: a progress bar fed by the metrics stream, and the
summary table. Everything goes to stderr except the summary."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from kplan.cli.render.text import safe
from kplan.core.text import clean
from kplan.profiler.job import Progress

if TYPE_CHECKING:
    from kplan.profiler.summary import ProfileSummary

_PHASES = {
    "starting": "starting workers",
    "sweep": "batch-size sweep",
    "gns": "noise scale",
    "allreduce": "all-reduce bench",
    "device": "device bench",
    "finished": "job done",
}


@contextmanager
def progress_bar(name: str) -> Iterator[Callable[[Progress], None]]:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.progress import Progress as RichProgress

    console = Console(stderr=True)
    with RichProgress(
        SpinnerColumn(),
        TextColumn("[bold]{task.fields[name]}[/] {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as bar:
        task = bar.add_task("starting workers", total=None, name=safe(name))

        def update(p: Progress) -> None:
            label = _PHASES.get(p.phase) or safe(p.phase)
            if p.phase == "sweep" and p.local_batch is not None:
                label += f" (local batch {p.local_batch})"
            if p.phase == "device":
                bar.update(task, description=label)
                return
            bar.update(task, description=label, completed=p.done, total=p.total or None)

        yield update


def _fmt_s(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def render_summary(summary: ProfileSummary) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"kplan profile: {safe(summary.name)} ({summary.workers} workers)")
    for column in ("local batch", "step", "compute", "sync", "samples/s"):
        table.add_column(column, justify="right")
    for row in summary.sweep:
        table.add_row(
            str(row.local_batch),
            _fmt_s(row.step_time),
            _fmt_s(row.compute_time),
            _fmt_s(row.sync_time),
            f"{row.samples_per_s:.0f}",
        )
    console.print(table)
    fit, dev, gns, model = summary.compute_fit, summary.device, summary.gns, summary.model
    lines = [
        f"compute time  T_c(b) = {fit.a_c * 1e3:.2f} ms + {fit.b_c * 1e3:.3f} ms * b"
        f"  (R² {fit.r2:.3f})",
        f"gradient      {model.gradient_bytes / 1e6:.2f} MB ({model.parameters:,} parameters)",
        f"max batch     {summary.max_local_batch} per worker"
        + (
            f" (out of memory at {summary.oom_local_batch})"
            if summary.oom_local_batch
            else " (largest swept)"
        ),
    ]
    share = model.forward_share
    if share is not None:
        lines.append(
            f"forward       {share:.0%} of the compute (with the input; backward timed apart): "
            "what no gradient exchange overlaps"
        )
    if gns.noise_scale is not None:
        lines.append(f"noise scale   {gns.noise_scale:.1f} samples ({gns.steps} steps)")
    ar = summary.allreduce
    if ar:
        lines.append(
            f"all-reduce    {ar.nbytes / 1e6:.2f} MB in {_fmt_s(ar.seconds)} over "
            f"{ar.workers} {ar.backend} workers (bus {ar.bus_gbs:.2f} GB/s)"
        )
    if dev.fp32_tflops is not None:
        lines.append(
            f"device        {dev.gpu}: {dev.fp32_tflops:.2f} fp32 TFLOP/s, "
            f"{dev.mem_bw_gbs:.1f} GB/s copy"
        )
    lines.append(
        f"wrote         {summary.profile}"
        + (f" and {summary.measurements}" if summary.measurements else "")
    )
    lines.append(f"took          {summary.wall_s:.1f} s")
    for line in lines:
        console.print(clean(line), highlight=False, markup=False)
    warn = Console(stderr=True)
    for line in summary.warnings:
        warn.print(f"warning: {clean(line)}", highlight=False, markup=False)
