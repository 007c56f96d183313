"""Moving a running job to another region of its cloud when its spot pool runs dry (issue 27,
item 3): the launcher's half of the move rule of ``kplan/planner/spotmove.py``, which
``kplan simulate --trace POOL=FILE`` replays. Both call the same functions: ``stay_rent`` (what
staying has paid for the dry spell), ``copy_cost`` (the move's egress and copy time) and
``move_at`` (when the rent reaches the move's price ``M = egress + n u copy_s``).

- **Dry spell**: from a node's loss while a lost node waits for capacity in every zone of the
  region (``_no_capacity``), or while lost nodes run on the on-demand fallback; it ends when
  the cluster is whole on spot again.
- **The checkpoint** a move copies: the newest ``checkpoint`` event's bytes in the job's
  metrics (rank 0's), read from its storage when the spell begins; before the workers wrote
  one, ``JobSpec.moves.checkpoint_gb`` (``--checkpoint-gb`` or the plan's).
- **The rule**: the job moves to the region (``JobSpec.moves``) whose move staying has paid for
  first, ``now >= move_at(...)``, with ``u = (on demand here - spot there) / 3600`` per node
  (the nodes' mean prices of their types); a region without an offer of every node's type and
  market is skipped. Then two checks, each said once per dry spell in an event when it keeps
  the job where it is: the deadline rule's slack with the cluster up a copy and a restart from
  now still covers the reserve (``move_fits_deadline``; event ``stay``), and the budget guard
  allows the move's egress with the new nodes (event ``move-refused``).
- **The move**: event ``move``; every instance gets SIGTERM and checkpoints (``_stop_all``);
  the egress is recorded (a ledger ``egress`` row ``egress/move-<k>: <from> -> <to>``); the
  old region's job resources are cleaned up; the provider of the new region is built
  (``backend_for``, default: the cloud's factory), the job's spec takes the new region, its
  zones and prices and is stored (``kplan status``, ``kplan down``, a restarted controller and
  the snapshot read it), the new region is prepared and the cluster provisioned there on a new
  generation. The checkpoint stays in the job's storage: the new nodes read it from there,
  which is the copy the egress pays for.

Unlike the replayer, the launcher cannot see another region's capacity without asking for it:
a destination that refuses the nodes makes the job wait there, under the same rules (and the
rule may move it again).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import replace

from kplan.core.errors import CloudError, KplanError
from kplan.launcher.bootstrap import cluster_spec
from kplan.launcher.cluster_changes import ChangingRun
from kplan.launcher.jobspec import NodeSpec
from kplan.launcher.move_spec import MoveRegion
from kplan.launcher.providers import Backend
from kplan.launcher.recovery import last_checkpoint_bytes, move_fits_deadline
from kplan.planner.spotmove import MoveCost, MoveTerms, copy_cost, move_at, stay_rent

BackendFor = Callable[[str], Backend]  # a region of the job's cloud -> its backend


class Moved(Exception):
    """The job left its region: provision the cluster again, in the new one."""


class MovingRun(ChangingRun):
    """Recovery with the move rule (subclassed by the lifecycle)."""

    backend_for: BackendFor | None = None  # None: the cloud's factory (providers.get_backend)
    dry_since: float | None = None  # the dry spell's first loss (None: not dry)
    measured_gb: float | None = None  # the newest checkpoint's size when the spell began
    said: tuple[str, float] | None = None  # (event, dry spell) already said: once per spell

    def _provision(self) -> None:
        while True:
            try:
                super()._provision()
                return
            except Moved:
                continue  # the cluster provisions again, in its new region

    def _recover(self) -> None:
        if self.lost:
            self._dry(min(t for t, _ in self.lost.values()))
        try:
            super()._recover()
        except Moved:
            self._provision()
            return
        if not self.lost and not self._fallbacks():
            self.dry_since = None  # replaced on spot within the wait: no dry spell

    def _no_capacity(self, ranks: Sequence[int], status: str | None = None) -> None:
        now = self.clock.now()
        self._dry(min((self.lost.get(r, (now, ""))[0] for r in ranks), default=now))
        if self._consider_move(waiting=True):
            raise Moved
        super()._no_capacity(ranks, status)

    def _return_to_spot(self) -> None:
        super()._return_to_spot()
        if not self._fallbacks():
            self.dry_since = None  # whole on spot again: the spell is over
        elif self._consider_move(waiting=False):
            self._provision()

    def _dry(self, since: float) -> None:
        if not self.spec.moves.regions:
            return  # nowhere to move: no spell to price
        if self.dry_since is None:  # a new spell: the checkpoint's size as it is now
            self.measured_gb = self._measure_checkpoint()
        self.dry_since = since if self.dry_since is None else min(self.dry_since, since)

    def _measure_checkpoint(self) -> float | None:
        """GB of the newest checkpoint the job's metrics record, read from its storage (None:
        none yet, or unreadable: the spec's size stands)."""
        try:
            size = last_checkpoint_bytes(self.storage, self.spec.job_id)
        except (KplanError, OSError):
            return None
        return None if size is None else size / 1e9

    def _checkpoint_gb(self) -> tuple[float, str]:
        """The checkpoint a move copies, in GB, and where its size comes from."""
        if self.measured_gb is not None:
            return self.measured_gb, "measured"
        return self.spec.moves.checkpoint_gb, "the job's --checkpoint-gb or plan"

    def _consider_move(self, *, waiting: bool) -> bool:
        """Move now if the rule says so and the deadline and the budget allow it."""
        dry = self.dry_since
        if dry is None or not self.spec.moves.regions:
            return False
        choice = self._move_choice(self.clock.now(), dry, waiting)
        if choice is None:
            return False
        there, cost, nodes = choice
        now = self.clock.now()
        view = self.adapter.obs.view
        if not move_fits_deadline(self.spec, view, now, self.guard.deadline_at, cost.copy_s):
            self._say_once(
                "stay",
                dry,
                f"not moving to {there.region}: the deadline's slack does not cover the move "
                f"({cost.copy_s:.0f} s copy and a restart)",
            )
            return False
        decision = self.guard.check(
            self.ledger.closed_spend() + cost.egress_usd,
            self._live(),
            now,
            [n.usd_per_hour for n in nodes],
        )
        if decision.stop:
            self._say_once(
                "move-refused",
                dry,
                f"not moving to {there.region} (${cost.egress_usd:.2f} egress): {decision.message}",
            )
            return False
        self._move(there, cost, nodes)
        return True

    def _say_once(self, kind: str, dry: float, message: str) -> None:
        if self.said != (kind, dry):
            self.said = (kind, dry)
            self._event(kind, message)

    def _move_choice(
        self, now: float, dry: float, waiting: bool
    ) -> tuple[MoveRegion, MoveCost, tuple[NodeSpec, ...]] | None:
        """The region the rule moves the job to now (the one whose move it reached first)."""
        moves = self.spec.moves
        here = moves.region(self.spec.region)
        types = [n.instance_type for n in self.spec.nodes]
        od_here = None if here is None else here.mean_usd_per_hour(types, "on-demand")
        if here is None or od_here is None:
            return None
        on_demand = [self.records[self.current[r]].launched_at for r in self._fallbacks()]
        rent = stay_rent(dry, on_demand, waiting=waiting, allow_on_demand=self.spec.allow_on_demand)
        gb, _ = self._checkpoint_gb()
        cost = copy_cost(MoveTerms(self.spec.cloud, gb, moves.copy_gbps), here.egress_usd_gb)
        best: tuple[float, MoveRegion, tuple[NodeSpec, ...]] | None = None
        for there in moves.others(self.spec.region):
            nodes = _nodes_in(there, self.spec.nodes)
            spot_there = there.mean_usd_per_hour(types, "spot")
            if nodes is None or spot_there is None:
                continue
            t = move_at(cost, len(nodes), rent, od_here, spot_there)
            if t <= now and (best is None or t < best[0]):
                best = (t, there, nodes)
        return None if best is None else (best[1], cost, best[2])

    def _move(self, there: MoveRegion, cost: MoveCost, nodes: tuple[NodeSpec, ...]) -> None:
        """Checkpoint and stop every instance, pay the egress, switch the job's region and
        prepare it; the caller provisions the cluster there."""
        src, dst, job = self.spec.region, there.region, self.spec.job_id
        gb, source = self._checkpoint_gb()
        waited = self.clock.now() - (self.dry_since or self.clock.now())
        self._event(
            "move",
            f"moving {src} -> {dst}: {gb:.3g} GB checkpoint ({source}), "
            f"${cost.egress_usd:.2f} egress, {cost.copy_s:.0f} s copy (staying paid the "
            f"move's price in {waited:.0f} s dry)",
            {"from": src, "to": dst, "egress_usd": cost.egress_usd, "copy_s": cost.copy_s,
             "checkpoint_gb": gb},
        )  # fmt: skip
        old_provider, old_cluster = self.provider, self.cluster
        self._stop_all(f"moving to {dst}")
        self.ledger.record_move_egress(self.clock.now(), cost.egress_usd, f"{src} -> {dst}")
        with contextlib.suppress(CloudError):  # the old region's security group, best-effort
            old_provider.cleanup(old_cluster)
        self.provider = self._backend(dst).provider
        self.spec = replace(self.spec, region=dst, nodes=nodes, offers=there.offers)
        self.cluster = cluster_spec(self.spec, self.storage.uri)
        self.db.update_spec(job, replace(self.spec, storage_uri=self.storage.uri).to_dict())
        where = {
            "job": job,
            "cloud": self.spec.cloud,
            "region": dst,
            "storage_uri": self.storage.uri,
        }
        self.journal.write("job", self.clock.now(), **where)  # kplan down without the database
        self.lost.clear()
        self.returning.clear()
        self.finished.clear()
        self.first_done = None
        self.waiting_since = None
        self.dry_since = self.measured_gb = None
        self.generation += 1
        self.provider.prepare(self.cluster)
        self._event("prepare", f"prepared {self.spec.cloud} {dst}")

    def _backend(self, region: str) -> Backend:
        if self.backend_for is not None:
            return self.backend_for(region)
        from kplan.core.paths import kplan_home
        from kplan.launcher.providers import ProviderSettings, get_backend

        settings = ProviderSettings(kplan_home(), region, self.storage.uri)
        return get_backend(self.spec.cloud, settings)


def _nodes_in(region: MoveRegion, nodes: tuple[NodeSpec, ...]) -> tuple[NodeSpec, ...] | None:
    """The job's nodes in ``region``: each in the cheapest zone of its type and market there
    (None: a type or market the region does not offer)."""
    out = []
    for node in nodes:
        offers = [
            o
            for o in region.offers
            if o.instance_type == node.instance_type and o.market == node.market
        ]
        if not offers:
            return None
        best = min(offers, key=lambda o: (o.usd_per_hour, o.zone))
        out.append(replace(node, zone=best.zone, usd_per_hour=best.usd_per_hour))
    return tuple(out)
