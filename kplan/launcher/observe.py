"""What a running job knows and how it learns it: instances, node status, ledger, guard.

:class:`RunState` holds a job's state during :func:`kplan.launcher.lifecycle.run_job` and
implements one monitor check (:meth:`RunState._tick`): a ``kplan down`` request, the provider's
view of the instances (state changes are recorded, the ledger rows of gone instances closed,
losses classified), the node status files, the ledger accrual and the guard.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from kplan.core.errors import CloudError, KplanError
from kplan.launcher.adapt import Adapter
from kplan.launcher.bootstrap import cluster_spec, job_key
from kplan.launcher.clock import Clock
from kplan.launcher.failure import log_tail, node_error
from kplan.launcher.guard import Guard, Running
from kplan.launcher.hardstop import write_lease
from kplan.launcher.jobspec import JobSpec
from kplan.launcher.journal import Journal, instance_doc
from kplan.launcher.ledger import BillingRule, Ledger, billing_for
from kplan.launcher.provider import Instance
from kplan.launcher.providers import Backend
from kplan.launcher.recovery import work_lost_s
from kplan.launcher.state import GONE_STATES, EventRecord, InstanceRecord, StateDB

EventSink = Callable[[EventRecord], None]
_MAX_QUERY_FAILURES = 3
CRASH_LIMIT = 3
"""A node rank whose instances fail with the same error this many times in a row fails the job
(a script that cannot start would otherwise be relaunched until ``max_replacements``)."""
COLLATERAL_WINDOW_S = 60.0
"""A node that fails within this many seconds of another node's loss (or while one is lost) is
taken as failing because of it (its rendezvous store or a peer went away mid-collective): it is
replaced, counted as a crash, instead of failing the job."""


@dataclass(frozen=True)
class NodeStatus:
    """``status/node-<rank>.json``: how a node's torchrun ended (written by the node's
    bootstrap: kplan/launcher/bootstrap.py)."""

    exit_code: int
    time: float | None = None
    node_rank: int | None = None
    instance: str | None = None  # the instance's name (None: the file does not say)

    @classmethod
    def from_json(cls, doc: object) -> NodeStatus | None:
        """The status in ``doc`` (None: not an object, or an instance name that is no text;
        ``ValueError``/``TypeError``/``KeyError``: no integer exit code)."""
        if not isinstance(doc, dict):
            return None
        code = int(doc["exit_code"])
        instance = doc.get("instance")
        if instance is not None and not isinstance(instance, str):
            return None
        when, rank = doc.get("time"), doc.get("node_rank")
        return cls(
            code,
            when if isinstance(when, int | float) else None,
            rank if isinstance(rank, int) else None,
            instance,
        )

    def to_dict(self) -> dict[str, object]:
        """The event's data: the fields the file held."""
        doc: dict[str, object] = {"exit_code": self.exit_code}
        for key, value in (
            ("time", self.time),
            ("node_rank", self.node_rank),
            ("instance", self.instance),
        ):
            if value is not None:
                doc[key] = value
        return doc


