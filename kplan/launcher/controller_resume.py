"""Restart a job's controller from its durable state (``kplan controller JOB``).

A controller (the loop of ``kplan/launcher/lifecycle.py``) may die anywhere: between the
journal's ``intent`` line and the cloud's answer, after an instance's end reached the database
but before its replacement was asked for, in the middle of a restart of every group.
:func:`resume_job` takes the job over from what survives it:

- the state database (job row, instances, ledger, events) and the launch journal
  (``created`` lines the database missed; ``intent`` lines whose instances the cloud made but
  no line recorded: they are adopted, not launched again);
- ``<job>/controller.json`` in the job's storage (kplan/launcher/controller.py): the rendezvous
  generation, the launch counts, the lost nodes already counted, when the job started; on a
  machine without the job's database, also the job's spec and instances
  (:func:`import_job`);
- the cloud itself (``query_instances``: what runs now, the head's address) and the node status
  files.

Spend is never counted twice: a ledger row is keyed by its instance, starts when that instance
was asked for and a closed row never changes, so rows rebuilt from the journal or the storage
document are the rows the dead controller kept. The job then goes on where it was: from the
start (nothing asked of the cloud yet), in provisioning (the head not up), or in the monitor
(lost nodes replaced by the recovery rules).
"""

from __future__ import annotations

import os
import re
from dataclasses import replace

from kplan.core.errors import InputError
from kplan.launcher.clock import Clock, SystemClock
from kplan.launcher.controller import ControllerDoc, read_controller, this_host
from kplan.launcher.controller_node import is_controller
from kplan.launcher.guard import Guard
from kplan.launcher.jobspec import JobSpec
from kplan.launcher.journal import Journal, JournalLog, instance_doc, instance_record
from kplan.launcher.ledger import BillingRule, Ledger, billing_for
from kplan.launcher.lifecycle import JobOutcome, JobRun, private_umask
from kplan.launcher.nodes import UNPLACED
from kplan.launcher.observe import EventSink
from kplan.launcher.provider import Instance
from kplan.launcher.providers import Backend
from kplan.launcher.snapshot import Snapshot, merge_snapshot, pull
from kplan.launcher.state import (
    GONE_STATES,
    TERMINAL_STATUSES,
    InstanceRecord,
    JobRecord,
    StateDB,
)

_NAME = re.compile(r"-n(\d+)-r(\d+)$")  # bootstrap.instance_name: <job>-n<rank>-r<k>


def resume_job(
    job_id: str,
    backend: Backend,
    db: StateDB,
    *,
    clock: Clock | None = None,
    billing: BillingRule | None = None,
    on_event: EventSink | None = None,
    journal: Journal | None = None,
    mode: str = "restarted",
    own: str | None = None,
) -> JobOutcome:
    """Take over job ``job_id`` from its durable state and run it to its end (teardown
    included, as ``run_job``). ``mode``: how this controller was started (``detached`` for
    ``kplan launch --detach``'s, ``restarted`` for ``kplan controller``); ``own``: the name of
    the controller instance this runs on (kplan/launcher/controller_node.py), if any."""
    clock = clock or SystemClock()
    journal = journal or Journal.for_job(db.path.parent, job_id)
    row = db.job(job_id)
    doc = read_controller(backend.storage, job_id)
    if row is None:
        if doc is None:
            raise InputError(
                f"no job {job_id!r} in {db.path} nor in {backend.storage.uri}",
                hint="give the job's --cloud, --region and --storage (where its controller "
                "wrote controller.json)",
            )
        row = import_job(db, doc, journal, clock, _snapshot_or_none(backend, job_id))
    if row.terminal:
        raise InputError(
            f"job {job_id} already ended ({row.status}): there is nothing to control",
            hint=f"`kplan status {job_id}` shows how it ended",
        )
    spec = JobSpec.from_dict(row.spec)
    with private_umask():
        run = _Resumed(spec, backend, db, clock, billing, on_event, journal)
        run.mode = mode
        run.own_name = own
        return run.resume(row, doc)


