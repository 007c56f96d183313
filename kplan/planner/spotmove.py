"""Moving a job to another pool (zone or region) when its pool runs dry (issue 27, item 3).

A **pool** is one trace of spot capacity (one cloud, instance type and zone or region) with its
spot and on-demand prices. The traces of several pools share one clock (time 0 is the same
instant in each). The job starts in the first pool and follows the replay's rules there
(``spotreplay.replay``: the recovery rules and the deadline rule of ``deadline.py``); on top of
them, the **move rule**:

- a **move** takes the whole cluster to another pool: the workers checkpoint (no lost work, as
  a switch back to spot), every instance stops, the last checkpoint is copied to the other
  pool's region, and the nodes the new pool has then are launched, up a restart later. Its cost
  (``move_cost``) is the copy's **egress**, ``checkpoint_gb x egress $/GB`` (the source
  region's list price to another region of its cloud, ``storage_prices.csv``), and its **copy
  time**, ``checkpoint_gb x 8 / copy_gbps`` seconds at the stated bandwidth, during which
  nothing runs. A move between zones of one region copies nothing: the checkpoint is in the
  region's object store, which every zone reads free of transfer charges (both clouds' list
  prices; the catalog has no zone-to-zone row because none applies);
- the pool is **dry** from a loss whose replacement the pool cannot grant within the restart
  (the replay's outage, the same threshold as the fit's), until the cluster is whole on spot
  there again; a dry pool costs the job, every dry second, either a second of slack (waiting)
  or a second on demand instead of on spot elsewhere; the slack it spends is bought back on
  demand at worst. Both are worth at most ``v = nodes x (on-demand $/h here - spot $/h
  there) / 3600`` dollars a second;
- the move's own price in the same currency is ``M = egress + v x copy_s``: the rule moves when
  the pool has been dry for the **break-even** time ``T* = M / v = copy_s + egress / v``
  (``break_even_s``), provided the pool is still dry then, the other pool holds the job's nodes
  (it has capacity now: nothing about its future is read), and the deadline rule's slack with
  the cluster up in the new pool (``t + copy_s + restart_s``) still covers the reserve (the
  move counts its copy and restart against the slack). With several pools it takes the one it
  can move to first. ``v <= 0`` (on demand no dearer than spot there) never moves;
- this is the ski-rental rule: staying is renting at ``v`` a second, moving is buying at ``M``.
  Whatever the dry spell's length ``D``, the rule pays at most ``min(v D, M) + M <= 2 min(v D,
  M)`` for it, twice what a clairvoyant choice between staying and moving pays, and exactly
  what staying pays when the spell ends before ``T*``; it reads no model and no future. A zone
  move (``M = 0``) is the launcher's zone failover: at once.

Nothing here is fitted: the prices, the checkpoint size and the bandwidth are the rule's inputs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from kplan.planner.catalog import StoragePrice
from kplan.planner.spot import RecoveryPolicy
from kplan.planner.spotreplay import (
    ReplayEvent,
    ReplayOutcome,
    _Replayer,
    _Slot,
    _TraceIndex,
)
from kplan.planner.spottrace import LOSS_WINDOW_S, SpotTrace

INF = math.inf
DEFAULT_COPY_GBPS = 1.0  # a conservative copy rate between regions (one stream), Gbit/s


@dataclass(frozen=True)
class Pool:
    """One pool of spot capacity: its trace, where it is, its prices per node-hour."""

    name: str
    region: str
    trace: SpotTrace
    usd_per_hour: float  # spot
    usd_per_hour_on_demand: float

    def __post_init__(self) -> None:
        if not (self.usd_per_hour >= 0 and self.usd_per_hour_on_demand >= 0):
            raise ValueError(f"pool {self.name!r}: prices must be >= 0")


@dataclass(frozen=True)
class MoveCost:
    """What one move from a pool to another costs: egress dollars and copy seconds."""

    egress_usd: float
    copy_s: float
    usd_per_gb: float
    kind: str  # "zone" (same region: nothing copied) or "inter-region"


@dataclass(frozen=True)
class MoveTerms:
    """The move's inputs: the checkpoint's size, the copy's bandwidth, the egress prices."""

    cloud: str
    checkpoint_gb: float
    copy_gbps: float = DEFAULT_COPY_GBPS
    storage: dict[tuple[str, str], StoragePrice] | None = None

    def __post_init__(self) -> None:
        if not (self.checkpoint_gb >= 0 and math.isfinite(self.checkpoint_gb)):
            raise ValueError(f"checkpoint_gb {self.checkpoint_gb} must be finite and >= 0")
        if not (self.copy_gbps > 0 and math.isfinite(self.copy_gbps)):
            raise ValueError(f"copy_gbps {self.copy_gbps} must be finite and > 0")