class Finish(Exception):
    """Leave the monitor: the job reached a final status (teardown follows)."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class RunState:
    """A job's state while it runs; subclassed by the lifecycle, which drives it."""

    def __init__(
        self,
        spec: JobSpec,
        backend: Backend,
        db: StateDB,
        clock: Clock,
        billing: BillingRule | None,
        on_event: EventSink | None,
        journal: Journal | None = None,
    ) -> None:
        self.spec = spec
        self.journal = journal or Journal.for_job(db.path.parent, spec.job_id)
        self.db_broken = False  # a best-effort write failed during teardown: skip the rest
        self.provider = backend.provider
        self.storage = backend.storage
        self.db = db
        self.clock = clock
        self.billing = billing or billing_for(spec.cloud)
        self.on_event = on_event
        self.cluster = cluster_spec(spec, self.storage.uri)
        self.started = clock.now()
        self.ledger = Ledger(db, spec.job_id, self.billing, spec.costs, self.started)
        deadline = None if spec.deadline_h is None else self.started + spec.deadline_h * 3600
        self.guard = Guard(
            spec.budget_usd, deadline, spec.horizon_s, self.billing, spec.costs.disk_usd_node_h
        )
        self.generation = 0
        self.head_addr: str | None = None
        self.current: dict[int, str] = {}  # node rank -> id of its newest instance
        self.records: dict[str, InstanceRecord] = {}
        self.ips: dict[str, str] = {}
        self.launches: dict[int, int] = {}  # node rank -> instances launched for it
        self.terminating: set[str] = set()
        self.lost: dict[int, tuple[float, str]] = {}  # rank -> (when, why)
        self.last_loss: tuple[int, float] | None = None  # (rank, when) of the newest loss
        self.recovering: dict[int, float] = {}  # rank -> when it was lost
        self.finished: dict[int, NodeStatus] = {}  # rank -> how its current instance ended
        self.crashes: dict[int, tuple[str, int]] = {}  # rank -> (error, failures in a row)
        self.first_done: float | None = None
        self.replacements = 0
        self.preemptions = 0
        self.stopping = False
        self.query_failures = 0
        self.listed: set[str] = set()  # ids the provider has listed at least once
        self.requested = False  # run_instances was called at least once (something may exist)
        self.lease_failing = False  # the last lease renewal failed
        # --idle-minutes: the workers' progress as last seen, and since when it has not moved
        self.progress_mark: tuple[int, int, int] | None = None
        self.progress_at = self.started
        self.adapter = Adapter(spec, self.storage, self._event, self.started)
        # The controller instance this controller runs on (kplan/launcher/controller_node.py):
        # billed and counted by the guard, but neither observed as a node nor ended by teardown.
        self.own_name: str | None = None

    def _own(self, rec: InstanceRecord | Instance) -> bool:
        return self.own_name is not None and rec.name == self.own_name

    def _event(self, kind: str, message: str, data: Mapping[str, object] | None = None) -> None:
        now = self.clock.now()
        seq = self.db.add_event(self.spec.job_id, now, kind, message, data)
        if self.on_event is not None:
            stored = None if data is None else dict(data)
            self.on_event(EventRecord(seq, self.spec.job_id, now, kind, message, stored))

    def _status(self, status: str, reason: str | None = None) -> None:
        self.db.set_status(self.spec.job_id, status, self.clock.now(), reason)

    def _live(self) -> list[Running]:
        """Each live instance with its disk, and the job's storage (kplan/launcher/ledger.py)."""
        disk, storage = self.spec.costs.disk_usd_node_h, self.spec.costs.storage_usd_h
        live = [Running(r.launched_at, r.price + disk) for r in self.records.values() if r.alive]
        return live + ([Running(self.started, storage)] if storage > 0 else [])

    def _observe(self) -> None:
        """Query the provider; record state changes, close the ledger rows of gone instances."""
        found = {i.id: i for i in self.provider.query_instances(self.spec.job_id)}
        self.listed.update(found)
        now = self.clock.now()
        self._read_status()
        for rec in list(self.records.values()):
            if not rec.alive or self._own(rec):
                continue
            inst = found.get(rec.id)
            if inst is not None and inst.private_ip:
                self.ips[rec.id] = inst.private_ip
            if inst is None and self._not_listed_yet(rec, now):
                continue
            if inst is not None and inst.state not in GONE_STATES:
                if inst.state != rec.state:
                    self.records[rec.id] = replace(rec, state=inst.state)
                    self.db.update_instance(rec.job, rec.id, inst.state)
                    self._recovered(self.records[rec.id], now)
                continue
            state = inst.state if inst is not None else "terminated"
            reason = inst.reason if inst is not None else "no longer reported by the provider"
            if rec.id in self.terminating:
                reason = reason or "terminated by kplan"
            ended = replace(rec, state=state, ended_at=now, reason=reason)
            self.records[rec.id] = ended  # memory first: teardown relies on it
            with contextlib.suppress(OSError, KplanError):
                self.journal.write("gone", now, id=rec.id, state=state)
            self._record_end(ended, now)
            self._ended(ended, now)
        for inst in found.values():  # tagged with the job but not ours: never leave it running
            if (
                inst.state not in GONE_STATES
                and inst.id not in self.records
                and not self._own(inst)
            ):
                self._adopt(inst)
                self._event("stray", f"terminating {inst.id}: not launched by this run")
                self.terminating.add(inst.id)
                self.provider.terminate_instances([inst.id])

    def _not_listed_yet(self, rec: InstanceRecord, now: float) -> bool:
        """A new instance the provider does not list yet (AWS's describe is eventually
        consistent): not gone until it was listed once or ``provision_timeout_s`` passed."""
        return (
            rec.id not in self.listed
            and now - rec.launched_at < self.spec.timing.provision_timeout_s
        )

    def _read_status(self) -> None:
        """New ``status/node-<rank>.json`` files of the ranks' current instances."""
        prefix = job_key(self.spec.job_id, "status/")
        for key in self.storage.list_keys(prefix):
            name = key.rsplit("/", 1)[-1]
            if not (name.startswith("node-") and name.endswith(".json")):
                continue
            try:
                rank = int(name[5:-5])
                if rank in self.finished or rank not in self.current:
                    continue
                data = self.storage.get_bytes(key)
                status = NodeStatus.from_json(json.loads(data)) if data else None
            except (ValueError, TypeError, KeyError, json.JSONDecodeError):
                continue  # being written, or not ours: read again next check
            if status is None:
                continue
            current = self.records[self.current[rank]].name
            if status.instance is not None and status.instance != current:
                continue  # a late write of an instance this rank no longer runs on
            self.finished[rank] = status
            code = status.exit_code
            told = status.to_dict()
            if code != 0:  # the script's last lines in its log, for `kplan status --json`
                tail = log_tail(self.storage, self.spec.job_id, rank, script_only=True)
                told = {**told, "log_tail": tail}
            self._event("node-exit", f"node {rank} exited with code {code}", told)
            if code == 0 and self.first_done is None:
                self.first_done = self.clock.now()

    def _record_end(self, ended: InstanceRecord, end: float) -> None:
        """Write an instance's end (state, time, reason) and close its ledger row, together."""
        with self.db.transaction():
            self.db.update_instance(
                ended.job, ended.id, ended.state, ended_at=end, reason=ended.reason
            )
            self.ledger.close(ended, end)

    def _ended(self, rec: InstanceRecord, now: float) -> None:
        if self.stopping or rec.id in self.terminating:
            return
        if self.current.get(rec.node_rank) != rec.id:
            return
        status = self.finished.get(rec.node_rank)
        if status is not None and (status.exit_code == 0 or rec.state != "preempted"):
            return  # it finished (exit 0), or its exit code decides (in the monitor)
        kind = "preempted" if rec.state == "preempted" else "lost"
        if kind == "preempted":
            self.preemptions += 1
            self.crashes.pop(rec.node_rank, None)
        elif _crashed(rec.reason):
            self._crash(rec.node_rank, rec.reason or "exited")
        self.lost[rec.node_rank] = (now, rec.reason or kind)
        self.last_loss = (rec.node_rank, now)
        self._event(
            kind,
            f"node {rec.node_rank}: {rec.id} {kind} ({rec.reason or 'no reason given'})",
            {"instance": rec.id, "node_rank": rec.node_rank, "reason": rec.reason},
        )

    def _crash(self, rank: int, why: str) -> None:
        """Count a failure of ``rank``'s instance (it ended by itself with an error, not by a
        preemption): the same error as the last one (its log's error line, else ``why``) makes
        one more in a row. The job fails at :data:`CRASH_LIMIT` in a row (``_check_crashes``);
        until then its status reads ``recovering (restarting node R (n/N): <error>)``."""
        error = node_error(self.storage, self.spec.job_id, rank) or why
        last, count = self.crashes.get(rank, ("", 0))
        count = count + 1 if error == last else 1
        self.crashes[rank] = (error, count)
        if count < CRASH_LIMIT:
            self._status("recovering", f"restarting node {rank} ({count}/{CRASH_LIMIT}): {error}")

    def _check_crashes(self) -> None:
        """Fail the job once a rank failed :data:`CRASH_LIMIT` times in a row the same way."""
        for rank, (error, count) in sorted(self.crashes.items()):
            if count >= CRASH_LIMIT:
                raise Finish("failed", f"node {rank} failed {count} times in a row: {error}")

    def failure_reason(self, rank: int, code: int) -> str:
        """``node R exited with code C: <the error line of its log>``."""
        error = node_error(self.storage, self.spec.job_id, rank)
        return f"node {rank} exited with code {code}" + (f": {error}" if error else "")

    def _recovered(self, rec: InstanceRecord, now: float) -> None:
        lost_at = self.recovering.get(rec.node_rank)
        if rec.state != "running" or lost_at is None or self.current.get(rec.node_rank) != rec.id:
            return
        del self.recovering[rec.node_rank]
        lost_work = work_lost_s(self.storage, self.spec.job_id, lost_at)
        self._event(
            "recovered",
            f"node {rec.node_rank} back on {rec.id} after {now - lost_at:.0f} s",
            {"node_rank": rec.node_rank, "downtime_s": now - lost_at, "work_lost_s": lost_work},
        )

    def _tick(self) -> None:
        """One check: stop request, instances, node status, ledger, guard."""
        job = self.db.job(self.spec.job_id)
        if job is not None and job.stop_requested:
            raise Finish("cancelled", job.stop_requested)
        try:
            self._observe()
            self.query_failures = 0
        except CloudError as err:  # the provider already retried; give it a few ticks
            self.query_failures += 1
            self._event("query-failed", err.message)
            if self.query_failures >= _MAX_QUERY_FAILURES:
                raise
        now = self.clock.now()
        self.ledger.accrue([r for r in self.records.values() if r.alive], now)
        decision = self.guard.check(self.ledger.closed_spend(), self._live(), now)
        if decision.stop:
            self._event("guard", decision.message, {"projected_usd": decision.projected_usd})
            raise Finish("stopped", decision.reason or "budget")
        self.ledger.record_egress(now)  # the guard counted it: the budget pays it
        self._check_idle(now)
        self.renew_lease()

    def _check_idle(self, now: float) -> None:
        """``--idle-minutes``: end the cluster when a node finished that long ago while the
        rest run on, or when the workers' step records stopped coming for that long.

        Progress is rank 0's step records as the adaptation loop reads them (its view, one
        monitor check late at most). The clock starts at the first step record and restarts at
        every new one and every cluster change (a lost node, a replacement, a new generation):
        bootstrapping and recovering are not idleness. A job that writes no step records (a
        script without the kplan runtime) is never idle by this rule; it ends when it
        finishes."""
        idle_s = self.spec.timing.idle_s
        if idle_s is None:
            return
        if self.first_done is not None and now - self.first_done >= idle_s:
            done = sorted(r for r, d in self.finished.items() if d.exit_code == 0)
            waited = f"{(now - self.first_done) / 60:.0f} min"
            raise Finish("succeeded", f"node(s) {done} finished; the rest ended after {waited}")
        view = self.adapter.obs.view
        mark = (self.generation, view.steps_in_generation, view.step)
        if mark != self.progress_mark or self.lost or self.recovering or view.step < 0:
            self.progress_mark, self.progress_at = mark, now
            return
        quiet = now - self.progress_at
        if quiet >= idle_s:
            minutes = quiet / 60
            message = f"no step record for {minutes:.0f} min (--idle-minutes {idle_s / 60:g})"
            self._event("idle", f"ending the cluster: {message}", {"idle_s": quiet})
            raise Finish("stopped", f"idle: {message}")

    def renew_lease(self) -> None:
        """Renew the nodes' lease (kplan/launcher/hardstop.py); a failed write is an event
        (once per run of failures): the nodes end themselves if it fails for a lease period."""
        try:
            write_lease(self.storage, self.spec, self.clock.now())
            self.lease_failing = False
        except (OSError, KplanError) as err:
            if not self.lease_failing:
                self.lease_failing = True
                with contextlib.suppress(OSError, KplanError):
                    self._event("lease", f"could not renew the nodes' lease: {err}")

    def _adopt(self, inst: Instance) -> None:
        """Record a live instance carrying the job's tag that this run does not know."""
        if inst.id in self.records:
            return
        price = max((n.usd_per_hour for n in self.spec.nodes), default=0.0)
        rec = InstanceRecord(
            id=inst.id,
            job=self.spec.job_id,
            name=inst.name,
            node_rank=inst.node_rank,
            cloud=self.spec.cloud,
            region=self.spec.region,
            zone=inst.zone,
            type=inst.instance_type,
            market=inst.market,
            price=price,
            state=inst.state,
            launched_at=min(inst.launched_at or self.started, self.clock.now()),
        )
        self.records[rec.id] = rec  # memory first, then the journal, then the database
        self.journal.write("created", self.clock.now(), instances=[instance_doc(rec)])
        with self.db.transaction():
            self.db.add_instance(rec)
            self.ledger.open(rec)


def _crashed(reason: str | None) -> bool:
    """Whether an instance's end reason says its bootstrap failed (``exited N``, N not 0): an
    error of the node's own, not a preemption, a termination or a vanished machine."""
    return reason is not None and reason.startswith("exited ") and reason != "exited 0"
