"""Time and cost of one training job on a spot cluster, as distributions.

``simulate`` is a seeded Monte-Carlo vectorised over configurations x runs (numpy, one loop
step per event); ``replay`` runs the same job against a recorded ``SpotTrace`` from one start.
Both follow the contract of ``kplan/planner/spot.py`` (``spottrace.synthetic_trace`` draws traces
from it), made exact here:

- **Clock**: t = 0 when the job asks for its nodes; all are launched then and up after
  ``provisioning_s``; a replacement launched at ``t`` is up at ``t + restart_s``. Training runs
  only while every node is up; survivors reload the checkpoint while the replacement boots.
- **Loss clocks**: each node slot runs a clock, ``Weibull(shape, scale_h * (1 + co_loss (n-1)))``
  drawn at 0 and whenever a slot is filled after its clock fired; a co-lost node's replacement
  keeps the slot's running clock; a clock that fires while its slot is empty (waiting for
  capacity) or on demand is drawn again when spot refills it. A node can be lost while booting.
- **Progress**: ``W = work_s * exp(log_sigma * z)`` seconds (one ``z`` per run). From the last
  committed progress ``c`` a checkpoint (``checkpoint_s`` of wall time) is written after every
  ``checkpoint_interval_s`` of progress, the last one at ``W`` when ``W - c`` is a whole number
  of intervals: undisturbed, ``W + checkpoint_s * floor(W / interval)``, the closed form of
  ``costs.py``. A checkpoint counts once written.
- **Loss event**: a clock fires on a slot holding a spot node; each other spot node launched
  goes too with probability ``co_loss``. Progress falls back to the last checkpoint. A loss
  during a restart or a wait is an event too (no progress to lose). More than
  ``max_replacements`` lost nodes in all: the run fails at that loss.
- **Capacity**: after a loss event, with probability ``outage.prob`` the zone has none; with
  ``zone_failover`` and probability ``1 - region_prob`` another zone has it (replacement at
  once). Otherwise the region (without failover, the zone) is out for ``D`` from
  ``outage.durations_h``; a loss while it is out finds it out until the same time (no new
  draw). A wait no longer than ``restart_s`` counts as none (replacement at once: the way
  ``replay`` and the fit read a trace). With ``allow_on_demand`` the lost nodes are replaced on
  demand at once (on-demand price) and go back to spot at ``D``: the workers checkpoint (progress
  kept; the write's time neglected), the on-demand nodes end, spot nodes launch, and training
  resumes ``restart_s`` later; the return is not a lost node. Without fallback the job waits
  ``D`` and launches then if ``D <= capacity_wait_s``; else it fails at ``loss +
  capacity_wait_s`` (survivors stay up and billed until then).
- **Money**: each instance is billed from its launch to its end (its loss, its return to
  spot, or the job's end) at its market's price, ``billing_min_s`` minimum, rounded up to
  ``billing_increment_s`` (``costs._billed``).
- **Failed runs** keep their time to failure and their cost so far in the distributions
  (``hours_*``, ``cost_*``); ``fail_prob`` counts them. ``wait_hours`` adds the wait of each
  loss event that waited. A run past ``max_events`` events counts as failed.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from kplan.planner.costs import _billed
from kplan.planner.spot import RecoveryPolicy, SpotRisk
from kplan.planner.spottrace import ADD, LOSS_WINDOW_S, REMOVE, SpotTrace

Array = NDArray[np.float64]
INF = math.inf
EPS = 1e-9


@dataclass(frozen=True)
class SimSamples:
    """Per-run results, shape (configurations, runs): for calibration and histograms."""

    hours: Array
    cost_usd: Array
    failed: NDArray[np.bool_]
    losses: Array  # loss events
    lost_nodes: Array
    wait_hours: Array
    on_demand_hours: Array  # node-hours on demand


@dataclass(frozen=True)
class SimResult:
    """Summaries over runs, one value per configuration."""

    hours_mean: Array
    hours_p90: Array
    cost_mean: Array
    cost_p90: Array
    losses_mean: Array
    lost_nodes_mean: Array
    lost_nodes_p99: Array
    fail_prob: Array
    wait_hours_mean: Array
    on_demand_hours_mean: Array
    samples: SimSamples


def _draw_regimes(
    P: dict[str, NDArray[Any]], risks: list[SpotRisk | None], cf: NDArray[np.intp], seed: int
) -> None:
    """Each run's market period (spot.py, Regimes): the loss hazard times ``exp(s z - s^2/2)``
    (a Weibull's scale times that to the power -1/k) and the outage chance's logit plus
    ``s' z'``. Drawn from their own stream: with no spread the runs are unchanged."""
    rate_sd = np.array([r.rate_sigma if r else 0.0 for r in risks])[cf]
    out_sd = np.array([r.outage_sigma if r else 0.0 for r in risks])[cf]
    if not (np.any(rate_sd > 0) or np.any(out_sd > 0)):
        return
    g = np.random.default_rng([seed, 7919])
    z1, z2 = g.standard_normal(cf.size), g.standard_normal(cf.size)
    mult = np.exp(rate_sd * z1 - rate_sd**2 / 2.0)
    with np.errstate(invalid="ignore", over="ignore"):
        P["scale"] = np.where(np.isfinite(P["scale"]), P["scale"] * mult ** (-P["k_inv"]), INF)
    p = np.clip(P["out_p"], 0.0, 1.0)
    inner = (p > 0) & (p < 1)
    logit = np.log(np.where(inner, p, 0.5) / np.where(inner, 1.0 - p, 0.5)) + out_sd * z2
    P["out_p"] = np.where(inner, 1.0 / (1.0 + np.exp(-logit)), p)


def _per_config(values: Sequence[object], c: int, name: str) -> list[object]:
    if len(values) == c:
        return list(values)
    if len(values) == 1:
        return list(values) * c
    raise ValueError(f"{name} has {len(values)} entries for {c} configurations")


def simulate(
    *,
    work_s: ArrayLike,
    nodes: ArrayLike,
    risks: Sequence[SpotRisk | None],
    policies: Sequence[RecoveryPolicy],
    usd_per_hour: ArrayLike,
    usd_per_hour_on_demand: ArrayLike,
    log_sigma: ArrayLike = 0.0,
    runs: int = 2000,
    seed: int = 0,
    billing_min_s: ArrayLike = 60.0,
    billing_increment_s: ArrayLike = 1.0,
    max_events: int = 10_000,
) -> SimResult:
    """Monte-Carlo of ``runs`` runs of each configuration (the arrays broadcast; ``risks`` and
    ``policies`` have one entry per configuration, or one for all). A risk of ``None`` is an
    on-demand cluster: no preemption. ``usd_per_hour`` is the per-node price of the market the
    nodes run in (spot, or on demand for ``None``); ``usd_per_hour_on_demand`` prices the
    fallback. A run still going after ``max_events`` events counts as failed."""
    if runs < 1:
        raise ValueError(f"runs={runs} must be >= 1")
    arrays = np.broadcast_arrays(
        np.atleast_1d(np.asarray(work_s, dtype=float)),
        np.atleast_1d(np.asarray(nodes, dtype=float)),
        np.atleast_1d(np.asarray(usd_per_hour, dtype=float)),
        np.atleast_1d(np.asarray(usd_per_hour_on_demand, dtype=float)),
        np.atleast_1d(np.asarray(log_sigma, dtype=float)),
        np.atleast_1d(np.asarray(billing_min_s, dtype=float)),
        np.atleast_1d(np.asarray(billing_increment_s, dtype=float)),
    )
    c_n = max(arrays[0].size, len(risks), len(policies))
    w0, n_f, p_spot, p_od, sig, bmin, binc = (np.broadcast_to(a.ravel(), (c_n,)) for a in arrays)
    if np.any(n_f < 1) or np.any(n_f != np.round(n_f)):
        raise ValueError(f"nodes {n_f} must be whole numbers >= 1")
    if np.any(~(w0 >= 0)):
        raise ValueError(f"work_s {w0} must be >= 0")
    rk = _per_config(risks, c_n, "risks")
    pol = [p for p in _per_config(policies, c_n, "policies") if isinstance(p, RecoveryPolicy)]
    if len(pol) != c_n:
        raise ValueError("policies must be RecoveryPolicy")
    risk_list = [r if isinstance(r, SpotRisk) else None for r in rk]

    n_max = int(n_f.max())
    m = c_n * runs

    def per_cfg(vals: Sequence[float]) -> Array:
        return np.asarray(vals, dtype=float)

    co_loss = per_cfg([r.co_loss if r else 0.0 for r in risk_list])
    prov = per_cfg([p.provisioning_s for p in pol])
    interval = per_cfg([p.checkpoint_interval_s for p in pol])
    ck_s = per_cfg([p.checkpoint_s for p in pol])
    by_cfg: dict[str, NDArray[Any]] = {
        "k_inv": per_cfg([1.0 / r.lifetime.shape if r else 1.0 for r in risk_list]),
        # each slot's loss clock: the life's scale stretched by 1 + co_loss (n - 1) (spot.py)
        "scale": per_cfg([r.lifetime.scale_h * 3600.0 if r else INF for r in risk_list])
        * (1.0 + co_loss * (n_f - 1.0)),
        "co": co_loss.astype(np.float32),
        "out_p": per_cfg([r.outage.prob if r else 0.0 for r in risk_list]),
        "region_p": per_cfg([r.outage.region_prob if r else 0.0 for r in risk_list]),
        "failover": np.array([p.zone_failover for p in pol]),
        "allow_od": np.array([p.allow_on_demand for p in pol]),
        "restart": per_cfg([p.restart_s for p in pol]),
        "interval": interval,
        "ck": ck_s,
        "cycle": interval + ck_s,
        "max_rep": per_cfg([float(p.max_replacements) for p in pol]),
        "cap": per_cfg([p.capacity_wait_s for p in pol]),
        "n_dur": np.array([len(r.outage.durations_h) if r else 0 for r in risk_list]),
        "bmin": bmin,
        "binc": binc,
        "p_spot": p_spot,
        "p_od": p_od,
        "cf": np.arange(c_n),
    }
    # outage durations: one padded row per configuration, sampled by index
    durs = np.zeros((c_n, max(int(by_cfg["n_dur"].max()), 1)))
    for i, r in enumerate(risk_list):
        if r and r.outage.durations_h:
            durs[i, : len(r.outage.durations_h)] = np.asarray(r.outage.durations_h) * 3600.0
    any_co = bool(np.any(co_loss > 0))

    rng = np.random.default_rng(seed)
    cf = np.repeat(np.arange(c_n), runs)  # configuration of each lane
    # per-lane copies of the parameters, compacted with the state (no gather per event)
    P = {key: x[cf] for key, x in by_cfg.items()}
    _draw_regimes(P, risk_list, cf, seed)

    def lives(idx: NDArray[np.intp]) -> Array:
        """Fresh slot clocks (s from now) for lanes ``idx``."""
        e = rng.exponential(1.0, size=idx.shape)
        s = P["scale"][idx]
        with np.errstate(invalid="ignore", over="ignore"):
            out: Array = np.where(np.isfinite(s), s * e ** P["k_inv"][idx], INF)
        return out

    def billed_usd(idx: NDArray[np.intp], seconds: Array, usd_h: Array) -> Array:
        out: Array = usd_h * _billed(seconds, P["bmin"][idx], P["binc"][idx]) / 3600.0
        return out

    # state of the lanes still running (compacted as lanes finish); lane = one run of one config
    # slots (node ranks): launch = INF for a slot not in the cluster or waiting for none;
    # launch_spot the same, INF on demand too (only spot nodes can be lost); death INF on demand
    orig = np.arange(m)
    work = w0[cf] * np.exp(sig[cf] * rng.standard_normal(m))
    slot_on = np.arange(n_max)[None, :] < n_f[cf][:, None]  # (lanes, n_max)
    launch = np.where(slot_on, 0.0, INF)
    launch_spot = launch.copy()
    death = np.where(slot_on, lives(np.broadcast_to(np.arange(m)[:, None], slot_on.shape)), INF)
    on_od = np.zeros((m, n_max), dtype=bool)
    held = np.full((m, n_max), INF)  # the running clock of a slot while it is on demand
    t_res = prov[cf].copy()  # when every node is up (training resumes)
    n_od = np.zeros(m)  # slots on demand
    committed = np.zeros(m)
    region_until = np.full(m, -INF)
    cost = np.zeros(m)
    losses = np.zeros(m)
    lost = np.zeros(m)
    wait = np.zeros(m)
    od_s = np.zeros(m)
    # results, by original lane
    r_end, r_cost, r_losses, r_lost = np.zeros(m), np.zeros(m), np.zeros(m), np.zeros(m)
    r_wait, r_od = np.zeros(m), np.zeros(m)
    r_failed = np.zeros(m, dtype=bool)
    running = np.ones(m, dtype=bool)  # lanes kept until compaction; finished ones are inert

    for _ in range(max_events):
        n_l = orig.size
        if n_l == 0:
            break
        rows = np.arange(n_l)
        j = np.argmin(death, axis=1)
        d = death[rows, j]
        rem = np.maximum(work - committed, 0.0)
        fin = t_res + rem + P["ck"] * np.floor(rem / P["interval"] + EPS)
        t_sw = np.where(n_od > 0, region_until, INF)
        done = running & (fin <= np.minimum(d, t_sw))
        sw = running & ~done & (t_sw <= d)
        ls = running & ~done & ~sw
        t_end = np.where(done, fin, INF)
        failed = np.zeros(n_l, dtype=bool)

        sr = np.flatnonzero(sw)
        if sr.size:  # back to spot when capacity returns: checkpoint, relaunch on spot
            e = np.maximum(t_sw[sr] - t_res[sr], 0.0)
            cyc, ivl = P["cycle"][sr], P["interval"][sr]
            k = np.floor(e / cyc + EPS)
            prog = k * ivl + np.minimum(e - k * cyc, ivl)
            committed[sr] = np.minimum(committed[sr] + prog, work[sr])
            g_r, g_c = np.nonzero(on_od[sr])
            g_r = sr[g_r]
            t = t_sw[g_r]
            dur = t - launch[g_r, g_c]
            cost += np.bincount(g_r, billed_usd(g_r, dur, P["p_od"][g_r]), n_l)
            od_s += np.bincount(g_r, dur, n_l)
            launch[g_r, g_c] = launch_spot[g_r, g_c] = t
            kept = held[g_r, g_c]
            death[g_r, g_c] = np.where(kept > t, kept, t + lives(g_r))
            on_od[g_r, g_c] = False
            n_od[sr] = 0.0
            t_res[sr] = np.maximum(t_res[sr], t_sw[sr] + P["restart"][sr])

        if ls.any():  # a loss event at d: the first death, and co-losses
            e = np.maximum(d - t_res, 0.0)
            k = np.floor(e / P["cycle"] + EPS)
            train = ls & (d >= t_res)
            committed = np.where(train, np.minimum(committed + k * P["interval"], work), committed)
            gone = death <= d[:, None]
            if any_co:
                u = rng.random((n_l, n_max), dtype=np.float32)
                gone |= u < P["co"][:, None]
            gone &= launch_spot <= d[:, None]
            gone[rows, j] = True
            g_r, g_c = np.nonzero(gone & ls[:, None])
            losses += ls
            lost_now = np.bincount(g_r, minlength=n_l)
            lost += lost_now
            dur = d[g_r] - launch[g_r, g_c]
            cost += np.bincount(g_r, billed_usd(g_r, dur, P["p_spot"][g_r]), n_l)
            # capacity: the region still out from an earlier outage, or a new draw
            still = region_until > d
            u1, u2, u3 = rng.random(n_l), rng.random(n_l), rng.random(n_l)
            nd = P["n_dur"]
            draw_d = durs[P["cf"], np.minimum((u3 * nd).astype(np.intp), np.maximum(nd - 1, 0))]
            regional = (u1 < P["out_p"]) & (~P["failover"] | (u2 < P["region_p"]))
            region_until = np.where(ls & ~still & regional, d + draw_d, region_until)
            # a capacity wait no longer than the restart is none (as ``replay`` reads a trace)
            out = ls & (still | regional) & (region_until - d > P["restart"])
            d_wait = np.where(out, region_until - d, 0.0)
            use_od = out & P["allow_od"]
            wait_ok = out & ~P["allow_od"] & (d_wait <= P["cap"])
            no_cap = out & ~P["allow_od"] & ~wait_ok
            wait += np.where(wait_ok, d_wait, 0.0)
            t_launch = d + np.where(wait_ok, d_wait, 0.0)
            tl = t_launch[g_r]
            od = use_od[g_r]
            launch[g_r, g_c] = tl
            launch_spot[g_r, g_c] = np.where(od, INF, tl)
            # a slot refilled at tl keeps its clock unless it fired (its own loss, or while
            # the slot was empty): then a fresh one from tl
            clock = death[g_r, g_c]
            held[g_r, g_c] = clock  # kept through an on-demand spell (fired or not)
            clock = np.where(clock > tl, clock, tl + lives(g_r))
            death[g_r, g_c] = np.where(od, INF, clock)
            on_od[g_r, g_c] = od
            n_od += np.where(use_od, lost_now, 0)
            t_res = np.where(ls, np.maximum(t_res, t_launch + P["restart"]), t_res)
            too_many = ls & (lost > P["max_rep"])
            failed = too_many | no_cap
            if failed.any():
                t_end = np.where(too_many, d, np.where(no_cap, d + P["cap"], t_end))
                # the lost slots of a failed run have nothing running (already billed)
                f = failed[g_r]
                launch[g_r[f], g_c[f]] = INF

        end = np.isfinite(t_end)
        if end.any():  # close every launched instance at the end (or its death)
            er = np.flatnonzero(end)
            te = t_end[er]
            ln = launch[er]
            g_r, g_c = np.nonzero(ln <= te[:, None])
            dur = np.minimum(death[er][g_r, g_c], te[g_r]) - ln[g_r, g_c]
            odf = on_od[er][g_r, g_c]
            lane = er[g_r]
            price = np.where(odf, P["p_od"][lane], P["p_spot"][lane])
            cost[er] += np.bincount(g_r, billed_usd(lane, dur, price), er.size)
            od_s[er] += np.bincount(g_r, np.where(odf, dur, 0.0), er.size)
            o = orig[er]
            r_end[o], r_cost[o], r_losses[o], r_lost[o] = te, cost[er], losses[er], lost[er]
            r_wait[o], r_od[o], r_failed[o] = wait[er], od_s[er], failed[er]
            running[er] = False
            death[er] = INF  # inert: no event of theirs is looked at again
            stopped = n_l - int(running.sum())
            if stopped * 4 > n_l or stopped == n_l:  # compact (a copy of every array)
                keep = running
                P = {key: x[keep] for key, x in P.items()}
                orig, running, on_od = orig[keep], running[keep], on_od[keep]
                work, committed, region_until = work[keep], committed[keep], region_until[keep]
                t_res, n_od, cost, losses = t_res[keep], n_od[keep], cost[keep], losses[keep]
                lost, wait, od_s = lost[keep], wait[keep], od_s[keep]
                launch, launch_spot = launch[keep], launch_spot[keep]
                death, held = death[keep], held[keep]
    else:  # runs still going after max_events events: failed, at their last known time
        o = orig[running]
        r_end[o] = np.maximum(t_res[running], 0.0)
        r_cost[o], r_losses[o], r_lost[o] = cost[running], losses[running], lost[running]
        r_wait[o], r_od[o] = wait[running], od_s[running]
        r_failed[o] = True

    shp = (c_n, runs)
    s = SimSamples(
        hours=(r_end / 3600.0).reshape(shp),
        cost_usd=r_cost.reshape(shp),
        failed=r_failed.reshape(shp),
        losses=r_losses.reshape(shp),
        lost_nodes=r_lost.reshape(shp),
        wait_hours=(r_wait / 3600.0).reshape(shp),
        on_demand_hours=(r_od / 3600.0).reshape(shp),
    )
    return SimResult(
        hours_mean=s.hours.mean(axis=1),
        hours_p90=np.quantile(s.hours, 0.9, axis=1),
        cost_mean=s.cost_usd.mean(axis=1),
        cost_p90=np.quantile(s.cost_usd, 0.9, axis=1),
        losses_mean=s.losses.mean(axis=1),
        lost_nodes_mean=s.lost_nodes.mean(axis=1),
        lost_nodes_p99=np.quantile(s.lost_nodes, 0.99, axis=1),
        fail_prob=s.failed.mean(axis=1),
        wait_hours_mean=s.wait_hours.mean(axis=1),
        on_demand_hours_mean=s.on_demand_hours.mean(axis=1),
        samples=s,
    )


# ---------------------------------------------------------------------------- trace replay


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
    p = policy
    interval, ck = p.checkpoint_interval_s, p.checkpoint_s
    cycle = interval + ck
    t0 = float(start_s)
    events: list[ReplayEvent] = []
    instances: list[ReplayInstance] = []
    used: set[int] = set()
    lives = ix.lives
    unknown = ix.unknown_age

    def rel_death(life: int, launch: float) -> float:
        return max(lives[life].remove_s - t0, launch)

    def end_instance(slot: int, s: _Slot, end: float) -> None:
        dur = max(end - s.launch, 0.0)
        billed = float(_billed(np.asarray(dur), billing_min_s, billing_increment_s))
        price = usd_per_hour_on_demand if s.on_demand else usd_per_hour
        node = "" if s.on_demand or s.life < 0 else lives[s.life].node
        market = "on-demand" if s.on_demand else "spot"
        usd = price * billed / 3600.0
        instances.append(ReplayInstance(slot, market, node, s.launch, end, billed, usd))

    alive = ix.alive_at(t0)
    # nodes of unknown age (``alive`` at the trace's start) count as the oldest
    age_key = [-INF if lives[i].node in unknown else lives[i].add_s for i in alive]
    order = sorted(range(len(alive)), key=lambda n: age_key[n])
    if pick == "youngest":
        alive = [alive[n] for n in reversed(order)]
    elif pick == "oldest":
        alive = [alive[n] for n in order]
    else:
        np.random.default_rng(seed).shuffle(alive)
    slots: list[_Slot] = []
    for i in alive[:nodes]:
        used.add(i)
        slots.append(_Slot(i, 0.0, p.provisioning_s, rel_death(i, 0.0)))
    events.append(ReplayEvent(0.0, "start", tuple(range(len(slots))), f"{len(slots)} alive"))

    committed = 0.0
    losses = lost = 0
    wait = 0.0
    failed = False
    t_end = 0.0

    def refill(ranks: list[int], lost_at: list[float], boot: float) -> float | None:
        """Give each of ``ranks`` (lost at ``lost_at``, in that order) the next unused add at
        or after its loss; the time the job fails if one waits beyond ``capacity_wait_s``."""
        nonlocal wait
        gaps: list[float] = []
        got: list[int] = []
        for t in lost_at:
            taken = ix.take(t0 + t, 1, used)
            got.append(taken[0] if taken else -1)
            gaps.append(lives[taken[0]].add_s - t0 - t if taken else INF)
        waits = [gap for gap in gaps if gap > grace_s]
        if waits and not p.allow_on_demand:
            cap = p.capacity_wait_s
            fails = [t + cap for t, gap in zip(lost_at, gaps, strict=True) if gap > cap]
            if fails:
                return min(fails)
            wait += max(waits)  # one wait per loss event (its longest)
        for r, t, g, gap in zip(ranks, lost_at, got, gaps, strict=True):
            if gap <= grace_s:  # capacity at once: launched at the loss
                slots[r] = _Slot(g, t, t + boot, rel_death(g, t))
                events.append(ReplayEvent(t, "replace", (r,)))
            elif p.allow_on_demand:  # on demand until the add, then back to spot on it
                slots[r] = _Slot(-1, t, t + boot, INF, True, t + gap, g)
                events.append(ReplayEvent(t, "on_demand", (r,), f"capacity back in {gap:g} s"))
            else:  # wait for the add
                events.append(ReplayEvent(t, "wait", (r,), f"{gap:g} s"))
                slots[r] = _Slot(g, t + gap, t + gap + boot, rel_death(g, t + gap))
                events.append(ReplayEvent(t + gap, "replace", (r,)))
        return None

    missing = list(range(len(slots), nodes))
    slots.extend(_Slot(-1, INF, INF, INF) for _ in missing)
    fail_at = refill(missing, [0.0] * len(missing), p.provisioning_s) if missing else None
    if fail_at is not None:
        failed, t_end = True, fail_at
        events.append(ReplayEvent(t_end, "failed", tuple(missing), "no capacity at the start"))

    while not failed:
        t_res = max(s.up for s in slots)
        rem = max(work_s - committed, 0.0)
        fin = t_res + rem + ck * math.floor(rem / interval + EPS)
        spot = [r for r, s in enumerate(slots) if not s.on_demand]
        d = min((slots[r].death for r in spot), default=INF)
        t_sw = min((s.switch_s for s in slots if s.on_demand), default=INF)
        if fin <= min(d, t_sw):
            t_end = fin
            events.append(ReplayEvent(fin, "done", ()))
            break
        if t_sw <= d:  # capacity is back: the on-demand nodes go back to spot
            if t_sw >= t_res:
                e = t_sw - t_res
                k = math.floor(e / cycle + EPS)
                committed = min(committed + k * interval + min(e - k * cycle, interval), work_s)
            back = [r for r, s in enumerate(slots) if s.on_demand and s.switch_s <= t_sw]
            for r in back:
                s = slots[r]
                end_instance(r, s, t_sw)
                g = s.next_life
                death = rel_death(g, t_sw) if g >= 0 else INF
                slots[r] = _Slot(g, t_sw, t_sw + p.restart_s, death)
            events.append(ReplayEvent(t_sw, "to_spot", tuple(back)))
            continue
        # a loss event at d
        if d >= t_res:
            k = math.floor((d - t_res) / cycle + EPS)
            committed = min(committed + k * interval, work_s)
        gone = [r for r in spot if slots[r].launch <= d and slots[r].death <= d + loss_window_s]
        losses += 1
        lost += len(gone)
        events.append(ReplayEvent(d, "preempted", tuple(gone)))
        for r in gone:
            end_instance(r, slots[r], slots[r].death)
        if lost > p.max_replacements:
            failed, t_end = True, d
            for r in gone:
                slots[r] = _Slot(-1, INF, INF, INF)
            events.append(ReplayEvent(d, "failed", tuple(gone), "max_replacements"))
            break
        gone.sort(key=lambda r: slots[r].death)
        fail_at = refill(gone, [max(slots[r].death, d) for r in gone], p.restart_s)
        if fail_at is not None:
            failed, t_end = True, fail_at
            for r in gone:
                slots[r] = _Slot(-1, INF, INF, INF)
            events.append(ReplayEvent(t_end, "failed", tuple(gone), "no capacity"))

    for r, s in enumerate(slots):
        if s.launch <= t_end:
            end_instance(r, s, min(s.death, t_end))
    instances.sort(key=lambda x: (x.launch_s, x.slot))
    return ReplayOutcome(
        hours=t_end / 3600.0,
        cost_usd=sum(x.usd for x in instances),
        losses=losses,
        lost_nodes=lost,
        failed=failed,
        wait_s=wait,
        on_demand_node_s=sum(x.end_s - x.launch_s for x in instances if x.market != "spot"),
        truncated=t0 + t_end > ix.end_s,
        events=tuple(events),
        instances=tuple(instances),
    )