def move_cost(terms: MoveTerms, src: Pool, dst: Pool) -> MoveCost:
    """A move's egress and copy time (the module's rule); a region without a price row is a
    ``ValueError`` (the caller checks the pools first)."""
    if src.region == dst.region:
        return MoveCost(0.0, 0.0, 0.0, "zone")
    row = (terms.storage or {}).get((terms.cloud, src.region))
    if row is None:
        raise ValueError(f"no egress price for {terms.cloud}:{src.region}")
    gb = terms.checkpoint_gb
    return MoveCost(
        egress_usd=gb * row.egress_region_usd_gb,
        copy_s=gb * 8.0 / terms.copy_gbps,
        usd_per_gb=row.egress_region_usd_gb,
        kind="inter-region",
    )


def break_even_s(
    cost: MoveCost, nodes: int, usd_on_demand_here: float, usd_spot_there: float
) -> float:
    """``T* = copy_s + egress / v``, ``v = nodes x (on demand here - spot there) / 3600``: how
    long the pool must have been dry before a move pays (inf: never)."""
    v = nodes * (usd_on_demand_here - usd_spot_there) / 3600.0
    if v <= 0:
        return INF
    return cost.copy_s + cost.egress_usd / v


@dataclass(frozen=True)
class Move:
    """One move of the replayed job, seconds from its start."""

    time_s: float
    from_pool: str
    to_pool: str
    egress_usd: float
    copy_s: float


@dataclass(frozen=True)
class MoveOutcome:
    """A replay over several pools: the replay's record (instance dollars in
    ``replay.cost_usd``) and the moves; ``cost_usd`` adds their egress."""

    replay: ReplayOutcome
    moves: tuple[Move, ...]

    @property
    def egress_usd(self) -> float:
        return sum(m.egress_usd for m in self.moves)

    @property
    def cost_usd(self) -> float:
        return self.replay.cost_usd + self.egress_usd

    @property
    def hours(self) -> float:
        return self.replay.hours

    @property
    def losses(self) -> int:
        return self.replay.losses

    @property
    def failed(self) -> bool:
        return self.replay.failed

    @property
    def truncated(self) -> bool:
        return self.replay.truncated


@dataclass(frozen=True)
class _Pending:
    time_s: float
    to: int
    cost: MoveCost