def import_job(
    db: StateDB,
    doc: ControllerDoc,
    journal: Journal,
    clock: Clock,
    snap: Snapshot | None = None,
) -> JobRecord:
    """The job's row, instances and ledger rebuilt on a machine without the job's database:
    from its state snapshot where there is one (the row with its plan, every ledger row of
    every kind, as the storage, disk and egress rows the guard counts, and the events), then
    from its controller document (newer: written before every request for instances), each
    instance's ledger row from its request and end as the controller that wrote them kept it."""
    spec = JobSpec.from_dict(doc.spec)
    now = clock.now()
    journal.write(
        "job",
        now,
        job=spec.job_id,
        cloud=spec.cloud,
        region=spec.region,
        storage_uri=spec.storage_uri,
        pid=os.getpid(),
    )
    merged = snap is not None and snap.job_id == spec.job_id and merge_snapshot(db, snap)
    row = db.job(spec.job_id) if merged else None
    ledger = Ledger(db, spec.job_id, billing_for(spec.cloud), spec.costs, doc.job_started_at)
    with db.transaction():
        if row is None:
            row = _row_from(doc, spec, now)
            db.create_job(row)
        known = {i.id: i for i in db.instances(spec.job_id)}
        billed = {r.instance for r in db.ledger(spec.job_id)}
        for rec in doc.instances:
            held = known.get(rec.id)
            if held is not None and not held.alive:
                continue  # seen gone in the snapshot: stays gone, its row as it was closed
            db.add_instance(rec)
            if rec.id not in billed:
                ledger.open(rec)
            if rec.ended_at is not None:
                ledger.close(rec, rec.ended_at)
        source = controller_where(doc)
        if merged and snap is not None:
            source += f" and its state snapshot {snap.seq}"
        db.add_event(
            spec.job_id,
            now,
            "controller",
            f"imported from {source}: {len(doc.instances)} instance(s)",
        )
    if doc.instances:
        journal.write("created", now, instances=[instance_doc(r) for r in doc.instances])
    return row


def _row_from(doc: ControllerDoc, spec: JobSpec, now: float) -> JobRecord:
    """The job's row from its controller document alone (no snapshot to take it from)."""
    return JobRecord(
        id=spec.job_id,
        status="running" if doc.instances else "pending",
        reason=None,
        cloud=spec.cloud,
        region=spec.region,
        spec=doc.spec,
        plan=None,
        budget_usd=spec.budget_usd,
        deadline_h=spec.deadline_h,
        predicted_hours=spec.predicted.hours,
        predicted_cost_usd=spec.predicted.cost_usd,
        predicted_cost_p90_usd=spec.predicted.cost_p90_usd,
        launcher_pid=None,
        stop_requested=None,
        created_at=doc.job_started_at,
        updated_at=now,
    )


def _snapshot_or_none(backend: Backend, job_id: str) -> Snapshot | None:
    """The job's state snapshot, if its storage holds a readable one: a damaged one does not
    stop a restart (the controller document alone rebuilds the job, as before snapshots)."""
    try:
        return pull(backend.storage, job_id)
    except (InputError, OSError):
        return None


def controller_where(doc: ControllerDoc) -> str:
    return f"the controller state of {doc.host} (pid {doc.pid})"


def _launch_index(name: str) -> tuple[int, int] | None:
    found = _NAME.search(name)
    return None if found is None else (int(found.group(1)), int(found.group(2)))


