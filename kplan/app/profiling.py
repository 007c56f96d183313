"""``kplan profile`` as a library call: resolve the requests, name the files, run each profile.

One request per precision asked for (``NAME.PRECISION.profile.json`` when there are several);
every request is resolved and every output path checked before the first job runs, so a bad
flag or an unwritable ``--out`` costs no profiling time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kplan.profiler.job import Progress
    from kplan.profiler.run import ProfileRequest
    from kplan.profiler.summary import ProfileSummary

# A progress display for one job (its label): yields the callback the job reports to.
ProgressDisplay = Callable[[str], AbstractContextManager[Callable[["Progress"], None]]]


@dataclass(frozen=True)
class ProfileJob:
    """One profile to measure and the files it writes."""

    request: ProfileRequest
    out: Path
    measurements: Path | None


def per_precision(path: Path, precision: str) -> Path:
    """``x.profile.json`` -> ``x.bf16.profile.json`` (``x.json`` -> ``x.bf16.json``)."""
    name = path.name
    for suffix in (".profile.json", ".json", ".csv"):
        if name.endswith(suffix):
            return path.with_name(f"{name[: -len(suffix)]}.{precision}{suffix}")
    return path.with_name(f"{name}.{precision}")


def profile_jobs(
    argv: Sequence[str],
    example: str | None,
    *,
    precisions: Sequence[str],
    out: Path | None,
    measurements: Path | None,
    **options: Any,
) -> list[ProfileJob]:
    """The jobs of one ``kplan profile``: SCRIPT (the first of ``argv``, its flags the rest)
    or ``example``, once per precision; ``options`` are ``kplan.profiler.run.resolve``'s.
    Output paths are checked here (``--out``, ``--measurements``)."""
    from kplan.core.files import check_writable
    from kplan.profiler.run import check_device, resolve

    args = list(argv)
    script = None if example is not None or not args else args.pop(0)
    reqs = [resolve(script, example, args, precision=p, **options) for p in precisions]
    for req in reqs:  # every precision against this machine before the first one runs
        check_device(req)
    several = len(reqs) > 1
    jobs = []
    for req in reqs:
        out_path = out if out is not None else Path(f"{req.name}.profile.json")
        csv_path = measurements
        if several:
            out_path = per_precision(out_path, req.precision)
            csv_path = None if csv_path is None else per_precision(csv_path, req.precision)
        reads = [] if script is None else [("the SCRIPT", Path(script))]
        check_writable(out_path, "--out", reads)
        if csv_path is not None:
            check_writable(csv_path, "--measurements", [*reads, ("the --out", out_path)])
        jobs.append(ProfileJob(req, out_path, csv_path))
    return jobs


def run_profiles(
    jobs: Sequence[ProfileJob],
    *,
    progress: ProgressDisplay | None = None,
    on_summary: Callable[[ProfileSummary], None] = lambda s: None,
) -> list[ProfileSummary]:
    """Profile each job in turn and write its files; each job's summary (``on_summary`` sees
    it as soon as the job is done). ``progress``: a display per job (None: none)."""
    from kplan.profiler.output import write_measurements, write_profile
    from kplan.profiler.run import run_profile
    from kplan.profiler.summary import summarize

    out = []
    for job in jobs:
        req = job.request
        if progress is None:
            result = run_profile(req)
        else:
            with progress(f"{req.name} ({req.precision})") as on_progress:
                result = run_profile(req, on_progress)
        write_profile(job.out, result.profile)
        if job.measurements is not None:
            write_measurements(job.measurements, result.profile.measurements)
        summary = summarize(result, job.out, job.measurements)
        on_summary(summary)
        out.append(summary)
    return out


def profile(
    argv: Sequence[str],
    example: str | None,
    *,
    precisions: Sequence[str],
    out: Path | None,
    measurements: Path | None,
    progress: ProgressDisplay | None = None,
    on_summary: Callable[[ProfileSummary], None] = lambda s: None,
    **options: Any,
) -> list[ProfileSummary]:
    """``kplan profile``: resolve and check every job, then run them (``profile_jobs``,
    ``run_profiles``); the summaries, one per precision."""
    jobs = profile_jobs(
        argv, example, precisions=precisions, out=out, measurements=measurements, **options
    )
    return run_profiles(jobs, progress=progress, on_summary=on_summary)
