"""``kplan down``: end a job's instances, with or without its launcher and its database row.

Terminate first, record after. Instances are found by the job's tag through
``provider.query_instances`` and by id in the job's launch journal (``launcher/journal.py``), so
a job whose launcher was killed, whose database row is gone or whose database writes failed is
still cleaned up. A launcher that is alive is asked to stop first (it checkpoints and tears down
itself) when the database can carry the request; whatever is left is then terminated here.

Then, best-effort, the database is brought up to date: instances the journal knows but the
database missed are added, every ledger row is closed (at the time the journal saw the instance
end, else now), and a job the launcher left unfinished gets the status of what really happened:
``succeeded`` when every node's status file says exit 0, ``failed`` when one says 1..127,
``cancelled`` when this call terminated live instances, otherwise ``error`` naming what the cloud
shows. Running it again finds nothing to do.

``forget_job`` (``kplan down --forget``) removes a job's record once the cloud has nothing alive
tagged with it.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, replace

from kplan.core.errors import CloudError, JobError, KplanError
from kplan.launcher.bootstrap import cluster_spec, status_key
from kplan.launcher.clock import Clock
from kplan.launcher.jobspec import JobSpec
from kplan.launcher.journal import (
    FOLDER,
    Journal,
    JournalInstance,
    instance_record,
    read_journal,
)
from kplan.launcher.ledger import Ledger, billing_for
from kplan.launcher.provider import ClusterSpec, Instance
from kplan.launcher.providers import Backend
from kplan.launcher.state import GONE_STATES, JobRecord, StateDB
from kplan.launcher.storage import Storage
from kplan.launcher.summary import launcher_alive

_RECORD_ERRORS = (KplanError, sqlite3.Error, OSError)
_SIGNAL_EXIT = 128


@dataclass(frozen=True)
class DownResult:
    job_id: str
    terminated: tuple[str, ...]  # live instances this call asked to terminate
    removed: tuple[str, ...]  # already stopped ones it asked to delete (idempotent)
    waited_for_launcher: bool
    status: str | None  # the job's status afterwards (None: not in the database)
    recorded: bool = True  # False: the instances are gone but the database write failed
    note: str | None = None  # why it was not recorded
    snapshot: str | None = None  # the controller's snapshot merged first, or why it was not


def leftover_jobs(db: StateDB) -> list[str]:
    """Jobs that may still have instances: not finished, with an instance not seen gone, or
    known only to a journal (their database row was never written) with one not seen gone."""
    out = [j.id for j in db.jobs() if not j.terminal or any(i.alive for i in db.instances(j.id))]
    folder = db.path.parent / FOLDER
    if folder.is_dir():
        for path in sorted(folder.glob("*.jsonl")):
            job_id = path.name[: -len(".jsonl")]
            if job_id in out or job_id.endswith(".forgotten") or db.job(job_id) is not None:
                continue
            known = read_journal(path).instances
            if any(j.gone_at is None for j in known.values()):
                out.append(job_id)
    return out


def job_location(db: StateDB, job_id: str) -> tuple[str, str | None, str | None] | None:
    """(cloud, region, storage URI) of a job from its database row, else from its journal."""
    rec = db.job(job_id)
    if rec is not None:
        return rec.cloud, rec.region, JobSpec.from_dict(rec.spec).storage_uri
    line = Journal.for_job(db.path.parent, job_id).read().job
    return None if line is None else (line.cloud, line.region, line.storage_uri)


def down_job(
    job_id: str,
    backend: Backend,
    db: StateDB,
    clock: Clock,
    *,
    wait_launcher_s: float = 60.0,
    teardown_s: float = 300.0,
    cluster: ClusterSpec | None = None,
    journal: Journal | None = None,
) -> DownResult:
    journal = journal or Journal.for_job(db.path.parent, job_id)
    known = journal.read().instances
    job = db.job(job_id)
    waited = False
    live = job is not None and not job.terminal and launcher_alive(job)
    # Only a recorded request reaches the launcher; if the write fails, the launcher's own
    # writes fail too and it tears down by itself (terminating under it is then safe).
    if live and _try(lambda: _ask_launcher(db, job_id, clock)) is None:
        waited = True
        limit = clock.now() + wait_launcher_s
        while clock.now() < limit:
            current = db.job(job_id)
            if current is None or current.terminal or not launcher_alive(current):
                break
            clock.sleep(0.5)
    asked, removed, found = _terminate(job_id, backend, clock, teardown_s, known)
    with contextlib.suppress(KplanError):  # the journal's view, for `--all` and later downs
        if asked:
            journal.write("down", clock.now(), terminated=asked)
        states = {i.id: i.state for i in found}
        for iid in sorted(i for i, j in known.items() if j.gone_at is None):
            journal.write("gone", clock.now(), id=iid, state=states.get(iid, "terminated"))
    # and what an earlier `kplan down` terminated but could not record
    cancelled = set(asked) | journal.read().terminated
    if cluster is None and job is not None:
        spec = JobSpec.from_dict(job.spec)
        cluster = cluster_spec(spec, spec.storage_uri or backend.storage.uri)
    if cluster is not None:
        try:
            backend.provider.cleanup(cluster)
        except CloudError as err:
            raise CloudError(
                f"job {job_id}: instances are gone but cleanup failed: {err.message}",
                hint=f"run `kplan down {job_id}` again",
            ) from None
    if job is None:
        return DownResult(job_id, tuple(asked), tuple(removed), waited, None)
    failure = _try(lambda: _settle(job_id, db, clock, backend.storage, cancelled, found, known))
    current = _try_job(db, job_id)
    status = current.status if current is not None else job.status
    if failure is not None:
        _note(journal, clock, f"kplan down: not recorded: {failure}")
    return DownResult(
        job_id, tuple(asked), tuple(removed), waited, status, failure is None, failure
    )


def _ask_launcher(db: StateDB, job_id: str, clock: Clock) -> None:
    db.request_stop(job_id, "cancelled by kplan down", clock.now())
    db.add_event(job_id, clock.now(), "down", "kplan down: stop requested")


def _terminate(
    job_id: str,
    backend: Backend,
    clock: Clock,
    teardown_s: float,
    known: dict[str, JournalInstance],
) -> tuple[list[str], list[str], list[Instance]]:
    """Terminate what the cloud shows tagged with the job and what the journal knows alive."""
    provider = backend.provider
    asked: list[str] = []
    removed: list[str] = []
    seen: dict[str, Instance] = {}
    limit = clock.now() + teardown_s
    first = True
    while True:
        found = provider.query_instances(job_id)
        seen.update({i.id: i for i in found})
        alive = [i for i in found if i.state not in GONE_STATES]
        todo = [i.id for i in alive if i.id not in asked]
        ended = [i.id for i in found if i.state in GONE_STATES and i.id not in (*removed, *asked)]
        if ended:  # stopped VMs that still exist (GCP TERMINATED): delete them too
            provider.terminate_instances(ended)
            removed.extend(ended)
        if todo:
            provider.terminate_instances(todo)
            asked.extend(todo)
        if first:  # ids only the journal knows (not yet listed by the cloud): best-effort
            first = False
            hidden = [i for i, j in known.items() if j.gone_at is None and i not in seen]
            if hidden:
                with contextlib.suppress(CloudError):  # unknown to the cloud: already gone
                    provider.terminate_instances(hidden)
        if not alive:
            break
        if clock.now() >= limit:
            ids = ", ".join(i.id for i in alive)
            raise CloudError(
                f"job {job_id}: instances {ids} still not terminated after {teardown_s:.0f} s",
                hint=f"run `kplan down {job_id}` again, or end them in the cloud console",
            )
        clock.sleep(1.0)
    return asked, removed, list(seen.values())


def _settle(
    job_id: str,
    db: StateDB,
    clock: Clock,
    storage: Storage,
    asked: set[str],
    found: list[Instance],
    known: dict[str, JournalInstance],
) -> None:
    """Close what the launcher left open: instance rows (adding those only the journal knows),
    ledger rows, and the job's status from what really happened."""
    job = db.job(job_id)
    if job is None:
        return
    now = clock.now()
    ledger = _ledger(db, job, job_id)
    cloud = {i.id: i for i in found}
    with db.transaction():
        rows = {i.id: i for i in db.instances(job_id)}
        for j in known.values():
            if j.id not in rows:  # the launcher's database write failed after it was created
                rec = instance_record(
                    j,
                    job.id,
                    job.cloud,
                    job.region,
                    ended_at=j.gone_at,
                    reason="recorded from the launch journal",
                )
                db.add_instance(rec)
                ledger.open(rec)
                rows[rec.id] = rec
        closed = {r.instance for r in db.ledger(job_id) if r.closed}
        for row in rows.values():
            inst = row
            noted = known.get(inst.id)
            end = inst.ended_at or (noted.gone_at if noted is not None else None) or now
            if inst.alive:
                seen = cloud.get(inst.id)
                state = seen.state if seen is not None and seen.state in GONE_STATES else None
                reason = seen.reason if seen is not None else None
                if inst.id in asked:
                    state, reason = "terminated", "terminated by kplan down"
                db.update_instance(
                    job_id,
                    inst.id,
                    state or "terminated",
                    ended_at=end,
                    reason=reason or "ended after its launcher was gone",
                )
                inst = replace(inst, state=state or "terminated")
            if inst.id not in closed:
                ledger.close(inst, end)
        ledger.close_job(now)  # the job's storage row, if the launcher left it open
        if not job.terminal:
            status, reason = _outcome(job, storage, asked, found)
            db.set_status(job_id, status, now, reason)
            db.add_event(job_id, now, status, f"kplan down: {status} ({reason})")