class _Resumed(JobRun):
    """The lifecycle, restored from durable state instead of created."""

    def resume(self, row: JobRecord, doc: ControllerDoc | None) -> JobOutcome:
        self.stopping = row.status == "stopping"  # what ends now is teardown's doing
        phase = self._restore(row, doc, self.journal.read())
        self.db.set_launcher(self.spec.job_id, os.getpid())
        alive = sum(1 for r in self.records.values() if r.alive)
        self._event(
            "controller",
            f"controller {self.mode} on {this_host()} (pid {os.getpid()}): {len(self.records)} "
            f"instance(s) known, {alive} alive, generation {self.generation}; resuming in "
            f"{phase}",
            {"phase": phase, "generation": self.generation, "pid": os.getpid()},
        )
        self.heartbeat()
        if row.status == "stopping":  # it died in teardown: finish that, not the job
            ended = self._stopping_as(row)
            return self.drive(lambda: ended)
        if phase == "monitor" and not self.lost and row.status in ("pending", "provisioning"):
            self._status("running")
        if phase == "start":
            return self.drive(self.start)
        if phase == "provisioning":
            return self.drive(self._provision_then_monitor)
        return self.drive(self._monitor)

    def _stopping_as(self, row: JobRecord) -> tuple[str, str]:
        """The final status a controller that died in teardown was recording (its ``stop``
        event, else its journal's ``stopping`` note), with the job's reason."""
        stops = [e for e in self.db.events(row.id) if e.kind == "stop" and e.data]
        noted = self.journal.read().stopping  # written first, before the database's records
        status = str(stops[-1].data["status"]) if stops and stops[-1].data else noted or "error"
        if status not in TERMINAL_STATUSES:
            status = "error"
        return status, row.reason or "stopped before its controller died"

    def _provision_then_monitor(self) -> tuple[str, str]:
        self._provision()
        return self._monitor()

    def _restore(self, row: JobRecord, doc: ControllerDoc | None, log: JournalLog) -> str:
        """Rebuild the run's memory; returns where it resumes: ``start``, ``provisioning`` or
        ``monitor``."""
        self._restart_clock(doc.job_started_at if doc is not None else row.created_at)
        if doc is not None:
            self.generation = doc.generation
            self.launches = dict(doc.launches)
            self.lost_nodes = doc.lost_nodes
            self.counted = set(doc.counted)
            self.replacements, self.preemptions = doc.replacements, doc.preemptions
            self.returns, self.waiting_since = doc.returns, doc.waiting_since
        self.records = {r.id: r for r in self.db.instances(self.spec.job_id)}
        for j in log.instances.values():
            rec = self.records.get(j.id)
            if rec is None:  # created, but the database write was lost
                rec = instance_record(j, self.spec.job_id, self.spec.cloud, self.spec.region)
                self._record_new(rec, end=j.gone_at, journal=False)
            elif rec.alive and j.gone_at is not None:  # seen gone, the database write lost
                ended = replace(rec, state=j.state or "terminated", ended_at=j.gone_at)
                self.records[rec.id] = ended
                self._record_end(ended, j.gone_at)
        for name in [*log.intents, *(r.name for r in self.records.values())]:
            index = _launch_index(name)
            if index is not None:
                self.launches[index[0]] = max(self.launches.get(index[0], 0), index[1] + 1)
        # a controller instance alone (kplan/launcher/controller_node.py) asked for no node yet
        nodes = [r for r in self.records.values() if not is_controller(r.node_rank)]
        self.requested = bool(nodes or any(_launch_index(n) for n in log.intents))
        if not self.requested:
            return "start"
        found = self.provider.query_instances(self.spec.job_id)
        self.listed.update(i.id for i in found)
        for inst in found:
            if inst.private_ip:
                self.ips[inst.id] = inst.private_ip
            asked_at = log.intents.get(inst.name)
            lost_line = asked_at is not None and inst.id not in self.records
            if lost_line and inst.state not in GONE_STATES and asked_at is not None:
                self._record_new(  # asked for, made, but its `created` line was lost
                    self._from_cloud(inst, asked_at), end=None, journal=True
                )
        return self._restore_ranks()

    def _restart_clock(self, started: float) -> None:
        """The guard's deadline and the adapter count from the job's start, not this one."""
        from kplan.launcher.adapt import Adapter

        s = self.spec
        self.started = started
        deadline = None if s.deadline_h is None else started + s.deadline_h * 3600
        self.guard = Guard(
            s.budget_usd, deadline, s.horizon_s, self.billing, s.costs.disk_usd_node_h
        )
        self.ledger = Ledger(self.db, s.job_id, self.billing, s.costs, started)
        self.adapter = Adapter(s, self.storage, self._event, started)

    def _restore_ranks(self) -> str:
        """Each rank's newest instance is its current one; older ones still alive are ended
        (nothing would watch them); a current one that is gone is a lost node unless its node
        finished."""
        newest: dict[int, tuple[int, float, str]] = {}
        for rec in self.records.values():
            if is_controller(rec.node_rank):
                continue  # not a node: ended by `kplan down`, or by itself with the job
            index = _launch_index(rec.name)
            key = (index[1] if index else -1, rec.launched_at, rec.id)
            if rec.node_rank not in newest or key > newest[rec.node_rank]:
                newest[rec.node_rank] = key
        self.current = {rank: key[2] for rank, key in newest.items()}
        superseded = [  # and a dead controller's instance, unless this controller runs on it
            r.id
            for r in self.records.values()
            if r.alive
            and not self._own(r)
            and (is_controller(r.node_rank) or self.current[r.node_rank] != r.id)
        ]
        if superseded:
            self.terminating.update(superseded)
            self.provider.terminate_instances(superseded)
            self._event("terminate", f"ending superseded instance(s) {', '.join(superseded)}")
        self._observe()  # what ended while no controller watched: recorded, lost if current
        now = self.clock.now()
        for rank, iid in sorted(self.current.items()):
            rec = self.records[iid]
            done = self.finished.get(rank)
            if rank in self.lost or rec.alive or (done is not None and done.exit_code == 0):
                continue
            self.lost[rank] = (rec.ended_at or now, rec.reason or "lost")
        head = self.records.get(self.current.get(0, ""))
        if head is None or (head.alive and not (head.state == "running" and self.ips.get(head.id))):
            return "provisioning"
        if head.alive:
            self.head_addr = self.ips[head.id]
        for node in self.spec.nodes:  # asked for after the head ran, never made
            if node.node_rank not in self.current:
                self.lost[node.node_rank] = (now, UNPLACED)
        return "monitor"

    def _record_new(self, rec: InstanceRecord, *, end: float | None, journal: bool) -> None:
        """An instance the database lacks: memory, the journal (``journal``: one it has no
        ``created`` line for), the database with its ledger row."""
        if end is not None:
            rec = replace(rec, ended_at=end)
        self.records[rec.id] = rec
        if journal:
            self.journal.write("created", rec.launched_at, instances=[instance_doc(rec)])
        with self.db.transaction():
            self.db.add_instance(rec)
            self.ledger.open(rec)
            if end is not None:
                self.ledger.close(rec, end)

    def _from_cloud(self, inst: Instance, asked_at: float) -> InstanceRecord:
        """An instance whose request the journal has (at ``asked_at``) but not its answer:
        priced as its rank's offer in its zone and market (else the job's dearest node)."""
        s = self.spec
        price = max((n.usd_per_hour for n in s.nodes), default=0.0)
        if inst.node_rank < len(s.nodes):
            for cand in s.candidates(s.nodes[inst.node_rank]):
                if (cand.zone, cand.market) == (inst.zone, inst.market):
                    price = cand.usd_per_hour
                    break
        return InstanceRecord(
            id=inst.id,
            job=s.job_id,
            name=inst.name,
            node_rank=inst.node_rank,
            cloud=s.cloud,
            region=s.region,
            zone=inst.zone,
            type=inst.instance_type,
            market=inst.market,
            price=price,
            state=inst.state,
            launched_at=asked_at,
            reason="adopted: its request was in the journal",
        )
