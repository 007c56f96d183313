"""A running job's nodes: prepare, launch, provision the head then the rest, and see losses.

The part of the lifecycle (``kplan/launcher/lifecycle.py``) that asks the cloud for nodes and
decides what counts as a lost node, a failed script, or a wait for capacity
(``kplan/planner/spot.py``, RecoveryPolicy).
"""

from __future__ import annotations

from collections.abc import Sequence

from kplan.core.errors import CapacityError, CloudError
from kplan.launcher.bootstrap import (
    CODE_KEY,
    Rendezvous,
    instance_name,
    instance_spec,
    job_key,
    rendezvous,
    status_key,
)
from kplan.launcher.controller_node import code_in_storage, ship_code
from kplan.launcher.hardstop import cap_seconds
from kplan.launcher.jobspec import NodeSpec, place
from kplan.launcher.journal import instance_doc
from kplan.launcher.observe import COLLATERAL_WINDOW_S, Finish
from kplan.launcher.state import InstanceRecord
from kplan.launcher.teardown import TeardownRun

SIGNAL_EXIT = 128  # exit codes >= this (or < 0): killed by a signal, not a failing script
UNPLACED = "launch failed"  # a rank of a (re)start that found no capacity: not a lost node


class NodeRun(TeardownRun):
    """Launching nodes and noticing their losses (subclassed by the lifecycle)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.lost_nodes = 0  # nodes lost (preempted, gone, never booted): max_replacements
        self.counted: set[tuple[int, float]] = set()  # (rank, lost at) already counted
        self.waiting_since: float | None = None  # no capacity in the region since then
        self.returning: dict[int, str] = {}  # rank -> spot instance taking over from on demand
        self.last_probe: float | None = None  # last try to bring on-demand fallbacks back
        self.returns = 0  # nodes brought back from on demand to spot
        self.refusals: list[CloudError] = []  # why the last _launch_rank found no place

    def _prepare(self) -> None:
        code_key = job_key(self.spec.job_id, CODE_KEY)
        if self.spec.cloud != "local" and code_in_storage(
            self.spec.script,
            list(self.storage.list_keys(job_key(self.spec.job_id, "code/"))),
            code_key,
        ):
            self._event(
                "code",
                "the code and kplan's wheel are in the job's storage (uploaded by the launcher)",
            )
        elif self.spec.cloud != "local":
            for message, data in ship_code(self.spec, self.storage):
                self._event("code", message, data or None)
        self.storage.delete_prefix(job_key(self.spec.job_id, "status/"))
        self.provider.prepare(self.cluster)
        self._event("prepare", f"prepared {place(self.spec.cloud, self.spec.region)}")

    def _rdzv(self, head: bool) -> Rendezvous:
        return rendezvous(self.spec, self.generation, None if head else self.head_addr)

    def _launch(self, nodes: Sequence[NodeSpec]) -> list[InstanceRecord]:
        """Request ``nodes`` in one call and record them (ledger rows open at request time)."""
        specs = []
        now = self.clock.now()
        prices = [n.usd_per_hour for n in nodes]
        cap = cap_seconds(
            self.spec, self.ledger.closed_spend(), self._live(), prices, now, self.guard.deadline_at
        )  # the hard stop of each new instance (kplan/launcher/hardstop.py)
        self.renew_lease()
        for node in nodes:
            rank = node.node_rank
            k = self.launches.get(rank, 0)
            self.launches[rank] = k + 1
            name = instance_name(self.spec.job_id, rank, k)
            self.storage.delete_prefix(status_key(self.spec.job_id, rank))
            self.finished.pop(rank, None)
            rdzv = self._rdzv(rank == 0)
            specs.append(instance_spec(self.spec, node, name, rdzv, self.storage.uri, cap))
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

    def _launch_rank(
        self, node: NodeSpec, *, quiet: bool = False, spot_only: bool = False
    ) -> InstanceRecord | None:
        """Launch one node: its zone first, then other zones, then on-demand (if allowed).
        ``quiet``: no event per refused try (the retries of a wait for capacity);
        ``spot_only``: no on-demand fallback this time (the deadline rule lets it wait)."""
        self.refusals = []
        for cand in self.spec.candidates(node):
            if spot_only and cand.market != "spot":
                continue
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
                    self.clock.sleep(self.spec.timing.check_interval_s)
                    continue
                self._capacity_back()
            rec = self.records[self.current[0]]
            timeout_s = self.spec.timing.provision_timeout_s
            if self.clock.now() - rec.launched_at > timeout_s:
                raise CloudError(
                    f"the head node is not running after {timeout_s:.0f} s",
                    hint="the cloud may lack capacity; try another zone, type or market",
                )
            self._tick()
            rec = self.records[self.current[0]]
            if rec.state == "running" and self.ips.get(rec.id):
                self.head_addr = self.ips[rec.id]
            else:
                self.clock.sleep(min(self.spec.timing.check_interval_s, 5.0))
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
                    self.lost.setdefault(node.node_rank, (now, UNPLACED))
        self._status("running")

    def _check_failed(self) -> None:
        """A node whose status says 1..127 (the script failed; torchrun gave up on it) fails the
        job, with the error line of the node's log in the reason; unless another node was lost
        at about the same time (``_collateral``): then it is replaced and counted as a crash."""
        for rank, doc in sorted(self.finished.items()):
            code = doc.exit_code
            if not 0 < code < SIGNAL_EXIT or rank in self.lost:
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
            if (
                rec.state == "pending"
                and now - rec.launched_at > self.spec.timing.provision_timeout_s
            ):
                self._drop(
                    rank, now, f"not running after {self.spec.timing.provision_timeout_s:.0f} s"
                )

    def _count_losses(self) -> None:
        """Count each lost node once (a rank that found no capacity at a restart is not one)."""
        for rank, (lost_at, why) in self.lost.items():
            if why != UNPLACED and (rank, lost_at) not in self.counted:
                self.counted.add((rank, lost_at))
                self.lost_nodes += 1

    def _check_losses(self) -> None:
        self._check_crashes()
        self._count_losses()
        if self.lost_nodes > self.spec.recovery.max_replacements:
            raise Finish(
                "failed",
                f"{self.lost_nodes} lost nodes exceed max_replacements "
                f"{self.spec.recovery.max_replacements}",
            )

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
                f"{why}; retrying every {self.spec.timing.check_interval_s:g} s for up to "
                f"{self.spec.recovery.capacity_wait_s:g} s",
                {"node_ranks": list(ranks), "capacity_wait_s": self.spec.recovery.capacity_wait_s},
            )
        waited = now - self.waiting_since
        if waited > self.spec.recovery.capacity_wait_s:
            raise Finish(
                "failed",
                f"no capacity for node(s) {list(ranks)} in {where} for {waited:.0f} s "
                f"(capacity_wait_s {self.spec.recovery.capacity_wait_s:g})",
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

    def _stop_all(self, why: str) -> None:
        """SIGTERM every live instance (the workers checkpoint) and wait until all are gone."""
        alive = [r.id for r in self.records.values() if r.alive]
        self._event("restart", f"{why} ({len(alive)} still alive)")
        if alive:
            self.terminating.update(alive)
            self.provider.terminate_instances(alive)
        limit = self.clock.now() + self.spec.timing.grace_s + self.spec.timing.teardown_s
        if alive:
            self._tick()  # look once even with no grace: a cloud may end them at once
        while any(self.records[i].alive for i in alive) and self.clock.now() < limit:
            self.clock.sleep(min(self.spec.timing.check_interval_s, 5.0))
            self._tick()
        left = [i for i in alive if self.records[i].alive]
        if left:
            raise CloudError(
                f"instances {', '.join(left)} did not terminate for a restart",
                hint=f"run `kplan down {self.spec.job_id}`",
            )
