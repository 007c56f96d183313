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
  there again. Staying pays for a dry spell what it costs at once, at ``u = (on-demand $/h
  here - spot $/h there) / 3600`` a node-second: the lost nodes that run on demand until
  capacity returns pay that premium (``k u`` for ``k`` of them), from when they launch; a wait
  the deadline rule affords costs nothing (the rule judged the slack spare); without an
  on-demand fallback the whole stalled cluster pays ``n u`` from the first loss (the time it
  loses, priced as buying it back on demand) (``_MoveReplayer.rent``);
- the move's own price in the same currency is ``M = egress + n u copy_s``; the rule moves
  when what staying has paid for the spell reaches ``M`` (``move_at``; a stalled cluster after
  ``T* = copy_s + egress / (n u)``, ``break_even_s``), provided the spell is still on, the
  other pool holds the job's nodes (it has capacity now: nothing about its future is read),
  and the deadline rule's slack with the cluster up in the new pool (``t + copy_s +
  restart_s``) still covers the reserve (the move counts its copy and restart against the
  slack). With several pools it takes the one it can move to first. ``u <= 0`` (on demand no
  dearer than spot there) never pays a priced move; a move that costs nothing (a zone of the
  region) goes at once: the launcher's zone failover;
- this is the ski-rental rule: staying is renting, moving is buying at ``M``. Whatever the dry
  spell's length, the rule pays (in this accounting) at most twice what a clairvoyant choice
  between staying and moving pays for it, and exactly what staying pays when the spell ends
  before the break-even; it reads no model and no future. Counting a stall as rent also where
  the deadline rule waits (every node's slack bought back on demand at worst:
  ``MoveTerms.count_stall``) moves sooner: on the held-out pairs it saved up to 1.3 points
  more with 1 GB checkpoints and lost up to 1.7 points against staying with 100 GB
  (bench/spot_regions.py --count-stall, docs/benchmarks.md); the rule counts what staying
  pays.

Nothing here is fitted: the prices, the checkpoint size and the bandwidth are the rule's inputs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from kplan.core.flags import MAX_COPY_GBPS, MIN_COPY_GBPS
from kplan.planner.catalog import StoragePrice
from kplan.planner.extra_costs import MOVE_COPY_GBPS
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
DEFAULT_COPY_GBPS = MOVE_COPY_GBPS  # a conservative copy rate between regions (one stream)


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
    # the rent's other accounting (``_MoveReplayer.rent``): a stall counts also where the
    # deadline rule waits (bench/spot_regions.py --count-stall measures it against the rule)
    count_stall: bool = False

    def __post_init__(self) -> None:
        if not (self.checkpoint_gb >= 0 and math.isfinite(self.checkpoint_gb)):
            raise ValueError(f"checkpoint_gb {self.checkpoint_gb} must be finite and >= 0")
        if not MIN_COPY_GBPS <= self.copy_gbps <= MAX_COPY_GBPS:
            raise ValueError(
                f"copy_gbps {self.copy_gbps} must be in [{MIN_COPY_GBPS:g}, {MAX_COPY_GBPS:g}]"
            )


def move_cost(terms: MoveTerms, src: Pool, dst: Pool) -> MoveCost:
    """A move's egress and copy time (the module's rule); a region without a price row is a
    ``ValueError`` (the caller checks the pools first)."""
    return region_move_cost(terms, src.region, dst.region)


def region_move_cost(terms: MoveTerms, src_region: str, dst_region: str) -> MoveCost:
    """``move_cost`` between two regions of ``terms.cloud`` (the launcher's form: no trace)."""
    if src_region == dst_region:
        return MoveCost(0.0, 0.0, 0.0, "zone")
    row = (terms.storage or {}).get((terms.cloud, src_region))
    if row is None:
        raise ValueError(f"no egress price for {terms.cloud}:{src_region}")
    return copy_cost(terms, row.egress_region_usd_gb)


def copy_cost(terms: MoveTerms, usd_per_gb: float) -> MoveCost:
    """A move to another region at the source region's egress price ``usd_per_gb``: the
    checkpoint's egress and its copy time at ``terms.copy_gbps``."""
    gb = terms.checkpoint_gb
    return MoveCost(
        egress_usd=gb * usd_per_gb,
        copy_s=gb * 8.0 / terms.copy_gbps,
        usd_per_gb=usd_per_gb,
        kind="inter-region",
    )


def break_even_s(
    cost: MoveCost, nodes: int, usd_on_demand_here: float, usd_spot_there: float
) -> float:
    """``T* = copy_s + egress / v``, ``v = nodes x (on demand here - spot there) / 3600``: how
    long every node must have paid on demand (or stalled, without a fallback) in a dry spell
    before a move pays (inf: never)."""
    v = nodes * (usd_on_demand_here - usd_spot_there) / 3600.0
    if v <= 0:
        return INF
    return cost.copy_s + cost.egress_usd / v


