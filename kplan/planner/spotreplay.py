"""A job replayed against a recorded spot trace (``replay``), with the rules of
``spotsim.simulate`` (kplan/planner/spot.py states them): which nodes it takes, when it loses
them, what it waits for and pays."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from kplan.planner.costs import billed_seconds
from kplan.planner.deadline import on_demand_by_s
from kplan.planner.spot import RecoveryPolicy
from kplan.planner.spottrace import ADD, LOSS_WINDOW_S, REMOVE, SpotTrace

INF = math.inf
EPS = 1e-9


@dataclass(frozen=True)
class ReplayEvent:
    """What happened to the job, seconds from its start; ``nodes``: the slots (node ranks)."""

    time_s: float
    kind: str  # start, preempted, replace, on_demand, wait, to_spot, done, failed
    nodes: tuple[int, ...]
    detail: str = ""


@dataclass(frozen=True)
class ReplayInstance:
    """One instance the job ran (a launcher ledger row): seconds from the job's start."""

    slot: int
    market: str  # "spot" or "on-demand"
    node: str  # the trace's node id ("" on demand)
    launch_s: float
    end_s: float
    billed_s: float
    usd: float
    pool: str = ""  # the pool it ran in (a replay over several pools: spotmove.py)


@dataclass(frozen=True)
class ReplayOutcome:
    hours: float
    cost_usd: float
    losses: int  # loss events
    lost_nodes: int
    failed: bool
    wait_s: float  # capacity waits (loss events that waited, plus a wait for the first nodes)
    on_demand_node_s: float
    truncated: bool  # the job ran past the end of the trace (later events unknown)
    events: tuple[ReplayEvent, ...]
    instances: tuple[ReplayInstance, ...]


@dataclass(frozen=True)
class _Life:
    add_s: float
    remove_s: float  # INF: not removed before the trace's end
    node: str


class _TraceIndex:
    """Each node's life (add, remove) from a trace, and the adds in time order."""

    def __init__(self, trace: SpotTrace) -> None:
        lives: list[_Life] = []
        open_: dict[str, int] = {}
        adds: list[tuple[float, str]] = []
        removes: dict[int, float] = {}
        for t, kind, node in zip(
            trace.times_s.tolist(), trace.kinds.tolist(), trace.nodes, strict=True
        ):
            if kind == ADD:
                open_[node] = len(adds)
                adds.append((float(t), node))
            elif kind == REMOVE:
                if node in open_:
                    removes[open_.pop(node)] = float(t)
                else:  # alive before the trace began: seen from time 0
                    removes[len(adds)] = float(t)
                    adds.append((0.0, node))
        order = sorted(range(len(adds)), key=lambda i: adds[i][0])
        for i in order:
            lives.append(_Life(adds[i][0], removes.get(i, INF), adds[i][1]))
        self.lives = lives
        self.add_times = [life.add_s for life in lives]
        self._add = np.asarray(self.add_times, dtype=float)
        self._remove = np.asarray([life.remove_s for life in lives], dtype=float)
        self.end_s = float(trace.end_s)
        self.unknown_age = trace.unknown_age

    def alive_at(self, t: float) -> list[int]:
        hi = bisect.bisect_right(self.add_times, t)
        alive: list[int] = np.flatnonzero(self._remove[:hi] > t).tolist()
        return alive

    def take(self, t: float, k: int, used: set[int]) -> list[int]:
        """The next ``k`` adds at or after ``t`` not used yet (fewer if the trace ends)."""
        out: list[int] = []
        i = bisect.bisect_left(self.add_times, t)
        while len(out) < k and i < len(self.lives):
            if i not in used:
                out.append(i)
                used.add(i)
            i += 1
        return out


@dataclass
class _Slot:
    life: int  # index into _TraceIndex.lives; -1 on demand or none
    launch: float
    up: float
    death: float
    on_demand: bool = False
    switch_s: float = INF  # on demand: when capacity returns (back to spot)
    next_life: int = -1  # on demand: the spot node it goes back to