def _outcome(
    job: JobRecord, storage: Storage, asked: set[str], found: list[Instance]
) -> tuple[str, str]:
    """What happened to a job its launcher did not finish: the node status files first."""
    ranks = [int(n.get("node_rank", i)) for i, n in enumerate(job.spec.get("nodes", []))]
    codes: dict[int, int] = {}
    for rank in ranks:
        try:
            data = storage.get_bytes(status_key(job.id, rank))
            doc = json.loads(data) if data else None
            if isinstance(doc, dict):
                codes[rank] = int(doc["exit_code"])
        except (KeyError, TypeError, ValueError, OSError, KplanError):
            continue
    failed = sorted(r for r, c in codes.items() if 0 < c < _SIGNAL_EXIT)
    if failed:
        return "failed", f"node {failed[0]} exited with code {codes[failed[0]]}"
    if ranks and all(codes.get(r) == 0 for r in ranks):
        return "succeeded", "every node finished (recorded by kplan down)"
    if asked or job.stop_requested:
        return "cancelled", "cancelled by kplan down"
    shown = sorted({f"{i.state} ({i.reason})" if i.reason else i.state for i in found})
    what = ", ".join(shown) if shown else "no instance"
    return "error", f"its launcher was gone; the cloud shows {what}"


def forget_job(job_id: str, backend: Backend, db: StateDB, clock: Clock) -> float:
    """Remove a job's record once the cloud shows nothing alive tagged with it.

    The database rows go (job, instances, events, ledger); the money spent stays on record in
    the job's journal, renamed ``<job>.forgotten.jsonl``, with a final ``forgotten`` line
    holding the ledger. Returns the USD the ledger held."""
    job = db.job(job_id)
    if job is not None and not job.terminal and launcher_alive(job):
        raise JobError(
            f"job {job_id} has a running launcher (pid {job.launcher_pid}): not forgetting it",
            hint=f"run `kplan down {job_id}` first",
        )
    alive = [i.id for i in backend.provider.query_instances(job_id) if i.state not in GONE_STATES]
    if alive:
        raise JobError(
            f"job {job_id} still has live instances ({', '.join(alive)}): not forgetting it",
            hint=f"run `kplan down {job_id}` first, then `kplan down --forget {job_id}`",
        )
    journal = Journal.for_job(db.path.parent, job_id)
    spend = db.spend(job_id) if job is not None else 0.0
    if job is None and not journal.path.exists():
        raise JobError(
            f"no record of job {job_id} in {db.path}", hint="`kplan status` lists the jobs"
        )
    rows = [
        {"instance": r.instance, "start": r.start, "end": r.end, "usd": r.usd}
        for r in (db.ledger(job_id) if job is not None else [])
    ]
    journal.write("forgotten", clock.now(), spend_usd=spend, ledger=rows)
    db.forget_job(job_id)
    kept = journal.path.with_name(f"{job_id}.forgotten.jsonl")
    journal.path.replace(kept)
    return spend


def _try(write: Callable[[], object]) -> str | None:
    """Run a best-effort database write; its error message, or None when it worked."""
    try:
        write()
    except _RECORD_ERRORS as err:
        return err.message if isinstance(err, KplanError) else str(err)
    return None


def _try_job(db: StateDB, job_id: str) -> JobRecord | None:
    try:
        return db.job(job_id)
    except _RECORD_ERRORS:
        return None


def _note(journal: Journal, clock: Clock, what: str) -> None:
    with contextlib.suppress(KplanError):
        journal.write("note", clock.now(), what=what)


def _ledger(db: StateDB, job: JobRecord, job_id: str) -> Ledger:
    """The job's ledger with its disk and storage rates (its job.json), to close their rows."""
    try:
        costs = JobSpec.from_dict(job.spec).costs
    except (KplanError, KeyError, TypeError, ValueError):
        costs = None  # a job.json this kplan cannot read: its instance rows only
    return Ledger(db, job_id, billing_for(job.cloud), costs, job.created_at)
