"""Deadline-safe spot plans judged by replays on the traces they were not fitted on.

Leave one trace out: for each shared spot trace (Bamboo EC2 p3 and g4dn autoscaling groups;
GCP A100 and V100 spot counts), the spot model is the other three, each fitted on its own
trace, pooled as markets within clouds (``spotpool.pool_markets``: the held-out trace is a
market the model never saw; ``--naive``: every lifetime and loss event of the three in one
sample, the regimes measured between the 2-hour blocks of all three as one market). Jobs of 1
and 4 nodes, a few lengths and deadlines, are priced with that model by the planner's
Monte-Carlo (``spotplan.simulate_rows``, the deadline rule of
kplan/planner/deadline.py), then replayed from random starts of the held-out trace
(``spotsim.replay_many``, the launcher's rules) next to three baselines on the same starts:

- on demand only: the cluster on demand from the start;
- greedy: spot until the first loss, then every node on demand to the end;
- the same rule with the outage wait of its first version (wait as long as the slack allows,
  not only while ahead of uniform progress): "/floor";
- hindsight: the cheapest schedule knowing the trace, a DP over 5-minute slots choosing spot,
  on demand or idle, each switch into spot or on demand one slot of boot, finishing by the
  deadline. A slot is usable on spot when the pool holds the job's nodes through it (a
  clairvoyant picks the survivors), and consecutive usable slots continue without a restart:
  an optimistic bound (lower than any real schedule), so "within x% of hindsight" is
  conservative.

Reported per held-out trace: the share of replays that met the deadline, the mean cost against
hindsight, greedy and on demand, the share of replays above the plan's cost p90 and the replayed
mean against the plan's expected cost; the same two for the plan without a deadline (on-demand
fallback, as today).

``--own`` prices each trace with its own fit instead (in-sample: the market's own band, the
floor for a model that never saw it); ``--flat`` drops the regimes of the model priced.

``--sibling`` prices each trace as a shipped row of a traced family prices a zone no trace
watched: the other trace of its cloud, its own fit (region ``*``), with the spread between
markets (``SpotRisk.market_sigma``, ``spotpool.market_spread``) and the period spread
(``period_sigma``), both from the three other traces only; ``--sibling --no-market`` the same
row without the market spread (each row as shipped before it had one).

``--no-notice`` replays and prices the jobs without the spot notice's checkpoint (a loss loses
the work since the last periodic one); by default the workers stop with a checkpoint
``spotnotice.stop_before_s`` before each loss where the lead fits in the cloud's notice (the
AWS traces, with a 1 s step and the 10 s checkpoint; GCP's 30 s is too short for it).

Run: .venv/bin/python -m bench.spot_deadline [--runs 200] [--seed 0] [--naive | --own | --sibling]
[--flat] [--no-notice] [--no-market]
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import ArrayLike, NDArray

from kplan.app import simulating
from kplan.planner import spotplan, spotreplay, spotsim
from kplan.planner.costs import billed_seconds
from kplan.planner.deadline import MARGIN_S, on_demand_by_s, remaining_wall_s, reserve_s
from kplan.planner.spot import RecoveryPolicy, SpotRisk
from kplan.planner.spotnotice import stop_before_s
from kplan.planner.spotpool import market_spread, pool_markets
from kplan.planner.spotreplay import ReplayOutcome
from kplan.planner.spottrace import ADD, SpotTrace
from scripts.fit_spot_model import (
    blocks,
    concat_samples,
    fit_risk,
    period_sigma,
    pooled_regimes,
    risk_from_sample,
    sample,
    with_markets,
)
from scripts.traces import data_root

DATA = data_root() / "spot" / "bamboo-nsdi23-traces" / "traces"
SLOT_S = 300.0
RESTART_S, PROVISION_S, CHECKPOINT_S = 300.0, 240.0, 10.0
STEP_S = 1.0  # the jobs' step, for the spot notice's lead (kplan/planner/spotnotice.py)


@dataclass(frozen=True)
class Market:
    trace: str
    cloud: str
    family: str
    usd_spot: float  # per node-hour, the shipped catalog's cheapest zone (2026-11)
    usd_on_demand: float


MARKETS = (
    Market("p3-trace.csv", "aws", "p3", 0.3733, 3.06),  # p3.2xlarge us-east-1
    Market("g4dn-trace.csv", "aws", "g4dn", 0.2132, 0.526),  # g4dn.xlarge us-east-1
    Market("gcloud/a100x1-east1b.txt", "gcp", "a2", 1.928, 3.673),  # a2-highgpu-1g us-east1
    Market("gcloud/v100x1-east1c.txt", "gcp", "n1", 1.338, 2.860),  # n1-standard-8 + V100
)
NODES = (1, 4)
LENGTHS = (0.12, 0.2)  # work, as a share of the trace's span
SLACKS = (1.3, 2.0)  # deadline / the work's wall time on demand


def pooled_risk(others: list[SpotTrace], m: Market, markets: list[Market]) -> SpotRisk:
    """The other markets as one population (kplan/planner/spotpool.py, item 2 of issue 27):
    each fitted on its own trace, pooled so that the spread between markets counts."""
    fitted = [
        fit_risk(
            t,
            cloud=o.cloud,
            family=o.family,
            region="*",
            cloud_blocks=[blocks(u) for u in others if u is not t],
        )
        for t, o in zip(others, markets, strict=True)
    ]
    return pool_markets(
        fitted, cloud=m.cloud, family=m.family, blocks=[len(blocks(t)) for t in others]
    )


def own_risk(held: SpotTrace, m: Market, others: list[SpotTrace]) -> SpotRisk:
    """The held-out trace's own fit (in-sample): how wide the market's own band is, the least
    a model that never saw it can be expected to give."""
    return fit_risk(
        held, cloud=m.cloud, family=m.family, region="*", cloud_blocks=[blocks(u) for u in others]
    )


def sibling_risk(
    others: list[SpotTrace], m: Market, markets: list[Market], market: bool
) -> SpotRisk:
    """The other trace of ``m``'s cloud fitted alone, applied to the held-out market as a
    shipped row is applied to a zone its trace did not watch (``with_markets``), its market and
    period spreads measured on the three other traces (never the held-out one)."""
    fitted = [
        fit_risk(t, cloud=o.cloud, family=o.family, region="*", cloud_blocks=[blocks(t)])
        for t, o in zip(others, markets, strict=True)
    ]
    period, _ = period_sigma(list(zip(others, fitted, strict=True)))
    k = next(i for i, o in enumerate(markets) if o.cloud == m.cloud)
    row = replace(fitted[k], period_sigma=period)
    if not market:
        return row
    spread = market_spread(fitted, m.cloud, [len(blocks(t)) for t in others])
    return with_markets(row, {m.cloud: spread})


def naive_pooled_risk(others: list[SpotTrace], m: Market) -> SpotRisk:
    """Every lifetime and loss event of the other traces in one sample (node-hours weigh)."""
    s = concat_samples([sample(t) for t in others], "pooled: " + ", ".join(t.name for t in others))
    every_block = [b for t in others for b in blocks(t)]
    regimes = pooled_regimes([every_block])
    return risk_from_sample(s, cloud=m.cloud, family=m.family, region="*", regimes=regimes)


def lives(
    trace: SpotTrace,
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.bool_]]:
    """(add, remove, age known) of every node; unknown ages from 0, never removed: the end."""
    add: dict[str, float] = {}
    rem: dict[str, float] = {}
    for t, kind, node in zip(trace.times_s.tolist(), trace.kinds, trace.nodes, strict=True):
        if kind == ADD:
            add[node] = t
        else:
            rem[node] = t
            add.setdefault(node, 0.0)
    names = list(add)
    return (
        np.array([add[n] for n in names]),
        np.array([rem.get(n, trace.end_s) for n in names]),
        np.array([n not in trace.unknown_age for n in names]),
    )


def pool_bound_usd(
    life: tuple[NDArray[np.float64], NDArray[np.float64]],
    start_s: float,
    nodes: int,
    work_s: float,
    deadline_s: float,
    usd: tuple[float, float],
) -> float:
    """An optimistic bound: spot usable in a slot when the pool holds the job's nodes through
    it (a clairvoyant picks survivors), consecutive usable slots without a restart."""
    good = usable_slots(life, start_s, nodes, deadline_s)
    return bound_usd(good, nodes, work_s, usd)


def usable_slots(
    life: tuple[NDArray[np.float64], NDArray[np.float64]],
    start_s: float,
    nodes: int,
    deadline_s: float,
) -> NDArray[np.bool_]:
    """Each slot before the deadline: does the pool hold the job's nodes through it."""
    n = int(deadline_s // SLOT_S)
    t = start_s + SLOT_S * np.arange(n)
    add, rem = life
    alive = (add[None, :] <= t[:, None]) & (rem[None, :] >= t[:, None] + SLOT_S)
    good: NDArray[np.bool_] = alive.sum(1) >= nodes
    return good


def bound_usd(
    good: NDArray[np.bool_], nodes: int, work_s: float, usd: tuple[float, float]
) -> float:
    """The cheapest schedule over slots (spot where ``good``, on demand, idle), each switch
    into spot or on demand one slot of boot, ``work_s`` done by the last slot."""
    n = len(good)
    k = math.ceil(work_s / SLOT_S - 1e-9)
    c_spot, c_od = (nodes * p * SLOT_S / 3600.0 for p in usd)
    inf = math.inf
    idle, spot, od = np.full(k + 1, inf), np.full(k + 1, inf), np.full(k + 1, inf)
    idle[0] = 0.0
    best = inf
    for i in range(n):
        enter_spot = np.minimum(idle, od) + c_spot if good[i] else np.full(k + 1, inf)
        enter_od = np.minimum(idle, spot) + c_od
        run_spot = np.full(k + 1, inf)
        if good[i]:
            run_spot[1:] = spot[:-1] + c_spot
        run_od = np.full(k + 1, inf)
        run_od[1:] = od[:-1] + c_od
        idle = np.minimum(idle, np.minimum(spot, od))  # leave (a checkpoint) and wait
        spot, od = np.minimum(enter_spot, run_spot), np.minimum(enter_od, run_od)
        best = min(best, spot[k], od[k])
    return best


def hindsight_usd(
    life: tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.bool_]],
    start_s: float,
    nodes: int,
    work_s: float,
    deadline_s: float,
    usd: tuple[float, float],
) -> float:
    """The cheapest schedule knowing the trace (module docstring): a DP over slots i and
    slots of progress p. Free (nothing running) -> idle, or boot on demand (one slot), or a
    spot spell: the launcher's nodes at slot i (the youngest alive), one slot of boot, then up
    to the last whole slot before the first of them is removed (a perfect checkpoint just
    before: no work lost). On demand runs until it stops (free again at once)."""
    n = int(deadline_s // SLOT_S)
    k = math.ceil(work_s / SLOT_S - 1e-9)
    add, rem, known = life
    c_spot, c_od = (nodes * p * SLOT_S / 3600.0 for p in usd)
    inf = math.inf
    free = np.full((n + 1, k + 1), inf)
    od = np.full((n + 1, k + 1), inf)
    free[0, 0] = 0.0
    age = np.where(known, add, -inf)
    for i in range(n):
        free[i] = np.minimum(free[i], od[i])  # stop on demand (a checkpoint): free
        row = free[i]
        free[i + 1] = np.minimum(free[i + 1], row)  # idle
        od[i + 1] = np.minimum(od[i + 1], row + c_od)  # boot on demand
        od[i + 1, 1:] = np.minimum(od[i + 1, 1:], od[i, :-1] + c_od)  # run on demand
        t = start_s + i * SLOT_S
        alive = np.flatnonzero((add <= t) & (rem > t))
        if len(alive) < nodes or not np.isfinite(row).any():
            continue
        picked = alive[np.argsort(-age[alive], kind="stable")[:nodes]]
        spell = int((rem[picked].min() - t) // SLOT_S)  # whole slots before the first loss
        for j in range(1, min(spell - 1, n - i - 1, k) + 1):  # a boot slot, j of progress
            free[i + 1 + j, j:] = np.minimum(
                free[i + 1 + j, j:], row[: k + 1 - j] + (1 + j) * c_spot
            )
    best = float(min(free[:, k].min(), od[:, k].min()))
    return best


@contextmanager
def slack_floor(*, on: bool) -> Iterator[None]:
    """The rule's first outage wait, for the comparison: wait for capacity as long as the
    slack allows (the floor of ``deadline.on_demand_by_s`` alone), not only while ahead of
    uniform progress; the rest of the rule is the same."""
    if not on:
        yield
        return
    rule = on_demand_by_s  # the name spotreplay calls (patched there for the comparison)

    def floor(
        deadline_s: ArrayLike,
        remaining_work_s: ArrayLike,
        restart_s: ArrayLike,
        interval_s: ArrayLike,
        checkpoint_s: ArrayLike,
        margin_s: float = MARGIN_S,
        total_work_s: ArrayLike | None = None,
    ) -> NDArray[np.float64]:
        return rule(deadline_s, remaining_work_s, restart_s, interval_s, checkpoint_s, margin_s)

    names = vars(spotreplay)
    names["on_demand_by_s"] = floor
    try:
        yield
    finally:
        names["on_demand_by_s"] = rule


def young_interval_s(risk: SpotRisk, nodes: int) -> float:
    """The planner's checkpoint interval on spot (costs.py): Young's sqrt(2 C / L)."""
    lam = nodes * risk.rate_per_hour / 3600.0
    return float(np.clip(math.sqrt(2.0 * CHECKPOINT_S / lam), 60.0, 3600.0))


def on_demand_usd(nodes: int, work_s: float, usd: float) -> float:
    wall = PROVISION_S + float(remaining_wall_s(work_s, 1800.0, CHECKPOINT_S))
    return nodes * usd * float(billed_seconds(np.asarray(wall), 60.0, 1.0)) / 3600.0


@dataclass(frozen=True)
class Result:
    met: float
    vs_hindsight: float
    vs_pool_bound: float
    vs_greedy: float
    vs_floor: float  # against the rule with the slack-floor outage wait
    floor_met: float
    vs_on_demand: float
    above_p90: float
    vs_expected: float
    free_above_p90: float  # the plan without a deadline
    free_vs_expected: float
    free_time_above_p90: float
    wait_time_above_p90: float  # without a deadline or fallback (the estimate's default)
    wait_above_p90: float
    wait_failed: float
    n: int


def judge(
    trace: SpotTrace,
    m: Market,
    risk: SpotRisk,
    nodes: int,
    work_s: float,
    deadline_s: float,
    runs: int,
    seed: int,
    notice: bool = True,
) -> Result | None:
    """One job on the held-out trace: its plan priced by the model, replayed with baselines
    (``notice``: the workers stop with a checkpoint on the cloud's spot notice where the lead
    fits, as the launcher's nodes do)."""
    usd = (m.usd_spot, m.usd_on_demand)
    interval = young_interval_s(risk, nodes)
    base = RecoveryPolicy(
        restart_s=RESTART_S,
        provisioning_s=PROVISION_S,
        checkpoint_interval_s=interval,
        checkpoint_s=CHECKPOINT_S,
        allow_on_demand=True,
        notice_stop_s=stop_before_s(m.cloud, STEP_S, CHECKPOINT_S) if notice else None,
    )
    wait = replace(
        base, allow_on_demand=False, capacity_wait_s=spotplan.default_capacity_wait_s(risk)
    )
    priced = {}
    for name, pol in (
        ("deadline", replace(base, deadline_s=deadline_s)),
        ("free", base),
        ("wait", wait),
    ):
        (priced[name],) = spotplan.simulate_rows(
            work_s=np.array([work_s]),
            nodes=np.array([float(nodes)]),
            risks=[risk],
            policies=[pol],
            usd_per_hour=np.array([usd[0]]),
            usd_per_hour_on_demand=np.array([usd[1]]),
            log_sigma=np.array([0.0]),
            billing_min_s=np.array([60.0]),
            billing_increment_s=np.array([1.0]),
            runs=2000,
            seed=seed,
        )
    rng = np.random.default_rng(seed)
    horizon = deadline_s * 1.2
    starts = [
        trace.first_with(nodes, float(t)) for t in rng.uniform(0.0, trace.end_s - horizon, runs)
    ]
    greedy_deadline = (
        PROVISION_S
        + float(remaining_wall_s(work_s, interval, CHECKPOINT_S))
        + float(reserve_s(RESTART_S, interval, CHECKPOINT_S))
    )
    outs: dict[str, list[ReplayOutcome]] = {}
    for name, pol in (
        ("deadline", priced["deadline"].policy),
        ("free", priced["free"].policy),
        ("greedy", replace(priced["deadline"].policy, deadline_s=greedy_deadline)),
        ("floor", priced["deadline"].policy),
    ):
        with slack_floor(on=name == "floor"):
            outs[name] = spotsim.replay_many(
                trace,
                starts,
                nodes=nodes,
                work_s=work_s,
                policy=pol,
                usd_per_hour=usd[0],
                usd_per_hour_on_demand=usd[1],
                seed=seed,
            )
    # the default plan (no deadline, no on-demand fallback) may wait past its capacity wait and
    # fail: judged on its own replays, a failed run above every p90 (it never finished)
    waited = spotsim.replay_many(
        trace,
        starts,
        nodes=nodes,
        work_s=work_s,
        policy=priced["wait"].policy,
        usd_per_hour=usd[0],
        usd_per_hour_on_demand=usd[1],
        seed=seed,
    )
    done = [o for o in waited if not o.truncated]
    pw = priced["wait"]
    w_fail = np.array([o.failed for o in done], dtype=bool)
    w_hours = np.array([o.hours for o in done])
    w_cost = np.array([o.cost_usd for o in done])
    keep = [
        i for i in range(runs) if not any(outs[k][i].truncated or outs[k][i].failed for k in outs)
    ]
    if not keep:
        return None
    life = lives(trace)

    def arr(name: str, attr: str) -> NDArray[np.float64]:
        return np.array([getattr(outs[name][i], attr) for i in keep])

    cost, hours = arr("deadline", "cost_usd"), arr("deadline", "hours")
    left = deadline_s - PROVISION_S + SLOT_S  # the DP's first boot slot stands for provisioning
    hind = np.array([hindsight_usd(life, starts[i], nodes, work_s, left, usd) for i in keep])
    bound = np.array([pool_bound_usd(life[:2], starts[i], nodes, work_s, left, usd) for i in keep])
    free = arr("free", "cost_usd")
    pd, pf = priced["deadline"], priced["free"]
    return Result(
        met=float(np.mean(hours <= deadline_s / 3600.0 + 1e-9)),
        vs_hindsight=float(cost.mean() / hind.mean()),
        vs_pool_bound=float(cost.mean() / bound.mean()),
        vs_greedy=float(cost.mean() / arr("greedy", "cost_usd").mean()),
        vs_floor=float(cost.mean() / arr("floor", "cost_usd").mean()),
        floor_met=float(np.mean(arr("floor", "hours") <= deadline_s / 3600.0 + 1e-9)),
        vs_on_demand=float(cost.mean() / on_demand_usd(nodes, work_s, usd[1])),
        above_p90=float(np.mean(cost > pd.cost_p90_usd)),
        vs_expected=float(cost.mean() / (pd.cost_mean_usd or pd.cost_usd)),
        free_above_p90=float(np.mean(free > pf.cost_p90_usd)),
        free_vs_expected=float(free.mean() / (pf.cost_mean_usd or pf.cost_usd)),
        free_time_above_p90=float(np.mean(arr("free", "hours") > pf.hours_p90)),
        wait_time_above_p90=float(np.mean(w_fail | (w_hours > pw.hours_p90))) if done else math.nan,
        wait_above_p90=float(np.mean(w_fail | (w_cost > pw.cost_p90_usd))) if done else math.nan,
        wait_failed=float(np.mean(w_fail)) if done else math.nan,
        n=len(keep),
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--naive", action="store_true", help="pool the traces' events in one sample")
    ap.add_argument(
        "--own", action="store_true", help="price each trace with its own fit (in-sample)"
    )
    ap.add_argument(
        "--sibling", action="store_true", help="price each trace with its cloud's other trace"
    )
    ap.add_argument(
        "--no-market", action="store_true", help="--sibling without the spread between markets"
    )
    ap.add_argument("--flat", action="store_true", help="the model without its regimes")
    ap.add_argument(
        "--no-notice", action="store_true", help="lose the work since the last periodic checkpoint"
    )
    args = ap.parse_args()
    t0 = time.time()
    traces = {m.trace: simulating.load_trace(DATA / m.trace) for m in MARKETS}
    print(
        f"{'held out':9} {'job':16} | {'met':>4} {'/hind':>6} {'/bound':>6} {'/greedy':>7} "
        f"{'/floor':>6} {'/od':>5} {'>p90$':>5} {'/exp':>5} | {'free >p90$':>10} {'/exp':>5} "
        f"{'>p90h':>5} | {'wait >p90h':>10} {'>p90$':>5} {'fail':>5} {'n':>4}"
    )
    for m in MARKETS:
        held = traces[m.trace]
        others = [o for o in MARKETS if o is not m]
        if args.own:
            risk = own_risk(held, m, [traces[o.trace] for o in others])
        elif args.sibling:
            risk = sibling_risk(
                [traces[o.trace] for o in others], m, others, market=not args.no_market
            )
        elif args.naive:
            risk = naive_pooled_risk([traces[o.trace] for o in others], m)
        else:
            risk = pooled_risk([traces[o.trace] for o in others], m, others)
        if args.flat:
            risk = replace(risk, rate_sigma=0.0, outage_sigma=0.0)
        print(
            f"{m.family} model ({_basis(args)}{', no regimes' if args.flat else ''}): "
            f"{risk.rate_per_hour:.3f}/node-h, rate sigma {risk.rate_sigma:.2f} (market "
            f"{risk.market_sigma:.2f}, period {risk.period_sigma:.2f}), outage "
            f"{risk.outage.prob:.2f} sigma {risk.outage_sigma:.2f} (market "
            f"{risk.market_outage_sigma:.2f})"
        )
        rows = []
        for nodes in NODES:
            for share in LENGTHS:
                work = round(held.end_s * share / SLOT_S) * SLOT_S
                for slack in SLACKS:
                    on_demand_s = PROVISION_S + float(remaining_wall_s(work, 1800.0, CHECKPOINT_S))
                    deadline = math.ceil(slack * on_demand_s / SLOT_S) * SLOT_S
                    r = judge(
                        held,
                        m,
                        risk,
                        nodes,
                        work,
                        deadline,
                        args.runs,
                        args.seed,
                        notice=not args.no_notice,
                    )
                    if r is None:
                        continue
                    rows.append(r)
                    job = f"{nodes}n {work / 3600:.1f}h dl {deadline / 3600:.1f}h"
                    print(_line(m.family, job, r), flush=True)
        _summary(m.family, rows)
    print(f"{time.time() - t0:.0f} s")


def _basis(args: argparse.Namespace) -> str:
    if args.own:
        return "its own fit"
    if args.sibling:
        return f"its cloud's other trace{', no market spread' if args.no_market else ''}"
    return "pooled from the others"


def _line(family: str, job: str, r: Result) -> str:
    return (
        f"{family:9} {job:16} | {r.met:4.0%} {r.vs_hindsight:6.2f} {r.vs_pool_bound:6.2f} "
        f"{r.vs_greedy:7.2f} {r.vs_floor:6.2f} {r.vs_on_demand:5.2f} {r.above_p90:5.0%} "
        f"{r.vs_expected:5.2f} | {r.free_above_p90:10.0%} {r.free_vs_expected:5.2f} "
        f"{r.free_time_above_p90:5.0%} | {r.wait_time_above_p90:10.0%} {r.wait_above_p90:5.0%} "
        f"{r.wait_failed:5.1%} {r.n:4d}"
    )


def _summary(name: str, rows: list[Result]) -> None:
    if not rows:
        print(f"{name}: no job fits the trace")
        return

    def col(attr: str) -> NDArray[np.float64]:
        return np.array([getattr(r, attr) for r in rows])

    print(
        f"== {name} held out, {len(rows)} jobs: deadline met {col('met').min():.0%} (worst "
        f"job); mean cost / hindsight {col('vs_hindsight').mean():.2f} (max "
        f"{col('vs_hindsight').max():.2f}); / greedy {col('vs_greedy').mean():.2f} (max "
        f"{col('vs_greedy').max():.2f}); / slack-floor wait {col('vs_floor').mean():.3f} "
        f"(range {col('vs_floor').min():.3f}-{col('vs_floor').max():.3f}, it met "
        f"{col('floor_met').min():.0%}); / on demand {col('vs_on_demand').mean():.2f}; above "
        f"cost p90 {col('above_p90').mean():.0%} ({col('above_p90').min():.0%}-"
        f"{col('above_p90').max():.0%}); mean / expected {col('vs_expected').mean():.2f} "
        f"({col('vs_expected').min():.2f}-{col('vs_expected').max():.2f}) | no deadline: "
        f"above cost p90 {col('free_above_p90').mean():.0%}, mean / expected "
        f"{col('free_vs_expected').mean():.2f}, above time p90 "
        f"{col('free_time_above_p90').mean():.0%} | no deadline, no fallback (waits): above time "
        f"p90 {np.nanmean(col('wait_time_above_p90')):.0%} ("
        f"{np.nanmin(col('wait_time_above_p90')):.0%}-{np.nanmax(col('wait_time_above_p90')):.0%}"
        f"), above cost p90 {np.nanmean(col('wait_above_p90')):.0%}, failed "
        f"{np.nanmean(col('wait_failed')):.1%}"
    )


if __name__ == "__main__":
    main()
