"""Spot plans priced with the trace-fitted model: risks per candidate, recovery rules, Monte-Carlo.

The search ranks every configuration with the closed form of ``costs`` (fed with the model's
rate, co-loss and expected capacity wait); the rows kplan shows (the frontier and the best by
each objective) are then priced by ``spotsim.simulate`` with the rules the launcher runs
(kplan/planner/spot.py), and those values replace the closed form's. Each spot row carries its
recovery rules (replacement limit, capacity wait, checkpoint interval) so that the launcher can
carry the plan out.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from kplan.planner import costs, nanstat
from kplan.planner.spot import RecoveryPolicy, SpotModel, SpotRisk, Weibull

if TYPE_CHECKING:
    from kplan.planner import spotsim

Array = NDArray[np.float64]
MIN_REPLACEMENTS = 20  # the launcher's floor: a crash loop still stops
REPLACEMENT_MARGIN = 1.5  # over the simulated p99 of lost nodes
# A simulated run past this many loss events is a crash loop and counts as failed there
# (``simulate_rows``): without the cut, one such run in a thousand kept the Monte-Carlo going
# for 10,000 events, most of the planner's time. Above every replacement limit of the README's
# plans (at most 112); a row whose limit is not below it has its runs go on past it.
MAX_EVENTS = 128
MIN_CAPACITY_WAIT_S = 3600.0
# A row expecting more loss events per run than this is priced in closed form
# (``closed_form_rows``): the Monte-Carlo steps through every event of every run, so its work
# grows with a run's losses (a 250-hour job took 18 s, ten times longer ran past 200 s); past it
# a run averages so many events that the renewal rate of the closed form holds, and the rate's
# spread between runs (the regimes and the period) is what the p90 must carry. The README's
# plans expect at most 5.
MC_MAX_LOSSES = 50.0
Z99 = 2.3263478740408408  # standard normal 99th percentile
CAPACITY_WAIT_MARGIN = 2.0  # over the longest outage the model draws


def risk_for(
    model: SpotModel,
    cloud: str,
    instance_type: str,
    region: str,
    rate: float = 0.0,
    rate_family: str = "*",
) -> SpotRisk:
    """The model's row for this type and region. When the catalog's spot rate
    (``spot_rates.csv``) names a more specific family than the model's row (a user's catalog,
    or a rate ``kplan catalog update`` learnt), the row's mean life is set to that rate and the
    shape, co-loss and outages are kept."""
    row = model.lookup(cloud, instance_type, region)
    model_len = 0 if row.family == "*" else len(row.family)
    catalog_len = 0 if rate_family == "*" else len(rate_family)
    if not rate > 0 or catalog_len <= model_len:
        return row
    k = row.lifetime.shape
    scale = 1.0 / rate / math.gamma(1.0 + 1.0 / k)
    source = f"{row.source}; mean life set to the catalog's {rate:.3g}/h"
    return replace(row, lifetime=Weibull(k, scale), source=source)


def expected_wait_s(risk: SpotRisk, allow_on_demand: bool, capacity_wait_s: float) -> float:
    """Expected capacity wait per loss event (the closed form's D)."""
    if allow_on_demand or not risk.outage.durations_h:
        return 0.0
    d = np.minimum(np.asarray(risk.outage.durations_h) * 3600.0, capacity_wait_s)
    return float(risk.outage.prob * risk.outage.region_prob * d.mean())


def default_capacity_wait_s(risk: SpotRisk) -> float:
    """Twice the longest outage the model draws (its fitted tail), and at least an hour: the
    traces are hours long and the next outage may be longer than any they saw; a job that gives
    up loses the time it waited (it resumes from its checkpoint when relaunched), and the
    plan's p90 already holds the waits the model expects."""
    longest = max(risk.outage.durations_h, default=0.0) * 3600.0
    return max(MIN_CAPACITY_WAIT_S, CAPACITY_WAIT_MARGIN * longest)


def replacement_limit(lost_nodes_p99: float) -> int:
    """The launcher's replacement limit for a plan: well above its simulated p99."""
    return max(MIN_REPLACEMENTS, math.ceil(REPLACEMENT_MARGIN * lost_nodes_p99) + 2)


@dataclass(frozen=True)
class SpotPricing:
    """What the Monte-Carlo says about one spot configuration: the median and p90 of its runs
    (as the closed form's, whose central value is the median step time's), and their mean."""

    hours: float
    hours_p90: float
    cost_usd: float
    cost_p90_usd: float
    losses: float  # expected loss events
    lost_nodes_p99: float
    fail_prob: float
    policy: RecoveryPolicy
    source: str  # the spot model row used
    runs: int
    basis: str = ""  # how it was priced, where not by the Monte-Carlo (``closed_form_rows``)
    on_demand_hours: float | None = None  # the same configuration on demand (closed form)
    on_demand_cost_usd: float | None = None
    hours_mean: float | None = None
    cost_mean_usd: float | None = None

    @property
    def heavy_tail(self) -> bool:
        """The mean above the p90 (rare long runs: a preemption of a short job)."""
        return (self.hours_mean or 0.0) > self.hours_p90 or (
            self.cost_mean_usd or 0.0
        ) > self.cost_p90_usd


def simulate_rows(
    *,
    work_s: Array,
    nodes: Array,
    risks: list[SpotRisk],
    policies: list[RecoveryPolicy],
    usd_per_hour: Array,
    usd_per_hour_on_demand: Array,
    log_sigma: Array,
    billing_min_s: Array,
    billing_increment_s: Array,
    runs: int,
    seed: int,
) -> list[SpotPricing]:
    """Monte-Carlo each row; the replacement limit is set from the simulated p99 of lost nodes
    (simulated without a limit, so the limit does not truncate what it is set from). A run past
    ``MAX_EVENTS`` loss events counts as failed at that event: every event loses a node, and the
    cut stays above each row's replacement limit (else the runs still going go on to a cut
    above it: ``spotsim.simulate``'s ``more_events``), so the launcher would have stopped that
    run sooner."""
    from kplan.planner import spotsim

    if len(risks) == 0:
        return []
    unlimited = [replace(p, max_replacements=10**9) for p in policies]

    def more_events(res: spotsim.SimResult) -> int | None:
        """At the cut: the runs still going go on to one event past the largest replacement
        limit when the cut is not above it. A run of more events than the limit has lost more
        nodes than it (every event loses one at least): the launcher fails it there, and the
        Monte-Carlo counts it failed at the cut (it went on to twice the limit before: the same
        median and p90, about 10% more time in the estimate for runs that fail either way)."""
        limit = max(replacement_limit(float(p)) for p in ended_lost_p99(res))
        if limit < cut[0]:
            return None
        cut[0] = limit + 1
        return cut[0]

    cut = [MAX_EVENTS]
    res = spotsim.simulate(
        work_s=work_s,
        nodes=nodes,
        risks=risks,
        policies=unlimited,
        usd_per_hour=usd_per_hour,
        usd_per_hour_on_demand=usd_per_hour_on_demand,
        log_sigma=log_sigma,
        runs=runs,
        seed=seed,
        billing_min_s=billing_min_s,
        billing_increment_s=billing_increment_s,
        max_events=MAX_EVENTS,
        more_events=more_events,
    )
    out = []
    p99s = ended_lost_p99(res)
    for j, (risk, pol) in enumerate(zip(risks, policies, strict=True)):
        p99 = float(p99s[j])
        out.append(
            SpotPricing(
                hours=float(res.hours_median[j]),
                hours_p90=float(res.hours_p90[j]),
                cost_usd=float(res.cost_median[j]),
                cost_p90_usd=float(res.cost_p90[j]),
                hours_mean=float(res.hours_mean[j]),
                cost_mean_usd=float(res.cost_mean[j]),
                losses=float(res.losses_mean[j]),
                lost_nodes_p99=p99,
                fail_prob=float(res.fail_prob[j]),
                policy=replace(pol, max_replacements=replacement_limit(p99)),
                source=risk.source
                + (
                    ""
                    if pol.deadline_s is None
                    else f"; deadline-safe: on demand once the slack no longer covers a "
                    f"preemption, so it ends by {pol.deadline_s / 3600:g} h"
                ),
                runs=runs,
            )
        )
    return out


def ended_lost_p99(res: spotsim.SimResult) -> Array:
    """Each row's p99 of lost nodes over the runs that ended (a row none of whose runs ended:
    over all). A run still going at the cut is not counted: in a market busy enough that it
    never ends its lost nodes grow with the cut, and a limit set from them chased the cut up
    (128, 386, 1,067 events on the default estimate) while the launcher stops such a run at
    its row's limit whatever it is."""
    ended = np.where(res.samples.failed, np.nan, res.samples.lost_nodes)
    p99 = nanstat.nan_quantile(ended, 0.99, axis=1)
    out: Array = np.where(np.isnan(p99), res.lost_nodes_p99, p99)
    return out


def closed_form_rows(
    *,
    work_s: Array,
    nodes: Array,
    risks: list[SpotRisk],
    policies: list[RecoveryPolicy],
    usd_per_hour: Array,
    usd_per_hour_on_demand: Array,
    log_sigma: Array,
    billing_min_s: Array,
    billing_increment_s: Array,
    checkpoint_s: float,
    overheads: costs.Overheads,
) -> list[SpotPricing]:
    """Rows past ``MC_MAX_LOSSES`` priced without the Monte-Carlo: ``costs.time_and_cost`` with
    the model's rate, co-loss and expected capacity wait, its p90 widened (in quadrature, in
    log) by the rate at its p90 over the run (``SpotRisk.rate_sigma_for``: a run draws one
    multiplier of the rate for its length). With the on-demand fallback a loss in an outage
    runs its lost nodes on demand until capacity returns: each loss event adds that expected
    time (``expected_wait_s`` without the fallback) at the on-demand premium per lost node.
    The replacement limit comes from the p99 rate's loss events, each losing ``1 + co_loss
    (nodes - 1)`` nodes on average; no run fails (none does with the default capacity wait)."""
    rate = np.array([r.rate_per_hour for r in risks])
    co = np.array([r.co_loss for r in risks])
    wait = np.array(
        [
            expected_wait_s(r, p.allow_on_demand, p.capacity_wait_s)
            for r, p in zip(risks, policies, strict=True)
        ]
    )
    spread = np.array(
        [float(r.rate_sigma_for(w / 3600.0)) for r, w in zip(risks, work_s, strict=True)]
    )

    def at(mult: Array, sigma: Array) -> costs.TimeCost:
        return costs.time_and_cost(
            train_seconds=work_s,
            instances=nodes,
            usd_per_hour=usd_per_hour,
            preempt_per_hour=rate * mult,
            log_sigma=sigma,
            checkpoint_s=checkpoint_s,
            billing_min_s=billing_min_s,
            billing_increment_s=billing_increment_s,
            overheads=overheads,
            co_loss=co,
            outage_wait_s=wait,
            notice_stop_s=[p.notice_stop_or_inf for p in policies],
        )

    tc, busy = (
        at(np.ones_like(rate), log_sigma),
        at(np.exp(costs.Z90 * spread - spread**2 / 2.0), np.zeros_like(rate)),
    )
    per_event = 1.0 + co * np.maximum(nodes - 1.0, 0.0)
    premium = _fallback_premium(risks, policies, per_event, usd_per_hour, usd_per_hour_on_demand)
    with np.errstate(invalid="ignore"):
        tc = replace(
            tc,
            cost_usd=tc.cost_usd + premium * tc.preemptions,
            cost_p90_usd=tc.cost_p90_usd + premium * tc.preemptions * tc.hours_p90 / tc.hours,
        )
        busy = replace(busy, cost_usd=busy.cost_usd + premium * busy.preemptions)
    with np.errstate(divide="ignore", invalid="ignore"):
        hours_p90 = tc.hours * np.exp(
            np.hypot(_log(tc.hours_p90, tc.hours), _log(busy.hours, tc.hours))
        )
        cost_p90 = tc.cost_usd * np.exp(
            np.hypot(_log(tc.cost_p90_usd, tc.cost_usd), _log(busy.cost_usd, tc.cost_usd))
        )
    lost_p99 = tc.preemptions * np.exp(Z99 * spread - spread**2 / 2.0) * per_event
    stuck = _stuck_share(lambda m: at(m, np.zeros_like(rate)).hours, spread, busy.hours)
    return [
        SpotPricing(
            hours=float(tc.hours[j]),
            hours_p90=float(hours_p90[j]),
            cost_usd=float(tc.cost_usd[j]),
            cost_p90_usd=float(cost_p90[j]),
            losses=float(tc.preemptions[j]),
            lost_nodes_p99=float(lost_p99[j]),
            fail_prob=float(stuck[j]),
            policy=replace(pol, max_replacements=replacement_limit(float(lost_p99[j]))),
            source=risk.source,
            runs=0,
            basis=f"closed form: {tc.preemptions[j]:.0f} expected loss events per run, past the "
            f"Monte-Carlo's bound of {MC_MAX_LOSSES:g} (its p90 carries the rate's spread "
            f"between runs, log-sd {spread[j]:.2f})",
        )
        for j, (risk, pol) in enumerate(zip(risks, policies, strict=True))
    ]


def _stuck_share(hours_at: Callable[[Array], Array], spread: Array, busy_hours: Array) -> Array:
    """The share of runs whose market is busy enough that the job never ends (its losses
    come so fast that under ``Overheads.min_useful_fraction`` of its time trains: the closed
    form's time is infinite): ``P(Z > z*)``, ``z*`` the least ``z`` of the mean-1 multiplier
    ``exp(z spread - spread^2 / 2)`` at which the time is infinite, on a grid from the p90's
    ``z`` down to 0 by 0.1 (cautious by less than 0.1 sd). 0 for rows that end at their
    p90's rate."""
    out = np.zeros_like(spread)
    rows = np.flatnonzero(~np.isfinite(busy_hours))
    if rows.size == 0:
        return out
    z_stuck = np.full(spread.shape, costs.Z90)
    for z in np.arange(costs.Z90 - 0.1, -1e-9, -0.1):  # down from the p90, where it is stuck
        stuck = ~np.isfinite(hours_at(np.exp(z * spread - spread**2 / 2.0)))
        z_stuck = np.where(stuck & (z_stuck <= z + 0.1 + 1e-9), z, z_stuck)
    out[rows] = [0.5 * math.erfc(float(z_stuck[j]) / math.sqrt(2.0)) for j in rows]
    return out


def _fallback_premium(
    risks: list[SpotRisk],
    policies: list[RecoveryPolicy],
    per_event: Array,
    usd_per_hour: Array,
    usd_per_hour_on_demand: Array,
) -> Array:
    """USD per loss event of the fallback's on-demand spells: the nodes an event loses, on
    demand for the outage's expected length, at the premium over spot (0 without a fallback)."""
    od_s = np.array(
        [
            expected_wait_s(r, False, p.capacity_wait_s) if p.allow_on_demand else 0.0
            for r, p in zip(risks, policies, strict=True)
        ]
    )
    out: Array = od_s * per_event * np.maximum(usd_per_hour_on_demand - usd_per_hour, 0.0) / 3600.0
    return out


def _log(x: Array, ref: Array) -> Array:
    """log(x / ref), inf where x is not finite (a p90 that is infeasible stays infeasible)."""
    out: Array = np.where(np.isfinite(x) & (x > 0), np.log(x / ref), np.inf)
    return out
