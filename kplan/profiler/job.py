"""Run one profile job: start the workers, follow their metrics stream, enforce the timeouts,
and leave no process behind whatever happens (success, error, timeout, Ctrl-C).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from kplan.core.errors import JobError
from kplan.core.precision import DEFAULT_PRECISION, Precision
from kplan.core.threads import THREADS_ENV, threads_per_worker
from kplan.profiler.allreduce import BENCH_PORT_ENV
from kplan.profiler.errlines import last_error_line
from kplan.profiler.opgraph_trace import OPGRAPH_PATH_ENV, opgraph_path
from kplan.profiler.procs import ProcessTree
from kplan.profiler.records import DoneEvent, MetricsTail, OomEvent, Record, StepRecord
from kplan.profiler.schedule import ProfileSchedule
from kplan.runtime import env as runtime_env


@dataclass(frozen=True)
class JobSpec:
    script: Path
    args: tuple[str, ...]
    workers: int
    schedule: ProfileSchedule
    cpu_only: bool  # hide CUDA devices from the job
    allreduce_bench: bool
    startup_timeout_s: float  # until the first record
    step_timeout_s: float  # longest silence between two records
    timeout_s: float  # the whole job
    precision: Precision = DEFAULT_PRECISION  # what the job trains in (KPLAN_PRECISION)
    trace_opgraph: bool = True  # rank 0 traces one step's operator graph (opgraph_trace.py)


@dataclass(frozen=True)
class Progress:
    """Where the job is, for a progress bar."""

    phase: str  # "starting", "sweep", "gns", "allreduce", "finished"
    done: int  # steps done (rank 0)
    total: int  # steps planned, shrinking when a size runs out of memory
    local_batch: int | None


@dataclass
class JobOutcome:
    records: list[Record]
    pids: dict[int, int]  # every process the job ran: pid -> start ticks
    stderr_path: Path
    wall_s: float
    first_record_s: float | None = None  # the job's start to its first record (rank 0's step)
    # the job's last record to its exit (the workers' and torchrun's shutdown), on this machine
    shutdown_s: float | None = None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def job_argv(spec: JobSpec) -> list[str]:
    """One worker: the script itself (through the wrapper when it traces the operator graph).
    Several: torchrun (c10d on 127.0.0.1) and the wrapper."""
    if spec.workers == 1:
        wrapper = ["-m", "kplan.profiler.worker"] if spec.trace_opgraph else []
        return [sys.executable, *wrapper, str(spec.script), *spec.args]
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes=1", f"--nproc-per-node={spec.workers}",
        "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        "--local-addr=127.0.0.1", "--max-restarts=0",
        "-m", "kplan.profiler.worker", str(spec.script), *spec.args,
    ]  # fmt: skip


# Inherited kplan variables that would change what a profile measures are dropped.
_KEEP_FROM_USER = (
    runtime_env.BACKEND, runtime_env.GNS, runtime_env.SEED, runtime_env.DIST_TIMEOUT,
)  # fmt: skip


def job_env(spec: JobSpec, metrics: Path) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("KPLAN_") or k in _KEEP_FROM_USER
    }
    env.update(
        runtime_env.kplan_environ(
            job_id="profile",
            metrics_path=metrics,
            profile_schedule=spec.schedule,
            precision=spec.precision,
        )
    )
    env["PYTHONUNBUFFERED"] = "1"
    # every worker's threads by the rule a local launch follows (kplan/core/threads.py), so the
    # launch runs what the profile measured; the user's OMP_NUM_THREADS, when set, is kept
    env[THREADS_ENV] = str(threads_per_worker(spec.workers))
    if spec.trace_opgraph:
        env[OPGRAPH_PATH_ENV] = str(opgraph_path(metrics.parent))
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if spec.allreduce_bench and spec.workers > 1:
        env[BENCH_PORT_ENV] = str(free_port())
    if spec.cpu_only:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


class _Tracker:
    """Counts rank 0's steps into a Progress."""

    def __init__(self, schedule: ProfileSchedule) -> None:
        self.schedule = schedule
        self.sweep_done = 0
        self.gns_done = 0
        self.oom: int | None = None
        self.local_batch: int | None = None
        self.phase = "starting"
        self.first_record_s: float | None = None
        self.shutdown_s: float | None = None

    def add(self, record: Record) -> None:
        if isinstance(record, OomEvent):
            self.oom = record.local_batch if self.oom is None else min(self.oom, record.local_batch)
        elif isinstance(record, StepRecord) and record.rank == 0:
            self.local_batch = record.local_batch
            if record.phase == "gns":
                self.gns_done += 1
                self.phase = "gns"
            else:
                self.sweep_done += 1
                self.phase = "sweep"
        elif isinstance(record, DoneEvent):
            self.phase = "allreduce"

    def progress(self) -> Progress:
        s = self.schedule
        fits = [b for b in s.local_batches if self.oom is None or b < self.oom]
        sweep_total = max(self.sweep_done, len(fits) * (s.warmup_steps + s.steps_per_batch))
        total = sweep_total + s.gns_steps
        done = min(self.sweep_done, sweep_total) + min(self.gns_done, s.gns_steps)
        return Progress(self.phase, done, total, self.local_batch)


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Let ``kill <kplan pid>`` unwind like Ctrl-C, so the workers are cleaned up too."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_job(
    spec: JobSpec,
    workdir: Path,
    on_progress: Callable[[Progress], None] = lambda p: None,
    on_start: Callable[[ProcessTree], None] = lambda t: None,
) -> JobOutcome:
    """Run the job to its end; JobError (with the job's last error line) if it fails."""
    metrics = workdir / "metrics.jsonl"
    stderr_path = workdir / "stderr.log"
    tail = MetricsTail(metrics)
    tracker = _Tracker(spec.schedule)
    records: list[Record] = []
    start = time.monotonic()
    with (
        _sigterm_as_interrupt(),
        (workdir / "stdout.log").open("wb") as out,
        stderr_path.open("wb") as err,
    ):
        tree = ProcessTree(job_argv(spec), job_env(spec, metrics), Path.cwd(), out, err)
        try:
            on_start(tree)
            on_progress(tracker.progress())
            rc = _follow(
                spec=spec,
                tree=tree,
                tail=tail,
                tracker=tracker,
                records=records,
                on_progress=on_progress,
                stderr_path=stderr_path,
                start=start,
            )
        finally:
            tree.kill()
    records.extend(tail.poll())
    if rc != 0:
        line = last_error_line(stderr_path.read_text(errors="replace")) or f"exit status {rc}"
        raise JobError(
            f"the job failed: {line}",
            hint=f"the job's full output is in {stderr_path}",
        )
    if not any(isinstance(r, DoneEvent) for r in records):
        raise JobError(
            "the job exited before finishing the profile schedule",
            hint="the script must train with kplan.runtime, which follows "
            f"{runtime_env.PROFILE_SCHEDULE}; its output is in {stderr_path}",
        )
    tracker.phase = "finished"
    on_progress(tracker.progress())
    return JobOutcome(
        records,
        dict(tree.seen),
        stderr_path,
        time.monotonic() - start,
        tracker.first_record_s,
        tracker.shutdown_s,
    )


