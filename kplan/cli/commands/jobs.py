"""``kplan status``, ``logs`` and ``down``: keep an eye on launched jobs, and stop them."""

from __future__ import annotations

import contextlib
import itertools
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from kplan.core.errors import InputError, JobError

if TYPE_CHECKING:
    from kplan.launcher.controller import Liveness
    from kplan.launcher.providers import Backend
    from kplan.launcher.state import JobRecord, StateDB
    from kplan.launcher.summary import JobSummary


def _home() -> Path:
    from kplan.core.paths import kplan_home

    return kplan_home()


def _backend(cloud: str, region: str | None, storage: str | None) -> Backend:
    from kplan.launcher.providers import ProviderSettings, get_backend

    return get_backend(cloud, ProviderSettings(_home(), region, storage))


def _db(readonly: bool = False) -> StateDB:
    """The state database; ``readonly`` for the commands that only read (status, logs)."""
    from kplan.launcher.state import StateDB

    return StateDB.open(readonly=readonly)


def _job_or_fail(db: StateDB, job_id: str) -> JobRecord:
    """The job ``job_id`` names (an id, a unique prefix of one, or ``last``); exit 2 if none."""
    rec = db.job(db.resolve_job_id(job_id))
    if rec is None:
        raise InputError(f"no job {job_id!r} in {db.path}", hint="`kplan status` lists the jobs")
    return rec


def sync_job(job_id: str, now: float) -> str | None:
    """Merge the job's controller state snapshot from its storage into this machine's database
    (kplan/launcher/snapshot.py); the ``controller state as of ...`` line, or None without one.
    A damaged or foreign snapshot is exit 2 before anything is merged."""
    from kplan.launcher.snapshot import age_line, merged_seq, pull, sync
    from kplan.launcher.statecheck import StateError

    with _db(readonly=True) as db:  # a read-only KPLAN_HOME still shows what it holds
        rec = _job_or_fail(db, job_id)
        storage = _storage_or_none(rec)
        merged = merged_seq(db, rec.id)
    if storage is None:
        return age_line(merged, now)
    try:
        db = _db()
    except StateError:  # cannot write here: say how old the snapshot is, merge nothing
        snap = pull(storage, rec.id)
        line = age_line(None if snap is None else (snap.seq, snap.written_at), now)
        return None if line is None else f"{line}; not merged (the state database is read-only)"
    with db:
        return age_line(sync(db, storage, rec.id), now)


