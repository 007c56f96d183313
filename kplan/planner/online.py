"""Online adaptation: refit the step-time model from a running job, evaluate, re-plan (pure).

While a job runs, the launcher aggregates the runtime's step records per configuration and feeds
them to ``OnlineModel.observe``; each observation is first predicted (the error is tracked, for
``kplan status``), then recorded. ``refit`` fits ``perfmodel`` to the profile's rows plus what
the job measured. ``evaluate`` predicts the rest of the job for many configurations at once and
``kplan.planner.replan.replan`` decides whether another configuration is worth a restart:

    steps(B)   = R * B0 / B * integral over the remaining GNS trajectory of (Bn + B) / (Bn + B0)
    seconds    = steps(B) * T_step(config) + restart            R remaining base-batch steps
    p90        = train seconds * exp(Z90 * hypot(step-time sigma, GNS forecast sigma)) + restart
    cost       = seconds * price + boot * price per node * nodes added
    switch     if value(best) < (1 - margin) * value(current)   hysteresis against model noise

A batch change on the same nodes and workers is applied in-process (no restart); any other
change pays ``restart_s`` of downtime at the new cluster's price plus ``boot_s`` for each node
added. No I/O, no clock: everything comes in as arguments.

With ``forecast=True`` the GNS points are the job's measurements so far, each at its progress
(a fraction of the whole job), and the rest of the trajectory is ``planner.gnsforecast``'s
forecast from them (its expected value for the steps, its spread in the p90). With
``forecast=False`` (the default, for callers whose point does not carry its progress) the latest
value is held.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from kplan.core.errors import InputError
from kplan.planner import efficiency, fit, perfmodel
from kplan.planner.costs import Z90
from kplan.planner.efficiency import sample_factor
from kplan.planner.fit import FitInputs, fit_perf_params
from kplan.planner.perfmodel import PerfParams
from kplan.planner.profile import GnsPoint, Measurement

Array = NDArray[np.float64]
OnlineObjective = Literal["cost", "time"]


@dataclass(frozen=True)
class Config:
    """One way to run the job: a cluster (whole nodes) and a global batch."""

    nodes: int
    workers: int
    global_batch: int
    accum_steps: int = 1
    instance_type: str = "local"
    market: str = "on-demand"
    usd_per_hour: float = 0.0  # the whole cluster

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.workers < self.nodes:
            raise InputError(
                f"nodes={self.nodes}, workers={self.workers}: need 1 <= nodes <= workers",
                hint="every node runs at least one worker",
            )
        if self.accum_steps < 1:
            raise InputError(f"accum_steps={self.accum_steps} must be >= 1", hint="e.g. 1")
        if self.global_batch < self.workers * self.accum_steps:
            raise InputError(
                f"global_batch={self.global_batch} is smaller than workers x accum_steps "
                f"({self.workers} x {self.accum_steps})",
                hint="each worker needs at least one sample per micro-step",
            )
        if not (math.isfinite(self.usd_per_hour) and self.usd_per_hour >= 0):
            raise InputError(
                f"usd_per_hour={self.usd_per_hour!r} must be a finite number >= 0", hint="e.g. 3.9"
            )

    @property
    def local_batch(self) -> float:
        """Samples per worker per micro-step (the runtime may split unevenly by one)."""
        return self.global_batch / (self.workers * self.accum_steps)

    @property
    def label(self) -> str:
        accum = f" x{self.accum_steps} accum" if self.accum_steps > 1 else ""
        return (
            f"{self.nodes}x {self.instance_type} {self.market} ({self.workers} workers), "
            f"B={self.global_batch}{accum}"
        )

    def same_cluster(self, other: Config) -> bool:
        """True when switching to ``other`` needs no restart (only the batch differs)."""
        return (self.nodes, self.workers, self.instance_type, self.market) == (
            other.nodes,
            other.workers,
            other.instance_type,
            other.market,
        )


@dataclass(frozen=True)
class ModelError:
    """Relative errors of the model's predictions, each made before the row was observed."""

    mape: float | None  # mean |predicted / measured - 1| (a fraction, 0.08 = 8%)
    last: float | None
    n: int


