"""Spot plans against the traces they were not fitted on: fit on the first half, replay the second.

For each shared trace (Bamboo p3 and g4dn autoscaling groups; GCP A100 and V100 spot counts),
the spot model is fitted on the first half of the trace in time (scripts.fit_spot_model.fit_risk)
and kplan plans spot jobs of several examples on that trace's instance family, one node and
several, with the job's length set to a fraction of the half so that replays fit. Each plan is
replayed from random start times of the second half with the launcher's recovery rules
(spotsim.replay_many), and the replayed time and cost are set against the plan's prediction:

- above p90: the fraction of replays above the plan's p90 (a calibrated p90: about 10%);
- mean ratio: replayed mean / planned mean (1.0 is right).

The plan's own p90 includes the step-time model's error, which a replay does not have (it runs
the expected step time), so the like-for-like figures are against the plan's "spot-only"
prediction: the same Monte-Carlo with the step time held at its expected value. The old model
(independent Poisson preemptions at the catalog's rate, a fixed restart, no outages; the
closed form of kplan/planner/costs.py) is shown on the same replays for comparison.

Run: .venv/bin/python -m bench.spot_replay [--runs 200] [--seed 0]
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass, replace

import numpy as np

from kplan.app import planning, simulating
from kplan.core.errors import InputError
from kplan.planner import costs
from kplan.planner.plan import Plan
from kplan.planner.search import SearchOptions
from kplan.planner.spot import SpotModel
from kplan.planner.spottrace import SpotTrace
from scripts.fit_spot_model import blocks, fit_risk, period_sigma
from scripts.traces import data_root

DATA = data_root() / "spot" / "bamboo-nsdi23-traces" / "traces"


@dataclass(frozen=True)
class Case:
    trace: str
    cloud: str
    family: str
    region: str
    types: tuple[str, ...]  # one-node and multi-node instance types to plan on
    nodes: tuple[int, ...]


CASES = (
    Case("p3-trace.csv", "aws", "p3", "us-east-1", ("p3.2xlarge", "p3.8xlarge"), (1, 4)),
    Case("g4dn-trace.csv", "aws", "g4dn", "us-east-1", ("g4dn.xlarge", "g4dn.12xlarge"), (1, 4)),
    Case("gcloud/a100x1-east1b.txt", "gcp", "a2", "us-east1", ("a2-highgpu-1g",), (1, 4)),
    Case("gcloud/v100x1-east1c.txt", "gcp", "n1", "us-east1", ("n1-standard-8+1xV100",), (1, 4)),
)
EXAMPLES = ("cifar10-resnet18", "imagenet-resnet50", "yolov3", "deepspeech2")


def _trace(case: Case) -> SpotTrace:
    return simulating.load_trace(DATA / case.trace)


def _plan(
    example: str, case: Case, itype: str, nodes: int, model: SpotModel, target_h: float
) -> Plan | None:
    prof = planning.load_example(example)
    opts = SearchOptions(
        clouds=(case.cloud,),
        regions=(case.region,),
        markets=("spot",),
        instance_types=(itype,),
        min_nodes=nodes,
        max_nodes=nodes,
        mixed=False,
        objective="cost",
        spot_model=model,
        top=1,
    )
    try:
        first = planning.estimate(prof, opts).plan.chosen
        # scale the epochs so the job takes about target_h (replays must fit in the half)
        epochs = prof.epochs * target_h / max(first.hours, 1e-6)
        plan = planning.estimate(prof, opts, epochs=epochs).plan
    except Exception as err:  # a type the job does not fit on: skip, say why
        print(f"  skip {example} on {nodes} x {itype}: {err}")
        return None
    return plan


def _old_model(job: simulating.Job, rate: float) -> tuple[float, float, float, float]:
    """The closed form of costs.py with independent Poisson losses at ``rate`` per node-hour
    and no outages (what kplan planned with before the spot model), step time fixed."""
    tc = costs.time_and_cost(
        train_seconds=job.work_s,
        instances=job.nodes,
        usd_per_hour=job.usd_per_hour,
        preempt_per_hour=rate,
        log_sigma=0.0,
        checkpoint_s=job.policy.checkpoint_s,
    )
    return float(tc.hours), float(tc.hours_p90), float(tc.cost_usd), float(tc.cost_p90_usd)


def _period_from_others(case: Case, traces: dict[str, SpotTrace]) -> float:
    """``period_sigma`` fitted on the other traces, each whole (``fit_spot_model.period_sigma``)."""
    fits = []
    for c in CASES:
        if c == case:
            continue
        cloud = [blocks(traces[o.trace]) for o in CASES if o.cloud == c.cloud and o != c]
        t = traces[c.trace]
        fits.append(
            (t, fit_risk(t, cloud=c.cloud, family=c.family, region="*", cloud_blocks=cloud))
        )
    return period_sigma(fits)[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.time()
    print(
        f"{'trace':10} {'example':18} {'plan':22} {'h':>5} | {'>p90 t':>6} {'>p90 $':>6} "
        f"{'t ratio':>7} {'$ ratio':>7} | {'old >t':>6} {'old >$':>6} {'old t':>6} {'old $':>6}"
        f" | {'plan >t':>7} {'fail':>4} {'n':>4}"
    )
    rows: list[tuple[float, ...]] = []
    keys: list[tuple[str, int]] = []
    traces = {case.trace: _trace(case) for case in CASES}
    first_blocks = {
        c.trace: blocks(traces[c.trace], until_s=traces[c.trace].end_s / 2) for c in CASES
    }
    for case in CASES:
        full = traces[case.trace]
        half = full.end_s / 2.0
        others = [first_blocks[c.trace] for c in CASES if c.cloud == case.cloud and c != case]
        risk = fit_risk(
            full,
            cloud=case.cloud,
            family=case.family,
            region="*",
            until_s=half,
            cloud_blocks=others,
        )
        # the spread between periods, from the other traces' halves (never the replayed one)
        risk = replace(risk, period_sigma=_period_from_others(case, traces))
        model = SpotModel((risk, replace(risk, family="*", region="*")))
        second = full.window(half, full.end_s)
        target_h = second.end_s / 3600.0 / 5.0  # a fifth of the half: starts spread over 2/3
        for itype in case.types:
            for nodes in case.nodes:
                for example in EXAMPLES:
                    doc = _plan(example, case, itype, nodes, model, target_h)
                    if doc is None:
                        continue
                    job = simulating.job_from_plan(doc)
                    try:
                        out = simulating.replay_plan(
                            job, second, runs=args.runs, seed=args.seed, risk=risk, samples=True
                        )
                    except InputError as err:
                        print(f"  skip {example} on {nodes} x {itype}: {err.message}")
                        continue
                    rep, so = out.replayed, out.spot_only
                    if rep is None or so is None:
                        continue
                    hours = np.array(out.samples_hours)
                    cost = np.array(out.samples_cost_usd)
                    old = _old_model(job, risk.rate_per_hour)
                    row = (
                        rep.above_spot_only_hours_p90,
                        rep.above_spot_only_cost_p90,
                        rep.hours_mean / so.hours_mean,
                        rep.cost_mean_usd / so.cost_mean_usd,
                        float(np.mean(hours > old[1])),
                        float(np.mean(cost > old[3])),
                        rep.hours_mean / old[0],
                        rep.cost_mean_usd / old[2],
                        rep.above_plan_hours_p90,
                        out.failed / max(out.runs - out.truncated, 1),
                    )
                    rows.append(row)
                    keys.append((case.family, nodes))
                    print(
                        f"{case.family:10} {example:18} {str(nodes) + ' x ' + itype:22} "
                        f"{job.hours:5.2f} | {row[0]:6.0%} {row[1]:6.0%} {row[2]:7.2f} "
                        f"{row[3]:7.2f} | {row[4]:6.0%} {row[5]:6.0%} {row[6]:6.2f} {row[7]:6.2f}"
                        f" | {row[8]:7.0%} {row[9]:4.0%} {out.runs - out.truncated:4d}",
                        flush=True,
                    )
    a = np.array(rows)
    print()
    print(f"{len(rows)} plans x {args.runs} replays, {time.time() - t0:.0f} s")
    _summary("kplan (spot model, spot-only)", a[:, 0], a[:, 1], a[:, 2], a[:, 3])
    _summary("old (Poisson, no outages)", a[:, 4], a[:, 5], a[:, 6], a[:, 7])
    print(f"kplan plan p90 (with the step-time error): above {np.mean(a[:, 8]):.1%} of the time")
    print()
    print("by trace and node count (kplan spot-only | old):")
    for key in dict.fromkeys(keys):
        sel = np.array([k == key for k in keys])
        b = a[sel]
        print(
            f"  {key[0]:5} {key[1]} node(s), {int(sel.sum())} plans: above p90 time "
            f"{np.mean(b[:, 0]):4.0%}, cost {np.mean(b[:, 1]):4.0%}, time ratio "
            f"{_gmean(b[:, 2]):.2f}, cost ratio {_gmean(b[:, 3]):.2f} | above p90 time "
            f"{np.mean(b[:, 4]):4.0%}, cost {np.mean(b[:, 5]):4.0%}, time ratio "
            f"{_gmean(b[:, 6]):.2f}, cost ratio {_gmean(b[:, 7]):.2f}"
        )


def _summary(
    name: str, above_t: np.ndarray, above_c: np.ndarray, rt: np.ndarray, rc: np.ndarray
) -> None:
    print(
        f"{name:32} above p90 time: mean {np.mean(above_t):5.1%} (range {np.min(above_t):.0%}-"
        f"{np.max(above_t):.0%}); above p90 cost: mean {np.mean(above_c):5.1%} (range "
        f"{np.min(above_c):.0%}-{np.max(above_c):.0%}); mean time ratio {_gmean(rt):.2f} "
        f"({np.min(rt):.2f}-{np.max(rt):.2f}), cost ratio {_gmean(rc):.2f} "
        f"({np.min(rc):.2f}-{np.max(rc):.2f}); |ratio-1| <= 15%: time "
        f"{np.mean(np.abs(rt - 1) <= 0.15):.0%}, cost {np.mean(np.abs(rc - 1) <= 0.15):.0%}"
    )


def _gmean(x: np.ndarray) -> float:
    return float(math.exp(np.mean(np.log(x))))


if __name__ == "__main__":
    main()
