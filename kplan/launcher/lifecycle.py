"""A job from request to teardown: provision, monitor, recover, guard, account, tear down.

``run_job`` is the whole lifecycle (see ``kplan/launcher/LIFECYCLE.md``). The state database records
every step as it happens, so ``kplan status`` and ``kplan down`` work from another process and
after the launcher died. Teardown always runs (``finally``); a teardown that fails raises a
``CloudError`` that names the instances left and the command that finishes the job.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial

from kplan.core.errors import CapacityError, CloudError, KplanError
from kplan.launcher.bootstrap import (
    CODE_KEY,
    Rendezvous,
    instance_name,
    instance_spec,
    job_key,
    rendezvous,
    status_key,
)
from kplan.launcher.clock import Clock, SystemClock
from kplan.launcher.jobspec import JobSpec, NodeSpec, place
from kplan.launcher.journal import Journal, instance_doc
from kplan.launcher.ledger import BillingRule
from kplan.launcher.observe import COLLATERAL_WINDOW_S, EventSink, Finish, RunState
from kplan.launcher.provider import Instance
from kplan.launcher.providers import Backend
from kplan.launcher.state import (
    GONE_STATES,
    InstanceRecord,
    JobRecord,
    StateDB,
    StateWriteError,
)

_SIGNAL_EXIT = 128  # exit codes >= this (or < 0): killed by a signal, not a failing script
_UNPLACED = "launch failed"  # a rank of a (re)start that found no capacity: not a lost node


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
) -> JobOutcome:
    """Run ``spec`` to its end; never returns with an instance it created still alive.

    ``journal``: where instance ids are written before the database (default
    ``<db folder>/journal/<job>.jsonl``). Files the job creates are ``0600`` (umask 077 while
    it runs)."""
    journal = journal or Journal.for_job(db.path.parent, spec.job_id)
    with _private_umask():
        return _Run(spec, backend, db, clock or SystemClock(), billing, on_event, journal).run()


@contextmanager
def _private_umask() -> Iterator[None]:
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


# What a best-effort record in the stop path may raise: the database or the disk failing.
_RECORD_ERRORS = (KplanError, sqlite3.Error, OSError)


class _Run(RunState):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.lost_nodes = 0  # nodes lost (preempted, gone, never booted): max_replacements
        self.counted: set[tuple[int, float]] = set()  # (rank, lost at) already counted
        self.waiting_since: float | None = None  # no capacity in the region since then
        self.returning: dict[int, str] = {}  # rank -> spot instance taking over from on demand
        self.last_probe: float | None = None  # last try to bring on-demand fallbacks back
        self.returns = 0  # nodes brought back from on demand to spot
        self.refusals: list[CloudError] = []  # why the last _launch_rank found no place

    def _create(self) -> None:
        s = self.spec
        now = self.clock.now()
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
                predicted_hours=s.predicted_hours,
                predicted_cost_usd=s.predicted_cost_usd,
                predicted_cost_p90_usd=s.predicted_cost_p90_usd,
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
        for note in s.price_notes:
            self._event("price", note)

    # --- the lifecycle ------------------------------------------------------------------------

    def run(self) -> JobOutcome:
        self._create()  # if this fails nothing exists yet: the error is the outcome
        status, reason = "error", "launcher error"
        error: BaseException | None = None
        try:
            # The guard agrees before anything is uploaded or created.
            self._afford([n.usd_per_hour for n in self.spec.nodes], "the cluster")
            self._prepare()
            self._provision()
            status, reason = self._monitor()
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
        self._settle_records()
        recorded = self._safe("final status", lambda: self._status(status, reason))
        spend = self._spend()
        self._safe(
            "final event",
            lambda: self._event(
                status, f"{status}: {reason}; spent ${spend:,.4f}", {"spend_usd": spend}
            ),
        )
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

    # --- best-effort records (the stop path) ----------------------------------------------------

    def _safe(self, what: str, write: Callable[[], object]) -> bool:
        """Run a database write; on failure note it in the journal and skip further writes
        until the end of teardown (each may wait for a lock), instead of raising."""
        if self.db_broken:
            return False
        try:
            write()
            return True
        except _RECORD_ERRORS as err:
            self.db_broken = True
            self._journal_safe("note", what=f"not recorded: {what}", error=str(err))
            return False

    def _journal_safe(self, kind: str, **data: object) -> None:
        # The journal is a second record; the instances are ended regardless.
        with contextlib.suppress(*_RECORD_ERRORS):
            self.journal.write(kind, self.clock.now(), **data)

    def _spend(self) -> float:
        try:
            return self.ledger.spend()
        except _RECORD_ERRORS:
            return 0.0

    def _settle_records(self) -> None:
        """Record the end of every instance that teardown saw gone (rows a failed write left)."""
        for rec in list(self.records.values()):
            if not rec.alive and rec.ended_at is not None:
                self._safe(f"end of {rec.id}", partial(self._record_end, rec, rec.ended_at))

    def _teardown_always(self, status: str, reason: str) -> CloudError | None:
        """Teardown, retried if a Ctrl-C lands in it; returns its failure instead of raising."""
        self._journal_safe("note", what=f"stopping: {status} ({reason})")
        for _ in range(3):
            try:
                self._teardown(status, reason)
                return None
            except KeyboardInterrupt:
                continue  # the first signal only: the handler ignores later ones
            except CloudError as err:
                return err
        return CloudError(
            f"job {self.spec.job_id}: teardown was interrupted",
            hint=f"run `kplan down {self.spec.job_id}`",
        )

    def _prepare(self) -> None:
        if self.spec.cloud != "local":
            from pathlib import Path

            from kplan.launcher.packing import pack_code

            code = pack_code(Path(self.spec.script))
            self.storage.put_bytes(job_key(self.spec.job_id, CODE_KEY), code.data)
            self._event(
                "code",
                f"uploaded the code: {len(code.files):,} file(s), {code.total_bytes:,} bytes "
                f"({code.archive_bytes:,} packed); left out {len(code.skipped_secrets)} "
                "secret-looking path(s)",
                {"files": len(code.files), "skipped_secrets": list(code.skipped_secrets)},
            )
            from kplan.launcher.bootstrap import ship_wheel

            shipped = ship_wheel(self.spec, self.storage)  # the kplan the nodes install
            if shipped is not None:
                self._event("code", shipped)
        self.storage.delete_prefix(job_key(self.spec.job_id, "status/"))
        self.provider.prepare(self.cluster)
        self._event("prepare", f"prepared {place(self.spec.cloud, self.spec.region)}")

    def _rdzv(self, head: bool) -> Rendezvous:
        return rendezvous(self.spec, self.generation, None if head else self.head_addr)

    def _launch(self, nodes: Sequence[NodeSpec]) -> list[InstanceRecord]:
        """Request ``nodes`` in one call and record them (ledger rows open at request time)."""
        specs = []
        for node in nodes:
            rank = node.node_rank
            k = self.launches.get(rank, 0)
            self.launches[rank] = k + 1
            name = instance_name(self.spec.job_id, rank, k)
            self.storage.delete_prefix(status_key(self.spec.job_id, rank))
            self.finished.pop(rank, None)
            rdzv = self._rdzv(rank == 0)
            specs.append(instance_spec(self.spec, node, name, rdzv, self.storage.uri))
        t_req = self.clock.now()
        # The journal knows what is about to exist before the cloud does (raises: no launch).
        self.journal.write(
            "intent",
            t_req,
            names=[i.name for i in specs],
            node_ranks=[n.node_rank for n in nodes],
        )
        self.requested = True
        created = self.provider.run_instances(self.cluster, specs)
        # In memory first: teardown finds these whatever fails next.
        by_spec = {i.name: n for i, n in zip(specs, nodes, strict=True)}
        fallback = max((n.usd_per_hour for n in self.spec.nodes), default=0.0)
        made: dict[str, InstanceRecord] = {}
        for inst in created:
            asked = by_spec.get(inst.name)
            rec = InstanceRecord(
                id=inst.id,
                job=self.spec.job_id,
                name=inst.name,
                node_rank=inst.node_rank if asked is None else asked.node_rank,
                cloud=self.spec.cloud,
                region=self.spec.region,
                zone=inst.zone or (asked.zone if asked else ""),
                type=inst.instance_type if asked is None else asked.instance_type,
                market=inst.market if asked is None else asked.market,
                price=fallback if asked is None else asked.usd_per_hour,
                state=inst.state,
                launched_at=t_req,
            )
            self.records[rec.id] = rec
            made[rec.name] = rec
            if asked is not None:
                self.current[asked.node_rank] = rec.id
            if inst.private_ip:
                self.ips[rec.id] = inst.private_ip
        self.journal.write("created", t_req, instances=[instance_doc(r) for r in made.values()])
        for rec in made.values():
            with self.db.transaction():
                self.db.add_instance(rec)
                self.ledger.open(rec)
        out = []
        for ispec, node in zip(specs, nodes, strict=True):
            got = made.get(ispec.name)
            if got is None:
                raise CloudError(
                    f"the provider returned no instance named {ispec.name}",
                    hint=f"run `kplan down {self.spec.job_id}` to remove what was created",
                )
            self._event(
                "launch",
                f"node {node.node_rank}: {got.id} {node.instance_type} {node.market} "
                f"{got.zone} ${node.usd_per_hour:.4f}/h",
                {"instance": got.id, "name": got.name, "node_rank": node.node_rank},
            )
            out.append(got)
        return out

    def _afford(self, prices: Sequence[float], what: str) -> None:
        """Stop (budget/deadline) unless launching instances at ``prices`` stays in bounds."""
        decision = self.guard.check(
            self.ledger.closed_spend(), self._live(), self.clock.now(), prices
        )
        if decision.stop:
            self._event("guard", f"not launching {what}: {decision.message}")
            raise Finish("stopped", decision.reason or "budget")

    def _launch_rank(self, node: NodeSpec, *, quiet: bool = False) -> InstanceRecord | None:
        """Launch one node: its zone first, then other zones, then on-demand (if allowed).
        ``quiet``: no event per refused try (the retries of a wait for capacity)."""
        self.refusals = []
        for cand in self.spec.candidates(node):
            self._afford([cand.usd_per_hour], f"node {node.node_rank}")
            try:
                return self._launch([cand])[0]
            except CloudError as err:
                self.refusals.append(err)
                if not quiet:
                    self._event(
                        "launch-failed",
                        f"node {node.node_rank} in {cand.zone} ({cand.market}): {err.message}",
                    )
        return None

    def _provision(self) -> None:
        """The head first (its private IP is the rendezvous address), then the rest."""
        self._status("provisioning")
        nodes = self.spec.nodes
        self._afford([n.usd_per_hour for n in nodes], "the cluster")
        self.head_addr = None
        while self.head_addr is None:
            head_id = self.current.get(0)
            head_gone = head_id is None or not self.records[head_id].alive
            self._check_failed()  # a head whose script failed while it booted fails the job
            if head_gone:
                self._check_losses()  # a head lost while it booted is a lost node too
                if self._launch_rank(nodes[0]) is None:
                    refused = self.refusals
                    if self.generation == 0 and not any(
                        isinstance(e, CapacityError) for e in refused
                    ):  # the first start, refused for another reason than capacity: say why
                        why = f": {refused[-1].message}" if refused else ""
                        raise CloudError(
                            f"no zone could launch the head node{why}",
                            hint="try another region or type",
                        )
                    # Wait for capacity (RecoveryPolicy), the first start included.
                    self._no_capacity([0], "provisioning" if self.generation == 0 else None)
                    self._tick()
                    self.clock.sleep(self.spec.check_interval_s)
                    continue
                self._capacity_back()
            rec = self.records[self.current[0]]
            if self.clock.now() - rec.launched_at > self.spec.provision_timeout_s:
                raise CloudError(
                    f"the head node is not running after {self.spec.provision_timeout_s:.0f} s",
                    hint="the cloud may lack capacity; try another zone, type or market",
                )
            self._tick()
            rec = self.records[self.current[0]]
            if rec.state == "running" and self.ips.get(rec.id):
                self.head_addr = self.ips[rec.id]
            else:
                self.clock.sleep(min(self.spec.check_interval_s, 5.0))
        self.lost.pop(0, None)
        self._event("head", f"head node running at {self.head_addr}")
        rest = list(nodes[1:])
        if rest:
            self._afford([n.usd_per_hour for n in rest], "the other nodes")
            try:
                self._launch(rest)
            except CloudError as err:
                self._event("launch-failed", f"nodes 1-{len(nodes) - 1}: {err.message}")
                now = self.clock.now()
                for node in rest:
                    self.lost.setdefault(node.node_rank, (now, _UNPLACED))
        self._status("running")

    # --- monitoring ---------------------------------------------------------------------------

    def _monitor(self) -> tuple[str, str]:
        while True:
            t0 = self.clock.now()
            self._tick()
            ranks = {n.node_rank for n in self.spec.nodes}
            now = self.clock.now()
            self._check_failed()
            for rank, doc in sorted(self.finished.items()):
                code = int(doc.get("exit_code", 1))
                if code != 0 and rank not in self.lost:  # killed by a signal: replace the node
                    self._drop(rank, now, f"exited with signal code {code}")
            done = {r for r, d in self.finished.items() if d.get("exit_code") == 0}
            if done >= ranks:
                return "succeeded", "every node finished"
            if done:
                if now - (self.first_done or now) >= self.spec.finish_grace_s:
                    return "succeeded", f"node(s) {sorted(done)} finished"
            else:
                self._check_pending(now)
                if self.lost:
                    self._recover()
                else:
                    self._return_to_spot()
                    if not self.lost and not self.returning:
                        self._adapt()
            self.clock.sleep(self.spec.check_interval_s - (self.clock.now() - t0))

    def _check_failed(self) -> None:
        """A node whose status says 1..127 (the script failed; torchrun gave up on it) fails the
        job, with the error line of the node's log in the reason; unless another node was lost
        at about the same time (``_collateral``): then it is replaced and counted as a crash."""
        for rank, doc in sorted(self.finished.items()):
            code = int(doc.get("exit_code", 1))
            if not 0 < code < _SIGNAL_EXIT or rank in self.lost:
                continue
            reason = self.failure_reason(rank, code)
            other = self._collateral(rank)
            if other is None:
                raise Finish("failed", reason)
            self._crash(rank, reason)
            self._check_crashes()
            self._drop(rank, self.clock.now(), f"{reason} (after node {other} was lost)")

    def _collateral(self, rank: int) -> int | None:
        """Another node lost now or within ``COLLATERAL_WINDOW_S``: a node whose workers lose
        their rendezvous store (the head) or a peer mid-collective exits with an error (e.g.
        RendezvousConnectionError), which is that loss's doing, not the script's."""
        for other in sorted(self.lost):
            if other != rank:
                return other
        if self.last_loss is not None:
            other, when = self.last_loss
            if other != rank and self.clock.now() - when <= COLLATERAL_WINDOW_S:
                return other
        return None

    def _drop(self, rank: int, now: float, why: str) -> None:
        """Give up on a rank's current instance (terminate it if alive) and mark it lost."""
        iid = self.current.get(rank)
        if iid is not None and self.records[iid].alive and iid not in self.terminating:
            self.terminating.add(iid)
            self.provider.terminate_instances([iid])
        self.lost[rank] = (now, why)
        self._event("lost", f"node {rank}: {why}", {"node_rank": rank, "instance": iid})

    def _check_pending(self, now: float) -> None:
        for rank, iid in self.current.items():
            rec = self.records[iid]
            if rec.state == "pending" and now - rec.launched_at > self.spec.provision_timeout_s:
                self._drop(rank, now, f"not running after {self.spec.provision_timeout_s:.0f} s")

    def _count_losses(self) -> None:
        """Count each lost node once (a rank that found no capacity at a restart is not one)."""
        for rank, (lost_at, why) in self.lost.items():
            if why != _UNPLACED and (rank, lost_at) not in self.counted:
                self.counted.add((rank, lost_at))
                self.lost_nodes += 1

    def _check_losses(self) -> None:
        self._check_crashes()
        self._count_losses()
        if self.lost_nodes > self.spec.max_replacements:
            raise Finish(
                "failed",
                f"{self.lost_nodes} lost nodes exceed max_replacements "
                f"{self.spec.max_replacements}",
            )

    def _recover(self) -> None:
        """Replace lost nodes (kplan/planner/spot.py, RecoveryPolicy): own zone, else another zone
        of the region, else on demand (``allow_on_demand``); with no capacity anywhere, wait
        up to ``capacity_wait_s``; more than ``max_replacements`` lost nodes fail the job."""
        self._check_losses()
        for rank in sorted(self.lost):  # a spot node already launched to take over: use it
            self._take_over(rank)
        if 0 in self.lost:
            self._status("recovering")
            self._restart_all()
        elif self.lost:
            if self.waiting_since is None:
                self._status("recovering")
            waiting = []
            for rank in sorted(self.lost):
                lost_at, _ = self.lost[rank]
                self.recovering.setdefault(rank, lost_at)
                if self._launch_rank(self.spec.nodes[rank], quiet=self.waiting_since is not None):
                    self.replacements += 1
                    del self.lost[rank]
                else:
                    waiting.append(rank)
            if waiting:
                self._no_capacity(waiting)
            else:
                self._capacity_back()
        if not self.lost:
            self._status("running")

    def _markets(self) -> str:
        return "spot, on demand" if self.spec.allow_on_demand else "spot"

    def _no_capacity(self, ranks: Sequence[int], status: str | None = None) -> None:
        """No zone (nor on demand, when allowed) could take ``ranks``: wait for capacity up to
        ``capacity_wait_s`` (the surviving nodes stay up, billed, under the guard), then fail."""
        now = self.clock.now()
        where = f"any zone of {self.spec.region} ({self._markets()})"
        if self.waiting_since is None:
            self.waiting_since = now
            why = f"waiting for capacity: no capacity for node(s) {list(ranks)} in {where}"
            self._status(status or "recovering", why)
            self._event(
                "waiting",
                f"{why}; retrying every {self.spec.check_interval_s:g} s for up to "
                f"{self.spec.capacity_wait_s:g} s",
                {"node_ranks": list(ranks), "capacity_wait_s": self.spec.capacity_wait_s},
            )
        waited = now - self.waiting_since
        if waited > self.spec.capacity_wait_s:
            raise Finish(
                "failed",
                f"no capacity for node(s) {list(ranks)} in {where} for {waited:.0f} s "
                f"(capacity_wait_s {self.spec.capacity_wait_s:g})",
            )

    def _capacity_back(self) -> None:
        if self.waiting_since is not None:
            waited = self.clock.now() - self.waiting_since
            self.waiting_since = None
            self._event(
                "capacity",
                f"capacity is back after {waited:.0f} s of waiting",
                {"waited_s": waited},
            )

    def _restart_all(self) -> None:
        """The head (and the rendezvous store) is gone: stop every group, start a generation."""
        lost_at = min(t for t, _ in self.lost.values())
        self._stop_all("head lost: restarting all nodes")
        self.replacements += len(self.lost)
        self.lost.clear()
        self.generation += 1
        for node in self.spec.nodes:
            self.recovering.setdefault(node.node_rank, lost_at)
        self._provision()

    # --- back to spot -------------------------------------------------------------------------

    def _fallbacks(self) -> list[int]:
        """Ranks planned on spot that run on demand now (a fallback with ``allow_on_demand``)."""
        out = []
        for node in self.spec.nodes:
            iid = self.current.get(node.node_rank)
            rec = None if iid is None else self.records[iid]
            fallback = rec is not None and rec.alive and rec.market == "on-demand"
            if node.market == "spot" and fallback:
                out.append(node.node_rank)
        return out

    def _return_to_spot(self) -> None:
        """Bring on-demand fallbacks back to spot when spot capacity returns.

        Every ``spot_probe_interval_s`` (default: every monitor tick) a spot launch is tried
        for each fallback rank (its zone first, then the region's other zones). A worker
        rank's spot instance takes over once it runs: the on-demand one is terminated the way
        a replacement works (its workers get SIGTERM and checkpoint; torchrun restarts the
        group with the spot node). The head holds the rendezvous store: once a spot launch
        for it succeeds (the probe instance is let go at once), every group restarts on a new
        generation with the head on spot. Not a lost node: ``max_replacements`` is untouched."""
        self._watch_returning()
        ranks = [r for r in self._fallbacks() if r not in self.returning]
        if not ranks:
            return
        now = self.clock.now()
        every = self.spec.spot_probe_interval_s or self.spec.check_interval_s
        if self.last_probe is not None and now - self.last_probe < every - 1e-9:
            return
        self.last_probe = now
        for rank in ranks:
            if rank == 0:
                if self._probe_head():
                    return
                continue
            old = self.current[rank]
            got = self._launch_spot(rank)
            if got is not None:
                self.current[rank] = old  # the on-demand node runs until the spot one does
                self.returning[rank] = got.id
                self._watch_returning()

    def _launch_spot(self, rank: int) -> InstanceRecord | None:
        """A spot instance for ``rank`` where the plan allows it, if the guard and the cloud
        agree; a refusal of either leaves the job as it is (no event for a failed probe)."""
        node = self.spec.nodes[rank]
        for cand in self.spec.candidates(node):
            if cand.market != "spot":
                continue
            decision = self.guard.check(
                self.ledger.closed_spend(), self._live(), self.clock.now(), [cand.usd_per_hour]
            )
            if decision.stop:
                return None  # the overlap would not fit the budget: stay on demand
            try:
                return self._launch([cand])[0]
            except CloudError:
                continue
        return None

    def _watch_returning(self) -> None:
        """Switch a rank to its spot instance once it runs; forget one that did not make it."""
        now = self.clock.now()
        for rank, iid in list(self.returning.items()):
            rec = self.records[iid]
            old = self.current.get(rank)
            if not rec.alive:
                del self.returning[rank]
                self._event("spot-return-failed", f"node {rank}: {iid} {rec.state} before use")
            elif rec.state == "pending" and now - rec.launched_at > self.spec.provision_timeout_s:
                del self.returning[rank]
                self.terminating.add(iid)
                self.provider.terminate_instances([iid])
                self._event("spot-return-failed", f"node {rank}: {iid} did not start")
            elif rec.state == "running" and old is not None and old != iid:
                del self.returning[rank]
                self.current[rank] = iid
                if self.records[old].alive:
                    self.terminating.add(old)
                    self.provider.terminate_instances([old])  # SIGTERM: its workers checkpoint
                self.returns += 1
                self._event(
                    "spot-return",
                    f"node {rank} returned to spot: {iid} {rec.zone} ${rec.price:.4f}/h; "
                    f"on-demand {old} stopped",
                    {"node_rank": rank, "instance": iid, "on_demand": old},
                )

    def _take_over(self, rank: int) -> None:
        """A lost rank whose spot instance was already launched (to return to spot) uses it."""
        iid = self.returning.pop(rank, None)
        if iid is None:
            return
        if self.records[iid].alive:
            lost_at, _ = self.lost.pop(rank)
            self.current[rank] = iid
            self.recovering.setdefault(rank, lost_at)
            self.replacements += 1
            self._event("launch", f"node {rank}: replaced by {iid}, launched to return to spot")

    def _probe_head(self) -> bool:
        """The head on demand: restart every group with a spot head once spot capacity is back
        (a spot launch succeeds; that probe instance is terminated at once, unused)."""
        probe = self._launch_spot(0)
        if probe is None:
            return False
        old = self.current[0]
        self.current[0] = old
        self.terminating.add(probe.id)
        self.provider.terminate_instances([probe.id])
        self._event("spot-return", f"node 0: spot capacity is back ({probe.zone}); restarting")
        self._stop_all("head returning to spot: restarting all nodes")
        self.generation += 1
        self._provision()
        self.returns += 1
        return True

    def _stop_all(self, why: str) -> None:
        """SIGTERM every live instance (the workers checkpoint) and wait until all are gone."""
        alive = [r.id for r in self.records.values() if r.alive]
        self._event("restart", f"{why} ({len(alive)} still alive)")
        if alive:
            self.terminating.update(alive)
            self.provider.terminate_instances(alive)
        limit = self.clock.now() + self.spec.grace_s + self.spec.teardown_s
        if alive:
            self._tick()  # look once even with no grace: a cloud may end them at once
        while any(self.records[i].alive for i in alive) and self.clock.now() < limit:
            self.clock.sleep(min(self.spec.check_interval_s, 5.0))
            self._tick()
        left = [i for i in alive if self.records[i].alive]
        if left:
            raise CloudError(
                f"instances {', '.join(left)} did not terminate for a restart",
                hint=f"run `kplan down {self.spec.job_id}`",
            )

    # --- adaptation ---------------------------------------------------------------------------

    def _adapt(self) -> None:
        """One adaptation check (kplan/launcher/adapt.py), and the change it asks for."""
        now = self.clock.now()
        action = self.adapter.tick(now, self.ledger.spend(), self._usd_per_hour())
        if action is None:
            return
        if action.kind == "stop":
            raise Finish("stopped", f"policy {action.source}: {action.reason}")
        if action.kind == "batch" and action.global_batch is not None:
            self._event(
                "batch",
                f"global batch -> {action.global_batch} ({action.source}: {action.reason})",
                {"global_batch": action.global_batch, "source": action.source},
            )
            self.adapter.changed(action, now, self.generation, len(self.spec.nodes))
            self.adapter.tick(now, self.ledger.spend(), self._usd_per_hour())  # write it now
        elif action.kind == "replace" and action.node_rank is not None:
            self._drop(action.node_rank, now, f"replaced ({action.source}: {action.reason})")
            self.adapter.changed(action, now, self.generation, len(self.spec.nodes))
        elif action.kind == "resize" and action.nodes is not None:
            why = f"{action.source}: {action.reason}"
            if self._resize(action.nodes, action.global_batch, why):
                self.adapter.changed(
                    action, self.clock.now(), self.generation, len(self.spec.nodes)
                )

    def _usd_per_hour(self) -> float:
        return sum(r.price for r in self.records.values() if r.alive)

    def _resize(self, nodes: int, global_batch: int | None, why: str) -> bool:
        """A checkpointed restart on ``nodes`` nodes of the job's first node type.

        Refused (False, the job goes on as it is) when the budget guard would not let the new
        cluster start while the old one is still billed until it is gone. Otherwise the workers
        checkpoint on SIGTERM and the new generation resumes at the step where the old one
        stopped."""
        old = len(self.spec.nodes)
        template = self.spec.nodes[0]
        new_nodes = tuple(replace(template, node_rank=r) for r in range(nodes))
        batch = global_batch or self.adapter.obs.view.global_batch or self.spec.global_batch
        decision = self.guard.check(
            self.ledger.closed_spend(),
            self._live(),
            self.clock.now(),
            [n.usd_per_hour for n in new_nodes],
        )
        if decision.stop:
            self._event(
                "resize-refused",
                f"not resizing {old} -> {nodes} node(s) ({why}): {decision.message}",
                {"nodes": nodes, "projected_usd": decision.projected_usd},
            )
            return False
        self._event(
            "resize",
            f"resizing {old} -> {nodes} node(s), global batch {batch}: {why}",
            {"from_nodes": old, "nodes": nodes, "global_batch": batch},
        )
        self._status("resizing")
        self._stop_all(f"resize to {nodes} node(s)")
        for rank in list(self.current):
            if rank >= nodes:
                del self.current[rank]
        self.finished.clear()
        self.first_done = None
        self.spec = replace(self.spec, nodes=new_nodes, global_batch=batch)
        stored = replace(self.spec, storage_uri=self.storage.uri).to_dict()
        self.db.update_spec(self.spec.job_id, stored)
        self.generation += 1
        self._provision()
        return True

    # --- teardown -----------------------------------------------------------------------------

    def _teardown(self, status: str, reason: str) -> None:
        """Terminate everything of the job (known in memory, and by tag) and see it gone.

        Terminate calls come first and never wait on the database: what teardown records
        (instance ends, ledger rows, events) is best-effort, and the end of each instance is
        kept in memory and in the journal for :meth:`_settle_records` and ``kplan down``."""
        job_id = self.spec.job_id
        poll = min(self.spec.check_interval_s, 5.0)
        limit = self.clock.now() + self.spec.grace_s + self.spec.teardown_s
        asked: set[str] = set()
        last_error: BaseException | None = None
        first = True
        known = sorted(r.id for r in self.records.values() if r.alive)
        if known:  # before any query: an instance the cloud does not list yet is still ended
            try:
                self.terminating.update(known)
                self.provider.terminate_instances(known)
                asked.update(known)
                self._journal_safe("note", what=f"terminating {', '.join(known)}")
                self._record_stop(status, reason)
                first = False
                what = f"terminating {', '.join(known)}"
                self._safe("event terminate", partial(self._event, "terminate", what))
            except Exception as err:  # retried below, with what the query finds
                last_error = err
        while True:
            found = None
            try:
                found = self.provider.query_instances(job_id)
            except Exception as err:  # terminate from memory regardless
                last_error = err
            if found is not None:
                for inst in found:
                    if inst.state not in GONE_STATES and inst.id not in self.records:
                        self._adopt_safe(inst)
                self._see_gone({i.id: i for i in found})
            ids = sorted(r.id for r in self.records.values() if r.alive)
            todo = [i for i in ids if i not in asked]
            if found is not None:  # a stopped VM still exists (GCP TERMINATED: its disk bills)
                todo += [i.id for i in found if i.state in GONE_STATES and i.id not in asked]
            if todo:
                try:
                    self.terminating.update(todo)
                    self.provider.terminate_instances(todo)
                    asked.update(todo)
                    self._journal_safe("note", what=f"terminating {', '.join(todo)}")
                    if first:
                        self._record_stop(status, reason)
                        first = False
                    what = f"terminating {', '.join(todo)}"
                    self._safe("event terminate", partial(self._event, "terminate", what))
                    if found is None or any(i in ids for i in todo):
                        continue
                except Exception as err:  # retried next poll
                    last_error = err
            if found is not None and not ids:
                break
            if found is None and not self.requested:
                # Nothing was ever asked of the cloud (e.g. credentials or the bucket failed in
                # prepare): no instance of this job can exist, so there is nothing to wait for.
                self._journal_safe("note", what="teardown: no instance was ever requested")
                break
            if self.clock.now() >= limit:
                why = f" (last error: {_message(last_error)})" if last_error else ""
                raise CloudError(
                    f"job {job_id}: instances {', '.join(ids) or '(unknown)'} may still be "
                    f"running{why}",
                    hint=f"run `kplan down {job_id}` to terminate them",
                )
            self.clock.sleep(min(poll, max(limit - self.clock.now(), 0.0)))
        if first:
            self._record_stop(status, reason)
        try:
            self.provider.cleanup(self.cluster)
        except CloudError as err:
            if not self.requested:  # job-wide rules/groups only, free; `kplan down` retries
                self._journal_safe("note", what=f"cleanup failed: {err.message}")
                what = f"cleanup of job-wide resources failed: {err.message}"
                self._safe("event cleanup", partial(self._event, "cleanup", what))
                return
            raise CloudError(
                f"job {job_id}: instances are gone but cleanup failed: {err.message}",
                hint=f"run `kplan down {job_id}` to retry",
            ) from None

    def _record_stop(self, status: str, reason: str) -> None:
        self._safe("status stopping", lambda: self._status("stopping", reason))
        self._safe(
            "event stop",
            lambda: self._event("stop", f"stopping: {status} ({reason})", {"status": status}),
        )

    def _see_gone(self, found: dict[str, Instance]) -> None:
        """Mark (in memory, then best-effort in the journal and the database) every live record
        the provider shows gone or no longer reports."""
        now = self.clock.now()
        self.listed.update(found)
        for rec in list(self.records.values()):
            if not rec.alive:
                continue
            inst = found.get(rec.id)
            if inst is not None and inst.state not in GONE_STATES:
                continue
            if inst is None and rec.id not in self.terminating and self._not_listed_yet(rec, now):
                continue  # not listed yet and not asked to end: it is terminated next
            state = inst.state if inst is not None else "terminated"
            reason = (inst.reason if inst is not None else None) or (
                "terminated by kplan" if rec.id in self.terminating else "no longer reported"
            )
            ended = replace(rec, state=state, ended_at=now, reason=reason)
            self.records[rec.id] = ended
            self._journal_safe("gone", id=rec.id, state=state)
            self._safe(f"end of {rec.id}", partial(self._record_end, ended, now))

    def _adopt_safe(self, inst: Instance) -> None:
        """Teardown's :meth:`_adopt`: in memory always, recorded if the database lets it."""
        try:
            self._adopt(inst)
        except _RECORD_ERRORS as err:
            self.db_broken = True
            self._journal_safe("note", what=f"not recorded: adopted {inst.id}", error=str(err))


def _message(err: BaseException) -> str:
    return err.message if isinstance(err, KplanError) else f"{type(err).__name__}: {err}"
