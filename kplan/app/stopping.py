"""``kplan down`` as a library call: terminate a job's instances (or every job that may still
run), found through the state database, else the job's launch journal, else by tag in the
``--cloud``/``--region`` given; or forget a job whose instances are all gone.

A job in the database first gets its controller's latest state snapshot merged from its storage
(kplan/launcher/snapshot.py), best-effort: the instances and ledger rows a detached controller
added are then recorded as ended too. A storage that cannot be reached, or a snapshot that cannot
be read, never stops a ``kplan down``: the result says so in one line."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from kplan.core.errors import InputError, KplanError

if TYPE_CHECKING:
    from kplan.launcher.down import DownResult
    from kplan.launcher.provider import ClusterSpec
    from kplan.launcher.providers import Backend
    from kplan.launcher.state import StateDB
    from kplan.launcher.storage import Storage

MAX_WAIT_S = 86400.0


@dataclass(frozen=True)
class DownRequest:
    job: str | None  # an id, a unique prefix of one, or ``last``; None with ``all_jobs``
    all_jobs: bool = False
    cloud: str | None = None  # where to look for a job the database lacks
    region: str | None = None
    wait_s: float = 60.0  # let a live launcher stop by itself this long
    forget: bool = False  # remove the job's record once nothing of it is alive


@dataclass(frozen=True)
class Forgotten:
    """``kplan down --forget``'s answer (its ``--json`` is this record's fields)."""

    job_id: str
    forgotten: bool
    spend_usd: float  # what the job spent, kept in its journal


def check(req: DownRequest) -> None:
    if (req.job is None) == (not req.all_jobs):
        raise InputError("give a job id or --all", hint="kplan down kp-... or kplan down --all")
    if req.forget and req.job is None:
        raise InputError("--forget takes one job id, not --all", hint="kplan down --forget kp-...")
    if not 0 <= req.wait_s <= MAX_WAIT_S:
        raise InputError(f"--wait {req.wait_s} must be >= 0 and <= 86400", hint="seconds")


def take_down(
    req: DownRequest,
    open_db: Callable[[], StateDB],
    backend_for: Callable[[str, str | None, str | None], Backend],
) -> list[DownResult] | Forgotten:
    """Each job's ``down_job`` result; with ``forget``, the one forgotten job.
    ``backend_for(cloud, region, storage)``."""
    check(req)
    with open_db() as db:
        return _take_down(req, db, backend_for)


def _take_down(
    req: DownRequest, db: StateDB, backend_for: Callable[[str, str | None, str | None], Backend]
) -> list[DownResult] | Forgotten:
    from kplan.launcher.clock import SystemClock
    from kplan.launcher.down import down_job, forget_job, leftover_jobs
    from kplan.launcher.jobspec import check_job_id
    from kplan.launcher.provider import ClusterSpec as Cluster

    if req.job is not None:
        # a prefix or `last` names a job of the database; an id it lacks stays as typed
        targets = [check_job_id(db.resolve_job_id(req.job, known_only=False))]
    else:
        targets = leftover_jobs(db)
    results: list[DownResult] = []
    for job_id in targets:
        which, where, storage, cluster = _locate(req, db, job_id)
        if which == "local":
            _refuse_another_homes_job(job_id, storage)
        backend = backend_for(which, where, storage)
        if req.forget:
            spent = forget_job(job_id, backend, db, SystemClock())
            return Forgotten(job_id, True, spent)
        merged = _merge_latest(db, backend.storage, job_id, SystemClock().now())
        result = down_job(
            job_id, backend, db, SystemClock(), wait_launcher_s=req.wait_s, cluster=cluster
        )
        for region in _other_regions(db, job_id, where):  # a job that moved, or may
            other = down_job(
                job_id,
                backend_for(which, region, storage),
                db,
                SystemClock(),
                wait_launcher_s=0.0,
                cluster=Cluster(job_id=job_id, cloud=which, region=region),
            )
            result = replace(result, terminated=result.terminated + other.terminated)
        results.append(replace(result, snapshot=merged))
    return results


def _other_regions(db: StateDB, job_id: str, where: str | None) -> list[str]:
    """The regions besides ``where`` the job may have run in: those it may move to
    (kplan/launcher/region_move.py) and those its recorded instances ran in."""
    from kplan.launcher.jobspec import JobSpec

    job = db.job(job_id)
    if job is None:
        return []
    regions = [r.region for r in JobSpec.from_dict(job.spec).moves.regions]
    regions += [i.region for i in db.instances(job_id)]
    return [r for r in dict.fromkeys(regions) if r != where]


def _merge_latest(db: StateDB, storage: Storage, job_id: str, now: float) -> str | None:
    """Merge the job's latest controller snapshot, best-effort: the line to show (its age, or
    why it was not merged), None when the job has none or is not in the database."""
    import sqlite3

    from kplan.launcher.snapshot import age_line, sync

    if db.job(job_id) is None:
        return None
    try:
        return age_line(sync(db, storage, job_id), now)
    except (KplanError, OSError, ValueError, sqlite3.Error) as err:
        why = err.message if isinstance(err, KplanError) else f"{type(err).__name__}: {err}"
        return f"controller state snapshot not merged ({why}); going on with this machine's records"


def _refuse_another_homes_job(job_id: str, storage: str | None) -> None:
    """A local job attached from another ``KPLAN_HOME`` of this machine (its storage is that
    home's ``jobs`` folder, whose ``local/JOB`` holds its processes): this home's provider cannot
    see them, so ending it here would record it ended while it runs on. Exit 2 instead."""
    from pathlib import Path
    from urllib.parse import unquote, urlparse

    from kplan.core.paths import kplan_home

    if storage is None or not storage.startswith("file://"):
        return
    owner = Path(unquote(urlparse(storage).path)).parent
    if owner.resolve() == kplan_home().resolve():
        return
    if (owner / "local" / job_id / "state.json").is_file():
        raise InputError(
            f"job {job_id} runs on this machine under another KPLAN_HOME ({owner}): this home "
            "cannot end its processes",
            hint=f"end it from its own home: KPLAN_HOME={owner} kplan down {job_id}",
        )


def _locate(
    req: DownRequest, db: StateDB, job_id: str
) -> tuple[str, str | None, str | None, ClusterSpec | None]:
    """(cloud, region, storage, cluster to find by tag or None): the database row, else the
    job's launch journal (its row was never written), else the flags."""
    from kplan.launcher.down import job_location
    from kplan.launcher.provider import ClusterSpec as Cluster

    found = job_location(db, job_id)
    if found is not None:
        which, where, storage = found
        cluster: ClusterSpec | None = None
        if db.job(job_id) is None and where is not None:
            cluster = Cluster(job_id=job_id, cloud=which, region=where)
        return which, where, storage, cluster
    if req.cloud is None:
        raise InputError(
            f"job {job_id!r} is not in {db.path}",
            hint="give --cloud (and --region) to find its instances by tag, or record it here "
            "first: `kplan attach JOB --storage URI`",
        )
    which = req.cloud.lower()
    cluster = None
    if req.region is not None:
        cluster = Cluster(job_id=job_id, cloud=which, region=req.region)
    return which, req.region, None, cluster