def replay(
    trace: SpotTrace,
    *,
    start_s: float,
    nodes: int,
    work_s: float,
    policy: RecoveryPolicy,
    usd_per_hour: float,
    usd_per_hour_on_demand: float,
    billing_min_s: float = 60.0,
    billing_increment_s: float = 1.0,
    pick: str = "youngest",
    seed: int = 0,
    grace_s: float | None = None,
    loss_window_s: float = LOSS_WINDOW_S,
) -> ReplayOutcome:
    """The job against a recorded trace from ``start_s``, with ``simulate``'s rules.

    The trace is one pool of capacity, read as the region: every wait in it is a regional
    outage (zone failover cannot be replayed from one pool; ``policy.zone_failover`` is not
    used), and our nodes die when the trace removes them (no clocks are drawn).

    - At ``start_s`` the job takes ``nodes`` nodes alive in the pool: the ``youngest`` (latest
      added: closest to the fresh nodes ``simulate`` launches; nodes of unknown age count as
      the oldest), the ``oldest``, or ``random`` (``seed``). They are launched at the start, up
      after ``provisioning_s``. Missing ones are taken from later adds, as after a loss.
    - A loss event: the first removal of one of our launched spot nodes; our nodes removed
      within ``loss_window_s`` (``spottrace.LOSS_WINDOW_S``) after it go in the same event.
    - Each lost node takes the next add at or after its own removal that the job has not used
      (capacity granted). Within ``grace_s`` (default ``restart_s``, the fit's outage
      threshold) it is launched at the removal; later, the wait is an outage: on demand
      (``allow_on_demand``) until that add, then back to spot on its node; or a wait, launched
      at the add; or, if the wait passes ``capacity_wait_s``, failure at removal +
      ``capacity_wait_s``. ``wait_s`` adds each event's longest wait.
    - A node taken after its removal (a late switch back to spot) dies at once.
    - With a deadline (``policy.deadline_s``): ``deadline.spot_ok`` at the start, at each loss
      and at each return of capacity (``spotsim`` states the rule's effect); a node the rule
      moves on demand stays there to the end.
    - ``truncated``: the job ran past the trace's end, where nothing more is known (no adds:
      a wait there is endless); leave such replays out.
    """
    (out,) = replay_many(
        trace,
        [start_s],
        nodes=nodes,
        work_s=work_s,
        policy=policy,
        usd_per_hour=usd_per_hour,
        usd_per_hour_on_demand=usd_per_hour_on_demand,
        billing_min_s=billing_min_s,
        billing_increment_s=billing_increment_s,
        pick=pick,
        seed=seed,
        grace_s=grace_s,
        loss_window_s=loss_window_s,
    )
    return out


def replay_many(
    trace: SpotTrace,
    starts: Sequence[float],
    *,
    nodes: int,
    work_s: float,
    policy: RecoveryPolicy,
    usd_per_hour: float,
    usd_per_hour_on_demand: float,
    billing_min_s: float = 60.0,
    billing_increment_s: float = 1.0,
    pick: str = "youngest",
    seed: int = 0,
    grace_s: float | None = None,
    loss_window_s: float = LOSS_WINDOW_S,
) -> list[ReplayOutcome]:
    """``replay`` from each start (the trace indexed once; ``random`` picks seeded per start)."""
    index = _TraceIndex(trace)
    return [
        _replay(
            index,
            start_s=float(s),
            nodes=nodes,
            work_s=work_s,
            policy=policy,
            usd_per_hour=usd_per_hour,
            usd_per_hour_on_demand=usd_per_hour_on_demand,
            billing_min_s=billing_min_s,
            billing_increment_s=billing_increment_s,
            pick=pick,
            seed=seed + n,
            grace_s=policy.restart_s if grace_s is None else grace_s,
            loss_window_s=loss_window_s,
        )
        for n, s in enumerate(starts)
    ]