def status_command(
    job: Annotated[
        str | None,
        typer.Argument(
            help="Job id, a unique prefix of one, or `last` (the newest job); default: every job."
        ),
    ] = None,
    watch: Annotated[
        bool,
        typer.Option(
            "--watch",
            "-w",
            help="Refresh until the job ends (exit 0; Ctrl-C stops watching): redrawn in place "
            "on a terminal, a new block each time otherwise.",
        ),
    ] = False,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between refreshes.")] = 2.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    import time

    from kplan.cli.render.launch import render_job, render_jobs
    from kplan.launcher.summary import job_summary

    if not 0 < interval <= 86400:
        raise InputError(f"--interval {interval} must be > 0 and <= 86400", hint="seconds, e.g. 2")
    if job is not None:  # a prefix or `last` names one job for the whole watch
        with _db(readonly=True) as db:
            job = _job_or_fail(db, job).id
    age = None if job is None else sync_job(job, time.time())
    if watch and not as_json and sys.stdout.isatty():
        _watch_live(job, interval)  # redrawn in place until the job ends (or Ctrl-C)
        return
    with _db(readonly=True) as db, contextlib.suppress(KeyboardInterrupt):
        for refresh in itertools.count():
            now = time.time()
            if job is not None and refresh:  # what the controller did since the last refresh
                age = _resync(job, now, age)
            if job is None:
                recs = db.jobs()
                docs = [job_summary(db, j, now, events=0) for j in recs]
                if as_json:
                    typer.echo(json.dumps([d.to_dict() for d in docs], indent=1))
                else:
                    render_jobs(docs)
                finished = _all_finished(recs, docs, now)
            else:
                rec = _job_or_fail(db, job)
                doc = job_summary(db, rec, now)
                alive = _controller(rec, now)
                if as_json:
                    state = None if alive is None else alive.to_dict()
                    typer.echo(json.dumps({**doc.to_dict(), "controller": state}, indent=1))
                else:
                    render_job(doc)
                    if age is not None:
                        typer.echo(age)
                    if not rec.terminal:
                        typer.echo(_controller_line(rec.id, alive, doc.launcher))
                finished = _finished(doc.status, doc.launcher, alive)
            if not watch or finished:
                return
            time.sleep(interval)


def _resync(job_id: str, now: float, age: str | None) -> str | None:
    """A watch's later merge of the controller's snapshot: a storage that fails for a moment
    (network, a snapshot being replaced) keeps the last view and says so; the first merge,
    before the watch, is the one that refuses a damaged snapshot with exit 2."""
    import sqlite3

    from kplan.core.errors import KplanError

    try:
        return sync_job(job_id, now)
    except (KplanError, OSError, ValueError, sqlite3.Error) as err:
        why = err.message if isinstance(err, KplanError) else f"{type(err).__name__}: {err}"
        last = (age or "controller state").split("; this refresh not merged")[0]
        return f"{last}; this refresh not merged ({why})"


def _finished(status: str, launcher: str, alive: Liveness | None) -> bool:
    """Nothing more to watch: the job ended, or neither its launcher nor a controller whose
    heartbeat is fresh (a detached controller on its own instance) is running."""
    return status not in _ACTIVE or (launcher == "gone" and not (alive and alive.alive))


def _all_finished(recs: list[JobRecord], docs: list[JobSummary], now: float) -> bool:
    """Every job ended, or runs with neither its launcher nor a live controller (the
    controller's heartbeat is read only for those whose launcher is gone)."""
    return all(
        _finished(d.status, d.launcher, _controller(r, now) if d.launcher == "gone" else None)
        for r, d in zip(recs, docs, strict=True)
    )


def _controller(rec: JobRecord, now: float) -> Liveness | None:
    """The job's controller from its heartbeat (``<job>/controller.json``), if it can be read."""
    from kplan.app.controlling import controller_state

    if rec.terminal:
        return None
    return controller_state(_storage_or_none(rec), rec.id, now)


def _controller_line(job_id: str, alive: Liveness | None, launcher: str) -> str:
    """Whether the job's controller runs, and how to restart it when it does not."""
    restart = f"restart it: kplan controller {job_id} [--detach]; or end the job: kplan down"
    if alive is None:
        state = "running" if launcher == "running" else "not running"
        tail = "" if launcher == "running" else f"; {restart} {job_id}"
        return f"controller: {state} (no heartbeat read){tail}"
    where = f"{alive.mode}, pid {alive.pid} on {alive.host}"
    beat = f"heartbeat {alive.heartbeat_age_s:.0f} s ago"
    if alive.alive:
        return f"controller: alive ({where}; {beat})"
    return f"controller: not running ({where}; last {beat}); {restart} {job_id}"


_ACTIVE = ("pending", "provisioning", "running", "recovering", "resizing", "stopping")


def _watch_live(job: str | None, interval: float) -> None:
    """``status --watch`` on a terminal: one view redrawn in place (every job's table, or one
    job's progress panel over its instances and latest events) until it ends; Ctrl-C ends it
    with exit 0."""
    import time

    from kplan.cli.render.launch import job_view, jobs_view
    from kplan.cli.render.live import watch_live
    from kplan.launcher.summary import job_summary

    with _db(readonly=True) as db:
        if job is None:

            def frame() -> tuple[Any, bool]:
                now, recs = time.time(), db.jobs()
                docs = [job_summary(db, j, now, events=0) for j in recs]
                return jobs_view(docs), _all_finished(recs, docs, now)

        else:
            from rich.console import Group

            from kplan.cli.render.live import progress_panel
            from kplan.launcher.progress import ProgressTracker

            tracker = ProgressTracker(job, _storage_or_none(_job_or_fail(db, job)))

            def frame() -> tuple[Any, bool]:
                now = time.time()
                _resync(job, now, None)  # the detached controller's rows since the last frame
                rec = _job_or_fail(db, job)
                doc = job_summary(db, rec, now, events=5)
                snap = tracker.snapshot(db, now)
                done = _finished(doc.status, doc.launcher, _controller(rec, now))
                if snap is None:
                    return job_view(doc), done
                return Group(progress_panel(snap, "kplan status"), job_view(doc)), done

        watch_live(frame, interval)


def _storage_or_none(rec: JobRecord) -> Any:
    """The job's storage (its metrics), or None when it cannot be reached from here (a cloud
    without credentials or SDK): the view then shows the job without training numbers."""
    from kplan.core.errors import KplanError
    from kplan.launcher.jobspec import JobSpec

    try:
        return _backend(rec.cloud, rec.region, JobSpec.from_dict(rec.spec).storage_uri).storage
    except (KplanError, ImportError):
        return None


def logs_command(
    job: Annotated[
        str, typer.Argument(help="Job id, a unique prefix of one, or `last` (the newest job).")
    ],
    follow: Annotated[
        bool,
        typer.Option(
            "--follow",
            "-f",
            help="Keep printing new lines until the job ends (or its launcher is gone and "
            "nothing of it runs).",
        ),
    ] = False,
    node: Annotated[int | None, typer.Option("--node", help="Only this node rank.")] = None,
) -> None:
    import time

    from kplan.launcher.jobspec import JobSpec

    if node is not None and not 0 <= node < 4096:
        raise InputError(f"--node {node} must be a node rank >= 0", hint="e.g. --node 0")
    sync_job(job, time.time())  # the detached controller's events and nodes first
    with _db(readonly=True) as db:
        rec = _job_or_fail(db, job)
        job = rec.id
        spec = JobSpec.from_dict(rec.spec)
        backend = _backend(rec.cloud, rec.region, spec.storage_uri)
        storage = backend.storage
        prefix = f"{job}/logs/" + ("" if node is None else f"node-{node}.log")
        offsets: dict[str, int] = {}
        shown: str | None = None  # the file whose lines were printed last (its header once)
        changed_at = checked_at = time.monotonic()
        while True:
            current = db.job(job)  # before reading: the lines of a job that just ended are read
            for key in sorted(storage.list_keys(prefix)):
                data = storage.get_bytes(key) or b""
                start = offsets.get(key, 0)
                if len(data) > start:
                    if node is None and key != shown:
                        typer.echo(f"==> {key.rsplit('/', 1)[-1]} <==")
                        shown = key
                    typer.echo(data[start:].decode("utf-8", "replace"), nl=False)
                    offsets[key] = len(data)
                    changed_at = time.monotonic()
            if not follow or current is None or current.terminal:
                if not offsets:
                    _no_logs(current or rec, node)
                return
            if _launcher_gone(current):  # nothing will record an end: stop on our own
                now = time.monotonic()
                idle = now - changed_at >= _LOGS_IDLE_S
                if idle or now - checked_at >= _LOGS_CLOUD_CHECK_S or checked_at == changed_at:
                    checked_at = now
                    if idle or not _cloud_alive(backend, job):
                        typer.echo(
                            f"job {job}: its launcher is gone and "
                            + ("nothing changed for a while" if idle else "nothing is running")
                            + f"; `kplan down {job}` records how it ended",
                            err=True,
                        )
                        return
            time.sleep(1.0)


def _no_logs(rec: JobRecord, node: int | None) -> None:
    """Say why there is nothing to print: the job has not written a log yet, or (a job that
    ended) the node never ran."""
    which = "" if node is None else f" node {node}"
    if not rec.terminal:
        typer.echo(f"no logs yet for job {rec.id}{which} ({rec.status})", err=True)
        return
    from kplan.launcher.jobspec import JobSpec

    ranks = len(JobSpec.from_dict(rec.spec).nodes)
    why = "no node of it ran" if node is None else f"node {node} never ran"
    typer.echo(
        f"job {rec.id} {rec.status} and left no log{which}: {why} "
        f"(its nodes: 0-{ranks - 1}; `kplan status {rec.id}` shows what happened)",
        err=True,
    )


_LOGS_IDLE_S = 60.0  # logs -f on a job without a launcher: stop after this long unchanged
_LOGS_CLOUD_CHECK_S = 10.0  # ... or as soon as the cloud shows nothing alive (checked this often)


def _launcher_gone(job: JobRecord) -> bool:
    from kplan.core.procs import read_stat
    from kplan.launcher.summary import launcher_alive

    if job.terminal:
        return False
    if not launcher_alive(job) or job.launcher_pid is None:
        return True
    stat = read_stat(job.launcher_pid)  # a launcher killed but not yet reaped is gone too
    return stat is not None and stat.state in ("Z", "X")


def _cloud_alive(backend: Backend, job_id: str) -> bool:
    """Whether the cloud shows an instance of the job alive (True when it cannot tell)."""
    from kplan.core.errors import KplanError
    from kplan.launcher.state import GONE_STATES

    try:
        return any(i.state not in GONE_STATES for i in backend.provider.query_instances(job_id))
    except KplanError:
        return True


def down_command(
    job: Annotated[
        str | None,
        typer.Argument(help="Job id, a unique prefix of one, or `last` (the newest job)."),
    ] = None,
    all_jobs: Annotated[bool, typer.Option("--all", help="Every job that may still run.")] = False,
    cloud: Annotated[
        str | None,
        typer.Option("--cloud", help="Cloud of a job missing from the state database."),
    ] = None,
    region: Annotated[
        str | None, typer.Option("--region", help="Region of a job missing from the database.")
    ] = None,
    wait: Annotated[
        float, typer.Option("--wait", help="Seconds to let a live launcher stop by itself.")
    ] = 60.0,
    forget: Annotated[
        bool,
        typer.Option(
            "--forget",
            help="Remove JOB's record (database rows; its journal keeps what was spent) once "
            "the cloud shows nothing alive tagged with it. Terminates nothing.",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    from dataclasses import asdict

    from kplan.app.stopping import DownRequest, Forgotten, take_down
    from kplan.cli.render.launch import render_down

    req = DownRequest(job, all_jobs, cloud, region, wait, forget)
    results = take_down(req, _db, _backend)
    if isinstance(results, Forgotten):
        typer.echo(
            json.dumps(asdict(results), indent=1)
            if as_json
            else f"{results.job_id}: forgotten (spent ${results.spend_usd:,.4f}; kept in its "
            "journal)"
        )
        return
    if as_json:
        typer.echo(json.dumps([asdict(r) for r in results], indent=1))
    else:
        render_down(results)
    unrecorded = [r for r in results if not r.recorded]
    if unrecorded:
        first = unrecorded[0]
        raise JobError(
            f"job {first.job_id}: its instances are gone but the state database could not "
            f"record it ({first.note})",
            hint=f"run `kplan down {first.job_id}` again once the database is writable",
        )


def register(app: typer.Typer) -> None:
    app.command("status", help="Show jobs, or one job's instances, spend and events.")(
        status_command
    )
    app.command("logs", help="Print a job's logs (all nodes, or --node).")(logs_command)
    app.command("down", help="Terminate a job's instances (idempotent; works without a DB).")(
        down_command
    )
