"""Time to train and dollar cost, with spot preemptions, checkpoints and billing rules.

For a job of ``W0 = steps * T_step`` seconds of training on ``n`` instances:

    tau       checkpoint interval: 30 min on demand; on spot Young's optimum
              sqrt(2 C / L) with L = sum of the instances' preemption rates, in [1 min, 1 h]
    W         = W0 (1 + C / tau) / (1 - L (R + lost))
              each preemption costs the restart R plus, on average, ``lost`` of progress:
              half an interval, or with the notice's checkpoint ``s`` before the loss
              ``s - s^2 / (2 tau)`` where ``s < tau`` (``expected_lost_s``)
    N         = L W expected preemptions (Poisson)
    hours     = (W + provisioning) / 3600
    cost      = sum over instances of price * billed(W + provisioning) + N * price * boot

The p90 combines the step-time model's log-normal error (``log_sigma``) with the Poisson p90 of
the preemption count. A configuration whose expected loss rate leaves less than 20% useful
progress (``1 - L (R + lost) < 0.2``) is infeasible: it would mostly restart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

Array = NDArray[np.float64]
Z90 = 1.2815515655446004  # standard normal 90th percentile


@dataclass(frozen=True)
class Overheads:
    """Fixed costs of running a job (seconds), with where each number comes from."""

    provisioning_s: float = 240.0  # boot, image pull, install: typical GPU VM, assumed
    restart_s: float = 300.0  # detect preemption, replace the instance, rejoin, reload
    on_demand_interval_s: float = 1800.0  # checkpoint period without preemption risk
    checkpoint_fixed_s: float = 2.0  # serialise + fsync + rename
    checkpoint_gbps: float = 4.0  # Gbit/s to local disk / object store, assumed
    min_useful_fraction: float = 0.2

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if value < 0:
                raise ValueError(f"{name}={value} must be >= 0")


@dataclass(frozen=True)
class TimeCost:
    """Vectorised results; NaN where a configuration is infeasible."""

    hours: Array
    hours_p90: Array
    cost_usd: Array
    cost_p90_usd: Array
    preemptions: Array
    checkpoint_interval_s: Array


def checkpoint_seconds(checkpoint_bytes: float, o: Overheads) -> float:
    """Time to write one checkpoint (model, optimizer and runtime state)."""
    return o.checkpoint_fixed_s + checkpoint_bytes * 8 / (o.checkpoint_gbps * 1e9)


def time_and_cost(
    *,
    train_seconds: ArrayLike,
    instances: ArrayLike,
    usd_per_hour: ArrayLike,
    preempt_per_hour: ArrayLike,
    log_sigma: ArrayLike,
    checkpoint_s: float,
    billing_min_s: ArrayLike = 60.0,
    billing_increment_s: ArrayLike = 1.0,
    overheads: Overheads | None = None,
    co_loss: ArrayLike = 0.0,
    outage_wait_s: ArrayLike = 0.0,
    notice_stop_s: ArrayLike | None = None,
) -> TimeCost:
    """Expected and p90 time and cost for each configuration (all inputs broadcast).

    ``notice_stop_s``: where finite, a loss keeps the progress made until that long before it
    (the checkpoint a node takes on the cloud's notice, kplan/planner/spotnotice.py), so it
    loses ``expected_lost_s`` instead of half an interval; None or inf: no notice counted on.

    ``usd_per_hour`` and ``preempt_per_hour`` are per instance; ``instances`` is the count.
    ``co_loss`` and ``outage_wait_s`` (expected capacity wait per loss event) come from the
    spot model (kplan/planner/spot.py). For a mixed cluster, pass the summed price and summed rate
    with ``instances=1`` per group via ``mixed_time_and_cost``.
    """
    o = overheads or Overheads()
    w0 = np.asarray(train_seconds, dtype=float)
    n = np.asarray(instances, dtype=float)
    price = np.asarray(usd_per_hour, dtype=float)
    per_event, rate_total = _loss_events(n, preempt_per_hour, co_loss)
    return _time_and_cost(
        w0,
        n * price,
        rate_total,
        np.asarray(log_sigma, dtype=float),
        checkpoint_s,
        billing_min_s,
        billing_increment_s,
        o,
        wait_s=np.asarray(outage_wait_s, dtype=float),
        idle_price=price * per_event,
        notice_stop_s=math.inf if notice_stop_s is None else notice_stop_s,
    )


def _time_and_cost(
    w0: Array,
    price_total: Array,
    rate_total: Array,
    log_sigma: Array,
    checkpoint_s: float,
    billing_min_s: ArrayLike,
    billing_increment_s: ArrayLike,
    o: Overheads,
    wait_s: ArrayLike = 0.0,
    idle_price: ArrayLike = 0.0,
    notice_stop_s: ArrayLike = math.inf,
) -> TimeCost:
    lam, tau, exposed_loss, useful = _exposure(rate_total, checkpoint_s, o, notice_stop_s)
    c = max(checkpoint_s, 1e-3)
    wait = np.asarray(wait_s, dtype=float)
    loss = exposed_loss + wait
    useful = np.where(useful >= o.min_useful_fraction, useful, np.nan)
    work = w0 * (1.0 + c / tau)
    exposed = work / useful
    timed = lam * exposed  # the loss events that cost time (each waits, unbilled, if it must)
    wall = exposed + timed * wait
    preemptions = lam * wall  # those during the waits too: they lose nodes, not time
    m90 = np.exp(Z90 * log_sigma)
    exposed_m90 = work * m90 / useful
    n90 = lam * exposed_m90 + Z90 * np.sqrt(lam * exposed_m90)
    wall_p90 = work * m90 + n90 * loss
    run = wall + o.provisioning_s
    run_p90 = wall_p90 + o.provisioning_s
    billed = billed_seconds(run, billing_min_s, billing_increment_s)
    billed_p90 = billed_seconds(run_p90, billing_min_s, billing_increment_s)
    # nodes lost in an event are not billed while they wait for capacity
    unbilled = np.asarray(idle_price, dtype=float) / 3600.0 * wait
    cost = price_total / 3600.0 * billed - timed * unbilled
    cost_p90 = price_total / 3600.0 * billed_p90 - n90 * unbilled
    return TimeCost(
        hours=run / 3600.0,
        hours_p90=run_p90 / 3600.0,
        cost_usd=cost,
        cost_p90_usd=cost_p90,
        preemptions=preemptions,
        checkpoint_interval_s=tau,
    )


def _exposure(
    rate_total: Array, checkpoint_s: float, o: Overheads, notice_stop_s: ArrayLike
) -> tuple[Array, Array, Array, Array]:
    """(loss events per second of the whole cluster, the checkpoint interval, what a loss
    costs while the cluster is exposed, the useful fraction of that time). A loss costs the
    restart, the progress since the last checkpoint and the capacity wait; the cluster is
    exposed to the losses that cost time while it trains or restarts, not while it waits for
    capacity (a survivor lost then finds the zone out until the same time)."""
    # rates below 1e-9/h are no risk at all
    lam = np.where(rate_total < 1e-9, 0.0, rate_total) / 3600.0
    c = max(checkpoint_s, 1e-3)
    with np.errstate(divide="ignore", invalid="ignore"):
        tau_spot = np.clip(np.sqrt(2.0 * c / np.where(lam > 0, lam, np.nan)), 60.0, 3600.0)
    tau = np.where(lam > 0, tau_spot, o.on_demand_interval_s)
    exposed_loss = o.restart_s + expected_lost_s(tau, notice_stop_s)
    return lam, tau, exposed_loss, 1.0 - lam * exposed_loss


def feasible(
    *,
    instances: ArrayLike,
    preempt_per_hour: ArrayLike,
    co_loss: ArrayLike,
    checkpoint_s: float,
    overheads: Overheads | None = None,
    notice_stop_s: ArrayLike = math.inf,
) -> NDArray[np.bool_]:
    """Where ``time_and_cost`` (same inputs) gives a finite time and cost: the useful fraction
    of the exposed time at least ``min_useful_fraction``. Without pricing the configurations
    (``pricing._undominated`` counts those it drops)."""
    o = overheads or Overheads()
    _, rate_total = _loss_events(np.asarray(instances, dtype=float), preempt_per_hour, co_loss)
    out: NDArray[np.bool_] = _exposure(rate_total, checkpoint_s, o, notice_stop_s)[3] >= (
        o.min_useful_fraction
    )
    return out


def _loss_events(n: Array, preempt_per_hour: ArrayLike, co_loss: ArrayLike) -> tuple[Array, Array]:
    """(nodes lost per loss event, loss events per hour of the cluster) of ``n`` nodes each
    preempted at ``preempt_per_hour``, each other node going with a loss at ``co_loss``."""
    per_event = 1.0 + np.asarray(co_loss, dtype=float) * np.maximum(n - 1.0, 0.0)
    return per_event, n * np.asarray(preempt_per_hour, dtype=float) / per_event


def expected_lost_s(interval_s: ArrayLike, notice_stop_s: ArrayLike = math.inf) -> Array:
    """Progress a loss costs on average, the loss uniform over a checkpoint interval ``tau``:
    ``tau / 2``; with the notice's checkpoint ``s`` before the loss, ``min(u, s)`` for ``u``
    uniform on ``[0, tau]``: ``s - s^2 / (2 tau)`` where ``s < tau``."""
    tau = np.asarray(interval_s, dtype=float)
    stop = np.asarray(notice_stop_s, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        out: Array = np.where(stop < tau, stop - stop * stop / (2.0 * tau), tau / 2.0)
    return out


def billed_seconds(seconds: Array, minimum: ArrayLike, increment: ArrayLike) -> Array:
    """Seconds billed for ``seconds`` of use: at least ``minimum``, rounded up to ``increment``."""
    lo = np.maximum(seconds, np.asarray(minimum, dtype=float))
    inc = np.asarray(increment, dtype=float)
    out: Array = np.ceil(lo / inc - 1e-9) * inc
    return out  # tolerate float noise at whole increments


def mixed_time_and_cost(
    *,
    train_seconds: ArrayLike,
    usd_per_hour_total: ArrayLike,
    preempt_per_hour_total: ArrayLike,
    log_sigma: ArrayLike,
    checkpoint_s: float,
    overheads: Overheads | None = None,
    notice_stop_s: ArrayLike = math.inf,
) -> TimeCost:
    """Like ``time_and_cost`` for a cluster given by its summed price and preemption rate."""
    o = overheads or Overheads()
    return _time_and_cost(
        np.asarray(train_seconds, dtype=float),
        np.asarray(usd_per_hour_total, dtype=float),
        np.asarray(preempt_per_hour_total, dtype=float),
        np.asarray(log_sigma, dtype=float),
        checkpoint_s,
        60.0,
        1.0,
        o,
        notice_stop_s=notice_stop_s,
    )
