"""``kplan attach JOB --storage URI``: follow a job launched on another machine.

The job's controller publishes its rows to ``JOB/state/snapshot.json`` in the job's storage
(kplan/launcher/snapshot.py). Attaching pulls that snapshot through the provider the URI's scheme
names (``s3://``: aws, ``gs://``: gcp, a folder: local), checks it whole before this machine's
database is opened (a damaged or foreign snapshot, or none, writes nothing), then merges it,
creating the job's row with its spec. From then on ``kplan status``, ``logs``, ``report`` and
``down`` work on the job as on the machine that launched it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kplan.core.errors import InputError

if TYPE_CHECKING:
    from kplan.launcher.providers import Backend
    from kplan.launcher.snapshot import Attached
    from kplan.launcher.state import StateDB
    from kplan.launcher.summary import JobSummary


@dataclass(frozen=True)
class AttachRequest:
    job_id: str  # the full id: this machine knows no job to complete a prefix from
    storage_uri: str  # s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or a local folder
    region: str | None = None  # where to reach the storage from (None: the provider's default)


@dataclass(frozen=True)
class AttachResult:
    attached: Attached
    summary: JobSummary  # the job as `kplan status JOB` shows it now
    age: str | None  # ``controller state as of N s ago ...``


def attach_job(
    req: AttachRequest,
    open_db: Callable[[], StateDB],
    backend_for: Callable[[str, str | None, str | None], Backend],
    now: float,
) -> AttachResult:
    """Pull and check the job's snapshot, then merge it into the database ``open_db`` opens.
    ``backend_for(cloud, region, storage)``."""
    from kplan.launcher.jobspec import check_job_id
    from kplan.launcher.providers import storage_cloud
    from kplan.launcher.snapshot import age_line, attach, merged_seq, pull_or_fail
    from kplan.launcher.summary import job_summary

    check_job_id(req.job_id)
    cloud, uri = storage_cloud(req.storage_uri)
    storage = backend_for(cloud, req.region, uri).storage
    snap = pull_or_fail(storage, req.job_id)  # before the database is opened: nothing written
    runs_on = snap.job.cloud
    if runs_on != cloud:  # its storage would be read through the wrong provider from now on
        raise InputError(
            f"job {req.job_id} runs on {runs_on}, but {uri} is {cloud} storage",
            hint=f"attach it with the storage its launch used: "
            f"{snap.job.spec.get('storage_uri') or 'its --storage'}",
        )
    with open_db() as db:
        done = attach(db, snap, storage)
        summary = job_summary(db, done.job, now, events=0)
        age = age_line(merged_seq(db, done.job.id), now)
    return AttachResult(done, summary, age)
