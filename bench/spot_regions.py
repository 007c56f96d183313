"""Moving between regions (issue 27 item 3) judged by replays on pairs of pools.

Leave one trace out, as bench/spot_deadline.py: each of the four shared spot traces (Bamboo EC2
p3 and g4dn; GCP A100 and V100 counts) is the job's home pool in turn, its plan's checkpoint
interval from the spot model pooled from the other three (``spot_deadline.pooled_risk``,
Young's interval). Each of the other three traces is then the second pool, standing for the
same instance type in another region of the home's cloud (us-east-1 -> us-east-2 on AWS,
us-east1 -> us-central1 on GCP: the catalog's inter-region egress, $0.02/GB from either), at
the home's prices. No shared trace watches two regions at once: the two traces are laid on one
clock from their starts, so the pair's outages are independent (a regional event that empties
both at once is not in them, which flatters moving) and the second pool's own preemptions
count against the move.

Jobs of 1 and 4 nodes, 12% and 20% of the pair's common span of work, deadlines 1.3x and 2x
the work's time on demand (as spot_deadline), the deadline rule of kplan/planner/deadline.py,
replayed from random starts (``spotmove.replay_pools``: the move rule of
kplan/planner/spotmove.py) and, on the same starts, staying in the home pool
(``spotsim.replay_many``); checkpoints of 1 GB (a ~100M-parameter model with Adam), 100 GB
(~8B) and 1000 GB (~80B), copied at 1 Gbit/s.

Reported per home trace and checkpoint size: the share of replays that met the deadline (with
moves, staying), the mean cost with moves against staying, against the hindsight bound of two
pools and of staying's one, moves per replay and egress dollars per replay.

Hindsight (``two_pool_bound_usd``): the cheapest schedule knowing both traces, over 5-minute
slots: spot in a pool in a slot where it holds the job's nodes through it, on demand, or idle;
each switch into spot or on demand a slot of boot; a move from idle in one pool to idle in the
other costs the egress and the copy's slots (rounded up); the job may start in either pool. It
is optimistic (survivors picked clairvoyantly, no work lost), a lower bound.

Run: .venv/bin/python -m bench.spot_regions [--runs 100] [--seed 0]
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from bench.spot_deadline import (
    CHECKPOINT_S,
    DATA,
    MARKETS,
    PROVISION_S,
    RESTART_S,
    SLOT_S,
    Market,
    bound_usd,
    lives,
    pooled_risk,
    usable_slots,
    young_interval_s,
)
from kplan.app import simulating
from kplan.catalogs.loader import shipped_catalog
from kplan.planner import spotsim
from kplan.planner.deadline import remaining_wall_s
from kplan.planner.spot import RecoveryPolicy
from kplan.planner.spotmove import MoveTerms, Pool, move_cost, replay_pools
from kplan.planner.spottrace import SpotTrace

REGIONS = {"aws": ("us-east-1", "us-east-2"), "gcp": ("us-east1", "us-central1")}
CHECKPOINT_GB = (1.0, 100.0, 1000.0)
COPY_GBPS = 1.0
NODES = (1, 4)
LENGTHS = (0.12, 0.2)
SLACKS = (1.3, 2.0)


def two_pool_bound_usd(
    good: tuple[NDArray[np.bool_], NDArray[np.bool_]],
    nodes: int,
    work_s: float,
    usd: tuple[float, float],
    move: tuple[float, int],
) -> float:
    """The hindsight bound of two pools (module docstring); ``move`` = (egress $, slots)."""
    k = math.ceil(work_s / SLOT_S - 1e-9)
    c_spot, c_od = (nodes * p * SLOT_S / 3600.0 for p in usd)
    egress, lag = move
    inf = math.inf

    def full() -> NDArray[np.float64]:
        return np.full(k + 1, inf)

    idle, spot, od = [full(), full()], [full(), full()], [full(), full()]
    idle[0][0] = idle[1][0] = 0.0
    transit = [[full() for _ in range(lag)] for _ in range(2)]  # arriving in pool x
    best = inf
    for i in range(len(good[0])):
        new_idle = []
        for x in (0, 1):
            g = bool(good[x][i])
            enter_spot = np.minimum(idle[x], od[x]) + c_spot if g else full()
            run_spot = full()
            if g:
                run_spot[1:] = spot[x][:-1] + c_spot
            enter_od = np.minimum(idle[x], spot[x]) + c_od
            run_od = full()
            run_od[1:] = od[x][:-1] + c_od
            rest = np.minimum(idle[x], np.minimum(spot[x], od[x]))
            if lag:
                rest = np.minimum(rest, transit[x].pop(0))
            new_idle.append(rest)
            spot[x], od[x] = np.minimum(enter_spot, run_spot), np.minimum(enter_od, run_od)
            best = min(best, spot[x][k], od[x][k])
        for x in (0, 1):
            leaving = new_idle[1 - x] + egress
            if lag:
                transit[x].append(leaving)
            else:
                new_idle[x] = np.minimum(new_idle[x], leaving)
        idle = new_idle
    return best


@dataclass(frozen=True)
class Row:
    met: float
    stay_met: float
    vs_stay: float
    vs_bound: float  # with moves / the two pools' hindsight
    stay_vs_bound: float  # staying / the home pool's hindsight
    moves: float
    moved: float
    egress_usd: float
    n: int


def judge(
    pair: tuple[SpotTrace, SpotTrace],
    m: Market,
    interval_s: float,
    job: tuple[int, float, float],
    gb: float,
    runs: int,
    seed: int,
    count_stall: bool = False,
) -> Row | None:
    """One job on the pair (home first): moves allowed against staying, and hindsight."""
    nodes, work_s, deadline_s = job
    usd = (m.usd_spot, m.usd_on_demand)
    regions = REGIONS[m.cloud]
    pools = [
        Pool(regions[0], regions[0], pair[0], *usd),
        Pool(regions[1], regions[1], pair[1], *usd),
    ]
    terms = MoveTerms(m.cloud, gb, COPY_GBPS, shipped_catalog().storage, count_stall)
    pol = RecoveryPolicy(
        restart_s=RESTART_S,
        provisioning_s=PROVISION_S,
        checkpoint_interval_s=interval_s,
        checkpoint_s=CHECKPOINT_S,
        allow_on_demand=True,
        deadline_s=deadline_s,
    )
    end = min(t.end_s for t in pair)
    rng = np.random.default_rng(seed)
    starts = [
        pair[0].first_with(nodes, float(t)) for t in rng.uniform(0, end - deadline_s * 1.2, runs)
    ]
    moved = replay_pools(pools, starts, nodes=nodes, work_s=work_s, policy=pol, terms=terms)
    stay = spotsim.replay_many(
        pair[0], starts, nodes=nodes, work_s=work_s, policy=pol, usd_per_hour=usd[0],
        usd_per_hour_on_demand=usd[1], seed=seed,
    )  # fmt: skip
    keep = [
        i
        for i in range(runs)
        if not (moved[i].truncated or stay[i].truncated or moved[i].failed or stay[i].failed)
    ]
    if not keep:
        return None
    cost = np.array([moved[i].cost_usd for i in keep])
    s_cost = np.array([stay[i].cost_usd for i in keep])
    life = [lives(t)[:2] for t in pair]
    left = deadline_s - PROVISION_S + SLOT_S  # the first boot slot stands for provisioning
    c = move_cost(terms, pools[0], pools[1])
    lag = math.ceil(c.copy_s / SLOT_S - 1e-9)
    two, one = [], []
    for i in keep:
        good = (
            usable_slots(life[0], starts[i], nodes, left),
            usable_slots(life[1], starts[i], nodes, left),
        )
        two.append(two_pool_bound_usd(good, nodes, work_s, usd, (c.egress_usd, lag)))
        one.append(bound_usd(good[0], nodes, work_s, usd))
    hours = np.array([moved[i].hours for i in keep])
    s_hours = np.array([stay[i].hours for i in keep])
    return Row(
        met=float(np.mean(hours <= deadline_s / 3600 + 1e-9)),
        stay_met=float(np.mean(s_hours <= deadline_s / 3600 + 1e-9)),
        vs_stay=float(cost.mean() / s_cost.mean()),
        vs_bound=float(cost.mean() / np.mean(two)),
        stay_vs_bound=float(s_cost.mean() / np.mean(one)),
        moves=float(np.mean([len(moved[i].moves) for i in keep])),
        moved=float(np.mean([bool(moved[i].moves) for i in keep])),
        egress_usd=float(np.mean([moved[i].egress_usd for i in keep])),
        n=len(keep),
    )


def jobs(end_s: float) -> list[tuple[int, float, float]]:
    out = []
    for nodes in NODES:
        for share in LENGTHS:
            work = round(end_s * share / SLOT_S) * SLOT_S
            for slack in SLACKS:
                on_demand_s = PROVISION_S + float(remaining_wall_s(work, 1800.0, CHECKPOINT_S))
                out.append((nodes, work, math.ceil(slack * on_demand_s / SLOT_S) * SLOT_S))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--count-stall",
        action="store_true",
        help="the rent counts the slack of a stall also where the deadline rule waits",
    )
    args = ap.parse_args()
    t0 = time.time()
    traces = {m.trace: simulating.load_trace(DATA / m.trace) for m in MARKETS}
    print(
        f"{'home':5} {'ckpt GB':>7} | {'met':>4} {'stay met':>8} {'/stay':>6} (range)     "
        f"{'/hind2':>6} {'stay/hind1':>10} {'moves':>5} {'moved':>5} {'egress $':>8} {'n':>5}"
    )
    for m in MARKETS:
        home = traces[m.trace]
        others = [o for o in MARKETS if o is not m]
        risk = pooled_risk([traces[o.trace] for o in others], m, others)
        for gb in CHECKPOINT_GB:
            rows = []
            for o in others:
                pair = (home, traces[o.trace])
                end = min(t.end_s for t in pair)
                for nodes, work, deadline in jobs(end):
                    interval = young_interval_s(risk, nodes)
                    job = (nodes, work, deadline)
                    r = judge(pair, m, interval, job, gb, args.runs, args.seed, args.count_stall)
                    if r is not None:
                        rows.append(r)
            print(_line(m.family, gb, rows), flush=True)
    print(f"{time.time() - t0:.0f} s")


def _line(family: str, gb: float, rows: list[Row]) -> str:
    if not rows:
        return f"{family:5} {gb:7g} | no job fits"

    def col(attr: str) -> NDArray[np.float64]:
        return np.array([getattr(r, attr) for r in rows])

    n = col("n")

    def mean(attr: str) -> float:  # over replays
        return float(np.average(col(attr), weights=n))

    return (
        f"{family:5} {gb:7g} | {col('met').min():4.0%} {col('stay_met').min():8.0%} "
        f"{col('vs_stay').mean():6.3f} ({col('vs_stay').min():.2f}-{col('vs_stay').max():.2f}) "
        f"{col('vs_bound').mean():6.2f} {col('stay_vs_bound').mean():10.2f} "
        f"{mean('moves'):5.2f} {mean('moved'):5.0%} {mean('egress_usd'):8.3f} {int(n.sum()):5d}"
    )


if __name__ == "__main__":
    main()