def move_at(
    cost: MoveCost,
    nodes: int,
    rent: tuple[float, float, int],
    usd_on_demand_here: float,
    usd_spot_there: float,
) -> float:
    """When the rent staying has paid reaches the move's price (inf: never). ``rent`` = (the
    stall's start, its end, the nodes on demand after it): a stalled second costs ``nodes x
    u``, an on-demand second ``paying x u``, ``u = (on demand here - spot there) / 3600``;
    the move costs ``egress + nodes x u x copy_s``. A move that costs nothing goes at once."""
    stall_from, stall_to, paying = rent
    u = (usd_on_demand_here - usd_spot_there) / 3600.0
    price = cost.egress_usd + (nodes * u * cost.copy_s if u > 0 else 0.0)
    if price == 0:
        return stall_from
    if u <= 0:
        return INF
    stalled = nodes * u * (stall_to - stall_from)
    if stalled >= price:
        return stall_from + price / (nodes * u)
    if paying == 0:
        return INF
    return stall_to + (price - stalled) / (paying * u)


def stay_rent(
    dry_since: float,
    on_demand_since: Sequence[float],
    *,
    waiting: bool,
    allow_on_demand: bool,
    count_stall: bool = False,
) -> tuple[float, float, int]:
    """How staying pays for a dry spell that began at ``dry_since``: (a stall's start, its
    end, the nodes on demand after it), ``move_at``'s ``rent``. ``on_demand_since``: when each
    lost node now on demand launched; ``waiting``: a lost node still waits for capacity. With an
    on-demand fallback the lost nodes on demand pay from their launch and a wait (the deadline
    rule's) pays nothing; without one the cluster stalls from the first loss until capacity
    returns. ``count_stall``: the stall lasts until the last lost node is up on demand, also
    where the deadline rule waits (the benchmark's other accounting). The replayer and the
    launcher (kplan/launcher/region_move.py) both call this."""
    stall_to = dry_since
    if not allow_on_demand or count_stall:
        stall_to = INF if waiting or not on_demand_since else max(on_demand_since)
    return dry_since, stall_to, len(on_demand_since)


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
        """The replay's refill; in a dry spell, the move the rule will make (``pending``).
        Without an on-demand fallback a wait past ``capacity_wait_s`` fails the job unless
        the move comes first."""
        fail_at = super().refill(ranks, lost_at, boot)
        now = max(lost_at, default=0.0)
        if fail_at is not None:  # the lost nodes wait (for the move, or the failure)
            for r in ranks:
                self.slots[r] = _Slot(-1, INF, INF, INF)
            dry = list(lost_at)
        else:
            dry = [t for r, t in zip(ranks, lost_at, strict=True) if self.slot_dry(r, t)]
            if not dry:
                return None
        self.dry_since = min(self.dry_since, *dry)
        back = INF if fail_at is not None else self.whole_at()
        self.pending = self.plan_move(now, back)
        if fail_at is None:
            return None
        if self.pending is None or self.pending.time_s >= fail_at:
            return fail_at
        self.stay_fails_at = fail_at
        return None

    def slot_dry(self, r: int, lost: float) -> bool:
        s = self.slots[r]
        back = s.switch_s if s.on_demand else s.launch
        return back - lost > self.grace_s

    def rent(self, now: float) -> tuple[float, float, int]:
        """How staying pays for this dry spell: (a stall's start, its end, the nodes on demand
        after it). The lost nodes on demand until capacity returns pay from their launch;
        without an on-demand fallback the cluster stalls from the first loss (``n`` nodes pay)
        until capacity returns; a wait the deadline rule affords pays nothing. With
        ``terms.count_stall`` (the benchmark's comparison) the cluster stalls from the first
        loss until the last lost node is up on demand, also where the deadline rule waits."""
        od = [s.launch for s in self.slots if s.on_demand and s.switch_s < INF]
        waiting = any(not s.on_demand and s.launch > now for s in self.slots)
        return stay_rent(
            self.dry_since,
            od,
            waiting=waiting,
            allow_on_demand=self.p.allow_on_demand,
            count_stall=self.terms.count_stall,
        )

    def plan_move(self, now: float, back: float) -> _Pending | None:
        """The move the rule makes in this dry spell (before ``back``, when the cluster would
        be whole here again), or None."""
        here, n = self.pools[self.here], len(self.slots)
        stall_from, stall_to, paying = self.rent(now)
        best: _Pending | None = None
        for j, pool in enumerate(self.pools):
            if j == self.here:
                continue
            cost = move_cost(self.terms, here, pool)
            t = move_at(
                cost,
                n,
                (stall_from, stall_to, paying),
                here.usd_per_hour_on_demand,
                pool.usd_per_hour,
            )
            if not math.isfinite(t):
                continue
            t_cap = pool.trace.first_with(n, self.t0 + max(t, now)) - self.t0
            enough = pool.trace.alive_at(self.t0 + t_cap) >= n
            if not enough or self.t0 + t_cap > pool.trace.end_s:
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
