"""A job from request to teardown: provision, monitor, recover, guard, account, tear down.

``run_job`` is the whole lifecycle (see ``kplan/launcher/LIFECYCLE.md``). The state database records
every step as it happens, so ``kplan status`` and ``kplan down`` work from another process and
after the launcher died. Teardown always runs (``finally``); a teardown that fails raises a
``CloudError`` that names the instances left and the command that finishes the job.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial

from kplan.core.errors import InputError, KplanError
from kplan.launcher.clock import Clock, SystemClock
from kplan.launcher.controller import ControllerDoc, this_host, write_controller
from kplan.launcher.jobspec import JobSpec, NodeSpec, place
from kplan.launcher.journal import Journal
from kplan.launcher.ledger import BillingRule
from kplan.launcher.observe import EventSink, Finish
from kplan.launcher.providers import Backend
from kplan.launcher.region_move import BackendFor, MovingRun
from kplan.launcher.snapshot import publish
from kplan.launcher.state import InstanceRecord, JobRecord, StateDB, StateWriteError


@dataclass(frozen=True)
class JobOutcome:
    job_id: str
    status: str  # succeeded, failed, stopped, cancelled, error
    reason: str | None
    spend_usd: float
    seconds: float
    preemptions: int


def run_job(
    spec: JobSpec,
    backend: Backend,
    db: StateDB,
    *,
    clock: Clock | None = None,
    billing: BillingRule | None = None,
    on_event: EventSink | None = None,
    journal: Journal | None = None,
    backend_for: BackendFor | None = None,
) -> JobOutcome:
    """Run ``spec`` to its end; never returns with an instance it created still alive.

    ``journal``: where instance ids are written before the database (default
    ``<db folder>/journal/<job>.jsonl``). ``backend_for``: the backend of another region of the
    job's cloud, for a move (kplan/launcher/region_move.py; default: the cloud's factory).
    Files the job creates are ``0600`` (umask 077 while it runs)."""
    journal = journal or Journal.for_job(db.path.parent, spec.job_id)
    with private_umask():
        run = JobRun(spec, backend, db, clock or SystemClock(), billing, on_event, journal)
        run.backend_for = backend_for
        return run.run()


def record_job(spec: JobSpec, backend: Backend, db: StateDB, *, clock: Clock | None = None) -> None:
    """Create the job's records (journal line, job row ``pending``, ``created`` event) and start
    nothing: ``kplan launch --detach`` does this before its controller process takes the job
    (``kplan/launcher/controller_resume.py``), so the job exists when the command returns."""
    journal = Journal.for_job(db.path.parent, spec.job_id)
    with private_umask():
        JobRun(spec, backend, db, clock or SystemClock(), None, None, journal)._create()


@contextmanager
def private_umask() -> Iterator[None]:
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


class JobRun(MovingRun):
    """The whole lifecycle: create the job's records, run it, and always tear it down."""

    mode = "foreground"  # how its controller was started (controller.py: MODES)
    controller_since: float | None = None
    heartbeat_failing = False
    snapshot_seq = 0  # the last published state snapshot's number (kplan/launcher/snapshot.py)

    def _tick(self) -> None:
        """One monitor check, then the controller's heartbeat (its durable state)."""
        super()._tick()
        self.heartbeat()

    def _launch(self, nodes: Sequence[NodeSpec]) -> list[InstanceRecord]:
        # The generation and the launch counts are durable before the cloud is asked: a
        # restarted controller gives the new instances' peers the same rendezvous.
        self.heartbeat()
        return super()._launch(nodes)

    def heartbeat(self) -> None:
        """Write ``<job>/controller.json`` (kplan/launcher/controller.py) and the state snapshot
        the read commands of other machines merge (kplan/launcher/snapshot.py); a failed write is
        an event once per run of failures (the job goes on: the state database has the rest)."""
        now = self.clock.now()
        if self.controller_since is None:
            self.controller_since = now
        try:
            write_controller(self.storage, self.controller_doc(now))
            # grows across a restarted controller too: at least the clock in milliseconds
            self.snapshot_seq = max(self.snapshot_seq + 1, int(now * 1000))
            publish(self.db, self.storage, self.spec.job_id, self.snapshot_seq, now)
            self.heartbeat_failing = False
        except (OSError, KplanError) as err:
            if not self.heartbeat_failing:
                self.heartbeat_failing = True
                with contextlib.suppress(OSError, KplanError):
                    self._event("heartbeat", f"could not write the controller's state: {err}")

    def controller_doc(self, now: float) -> ControllerDoc:
        s = self.spec
        return ControllerDoc(
            job=s.job_id,
            host=this_host(),
            pid=os.getpid(),
            mode=self.mode,
            started_at=self.controller_since if self.controller_since is not None else now,
            heartbeat_at=now,
            check_interval_s=s.timing.check_interval_s,
            job_started_at=self.started,
            generation=self.generation,
            launches=dict(self.launches),
            lost_nodes=self.lost_nodes,
            counted=tuple(sorted(self.counted)),
            replacements=self.replacements,
            preemptions=self.preemptions,
            returns=self.returns,
            waiting_since=self.waiting_since,
            spec=replace(s, storage_uri=self.storage.uri).to_dict(),
            instances=tuple(self.records.values()),
        )

    def _create(self) -> None:
        s = self.spec
        now = self.clock.now()
        if self.db.job(s.job_id) is not None:  # before its journal gets this launch's job line
            raise InputError(f"job {s.job_id!r} already exists", hint="use a new job id")
        self.journal.write(
            "job",
            now,
            job=s.job_id,
            cloud=s.cloud,
            region=s.region,
            storage_uri=self.storage.uri,
            pid=os.getpid(),
        )
        self.db.create_job(
            JobRecord(
                id=s.job_id,
                status="pending",
                reason=None,
                cloud=s.cloud,
                region=s.region,
                spec=replace(s, storage_uri=self.storage.uri).to_dict(),
                plan=None if s.plan is None else s.plan.to_dict(),
                budget_usd=s.budget_usd,
                deadline_h=s.deadline_h,
                predicted_hours=s.predicted.hours,
                predicted_cost_usd=s.predicted.cost_usd,
                predicted_cost_p90_usd=s.predicted.cost_p90_usd,
                launcher_pid=os.getpid(),
                stop_requested=None,
                created_at=now,
                updated_at=now,
            )
        )
        self._event(
            "created",
            f"job {s.job_id}: {len(s.nodes)} node(s), {s.workers} worker(s) on "
            f"{place(s.cloud, s.region)}, budget ${s.budget_usd:,.2f}",
            {"usd_per_hour": s.usd_per_hour},
        )
        for note in s.predicted.price_notes:
            self._event("price", note)

    def run(self) -> JobOutcome:
        self._create()  # if this fails nothing exists yet: the error is the outcome
        return self.drive(self.start)

    def start(self) -> tuple[str, str]:
        """From nothing: the guard agrees before anything is uploaded or created."""
        self._afford([n.usd_per_hour for n in self.spec.nodes], "the cluster")
        self._prepare()
        self._provision()
        return self._monitor()

    def drive(self, body: Callable[[], tuple[str, str]]) -> JobOutcome:
        """Run ``body`` (to the job's final status), then always tear down and record the end."""
        status, reason = "error", "launcher error"
        error: BaseException | None = None
        try:
            status, reason = body()
        except Finish as fin:
            status, reason = fin.status, fin.reason
        except KeyboardInterrupt:
            status, reason = "cancelled", "interrupted"
        except KplanError as err:
            status, reason, error = "error", err.message, err
        except OSError as err:  # a local file write (storage, logs): disk full, permissions
            status, reason = "error", f"{err.strerror or err}: {err.filename or 'a file write'}"
            error = KplanError(reason, hint="free disk space, or fix the folder's permissions")
        except BaseException as err:  # even SystemExit must not skip teardown
            status, reason, error = "error", f"{type(err).__name__}: {err}", err
        finally:
            # Teardown first; every record of it is best-effort (the database may be what
            # failed): terminate calls never wait on a database write.
            self.stopping = True
            teardown_error = self._teardown_always(status, reason)
        self.db_broken = False  # one more try to record the end
        if teardown_error is not None:
            why = f"{reason}; teardown failed: {teardown_error.message}"
            self._safe("status error", lambda: self._status("error", why))
            self._safe("event error", lambda: self._event("error", teardown_error.message))
            raise teardown_error
        self._end_own()
        self._settle_records()
        self._safe("storage row", lambda: self.ledger.close_job(self.clock.now()))
        recorded = self._safe("final status", lambda: self._status(status, reason))
        spend = self._spend()
        self._safe(
            "final event",
            lambda: self._event(
                status, f"{status}: {reason}; spent ${spend:,.4f}", {"spend_usd": spend}
            ),
        )
        self._terminate_own()
        if error is not None:
            raise error
        if not recorded:
            raise StateWriteError(
                f"job {self.spec.job_id} {status} ({reason}) and its instances are gone, but "
                f"the state database could not record it",
                hint=f"`kplan down {self.spec.job_id}` records it once the database is writable",
            )
        return JobOutcome(
            self.spec.job_id,
            status,
            reason,
            spend,
            self.clock.now() - self.started,
            self.preemptions,
        )

    def _end_own(self) -> None:
        """The nodes are gone: close the ledger row of the controller instance this runs on
        (kplan/launcher/controller_node.py) now; it ends itself right after."""
        now = self.clock.now()
        for rec in list(self.records.values()):
            if rec.alive and self._own(rec):
                ended = replace(rec, state="terminated", ended_at=now, reason="ended with its job")
                self.records[rec.id] = ended
                self._journal_safe("gone", id=rec.id, state="terminated")
                self._safe(f"end of {rec.id}", partial(self._record_end, ended, now))

    def _terminate_own(self) -> None:
        """A cloud controller instance ends itself once the job's end is recorded (its
        bootstrap powers it off too; a local one ends when this process exits)."""
        own = [r.id for r in self.records.values() if self._own(r)]
        if own and self.spec.cloud != "local":
            with contextlib.suppress(Exception):
                self.provider.terminate_instances(own)

    def _monitor(self) -> tuple[str, str]:
        while True:
            t0 = self.clock.now()
            self._tick()
            ranks = {n.node_rank for n in self.spec.nodes}
            now = self.clock.now()
            self._check_failed()
            for rank, doc in sorted(self.finished.items()):
                code = doc.exit_code
                if code != 0 and rank not in self.lost:  # killed by a signal: replace the node
                    self._drop(rank, now, f"exited with signal code {code}")
            done = {r for r, d in self.finished.items() if d.exit_code == 0}
            if done >= ranks:
                return "succeeded", "every node finished"
            if done:
                if now - (self.first_done or now) >= self.spec.timing.finish_grace_s:
                    return "succeeded", f"node(s) {sorted(done)} finished"
            else:
                self._check_pending(now)
                if self.lost:
                    self._recover()
                else:
                    self._return_to_spot()
                    if not self.lost and not self.returning:
                        self._adapt()
            self.clock.sleep(self.spec.timing.check_interval_s - (self.clock.now() - t0))


_Run = JobRun  # the name tests patch