class _MoveReplayer(_Replayer):
    """``spotreplay``'s replayer with the move rule (the module docstring)."""

    def __init__(
        self,
        pools: Sequence[Pool],
        ixs: list[_TraceIndex],
        terms: MoveTerms,
        *,
        start_s: float,
        work_s: float,
        policy: RecoveryPolicy,
        billing: tuple[float, float],
        grace_s: float,
        loss_window_s: float,
    ) -> None:
        home = pools[0]
        super().__init__(
            ixs[0],
            start_s=start_s,
            work_s=work_s,
            policy=policy,
            usd_per_hour=home.usd_per_hour,
            usd_per_hour_on_demand=home.usd_per_hour_on_demand,
            billing_min_s=billing[0],
            billing_increment_s=billing[1],
            grace_s=grace_s,
            loss_window_s=loss_window_s,
        )
        self.pools, self.ixs, self.terms = list(pools), ixs, terms
        self.used_by: list[set[int]] = [self.used, *(set() for _ in pools[1:])]
        self.here = 0
        self.pool = home.name
        self.pending: _Pending | None = None
        self.dry_since = INF
        self.stay_fails_at = INF  # without on demand: when staying fails the job
        self.moves: list[Move] = []

    def whole_at(self) -> float:
        """When every slot is on spot in this pool again (INF: not known to be)."""
        t = -INF
        for s in self.slots:
            t = max(t, s.switch_s if s.on_demand and s.switch_s < INF else s.launch)
        return t

    def refill(self, ranks: list[int], lost_at: list[float], boot: float) -> float | None:
        fail_at = super().refill(ranks, lost_at, boot)
        now = max(lost_at, default=0.0)
        back = INF if fail_at is not None else self.whole_at()
        dry = [t for r, t in zip(ranks, lost_at, strict=True) if self.slot_dry(r, t)]
        if fail_at is None and not dry:
            return None
        self.dry_since = min(self.dry_since, *(dry or lost_at))
        self.pending = self.plan_move(now, back)
        if fail_at is None:
            return None
        if self.pending is None or self.pending.time_s >= fail_at:
            return fail_at
        for r in ranks:  # waits for the move instead of failing
            self.slots[r] = _Slot(-1, INF, INF, INF)
        self.stay_fails_at = fail_at
        return None

    def slot_dry(self, r: int, lost: float) -> bool:
        s = self.slots[r]
        back = s.switch_s if s.on_demand else s.launch
        return back - lost > self.grace_s

    def plan_move(self, now: float, back: float) -> _Pending | None:
        """The move the rule makes in this dry spell (before ``back``, when the cluster would
        be whole here again), or None."""
        here, nodes = self.pools[self.here], len(self.slots)
        best: _Pending | None = None
        for j, pool in enumerate(self.pools):
            if j == self.here:
                continue
            cost = move_cost(self.terms, here, pool)
            wait = break_even_s(cost, nodes, here.usd_per_hour_on_demand, pool.usd_per_hour)
            if not math.isfinite(wait):
                continue
            t = max(self.dry_since + wait, now)
            t_cap = pool.trace.first_with(nodes, self.t0 + t) - self.t0
            if pool.trace.alive_at(self.t0 + t_cap) < nodes or self.t0 + t_cap > pool.trace.end_s:
                continue  # no capacity there (that the trace shows)
            if t_cap < back and (best is None or t_cap < best.time_s):
                best = _Pending(t_cap, j, cost)
        return best

    def step(self) -> bool:
        fin, d, t_sw, t_res, _ = self.next_times()
        mv = self.pending
        if mv is not None and mv.time_s < min(fin, d, t_sw):
            self.move(mv, t_res)
            return True
        going = super().step()
        now = min(fin, d, t_sw)
        if self.whole_at() <= now:  # whole on spot here again (or on demand to the end)
            self.pending, self.dry_since = None, INF
        return going

    def all_on_demand(self, t: float, lost: set[int], why: str) -> None:
        super().all_on_demand(t, lost, why)
        self.pending, self.dry_since = None, INF  # on demand to the end: no move

    def move(self, mv: _Pending, t_res: float) -> None:
        """The cluster leaves this pool at ``mv.time_s`` for ``mv.to`` (the module's rule)."""
        t, p = mv.time_s, self.p
        committed = self.progress_at(t, t_res)
        self.pending = None
        if not self.spot_ok(t + mv.cost.copy_s + p.restart_s, committed):
            what = "the deadline's slack does not cover the move"
            self.events.append(ReplayEvent(t, "stay", (), what))
            waiting = [r for r, s in enumerate(self.slots) if s.launch == INF]
            if waiting:  # no capacity here within the wait: the job fails as it would have
                self.fail(max(self.stay_fails_at, t), waiting, "no capacity")
            return
        self.committed = committed
        for r, s in enumerate(self.slots):
            if s.launch <= t:
                self.end_instance(r, s, min(s.death, t))
        src, dst = self.pools[self.here], self.pools[mv.to]
        self.moves.append(Move(t, src.name, dst.name, mv.cost.egress_usd, mv.cost.copy_s))
        n = len(self.slots)
        what = (
            f"{src.name} -> {dst.name}: {self.terms.checkpoint_gb:g} GB, "
            f"${mv.cost.egress_usd:.2f} egress, {mv.cost.copy_s:.0f} s copy"
        )
        self.events.append(ReplayEvent(t, "move", tuple(range(n)), what))
        self.here, self.ix, self.used = mv.to, self.ixs[mv.to], self.used_by[mv.to]
        self.prices = (dst.usd_per_hour, dst.usd_per_hour_on_demand)
        self.pool, self.dry_since = dst.name, INF
        t_l = t + mv.cost.copy_s
        self.slots = []
        for i in self.picked_alive(t_l)[:n]:
            self.used.add(i)
            self.slots.append(_Slot(i, t_l, t_l + p.restart_s, self.rel_death(i, t_l)))
        missing = list(range(len(self.slots), n))
        self.slots.extend(_Slot(-1, INF, INF, INF) for _ in missing)
        if missing:
            fail_at = self.refill(missing, [t_l] * len(missing), p.restart_s)
            if fail_at is not None:
                self.fail(fail_at, missing, "no capacity")

    def result(self) -> MoveOutcome:
        out = self.outcome()
        end = min(ix.end_s for ix in self.ixs)
        return MoveOutcome(replace(out, truncated=self.t0 + self.t_end > end), tuple(self.moves))


def replay_pools(
    pools: Sequence[Pool],
    starts: Sequence[float],
    *,
    nodes: int,
    work_s: float,
    policy: RecoveryPolicy,
    terms: MoveTerms,
    billing_min_s: float = 60.0,
    billing_increment_s: float = 1.0,
    grace_s: float | None = None,
    loss_window_s: float = LOSS_WINDOW_S,
) -> list[MoveOutcome]:
    """The job from each start (seconds on the pools' shared clock) in ``pools[0]``, with the
    replay's rules and the move rule (the module docstring); nodes taken youngest first."""
    if not pools:
        raise ValueError("no pool to replay")
    if nodes < 1 or work_s < 0:
        raise ValueError(f"nodes {nodes} must be >= 1 and work_s {work_s} >= 0")
    names = [p.name for p in pools]
    if len(set(names)) != len(names):
        raise ValueError(f"pool names repeat: {names}")
    ixs = [_TraceIndex(p.trace) for p in pools]  # no replay state: each keeps its used sets
    out = []
    for s in starts:
        job = _MoveReplayer(
            pools,
            ixs,
            terms,
            start_s=float(s),
            work_s=work_s,
            policy=policy,
            billing=(billing_min_s, billing_increment_s),
            grace_s=policy.restart_s if grace_s is None else grace_s,
            loss_window_s=loss_window_s,
        )
        job.start(nodes, "youngest", 0)
        while not job.failed and job.step():
            pass
        out.append(job.result())
    return out