class OnlineModel:
    """The step-time model of one instance type, refitted from what a running job measures."""

    def __init__(
        self,
        prior: PerfParams,
        *,
        base_rows: Sequence[Measurement] = (),
        gradient_bytes: float | None = None,
        intra_gbps: float | None = None,
        inter_gbps: float | None = None,
        gpus_per_node: int | None = None,
        min_rows_to_refit: int = 1,
        newest_weight: float = 0.5,
    ) -> None:
        if min_rows_to_refit < 1:
            raise InputError(f"min_rows_to_refit={min_rows_to_refit} must be >= 1", hint="e.g. 1")
        if not 0.0 < newest_weight <= 1.0:
            raise InputError(f"newest_weight={newest_weight} must be in (0, 1]", hint="e.g. 0.5")
        self.prior = prior
        self.base_rows = tuple(base_rows)
        self.gradient_bytes = gradient_bytes if gradient_bytes is not None else prior.gradient_bytes
        self.intra_gbps = intra_gbps if intra_gbps is not None else prior.intra_gbps
        self.inter_gbps = inter_gbps if inter_gbps is not None else prior.inter_gbps
        self.gpus_per_node = gpus_per_node if gpus_per_node is not None else prior.gpus_per_node
        self.min_rows_to_refit = min_rows_to_refit
        self.newest_weight = newest_weight
        self._params = prior
        self._rows: dict[tuple[int, int, int, int], Measurement] = {}
        self._abs_errors: list[float] = []

    @property
    def params(self) -> PerfParams:
        """The latest fit (the prior until ``refit`` has enough rows)."""
        return self._params

    @property
    def observed(self) -> tuple[Measurement, ...]:
        """The merged observations, one per configuration, in first-seen order."""
        return tuple(self._rows.values())

    @property
    def error(self) -> ModelError:
        errs = self._abs_errors
        return ModelError(
            mape=float(np.mean(errs)) if errs else None,
            last=errs[-1] if errs else None,
            n=len(errs),
        )

    def predict(self, config: Config) -> tuple[float, float]:
        """(seconds per optimizer step, log-space one-sigma error) at ``config``."""
        p = self._params
        nodes = np.array([config.nodes], dtype=float)
        step = perfmodel.step_time(
            p, nodes, [config.workers], [config.local_batch], [config.accum_steps]
        )
        return float(step[0]), float(
            fit.prior_log_sigma(p, nodes, np.array([config.workers], float))[0]
        )

    def _predict_row(self, m: Measurement) -> float:
        step = perfmodel.step_time(
            self._params, [m.nodes], [m.workers], [m.local_batch], [m.accum_steps]
        )
        return float(step[0])

    def observe(self, m: Measurement) -> float | None:
        """Record one measured configuration; return the error of the prediction made before.

        Repeated observations of a configuration are merged: the newest gets ``newest_weight``
        (the runtime's aggregates are already means over many steps; the newest reflects the
        current state of the machines best). A model with neither base rows nor observations is
        no model yet (its prior was typically fitted on this very row): the error is None.
        """
        predicted = self._predict_row(m)
        err: float | None = None
        has_model = bool(self.base_rows or self._rows)
        if has_model and math.isfinite(predicted) and predicted > 0:
            err = abs(predicted / m.step_time - 1.0)
            self._abs_errors.append(err)
        key = (m.nodes, m.workers, m.local_batch, m.accum_steps)
        old = self._rows.get(key)
        if old is not None:
            w = self.newest_weight
            sync: float | None = None
            if m.sync_time is not None and old.sync_time is not None:
                sync = w * m.sync_time + (1 - w) * old.sync_time
            else:
                sync = m.sync_time if m.sync_time is not None else old.sync_time
            step = w * m.step_time + (1 - w) * old.step_time
            m = replace(m, step_time=step, sync_time=None if sync is None else min(sync, step))
        self._rows[key] = m
        return err

    def refit(self) -> PerfParams:
        """Fit the model to the profile's rows plus the observed ones (robust, log space).

        Terms that the rows cannot identify keep the prior's values: the intra-node sync terms
        without one-node multi-worker rows, the inter-node terms without multi-node rows. With a
        single per-worker batch in the rows the compute split cannot be fitted, so the prior is
        only rescaled by the median measured/predicted ratio.
        """
        observed = list(self._rows.values())
        if len(observed) < self.min_rows_to_refit:
            return self._params
        rows = [*self.base_rows, *observed]
        d = FitInputs.from_measurements(rows)
        if len(np.unique(d.local_batch)) < 2:
            self._params = self._rescaled(observed)
            return self._params
        fitted = fit_perf_params(
            d,
            gradient_bytes=self.gradient_bytes,
            intra_gbps=self.intra_gbps,
            inter_gbps=self.inter_gbps,
            gpu=self.prior.gpu,
            gpus_per_node=self.gpus_per_node,
        )
        multi, p = d.workers > 1, self.prior
        if not (multi & (d.nodes == 1)).any():  # no row inside one node: keep the prior's
            fitted = replace(
                fitted, intra_alpha=p.intra_alpha, intra_beta=p.intra_beta, intra_lat=p.intra_lat
            )
        if not (multi & (d.nodes > 1)).any():  # no row across nodes: keep the prior's
            fitted = replace(
                fitted,
                inter_alpha=p.inter_alpha,
                inter_beta=p.inter_beta,
                inter_lat=p.inter_lat,
                two_node=p.two_node,
                inter_gamma=p.inter_gamma,
            )
        self._params = replace(
            fitted,
            max_nodes_measured=max(fitted.max_nodes_measured, self.prior.max_nodes_measured),
            nodes_measured=_union(fitted.nodes_measured, self.prior.nodes_measured),
            max_workers_measured=max(fitted.max_workers_measured, self.prior.max_workers_measured),
            inter_measured=fitted.inter_measured or self.prior.inter_measured,
        )
        return self._params

    def _rescaled(self, observed: Sequence[Measurement]) -> PerfParams:
        p = self.prior
        ratios = [m.step_time / self._predict_prior(m) for m in observed]
        r = float(np.median(ratios))
        resid = np.log(np.asarray(ratios) / r)
        sigma = math.hypot(p.log_sigma, float(np.sqrt(np.mean(resid**2))))
        return replace(  # every time-valued parameter: every predicted step time scales by r
            p,
            compute_a=p.compute_a * r,
            compute_b=p.compute_b * r,
            intra_alpha=p.intra_alpha * r,
            intra_beta=p.intra_beta * r,
            inter_alpha=p.inter_alpha * r,
            inter_beta=p.inter_beta * r,
            intra_lat=p.intra_lat * r,
            inter_lat=p.inter_lat * r,
            log_sigma=sigma,
        )

    def _predict_prior(self, m: Measurement) -> float:
        step = perfmodel.step_time(
            self.prior, [m.nodes], [m.workers], [m.local_batch], [m.accum_steps]
        )
        return float(step[0])


