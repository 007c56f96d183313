"""``kplan down``: end a job's instances, with or without its launcher and its database row.

Instances are found by the job's tag through ``provider.query_instances``, so a job whose
launcher was killed, or whose state database is gone, is still cleaned up. A launcher that is
alive is asked to stop first (it checkpoints and tears down itself); whatever is left is then
terminated here, the ledger rows are closed and the job is marked ``cancelled``. Running it
again finds nothing to do.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kplan.errors import CloudError
from kplan.launcher.bootstrap import cluster_spec
from kplan.launcher.clock import Clock
from kplan.launcher.jobspec import JobSpec
from kplan.launcher.ledger import Ledger, billing_for
from kplan.launcher.provider import ClusterSpec
from kplan.launcher.providers import Backend
from kplan.launcher.state import GONE_STATES, StateDB
from kplan.launcher.summary import launcher_alive


@dataclass(frozen=True)
class DownResult:
    job_id: str
    terminated: tuple[str, ...]  # live instances this call asked to terminate
    removed: tuple[str, ...]  # already stopped ones it asked to delete (idempotent)
    waited_for_launcher: bool
    status: str | None  # the job's status afterwards (None: not in the database)


def leftover_jobs(db: StateDB) -> list[str]:
    """Jobs that may still have instances: not finished, or with an instance not seen gone."""
    return [j.id for j in db.jobs() if not j.terminal or any(i.alive for i in db.instances(j.id))]


def down_job(
    job_id: str,
    backend: Backend,
    db: StateDB,
    clock: Clock,
    *,
    wait_launcher_s: float = 60.0,
    teardown_s: float = 300.0,
    cluster: ClusterSpec | None = None,
) -> DownResult:
    job = db.job(job_id)
    waited = False
    if job is not None and not job.terminal:
        db.request_stop(job_id, "cancelled by kplan down", clock.now())
        db.add_event(job_id, clock.now(), "down", "kplan down: stop requested")
        if launcher_alive(job):
            waited = True
            limit = clock.now() + wait_launcher_s
            while clock.now() < limit:
                current = db.job(job_id)
                if current is None or current.terminal or not launcher_alive(current):
                    break
                clock.sleep(0.5)
    provider = backend.provider
    asked: list[str] = []
    removed: list[str] = []
    limit = clock.now() + teardown_s
    while True:
        found = provider.query_instances(job_id)
        alive = [i for i in found if i.state not in GONE_STATES]
        todo = [i.id for i in alive if i.id not in asked]
        ended = [i.id for i in found if i.state in GONE_STATES and i.id not in (*removed, *asked)]
        if ended:  # stopped VMs that still exist (GCP TERMINATED): delete them too
            provider.terminate_instances(ended)
            removed.extend(ended)
        if todo:
            provider.terminate_instances(todo)
            asked.extend(todo)
            if job is not None:
                db.add_event(job_id, clock.now(), "terminate", f"kplan down: {', '.join(todo)}")
        if not alive:
            break
        if clock.now() >= limit:
            ids = ", ".join(i.id for i in alive)
            raise CloudError(
                f"job {job_id}: instances {ids} still not terminated after {teardown_s:.0f} s",
                hint=f"run `kplan down {job_id}` again, or end them in the cloud console",
            )
        clock.sleep(1.0)
    status = None
    if job is not None:
        status = _settle(job_id, db, clock)
    if cluster is None and job is not None:
        spec = JobSpec.from_dict(job.spec)
        cluster = cluster_spec(spec, spec.storage_uri or backend.storage.uri)
    if cluster is not None:
        try:
            provider.cleanup(cluster)
        except CloudError as err:
            raise CloudError(
                f"job {job_id}: instances are gone but cleanup failed: {err.message}",
                hint=f"run `kplan down {job_id}` again",
            ) from None
    return DownResult(job_id, tuple(asked), tuple(removed), waited, status)


def _settle(job_id: str, db: StateDB, clock: Clock) -> str:
    """Close what the launcher left open: instance rows, ledger rows, the job's status."""
    job = db.job(job_id)
    if job is None:
        return "cancelled"
    now = clock.now()
    ledger = Ledger(db, job_id, billing_for(job.cloud))
    with db.transaction():
        for inst in db.instances(job_id):
            if inst.alive:
                db.update_instance(
                    job_id, inst.id, "terminated", ended_at=now, reason="terminated by kplan down"
                )
                ledger.close(replace(inst, state="terminated"), now)
        if not job.terminal:
            db.set_status(job_id, "cancelled", now, "cancelled by kplan down")
            db.add_event(job_id, now, "cancelled", "cancelled by kplan down")
    current = db.job(job_id)
    return current.status if current is not None else "cancelled"
