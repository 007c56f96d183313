"""Changes to a running job's cluster: replace lost nodes, return to spot, adapt and resize.

Recovery follows the rules the planner prices (``kplan/planner/spot.py``, RecoveryPolicy);
adaptation runs the checks of ``kplan/launcher/adapt.py``. ``kplan/launcher/lifecycle.py``
calls these from its monitor loop.
"""

from __future__ import annotations

from dataclasses import replace

from kplan.core.errors import CloudError
from kplan.launcher.nodes import NodeRun
from kplan.launcher.observe import Finish
from kplan.launcher.recovery import deadline_choice, deadline_wait
from kplan.launcher.state import InstanceRecord


class ChangingRun(NodeRun):
    """Recovery, the return to spot and adaptation (subclassed by the lifecycle)."""

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
            view, now, at = self.adapter.obs.view, self.clock.now(), self.guard.deadline_at
            choice = deadline_choice(self.spec, view, now, at)  # the plan's deadline rule
            spot_only = choice == "spot" and deadline_wait(self.spec, view, now, at)
            for rank in sorted(self.lost):
                lost_at, _ = self.lost[rank]
                self.recovering.setdefault(rank, lost_at)
                node = self.spec.nodes[rank]
                if choice == "on-demand":
                    node = replace(node, market="on-demand")
                quiet = self.waiting_since is not None
                if self._launch_rank(node, quiet=quiet, spot_only=spot_only):
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
        view, at = self.adapter.obs.view, self.guard.deadline_at
        if not ranks or deadline_choice(self.spec, view, self.clock.now(), at) == "on-demand":
            return  # the deadline rule: a return's restart would spend the reserve
        now = self.clock.now()
        every = self.spec.recovery.spot_probe_interval_s or self.spec.timing.check_interval_s
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
            elif (
                rec.state == "pending"
                and now - rec.launched_at > self.spec.timing.provision_timeout_s
            ):
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
        batch = global_batch or self.adapter.obs.view.global_batch or self.spec.batch.global_batch
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
        batch_plan = replace(self.spec.batch, global_batch=batch)
        self.spec = replace(self.spec, nodes=new_nodes, batch=batch_plan)
        stored = replace(self.spec, storage_uri=self.storage.uri).to_dict()
        self.db.update_spec(self.spec.job_id, stored)
        self.generation += 1
        self._provision()
        return True