class _Replayer:
    """One replay's state: the slots, the progress, the ledger (``replay`` describes the
    rules)."""

    def __init__(
        self,
        ix: _TraceIndex,
        *,
        start_s: float,
        work_s: float,
        policy: RecoveryPolicy,
        usd_per_hour: float,
        usd_per_hour_on_demand: float,
        billing_min_s: float,
        billing_increment_s: float,
        grace_s: float,
        loss_window_s: float,
    ) -> None:
        self.ix, self.p, self.t0, self.work_s = ix, policy, float(start_s), work_s
        self.prices = (usd_per_hour, usd_per_hour_on_demand)
        self.billing = (billing_min_s, billing_increment_s)
        self.grace_s, self.loss_window_s = grace_s, loss_window_s
        self.events: list[ReplayEvent] = []
        self.instances: list[ReplayInstance] = []
        self.used: set[int] = set()
        self.slots: list[_Slot] = []
        self.committed = self.wait = self.t_end = 0.0
        self.losses = self.lost = 0
        self.failed = False
        self.rule = policy.deadline_rule()
        self.pool = ""  # the pool's name, where a replay has several (spotmove.py)

    def spot_ok(self, up: float, committed: float) -> bool:
        return self.rule is None or self.rule.spot_ok(up, self.work_s - committed)

    def all_on_demand(self, t: float, lost: set[int], why: str) -> None:
        """Every node on demand from ``t`` to the end: the spot survivors end at ``t``; they
        and the ``lost`` ones (already ended) relaunch on demand."""
        for r, s in enumerate(self.slots):
            if s.on_demand and s.launch <= t:
                self.slots[r] = replace(s, switch_s=INF, next_life=-1)
                continue
            if r not in lost and s.launch <= t:
                self.end_instance(r, s, t)
            self.slots[r] = _Slot(-1, t, t + self.p.restart_s, INF, True)
        self.events.append(ReplayEvent(t, "on_demand", tuple(range(len(self.slots))), why))

    def rel_death(self, life: int, launch: float) -> float:
        return max(self.ix.lives[life].remove_s - self.t0, launch)

    def end_instance(self, slot: int, s: _Slot, end: float) -> None:
        dur = max(end - s.launch, 0.0)
        billed = float(billed_seconds(np.asarray(dur), *self.billing))
        price = self.prices[1] if s.on_demand else self.prices[0]
        node = "" if s.on_demand or s.life < 0 else self.ix.lives[s.life].node
        market = "on-demand" if s.on_demand else "spot"
        usd = price * billed / 3600.0
        self.instances.append(
            ReplayInstance(slot, market, node, s.launch, end, billed, usd, self.pool)
        )

    def picked_alive(self, t: float, pick: str = "youngest", seed: int = 0) -> list[int]:
        """The pool's nodes alive at ``t`` (from the job's start) and not used yet, in the
        order ``pick`` takes them."""
        lives = self.ix.lives
        alive = [i for i in self.ix.alive_at(self.t0 + t) if i not in self.used]
        # nodes of unknown age (``alive`` at the trace's start) count as the oldest
        age_key = [-INF if lives[i].node in self.ix.unknown_age else lives[i].add_s for i in alive]
        order = sorted(range(len(alive)), key=lambda n: age_key[n])
        if pick == "youngest":
            return [alive[n] for n in reversed(order)]
        if pick == "oldest":
            return [alive[n] for n in order]
        np.random.default_rng(seed).shuffle(alive)
        return alive

    def start(self, nodes: int, pick: str, seed: int) -> None:
        """Take ``nodes`` alive nodes by ``pick``; the missing ones from later adds."""
        p = self.p
        alive = self.picked_alive(0.0, pick, seed)
        if not self.spot_ok(p.provisioning_s, 0.0):
            self.slots = [_Slot(-1, 0.0, p.provisioning_s, INF, True) for _ in range(nodes)]
            what = "on demand: the deadline leaves no slack for spot"
            self.events.append(ReplayEvent(0.0, "start", tuple(range(nodes)), what))
            return
        for i in alive[:nodes]:
            self.used.add(i)
            self.slots.append(_Slot(i, 0.0, p.provisioning_s, self.rel_death(i, 0.0)))
        got = tuple(range(len(self.slots)))
        self.events.append(ReplayEvent(0.0, "start", got, f"{len(self.slots)} alive"))
        missing = list(range(len(self.slots), nodes))
        self.slots.extend(_Slot(-1, INF, INF, INF) for _ in missing)
        fail_at = self.refill(missing, [0.0] * len(missing), p.provisioning_s) if missing else None
        if fail_at is not None:
            self.failed, self.t_end = True, fail_at
            what = "no capacity at the start"
            self.events.append(ReplayEvent(fail_at, "failed", tuple(missing), what))

    def refill(self, ranks: list[int], lost_at: list[float], boot: float) -> float | None:
        """Give each of ``ranks`` (lost at ``lost_at``, in that order) the next unused add at
        or after its loss; the time the job fails if one waits beyond ``capacity_wait_s``."""
        p, t0, lives = self.p, self.t0, self.ix.lives
        gaps: list[float] = []
        got: list[int] = []
        for t in lost_at:
            taken = self.ix.take(t0 + t, 1, self.used)
            got.append(taken[0] if taken else -1)
            gaps.append(lives[taken[0]].add_s - t0 - t if taken else INF)
        waits = [gap for gap in gaps if gap > self.grace_s]
        t_od = -INF  # the deadline rule: wait for capacity until then, then on demand
        if self.rule is not None:
            rule = self.rule
            rem = self.work_s - self.committed
            t_od = float(
                on_demand_by_s(
                    rule.deadline_s,
                    rem,
                    rule.restart_s,
                    rule.checkpoint_interval_s,
                    rule.checkpoint_s,
                    rule.margin_s,
                    total_work_s=self.work_s,
                )
            )
            if waits:
                self.wait += max(
                    min(t + gap, max(t_od, t)) - t for t, gap in zip(lost_at, gaps, strict=True)
                )
        if waits and not p.allow_on_demand:
            cap = p.capacity_wait_s
            fails = [t + cap for t, gap in zip(lost_at, gaps, strict=True) if gap > cap]
            if fails:
                return min(fails)
            self.wait += max(waits)  # one wait per loss event (its longest)
        for r, t, g, gap in zip(ranks, lost_at, got, gaps, strict=True):
            if gap <= self.grace_s:  # capacity at once: launched at the loss
                self.slots[r] = _Slot(g, t, t + boot, self.rel_death(g, t))
                self.events.append(ReplayEvent(t, "replace", (r,)))
            elif p.allow_on_demand and t + gap > t_od:  # on demand until the add, then spot
                t_l = max(t, t_od)
                self.slots[r] = _Slot(-1, t_l, t_l + boot, INF, True, t + gap, g)
                what = f"capacity back in {gap:g} s"
                self.events.append(ReplayEvent(t, "on_demand", (r,), what))
            else:  # wait for the add
                self.events.append(ReplayEvent(t, "wait", (r,), f"{gap:g} s"))
                self.slots[r] = _Slot(g, t + gap, t + gap + boot, self.rel_death(g, t + gap))
                self.events.append(ReplayEvent(t + gap, "replace", (r,)))
        return None

    def next_times(self) -> tuple[float, float, float, float, list[int]]:
        """(the end if nothing happens first, the next spot death, the next return of
        capacity to an on-demand node, when the cluster resumes, the spot slots)."""
        p, slots = self.p, self.slots
        interval, ck = p.checkpoint_interval_s, p.checkpoint_s
        t_res = max(s.up for s in slots)
        rem = max(self.work_s - self.committed, 0.0)
        fin = t_res + rem + ck * math.floor(rem / interval + EPS)
        spot = [r for r, s in enumerate(slots) if not s.on_demand]
        d = min((slots[r].death for r in spot), default=INF)
        t_sw = min((s.switch_s for s in slots if s.on_demand), default=INF)
        return fin, d, t_sw, t_res, spot

    def progress_at(self, t: float, t_res: float) -> float:
        """The committed progress when the cluster (resumed at ``t_res``) checkpoints at
        ``t`` before it stops (no lost work)."""
        p = self.p
        interval, cycle = p.checkpoint_interval_s, p.checkpoint_interval_s + p.checkpoint_s
        if t < t_res:
            return self.committed
        e = t - t_res
        k = math.floor(e / cycle + EPS)
        done = k * interval + min(e - k * cycle, interval)
        return min(self.committed + done, self.work_s)

    def step(self) -> bool:
        """The next event (done, back to spot, or a loss); False once the job has ended."""
        fin, d, t_sw, t_res, spot = self.next_times()
        if fin <= min(d, t_sw):
            self.t_end = fin
            self.events.append(ReplayEvent(fin, "done", ()))
            return False
        if t_sw <= d:
            self.to_spot(t_sw, t_res)
            return True
        return self.loss(d, t_res, spot)

    def to_spot(self, t_sw: float, t_res: float) -> None:
        """Capacity is back: the on-demand nodes go back to spot (progress checkpointed)."""
        p, slots = self.p, self.slots
        committed = self.progress_at(t_sw, t_res)
        if not self.spot_ok(max(t_res, t_sw + p.restart_s), committed):
            # the deadline rule: the on-demand nodes stay on demand to the end
            od = tuple(r for r, s in enumerate(slots) if s.on_demand)
            for r in od:
                slots[r] = replace(slots[r], switch_s=INF, next_life=-1)
            self.events.append(ReplayEvent(t_sw, "on_demand", od, "the deadline: staying"))
            return
        self.committed = committed
        back = [r for r, s in enumerate(slots) if s.on_demand and s.switch_s <= t_sw]
        for r in back:
            s = slots[r]
            self.end_instance(r, s, t_sw)
            g = s.next_life
            death = self.rel_death(g, t_sw) if g >= 0 else INF
            slots[r] = _Slot(g, t_sw, t_sw + p.restart_s, death)
        self.events.append(ReplayEvent(t_sw, "to_spot", tuple(back)))

    def loss(self, d: float, t_res: float, spot: list[int]) -> bool:
        """A loss event at ``d``; False when the job fails there."""
        p, slots = self.p, self.slots
        if d >= t_res:
            k = math.floor((d - t_res) / (p.checkpoint_interval_s + p.checkpoint_s) + EPS)
            ahead = min(self.committed + k * p.checkpoint_interval_s, self.work_s)
            if p.notice_stop_s is not None:  # the notice's checkpoint (spotnotice.py)
                ahead = max(ahead, self.progress_at(d - p.notice_stop_s, t_res))
            self.committed = ahead
        window = d + self.loss_window_s
        gone = [r for r in spot if slots[r].launch <= d and slots[r].death <= window]
        self.losses += 1
        self.lost += len(gone)
        self.events.append(ReplayEvent(d, "preempted", tuple(gone)))
        for r in gone:
            self.end_instance(r, slots[r], slots[r].death)
        if self.lost > p.max_replacements:
            self.fail(d, gone, "max_replacements")
            return False
        gone.sort(key=lambda r: slots[r].death)
        up = max(t_res, d + p.restart_s)
        if not self.spot_ok(up, self.committed):
            self.all_on_demand(d, set(gone), "the deadline: the slack no longer covers a loss")
            return True
        fail_at = self.refill(gone, [max(slots[r].death, d) for r in gone], p.restart_s)
        if fail_at is not None:
            self.fail(fail_at, gone, "no capacity")
            return False
        return True

    def fail(self, t: float, gone: list[int], why: str) -> None:
        self.failed, self.t_end = True, t
        for r in gone:
            self.slots[r] = _Slot(-1, INF, INF, INF)
        self.events.append(ReplayEvent(t, "failed", tuple(gone), why))

    def outcome(self) -> ReplayOutcome:
        """Close the instances still running at the end; the replay's totals."""
        for r, s in enumerate(self.slots):
            if s.launch <= self.t_end:
                self.end_instance(r, s, min(s.death, self.t_end))
        instances = sorted(self.instances, key=lambda x: (x.launch_s, x.slot))
        return ReplayOutcome(
            hours=self.t_end / 3600.0,
            cost_usd=sum(x.usd for x in instances),
            losses=self.losses,
            lost_nodes=self.lost,
            failed=self.failed,
            wait_s=self.wait,
            on_demand_node_s=sum(x.end_s - x.launch_s for x in instances if x.market != "spot"),
            truncated=self.t0 + self.t_end > self.ix.end_s,
            events=tuple(self.events),
            instances=tuple(instances),
        )


def _replay(
    ix: _TraceIndex,
    *,
    start_s: float,
    nodes: int,
    work_s: float,
    policy: RecoveryPolicy,
    usd_per_hour: float,
    usd_per_hour_on_demand: float,
    billing_min_s: float,
    billing_increment_s: float,
    pick: str,
    seed: int,
    grace_s: float,
    loss_window_s: float,
) -> ReplayOutcome:
    if nodes < 1 or work_s < 0:
        raise ValueError(f"nodes {nodes} must be >= 1 and work_s {work_s} >= 0")
    if pick not in ("youngest", "oldest", "random"):
        raise ValueError(f"pick {pick!r} is not youngest, oldest or random")
    job = _Replayer(
        ix,
        start_s=start_s,
        work_s=work_s,
        policy=policy,
        usd_per_hour=usd_per_hour,
        usd_per_hour_on_demand=usd_per_hour_on_demand,
        billing_min_s=billing_min_s,
        billing_increment_s=billing_increment_s,
        grace_s=grace_s,
        loss_window_s=loss_window_s,
    )
    job.start(nodes, pick, seed)
    while not job.failed and job.step():
        pass
    return job.outcome()
