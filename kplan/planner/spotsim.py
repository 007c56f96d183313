"""Time and cost of one training job on a spot cluster, as distributions.

``simulate`` is a seeded Monte-Carlo vectorised over configurations x runs (numpy, one loop
step per event), its draws counter-based (``spotdraws``: a row draws the same numbers whatever
rows are simulated with it); ``replay`` runs the same job against a recorded ``SpotTrace``
from one start.
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
  goes too with probability ``co_loss``. Progress falls back to the last checkpoint: the last
  periodic one, or with ``notice_stop_s`` the notice's, taken that long before the loss
  (``kplan/planner/spotnotice.py``), whichever holds more. A loss
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
  ``billing_increment_s`` (``costs.billed_seconds``).
- **Deadline** (``policy.deadline_s``, kplan/planner/deadline.py): the lanes follow
  ``deadline.spot_ok`` at the start, at each loss and at each return of capacity; where it says
  no at a loss, every node goes on demand at the loss (spot survivors billed to it) to the end;
  where it says no at a return, the on-demand nodes stay on demand to the end. In an outage
  the job waits until ``deadline.on_demand_by_s`` and then goes on demand until capacity
  returns (the fallback's launch, not the loss, starts its bill).
- **Failed runs** keep their time to failure and their cost so far in the distributions
  (``hours_*``, ``cost_*``); ``fail_prob`` counts them. ``wait_hours`` adds the wait of each
  loss event that waited. A run past ``max_events`` events counts as failed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from kplan.planner import deadline, nanstat, spotdraws
from kplan.planner.costs import billed_seconds
from kplan.planner.spot import RecoveryPolicy, SpotRisk
from kplan.planner.spotparams import config_params, draw_regimes

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
    """Summaries over runs, one value per configuration. A plan shows the median and the p90
    (one distribution: the p90 is never below it); a short job's rare preemption can put the
    mean above the p90 (a heavy tail)."""

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
    hours_median: Array
    cost_median: Array


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
    more_events: Callable[[SimResult], int | None] | None = None,
) -> SimResult:
    """Monte-Carlo of ``runs`` runs of each configuration (the arrays broadcast; ``risks`` and
    ``policies`` have one entry per configuration, or one for all). A risk of ``None`` is an
    on-demand cluster: no preemption. ``usd_per_hour`` is the per-node price of the market the
    nodes run in (spot, or on demand for ``None``); ``usd_per_hour_on_demand`` prices the
    fallback. A run still going after ``max_events`` events counts as failed.

    ``more_events``: asked with the result at the cut while runs are still going; a larger cut
    continues those runs to it (the same result as a fresh simulation with that cut: the runs
    draw the same numbers up to it), None keeps the result."""
    if runs < 1:
        raise ValueError(f"runs={runs} must be >= 1")
    arrays = np.broadcast_arrays(
        *(
            np.atleast_1d(np.asarray(a, dtype=float))
            for a in (work_s, nodes, usd_per_hour, usd_per_hour_on_demand, log_sigma)
        ),
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
    by_cfg = config_params(risk_list, pol, n_f, (bmin, binc, p_spot, p_od), w0)
    rows = [
        (float(w0[i]), n_f[i], rk[i], pol[i], p_spot[i], p_od[i], sig[i], bmin[i], binc[i])
        for i in range(c_n)
    ]
    by_cfg["key"] = spotdraws.row_keys(rows, seed)
    sim = _Lanes(by_cfg, risk_list, pol, n_f, runs)
    sim.start(w0, sig)
    done = 0
    while True:
        for _ in range(max_events - done):
            if sim.orig.size == 0:
                return _summary(sim.results(), (c_n, runs))
            sim.step()
        done = max_events
        if sim.orig.size == 0:
            return _summary(sim.results(), (c_n, runs))
        # runs still going after max_events events: failed, at their last known time (each
        # is recorded again if it goes on and ends)
        sim.give_up()
        res = _summary(sim.results(), (c_n, runs))
        more = None if more_events is None else more_events(res)
        if more is None or more <= max_events:
            return res
        max_events = more


class _Lanes:
    """The state of the lanes still running (one lane = one run of one configuration),
    compacted as lanes finish, and the results by original lane. Slots are node ranks:
    ``launch`` is INF for a slot not in the cluster or waiting for none; ``launch_spot`` the
    same, INF on demand too (only spot nodes can be lost); ``death`` INF on demand."""

    def __init__(
        self,
        by_cfg: dict[str, NDArray[Any]],
        risk_list: list[SpotRisk | None],
        pol: list[RecoveryPolicy],
        n_f: Array,
        runs: int,
    ) -> None:
        c_n = len(pol)
        self.n_f, self.n_max, self.m = n_f, int(n_f.max()), c_n * runs
        # outage durations: one padded row per configuration, sampled by index
        self.durs = np.zeros((c_n, max(int(by_cfg["n_dur"].max()), 1)))
        for i, r in enumerate(risk_list):
            if r and r.outage.durations_h:
                self.durs[i, : len(r.outage.durations_h)] = (
                    np.asarray(r.outage.durations_h) * 3600.0
                )
        self.any_co = bool(np.any(by_cfg["co"] > 0))
        # without a deadline the rule always allows spot (deadline.spot_ok): not evaluated
        self.any_dl = bool(np.isfinite(by_cfg["deadline"]).any())
        self.any_notice = bool(np.isfinite(by_cfg["notice"]).any())
        self.cf = np.repeat(np.arange(c_n), runs)  # configuration of each lane
        # per-lane copies of the parameters, compacted with the state (no gather per event)
        self.P = {key: x[self.cf] for key, x in by_cfg.items()}
        # each lane's random stream (spotdraws): its row's key and its run index
        self.P["lane"] = spotdraws.lane_keys(self.P.pop("key"), np.tile(np.arange(runs), c_n))
        self.ev = np.zeros(self.m, dtype=np.int64)  # each lane's event counter
        draw_regimes(self.P, risk_list, self.cf)
        self.prov = np.array([p.provisioning_s for p in pol])
        m = self.m
        self.r_end, self.r_cost, self.r_losses = np.zeros(m), np.zeros(m), np.zeros(m)
        self.r_lost, self.r_wait, self.r_od = np.zeros(m), np.zeros(m), np.zeros(m)
        self.r_failed = np.zeros(m, dtype=bool)

    def lives(self, idx: NDArray[np.intp], col: NDArray[np.intp]) -> Array:
        """Fresh slot clocks (s from now) for lanes ``idx``, slots ``col``."""
        slot = spotdraws.LIFE * spotdraws.SLOT_SPAN + col
        e = spotdraws.exponential(self.P["lane"][idx], self.ev[idx], slot)
        s = self.P["scale"][idx]
        with np.errstate(invalid="ignore", over="ignore"):
            out: Array = np.where(np.isfinite(s), s * e ** self.P["k_inv"][idx], INF)
        return out

    def billed_usd(self, idx: NDArray[np.intp], seconds: Array, usd_h: Array) -> Array:
        out: Array = (
            usd_h * billed_seconds(seconds, self.P["bmin"][idx], self.P["binc"][idx]) / 3600.0
        )
        return out

    def start(self, w0: Array, sig: Array) -> None:
        """Every lane at t = 0: its work drawn, every slot launched with a fresh clock."""
        m, n_max, cf = self.m, self.n_max, self.cf
        self.orig = np.arange(m)
        self.flat_rows = self.orig * n_max  # each lane's first slot in the flat (lanes, slots)
        z = spotdraws.normal(self.P["lane"], self.ev, spotdraws.WORK_Z1, spotdraws.WORK_Z2)
        self.work = w0[cf] * np.exp(sig[cf] * z)
        slot_on = np.arange(n_max)[None, :] < self.n_f[cf][:, None]  # (lanes, n_max)
        self.launch = np.where(slot_on, 0.0, INF)
        self.launch_spot = self.launch.copy()
        self.death = np.full((m, n_max), INF)
        self.death[slot_on] = self.lives(*np.nonzero(slot_on))
        self.on_od = np.zeros((m, n_max), dtype=bool)
        self.held = np.full((m, n_max), INF)  # the running clock of a slot while on demand
        self.t_res = self.prov[cf].copy()  # when every node is up (training resumes)
        self.n_od = np.zeros(m)  # slots on demand
        self.committed = np.zeros(m)
        self.region_until = np.full(m, -INF)
        self.cost, self.losses, self.lost = np.zeros(m), np.zeros(m), np.zeros(m)
        self.wait, self.od_s = np.zeros(m), np.zeros(m)
        self.running = np.ones(m, dtype=bool)  # kept until compaction; finished ones are inert
        self.od_final = np.zeros(m, dtype=bool)  # on demand to the end (the deadline rule)
        late = ~self.spot_ok(np.arange(m), self.t_res, self.work)
        if late.any():  # too little slack for spot from the start: on demand throughout
            on = slot_on & late[:, None]
            self.on_od |= on
            self.launch_spot[on] = INF
            self.death[on] = INF
            self.n_od = np.where(late, self.n_f[cf], 0.0)
            self.od_final = late

    def spot_ok(self, idx: NDArray[np.intp], up: Array, remaining: Array) -> NDArray[np.bool_]:
        """The deadline rule (kplan/planner/deadline.py) for lanes ``idx``."""
        P = self.P
        return deadline.spot_ok(
            P["deadline"][idx], up, remaining, P["restart"][idx], P["interval"][idx], P["ck"][idx]
        )

    def step(self) -> None:
        """One event per running lane: done, back to spot, or a loss."""
        P = self.P
        self.ev += 1
        j = np.argmin(self.death, axis=1)
        flat = self.flat_rows + j  # the first death's slot, as a flat index
        d = self.death.ravel()[flat]
        rem = np.maximum(self.work - self.committed, 0.0)
        fin = self.t_res + rem + P["ck"] * np.floor(rem / P["interval"] + EPS)
        t_sw = np.where((self.n_od > 0) & ~self.od_final, self.region_until, INF)
        run = self.running
        done = run & (fin <= np.minimum(d, t_sw))
        going = run & ~done
        sw = going & (t_sw <= d)
        ls = going & ~sw
        t_end = np.where(done, fin, INF)
        sr = np.flatnonzero(sw)
        if sr.size:
            self.back_to_spot(sr, t_sw)
        if ls.any():
            t_end, failed = self.loss(ls, d, flat, t_end)
        else:
            failed = np.zeros(self.orig.size, dtype=bool)
        if np.isfinite(t_end).any():
            self.finish(t_end, failed)

    def back_to_spot(self, sr: NDArray[np.intp], t_sw: Array) -> None:
        """Capacity returns: checkpoint, relaunch the on-demand slots on spot."""
        P, n_l = self.P, self.orig.size
        e = np.maximum(t_sw[sr] - self.t_res[sr], 0.0)
        prog = deadline.progress_in(e, P["cycle"][sr], P["interval"][sr])
        done = np.minimum(self.committed[sr] + prog, self.work[sr])
        up = np.maximum(self.t_res[sr], t_sw[sr] + P["restart"][sr])
        ok = self.spot_ok(sr, up, self.work[sr] - done)
        self.od_final[sr[~ok]] = True  # the deadline rule: stay on demand to the end
        sr, done = sr[ok], done[ok]
        self.committed[sr] = done
        g_r, g_c = np.nonzero(self.on_od[sr])
        g_r = sr[g_r]
        t = t_sw[g_r]
        dur = t - self.launch[g_r, g_c]
        self.cost += np.bincount(g_r, self.billed_usd(g_r, dur, P["p_od"][g_r]), n_l)
        self.od_s += np.bincount(g_r, dur, n_l)
        self.launch[g_r, g_c] = self.launch_spot[g_r, g_c] = t
        kept = self.held[g_r, g_c]
        self.death[g_r, g_c] = np.where(kept > t, kept, t + self.lives(g_r, g_c))
        self.on_od[g_r, g_c] = False
        self.n_od[sr] = 0.0
        self.t_res[sr] = np.maximum(self.t_res[sr], t_sw[sr] + P["restart"][sr])

    def loss(
        self, ls: NDArray[np.bool_], d: Array, first: NDArray[np.intp], t_end: Array
    ) -> tuple[Array, NDArray[np.bool_]]:
        """A loss event at ``d`` on lanes ``ls``: the first death (``first``, each lane's
        slot as a flat index), and co-losses; (the end times, the lanes that fail here)."""
        P, n_l = self.P, self.orig.size
        e = np.maximum(d - self.t_res, 0.0)
        k = np.floor(e / P["cycle"] + EPS)
        train = ls & (d >= self.t_res)
        ahead = np.minimum(self.committed + k * P["interval"], self.work)
        if self.any_notice:  # the notice's checkpoint: the progress made until the stop
            with np.errstate(invalid="ignore"):  # lanes with no loss now: d is INF
                stop = np.maximum(d - P["notice"] - self.t_res, 0.0)
                at_stop = self.committed + deadline.progress_in(stop, P["cycle"], P["interval"])
            ahead = np.fmax(ahead, np.minimum(at_stop, self.work))
        self.committed = np.where(train, ahead, self.committed)
        spot_up = (self.launch_spot <= d[:, None]) & ls[:, None]  # launched spot slots
        gone = spot_up & (self.death <= d[:, None])
        if self.any_co:  # each other launched spot slot goes too with probability co_loss
            cand = np.flatnonzero(spot_up & ~gone)
            r = cand // self.n_max
            slot = spotdraws.CO_LOSS * spotdraws.SLOT_SPAN + (cand - r * self.n_max)
            u = spotdraws.uniform(P["lane"][r], self.ev[r], slot)
            gone.ravel()[cand[u < P["co"][r]]] = True
        gone.ravel()[first[ls]] = True
        g = np.flatnonzero(gone)  # the lost slots, flat, lane by lane (as np.nonzero)
        g_r = g // self.n_max
        self.losses += ls
        lost_now = np.bincount(g_r, minlength=n_l)
        self.lost += lost_now
        launch, death = self.launch.ravel(), self.death.ravel()
        dur = d[g_r] - launch[g]
        self.cost += np.bincount(g_r, self.billed_usd(g_r, dur, P["p_spot"][g_r]), n_l)
        use_od, no_cap, t_launch = self.capacity(ls, d)
        up = np.maximum(self.t_res, d + P["restart"])  # were the replacements spot, now
        if self.any_dl:
            force = ls & ~self.spot_ok(np.arange(n_l), up, self.work - self.committed)
            use_od |= force
        else:
            force = np.zeros(n_l, dtype=bool)
        tl = t_launch[g_r]
        od = use_od[g_r]
        launch[g] = tl
        self.launch_spot.ravel()[g] = np.where(od, INF, tl)
        # a slot refilled at tl keeps its clock unless it fired (its own loss, or while the
        # slot was empty): then a fresh one from tl
        clock = death[g]
        self.held.ravel()[g] = clock  # kept through an on-demand spell (fired or not)
        clock = np.where(clock > tl, clock, tl + self.lives(g_r, g % self.n_max))
        death[g] = np.where(od, INF, clock)
        self.on_od.ravel()[g] = od
        self.n_od += np.where(use_od, lost_now, 0)
        self.t_res = np.where(ls, np.maximum(self.t_res, t_launch + P["restart"]), self.t_res)
        if force.any():
            self.all_on_demand(force, d, gone)
        too_many = ls & (self.lost > P["max_rep"])
        failed = too_many | no_cap
        if failed.any():
            t_end = np.where(too_many, d, np.where(no_cap, d + P["cap"], t_end))
            # the lost slots of a failed run have nothing running (already billed)
            launch[g[failed[g_r]]] = INF
        return t_end, failed

    def all_on_demand(self, force: NDArray[np.bool_], d: Array, gone: NDArray[np.bool_]) -> None:
        """The deadline rule said no at a loss at ``d``: the spot survivors of lanes ``force``
        end at ``d`` (billed) and restart on demand with the lost ones, to the end."""
        P, n_l = self.P, self.orig.size
        surv = force[:, None] & ~gone & ~self.on_od & (self.launch_spot <= d[:, None])
        g_r, g_c = np.nonzero(surv)
        dur = d[g_r] - self.launch[g_r, g_c]
        self.cost += np.bincount(g_r, self.billed_usd(g_r, dur, P["p_spot"][g_r]), n_l)
        self.launch[g_r, g_c] = d[g_r]
        self.on_od[g_r, g_c] = True
        self.launch_spot[force] = INF
        self.death[force] = INF
        self.n_od = np.where(force, self.n_f[self.P["cf"]], self.n_od)
        self.od_final |= force

    def capacity(
        self, ls: NDArray[np.bool_], d: Array
    ) -> tuple[NDArray[np.bool_], NDArray[np.bool_], Array]:
        """After a loss at ``d``: the region still out from an earlier outage, or a new draw;
        (the lanes going on demand, those failing, when the replacements launch)."""
        P = self.P
        still = self.region_until > d
        # the three draws of the lanes losing now (the others' are never read)
        il = np.flatnonzero(ls)
        u = np.full((3, ls.size), 0.5)
        u[:, il] = spotdraws.uniform(P["lane"][il], self.ev[il], _CAP_SLOTS)
        u1, u2, u3 = u
        nd = P["n_dur"]
        draw_d = self.durs[P["cf"], np.minimum((u3 * nd).astype(np.intp), P["last_dur"])]
        regional = (u1 < P["out_p"]) & (P["no_failover"] | (u2 < P["region_p"]))
        self.region_until = np.where(ls & ~still & regional, d + draw_d, self.region_until)
        # a capacity wait no longer than the restart is none (as ``replay`` reads a trace)
        out = ls & (still | regional) & (self.region_until - d > P["restart"])
        d_wait = np.where(out, self.region_until - d, 0.0)
        if not self.any_dl:
            use_od = out & P["allow_od"]
            wait_ok = out & ~P["allow_od"] & (d_wait <= P["cap"])
            self.wait += np.where(wait_ok, d_wait, 0.0)
            return use_od, out & ~P["allow_od"] & ~wait_ok, d + np.where(wait_ok, d_wait, 0.0)
        # the deadline rule: wait while the slack allows, then on demand until capacity returns
        dl = np.isfinite(P["deadline"])
        rem = self.work - self.committed
        t_od = deadline.on_demand_by_s(
            P["deadline"], rem, P["restart"], P["interval"], P["ck"], total_work_s=self.work
        )
        t_od = np.maximum(t_od, d)
        dl_wait = out & dl & (self.region_until <= t_od)
        use_od = out & P["allow_od"] & ~dl_wait
        wait_ok = out & ((~P["allow_od"] & (d_wait <= P["cap"])) | dl_wait)
        no_cap = out & ~P["allow_od"] & ~wait_ok
        with np.errstate(invalid="ignore"):  # lanes without a loss: d is infinite
            od_wait = np.where(use_od & dl, t_od - d, 0.0)
        self.wait += np.where(wait_ok, d_wait, 0.0) + od_wait
        t_launch = d + np.where(wait_ok, d_wait, 0.0) + od_wait
        return use_od, no_cap, t_launch

    def finish(self, t_end: Array, failed: NDArray[np.bool_]) -> None:
        """Close every launched instance of the lanes ending now (at the end or its death),
        record their results, and compact once a quarter of the lanes have ended."""
        P = self.P
        er = np.flatnonzero(np.isfinite(t_end))
        te = t_end[er]
        ln = self.launch[er]
        g_r, g_c = np.nonzero(ln <= te[:, None])
        lane = er[g_r]
        fl = self.flat_rows[lane] + g_c  # the launched slots, as flat indices
        dur = np.minimum(self.death.ravel()[fl], te[g_r]) - ln[g_r, g_c]
        odf = self.on_od.ravel()[fl]
        price = np.where(odf, P["p_od"][lane], P["p_spot"][lane])
        self.cost[er] += np.bincount(g_r, self.billed_usd(lane, dur, price), er.size)
        self.od_s[er] += np.bincount(g_r, np.where(odf, dur, 0.0), er.size)
        o = self.orig[er]
        self.r_end[o], self.r_cost[o], self.r_losses[o] = te, self.cost[er], self.losses[er]
        self.r_lost[o], self.r_wait[o], self.r_od[o] = self.lost[er], self.wait[er], self.od_s[er]
        self.r_failed[o] = failed[er]
        self.running[er] = False
        n_l = self.orig.size
        stopped = n_l - int(self.running.sum())
        if stopped * 4 > n_l or stopped == n_l:  # compact (a copy of every array)
            self.compact()
        else:
            self.death[er] = INF  # inert: no event of theirs is looked at again

    def compact(self) -> None:
        keep = self.running
        self.P = {key: x[keep] for key, x in self.P.items()}
        for name in _LANE_STATE:
            setattr(self, name, getattr(self, name)[keep])
        self.flat_rows = np.arange(self.orig.size) * self.n_max

    def give_up(self) -> None:
        """The lanes still running: failed, at their last known time."""
        run = self.running
        o = self.orig[run]
        self.r_end[o] = np.maximum(self.t_res[run], 0.0)
        self.r_cost[o], self.r_losses[o], self.r_lost[o] = (
            self.cost[run],
            self.losses[run],
            self.lost[run],
        )
        self.r_wait[o], self.r_od[o] = self.wait[run], self.od_s[run]
        self.r_failed[o] = True

    def results(self) -> tuple[Array, ...]:
        """(end s, cost, losses, lost nodes, wait s, on-demand node-s, failed), by lane."""
        return (
            self.r_end,
            self.r_cost,
            self.r_losses,
            self.r_lost,
            self.r_wait,
            self.r_od,
            self.r_failed,
        )


_CAP = (spotdraws.CAP_OUT, spotdraws.CAP_REGION, spotdraws.CAP_DUR)
_CAP_SLOTS = np.array([[s * spotdraws.SLOT_SPAN] for s in _CAP])  # (3, 1): per lane, broadcast
_LANE_STATE = (
    "orig",
    "ev",
    "running",
    "on_od",
    "work",
    "committed",
    "region_until",
    "t_res",
    "n_od",
    "cost",
    "losses",
    "lost",
    "wait",
    "od_s",
    "launch",
    "launch_spot",
    "death",
    "held",
    "od_final",
)


def _summary(results: tuple[Array, ...], shp: tuple[int, int]) -> SimResult:
    r_end, r_cost, r_losses, r_lost, r_wait, r_od, r_failed = results
    s = SimSamples(
        hours=(r_end / 3600.0).reshape(shp),
        cost_usd=r_cost.reshape(shp),
        failed=r_failed.astype(bool).reshape(shp),
        losses=r_losses.reshape(shp),
        lost_nodes=r_lost.reshape(shp),
        wait_hours=(r_wait / 3600.0).reshape(shp),
        on_demand_hours=(r_od / 3600.0).reshape(shp),
    )
    return SimResult(
        hours_mean=s.hours.mean(axis=1),
        hours_p90=nanstat.quantile(s.hours, 0.9, axis=1),
        cost_mean=s.cost_usd.mean(axis=1),
        cost_p90=nanstat.quantile(s.cost_usd, 0.9, axis=1),
        losses_mean=s.losses.mean(axis=1),
        lost_nodes_mean=s.lost_nodes.mean(axis=1),
        lost_nodes_p99=nanstat.quantile(s.lost_nodes, 0.99, axis=1),
        fail_prob=s.failed.mean(axis=1),
        wait_hours_mean=s.wait_hours.mean(axis=1),
        on_demand_hours_mean=s.on_demand_hours.mean(axis=1),
        samples=s,
        hours_median=nanstat.quantile(s.hours, 0.5, axis=1),
        cost_median=nanstat.quantile(s.cost_usd, 0.5, axis=1),
    )


if TYPE_CHECKING:  # spotsim's public names too, imported when first asked for (__getattr__)
    from kplan.planner.spotreplay import (
        ReplayEvent,
        ReplayInstance,
        ReplayOutcome,
        replay,
        replay_many,
    )

_REPLAY = frozenset({"ReplayEvent", "ReplayInstance", "ReplayOutcome", "replay", "replay_many"})


def __getattr__(name: str) -> Any:
    """The trace replay's names (kplan/planner/spotreplay.py), loaded on first use: an
    estimate simulates but never replays a trace."""
    if name in _REPLAY:
        from kplan.planner import spotreplay

        return getattr(spotreplay, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ReplayEvent",
    "ReplayInstance",
    "ReplayOutcome",
    "SimResult",
    "SimSamples",
    "replay",
    "replay_many",
    "simulate",
]