def _follow(
    *,
    spec: JobSpec,
    tree: ProcessTree,
    tail: MetricsTail,
    tracker: _Tracker,
    records: list[Record],
    on_progress: Callable[[Progress], None],
    stderr_path: Path,
    start: float,
) -> int:
    """Poll until the leader exits; returns its exit status or raises JobError on a timeout."""
    last_record = start
    seen_any = False
    while True:
        new = tail.poll()
        now = time.monotonic()
        if new:
            records.extend(new)
            for record in new:
                tracker.add(record)
            on_progress(tracker.progress())
            if not seen_any:
                tracker.first_record_s = now - start
            last_record, seen_any = now, True
        tree.refresh()
        rc = tree.poll()
        if rc is not None:
            if seen_any:  # within a poll (0.1 s) of the last record and of the exit
                tracker.shutdown_s = time.monotonic() - last_record
            return rc
        where = f"its output so far is in {stderr_path}"
        if now - start > spec.timeout_s:
            raise JobError(f"the job ran past --timeout={spec.timeout_s:g}s", hint=where)
        if not seen_any and now - start > spec.startup_timeout_s:
            raise JobError(
                f"the job reported nothing in its first {spec.startup_timeout_s:g}s",
                hint=f"raise --startup-timeout if it starts slowly; {where}",
            )
        if seen_any and now - last_record > spec.step_timeout_s:
            raise JobError(
                f"the job went silent for {spec.step_timeout_s:g}s "
                f"(phase {tracker.phase}, local batch {tracker.local_batch})",
                hint=f"raise --step-timeout for slow steps; {where}",
            )
        time.sleep(0.1)
