"""Detached (managed) jobs: the job's controller as its own process, and its restart.

``kplan launch --detach`` records the job (``lifecycle.record_job``: it exists in the state
database before the command returns) and starts the job's controller, ``kplan controller JOB``,
as a daemon on this machine: a new session (no terminal, so closing the launching shell sends it
no SIGHUP), stdin from ``/dev/null``, its output appended to the controller log
(:func:`controller_log`). The command returns once the controller has taken the job (its pid is
the job's ``launcher_pid``), or fails with the log's last line if it exited at once.
``kplan controller JOB`` restarts a controller that died (``controller_resume.resume_job``);
:func:`check_not_running` refuses to start a second one beside a live one.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from kplan.core.errors import InputError, JobError
from kplan.core.paths import kplan_home
from kplan.launcher.controller import Liveness, liveness, pid_alive, read_controller
from kplan.launcher.jobspec import JobSpec
from kplan.launcher.providers import Backend
from kplan.launcher.state import StateDB
from kplan.launcher.storage import Storage

TAKE_OVER_S = 60.0  # how long `--detach` waits for its controller to take the job


@dataclass(frozen=True)
class Detached:
    """What ``kplan launch --detach`` prints: the job and where its controller runs."""

    job_id: str
    controller_pid: int
    log: str

    def commands(self) -> list[str]:
        j = self.job_id
        return [
            f"kplan status {j} --watch",
            f"kplan logs {j} -f",
            f"kplan down {j}",
            f"kplan report {j}",
            f"kplan controller {j}",
        ]


def controller_log(job_id: str, cloud: str) -> Path:
    """A local job's controller log sits with its nodes' logs (``kplan logs`` prints it);
    a cloud job's in ``$KPLAN_HOME/controllers``."""
    home = kplan_home()
    if cloud == "local":
        return home / "jobs" / job_id / "logs" / "controller.log"
    return home / "controllers" / f"{job_id}.log"


def spawn_controller(job_id: str, log: Path, mode: str) -> subprocess.Popen[bytes]:
    """``kplan controller JOB`` as a daemon: own session, no stdin, output to ``log``."""
    log.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    code = "from kplan.cli.main import main; main()"
    argv = [sys.executable, "-c", code, "controller", job_id, "--mode", mode]
    with open(log, "ab", buffering=0) as out:
        log.chmod(0o600)
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )


def start_detached(spec: JobSpec, backend: Backend, db: StateDB) -> Detached:
    """Record the job, start its controller detached, and wait until it has taken the job."""
    from kplan.launcher.lifecycle import record_job

    record_job(spec, backend, db)
    return detach_controller(db, spec.job_id, spec.cloud)


def detach_controller(db: StateDB, job_id: str, cloud: str) -> Detached:
    """Start ``kplan controller JOB`` detached and wait until it has taken the job."""
    log = controller_log(job_id, cloud)
    proc = spawn_controller(job_id, log, "detached")
    limit = time.monotonic() + TAKE_OVER_S
    while time.monotonic() < limit:
        job = db.job(job_id)
        if job is not None and job.launcher_pid == proc.pid:
            return Detached(job_id, proc.pid, str(log))
        code = proc.poll()
        if code is not None:
            raise JobError(
                f"job {job_id}: its controller exited at once (code {code}): {_last_line(log)}",
                hint=f"see {log}; `kplan down {job_id}` ends whatever it started",
            )
        time.sleep(0.1)
    raise JobError(
        f"job {job_id}: its controller (pid {proc.pid}) did not take the job in "
        f"{TAKE_OVER_S:.0f} s",
        hint=f"see {log}; `kplan status {job_id}` shows whether it runs",
    )


def _last_line(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no output"
    return lines[-1] if lines else "no output"


def controller_state(storage: Storage | None, job_id: str, now: float) -> Liveness | None:
    """Whether the job's controller is alive (from its heartbeat document); None without one
    or without a storage to read it from."""
    if storage is None:
        return None
    doc = read_controller(storage, job_id)
    return None if doc is None else liveness(doc, now)


def check_not_running(db: StateDB, backend: Backend, job_id: str) -> None:
    """Refuse to start a controller for a job that has a live one."""
    job = db.job(job_id)
    state = controller_state(backend.storage, job_id, time.time())
    local = job is not None and job.launcher_pid is not None and pid_alive(job.launcher_pid)
    if local or (state is not None and state.alive):
        where = f"pid {state.pid} on {state.host}" if state else f"pid {job and job.launcher_pid}"
        raise InputError(
            f"job {job_id} has a live controller ({where}): not starting another",
            hint=f"`kplan status {job_id}` shows it; `kplan down {job_id}` ends the job",
        )