def _union(a: tuple[int, ...] | None, b: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """Node counts measured by either (None: a side that did not record them, so neither)."""
    return None if a is None or b is None else tuple(sorted({*a, *b}))


@dataclass(frozen=True)
class Evaluation:
    """The rest of the job at each configuration (arrays in the order given; NaN: unknown)."""

    step_time: Array  # seconds per optimizer step
    log_sigma: Array  # of the step time
    steps: Array  # optimizer steps to finish (expected over the GNS forecast)
    seconds: Array  # training plus restart downtime
    cost_usd: Array
    seconds_p90: Array
    cost_p90_usd: Array
    steps_log_sigma: Array | None = None  # of the steps, from the GNS forecast (None: held)

    def value(self, objective: str) -> Array:
        """USD (``cost``) or seconds (``time``) to finish."""
        return self.cost_usd if objective_kind(objective) == "cost" else self.seconds


def objective_kind(objective: str) -> OnlineObjective:
    if objective == "cost":
        return "cost"
    if objective == "time":
        return "time"
    raise InputError(f"unknown objective {objective!r}", hint="use cost or time")


def remaining_gns(gns: Sequence[GnsPoint], done_fraction: float) -> tuple[GnsPoint, ...]:
    """The part of a whole-job GNS trajectory after ``done_fraction``, rescaled to [0, 1].

    Beyond the last point the noise scale is held (what ``efficiency`` does), so a trajectory
    measured up to now predicts the rest at the latest value.
    """
    if not gns or done_fraction <= 0.0:
        return tuple(gns)
    d = min(done_fraction, 1.0)
    progress = np.array([g.progress for g in gns])
    scale = np.array([g.noise_scale for g in gns])
    now = float(np.interp(d, progress, scale))
    if d >= 1.0:
        return (GnsPoint(0.0, now),)
    rest = [GnsPoint((g.progress - d) / (1.0 - d), g.noise_scale) for g in gns if g.progress > d]
    return (GnsPoint(0.0, now), *rest)


def steps_to_finish(
    global_batch: ArrayLike,
    *,
    remaining_progress: float,
    base_batch: float,
    gns: Sequence[GnsPoint],
    done_fraction: float = 0.0,
    forecast: bool = False,
) -> Array:
    """Optimizer steps at ``global_batch`` to do ``remaining_progress`` base-batch steps: a step
    does ``B / B0`` of them, less by the statistical efficiency (NaN for ``B != B0`` without a
    GNS trajectory, as ``efficiency.sample_factor``). ``forecast``: see the module docstring."""
    batch = np.asarray(global_batch, dtype=float)
    if forecast and gns:
        factor = sample_factor(gns, base_batch, batch, start=min(max(done_fraction, 0.0), 1.0))
    else:
        factor = sample_factor(remaining_gns(gns, done_fraction), base_batch, batch, forecast=False)
    steps: Array = remaining_progress * base_batch * factor / batch
    return steps


def evaluate(
    params: PerfParams,
    configs: Sequence[Config],
    *,
    remaining_progress: float,
    base_batch: float,
    gns: Sequence[GnsPoint],
    restart_s: ArrayLike = 0.0,
    extra_usd: ArrayLike = 0.0,
    done_fraction: float = 0.0,
    forecast: bool = False,
) -> Evaluation:
    """Predict time and cost to finish ``remaining_progress`` base-batch steps at each config.

    ``gns`` is the whole job's trajectory (progress as a fraction of the job); only the part
    after ``done_fraction`` counts. ``restart_s`` (per config or one for all) is downtime before
    training resumes, billed at the config's price; ``extra_usd`` is added to the cost (e.g. the
    boot of added nodes). Without a GNS trajectory only the base batch can be evaluated.
    ``forecast``: forecast the GNS after the points (see the module docstring).
    """
    if not (math.isfinite(remaining_progress) and remaining_progress >= 0):
        raise InputError(
            f"remaining_progress={remaining_progress!r} must be >= 0", hint="base-batch steps left"
        )
    if not base_batch > 0:
        raise InputError(f"base_batch={base_batch!r} must be > 0", hint="the profile's B0")
    nodes = np.array([c.nodes for c in configs], dtype=float)
    workers = np.array([c.workers for c in configs], dtype=float)
    batch = np.array([c.global_batch for c in configs], dtype=float)
    accum = np.array([c.accum_steps for c in configs], dtype=float)
    price = np.array([c.usd_per_hour for c in configs], dtype=float)
    step = perfmodel.step_time(params, nodes, workers, batch / (workers * accum), accum)
    sigma = fit.prior_log_sigma(params, nodes, workers)
    steps = steps_to_finish(
        batch,
        remaining_progress=remaining_progress,
        base_batch=base_batch,
        gns=gns,
        done_fraction=done_fraction,
        forecast=forecast,
    )
    restart = np.broadcast_to(np.asarray(restart_s, dtype=float), nodes.shape)
    extra = np.broadcast_to(np.asarray(extra_usd, dtype=float), nodes.shape)
    train = steps * step
    seconds = train + restart
    work_sigma: Array | None = None
    total_sigma = sigma
    if forecast and gns:
        start = min(max(done_fraction, 0.0), 1.0)
        work_sigma = efficiency.log_sigma(gns, base_batch, batch, start=start)
        total_sigma = np.hypot(sigma, work_sigma)
    seconds_p90 = train * np.exp(Z90 * total_sigma) + restart
    return Evaluation(
        step_time=step,
        log_sigma=sigma,
        steps=steps,
        seconds=seconds,
        cost_usd=seconds / 3600.0 * price + extra,
        seconds_p90=seconds_p90,
        cost_p90_usd=seconds_p90 / 3600.0 * price + extra,
        steps_log_sigma=work_sigma,
    )
