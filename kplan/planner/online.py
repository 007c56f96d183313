"""Online adaptation: refit the step-time model from a running job, evaluate, re-plan (pure).

While a job runs, the launcher aggregates the runtime's step records per configuration and feeds
them to ``OnlineModel.observe``; each observation is first predicted (the error is tracked, for
``kplan status``), then recorded. ``refit`` fits ``perfmodel`` to the profile's rows plus what
the job measured. ``evaluate`` predicts the rest of the job for many configurations at once and
``replan`` decides whether another configuration is worth a restart:

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
from typing import Any, Literal

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

# Parameter groups that only rows of a kind can identify: kept from the prior without such rows.
_INTRA = ("intra_alpha", "intra_beta", "intra_lat")
_INTER = ("inter_alpha", "inter_beta", "inter_lat", "two_node", "inter_gamma")
# Time-valued parameters: scaling all of them by r scales every predicted step time by r.
_TIMES = ("compute_a", "compute_b", "intra_alpha", "intra_beta", "inter_alpha", "inter_beta")
_LATS = ("intra_lat", "inter_lat")


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
        keep: dict[str, Any] = {}
        multi = d.workers > 1
        if not (multi & (d.nodes == 1)).any():
            keep.update({n: getattr(self.prior, n) for n in _INTRA})
        if not (multi & (d.nodes > 1)).any():
            keep.update({n: getattr(self.prior, n) for n in _INTER})
        self._params = replace(
            fitted,
            **keep,
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
        changes: dict[str, Any] = {n: getattr(p, n) * r for n in (*_TIMES, *_LATS)}
        return replace(p, **changes, log_sigma=sigma)

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
        return self.cost_usd if _objective(objective) == "cost" else self.seconds


def _objective(objective: str) -> OnlineObjective:
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


@dataclass(frozen=True)
class Decision:
    switch: bool
    best: Config  # the best candidate found (the current config when there is none)
    current_value: float  # USD or seconds to finish, as the objective says
    best_value: float  # including the restart penalty
    gain: float  # (current_value - best_value) / current_value
    reason: str  # one line for a human


def switch_penalty(
    current: Config, configs: Sequence[Config], *, restart_s: float, boot_s: float = 0.0
) -> tuple[Array, Array]:
    """(downtime seconds, boot USD) of switching from ``current`` to each config (added nodes
    boot while the job still runs on the old cluster: billed, not downtime)."""
    down = np.array([0.0 if current.same_cluster(c) else restart_s for c in configs])
    boot = np.array(
        [
            0.0
            if current.same_cluster(c)
            else boot_s / 3600.0 * c.usd_per_hour / c.nodes * max(c.nodes - _kept(current, c), 0)
            for c in configs
        ]
    )
    return down, boot


def _kept(current: Config, c: Config) -> int:
    """Nodes of ``current`` that ``c`` can keep (same instance type and market)."""
    if (current.instance_type, current.market) != (c.instance_type, c.market):
        return 0
    return min(current.nodes, c.nodes)


def _deadline_chance(ev: Evaluation, restart_s: Array, deadline_left_s: float) -> Array:
    """P(finishing within ``deadline_left_s``) of each config: log-normal training time with
    the step time's and the GNS forecast's sigmas, plus the fixed restart downtime."""
    train = ev.seconds - restart_s
    sigma = (
        ev.log_sigma if ev.steps_log_sigma is None else np.hypot(ev.log_sigma, ev.steps_log_sigma)
    )
    room = deadline_left_s - restart_s
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.log(np.maximum(room, 1e-9) / train) / np.maximum(sigma, 1e-6)
    z = np.where((room > 0) & np.isfinite(train) & (train > 0), z, -np.inf)
    out: Array = 0.5 * (1.0 + np.vectorize(math.erf)(z / math.sqrt(2.0)))
    return np.where(np.isfinite(z), out, np.where(z > 0, 1.0, 0.0))


def deadline_safe(
    configs: Sequence[Config],
    ev: Evaluation,
    down: Array,
    deadline_left_s: float,
    *,
    hold_share: Array | None,
    restart_s: float,
) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
    """(alone, with a fallback): which configs keep the deadline at their p90.

    ``alone``: the config finishes the remaining work by the deadline at its p90 (the step
    time's and the GNS forecast's spread), its switch downtime ``down`` included.

    ``with a fallback``: the config is only run until the next re-plan, which re-reads the
    noise scale with a narrower forecast. It is safe to run when its expected time meets the
    deadline and, should the forecast then turn out wrong, some config (the *fallback*) can
    still finish the rest at its p90 from there: the config's switch downtime, its share
    ``hold_share`` of the remaining work at its p90 (a hold that is the whole rest of the job
    has no re-plan after it: then only ``alone`` counts), the fallback's switch
    (``restart_s`` of downtime: added nodes boot while the job runs, as ``switch_penalty``)
    and the rest at the fallback's p90 all within the time left. The p90 is today's (the
    forecast only narrows as points come in), so the guard is conservative. Without
    ``hold_share`` (no re-plan to rely on) only ``alone`` counts.
    """
    alone: NDArray[np.bool_] = ev.seconds_p90 <= deadline_left_s
    if hold_share is None or len(configs) < 2:
        return alone, alone.copy()
    share = np.clip(np.asarray(hold_share, dtype=float), 0.0, 1.0)
    train90 = ev.seconds_p90 - down
    _, same = _same(configs)
    penalty = np.where(same, 0.0, restart_s)  # [from, to]: added nodes boot meanwhile
    rest = penalty + (1.0 - share)[:, None] * np.where(np.isfinite(train90), train90, np.inf)
    fallback = down + share * train90 + np.min(rest, axis=1)  # the hold at its p90 too
    ok: NDArray[np.bool_] = (ev.seconds <= deadline_left_s) & (fallback <= deadline_left_s)
    return alone, alone | ok


def _same(configs: Sequence[Config]) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
    """[from, to] matrices: same instance type and market; same cluster (no restart)."""
    kinds: dict[tuple[str, str], int] = {}
    code = np.array([kinds.setdefault((c.instance_type, c.market), len(kinds)) for c in configs])
    nodes = np.array([c.nodes for c in configs])
    workers = np.array([c.workers for c in configs])
    same_kind: NDArray[np.bool_] = code[:, None] == code[None, :]
    same: NDArray[np.bool_] = (
        same_kind & (nodes[:, None] == nodes[None, :]) & (workers[:, None] == workers[None, :])
    )
    return same_kind, same


def _fallback_chance(
    configs: Sequence[Config],
    ev: Evaluation,
    down: Array,
    deadline_left_s: float,
    share: Array,
    *,
    restart_s: float,
) -> Array:
    """P(meeting the deadline) of running each config for its ``share`` of the remaining work,
    then the best config for the rest (itself included): log-normal training times with the
    step time's and the GNS forecast's sigmas, the switch downtimes fixed."""
    sigma = (
        ev.log_sigma if ev.steps_log_sigma is None else np.hypot(ev.log_sigma, ev.steps_log_sigma)
    )
    sigma = np.maximum(sigma, 1e-6)
    train = ev.seconds - down
    _, same = _same(configs)
    room = deadline_left_s - down - share * train  # after the hold on each config
    left = room[:, None] - np.where(same, 0.0, restart_s)
    need = (1.0 - share)[:, None] * train[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.log(np.maximum(left, 1e-9) / need) / sigma[None, :]
    z = np.where((left > 0) & np.isfinite(need) & (need > 0), z, -np.inf)
    z = np.where(np.isfinite(need) & (need <= 0) & (left >= 0), np.inf, z)  # nothing left
    best = np.max(z, axis=1)
    out: Array = np.array([0.5 * (1.0 + math.erf(v / math.sqrt(2.0))) for v in best])
    return out


def _contingent_value(
    configs: Sequence[Config],
    ev: Evaluation,
    down: Array,
    boot_usd: Array,
    deadline_left_s: float,
    share: Array,
    *,
    objective: str,
    restart_s: float,
    boot_s: float,
) -> Array:
    """The expected value of running each config with its fallback: with the chance ``P`` that
    it meets the deadline alone (``_deadline_chance``), its own value; otherwise its share of
    the work until the next re-plan, then a switch to the fallback and the rest there. The
    fallback is the cheapest config (by ``objective``) that then still finishes the rest by
    the deadline at its p90, or the soonest one when none does: a config a little too slow
    falls back on one a little faster, not on the fastest. A config that is safe only by its
    fallback then pays for the fallback as often as it is likely to need it."""
    n = len(configs)
    chance = _deadline_chance(ev, down, deadline_left_s)
    price = np.array([c.usd_per_hour for c in configs]) / 3600.0
    train = ev.seconds - down
    train90 = np.where(np.isfinite(ev.seconds_p90 - down), ev.seconds_p90 - down, np.inf)
    same_kind, same = _same(configs)
    nodes = np.array([c.nodes for c in configs], dtype=float)
    pause = np.where(same, 0.0, restart_s)  # [from, to]
    finish90 = pause + (1.0 - share)[:, None] * train90[None, :]
    room = deadline_left_s - down - share * train  # after the hold on each config
    if objective == "cost":
        kept = np.where(same_kind, np.minimum(nodes[:, None], nodes[None, :]), 0.0)
        added = np.maximum(nodes[None, :] - kept, 0.0)
        after = (
            pause * price[None, :]
            + boot_s * (price / nodes)[None, :] * added
            + (1.0 - share)[:, None] * (train * price)[None, :]
        )
        hold = down * price + boot_usd + share * train * price
    else:
        after = pause + (1.0 - share)[:, None] * train[None, :]
        hold = down + share * train
    ok = finish90 <= room[:, None]
    f = np.where(
        ok.any(axis=1),
        np.argmin(np.where(ok, after, np.inf), axis=1),
        np.argmin(finish90, axis=1),
    )
    own = ev.value(objective)
    out: Array = chance * own + (1.0 - chance) * (hold + after[np.arange(n), f])
    return np.where(np.isfinite(out), out, own)


def replan(
    params: PerfParams,
    current: Config,
    candidates: Sequence[Config],
    *,
    remaining_progress: float,
    base_batch: float,
    gns: Sequence[GnsPoint],
    objective: str,
    restart_s: float,
    margin: float = 0.1,
    budget_left_usd: float | None = None,
    deadline_left_s: float | None = None,
    boot_s: float = 0.0,
    done_fraction: float = 0.0,
    forecast: bool = False,
    recheck_s: float | None = None,
    recheck_fraction: float | None = None,
) -> Decision:
    """Switch to another configuration only when it is better by more than ``margin``.

    The candidates pay ``restart_s`` of downtime at their price (and ``boot_s`` for each node
    added) unless they differ from ``current`` only in the
    batch. A candidate must fit the budget at its p90 and keep the deadline: at its p90, or,
    when the caller re-plans again after ``recheck_s`` seconds or ``recheck_fraction`` of the
    whole job (whichever comes first), at its expected time with a fallback that still meets
    the deadline at its p90 from the next re-plan (``deadline_safe``): an early, wide forecast
    then does not lock the job into the fastest, dearest cluster, and as the forecast
    narrows the cheapest safe config is re-chosen. A current configuration that breaks the
    budget or the deadline is left for the best one that fits, whatever the margin; when none
    fits, the one with the best chance of meeting the deadline.
    """
    _objective(objective)
    if not 0.0 <= margin < 1.0:
        raise InputError(f"margin={margin} must be in [0, 1)", hint="e.g. 0.1")
    others = [c for c in candidates if c != current]
    configs = [current, *others]
    down, boot = switch_penalty(current, configs, restart_s=restart_s, boot_s=boot_s)
    ev = evaluate(
        params,
        configs,
        remaining_progress=remaining_progress,
        base_batch=base_batch,
        gns=gns,
        restart_s=down,
        extra_usd=boot,
        done_fraction=done_fraction,
        forecast=forecast,
    )
    value = ev.value(objective)
    fits = np.isfinite(value)
    if budget_left_usd is not None:
        fits &= ev.cost_p90_usd <= budget_left_usd
    in_budget = fits.copy()
    alone = np.ones(len(configs), dtype=bool)
    contingent: Array | None = None  # each config's value with its fallback (deadline rules)
    if deadline_left_s is not None:
        share = _hold_share(ev.seconds - down, done_fraction, recheck_s, recheck_fraction)
        alone, safe = deadline_safe(
            configs,
            ev,
            down,
            deadline_left_s,
            hold_share=share,
            restart_s=restart_s,
        )
        fits &= safe
        if share is not None:
            by_fallback = safe & ~alone
            contingent = _contingent_value(
                configs,
                ev,
                down,
                boot,
                deadline_left_s,
                share,
                objective=objective,
                restart_s=restart_s,
                boot_s=boot_s,
            )
            value = np.where(by_fallback, contingent, value)
    unit = "USD" if objective == "cost" else "s"
    cur = float(value[0])
    if deadline_left_s is not None and len(configs) > 1 and not fits.any() and share is not None:
        # Nothing keeps the deadline at its p90, even with a fallback. The chance of meeting
        # it with a config is that of running it until the next re-plan, then its fallback
        # (which an early forecast's spread narrows by then). Keep the cheapest config (the
        # expected value with its fallback) whose chance is within the margin (in
        # probability) of the best: another re-plan interval on it costs little chance, the
        # fastest cluster a lot of money. As the slack runs out, holding a slow config eats
        # the fallback's chance, and the fastest configs are all that remain.
        chance = _fallback_chance(configs, ev, down, deadline_left_s, share, restart_s=restart_s)
        chance = np.where(in_budget, chance, -1.0)
        near = in_budget & (chance >= float(chance.max()) - margin) & (chance > 0)
        if near.any() and contingent is not None:  # valued above (share is set)
            pick = np.where(near, contingent, np.inf)
            j = int(np.argmin(pick))
            gain = (pick[0] - pick[j]) / pick[0] if near[0] and pick[0] > 0 else 1.0
            why = (
                f"no configuration meets the deadline at its p90; the cheapest within "
                f"{margin:.0%} of the best chance of meeting it ({float(chance.max()):.0%}, "
                f"with a fallback from the next re-plan)"
            )
            if j != 0 and gain > margin:
                label = configs[j].label
                return Decision(
                    True, configs[j], cur, float(value[j]), gain, f"switch to {label}: {why}"
                )
            return Decision(
                False, configs[j], cur, float(value[j]), 0.0, f"stay on {current.label}: {why}"
            )
    if deadline_left_s is not None and len(configs) > 1 and not fits.any():
        # Nothing meets the deadline at its p90: take the best chance of meeting it, the
        # largest z = log(time left / predicted) / sigma (log-normal time; within the budget),
        # when its chance beats staying's by more than the margin (in probability).
        chance = _deadline_chance(ev, down, deadline_left_s)
        chance = np.where(in_budget, chance, -1.0)
        j = int(np.argmax(chance))
        if j != 0 and chance[j] > chance[0] + margin:
            gain = (cur - float(value[j])) / cur if cur > 0 and math.isfinite(cur) else 0.0
            return Decision(
                True,
                configs[j],
                cur,
                float(value[j]),
                gain,
                f"switch to {configs[j].label}: no configuration meets the deadline at its p90; "
                f"this one has the best chance ({chance[j]:.0%} against {chance[0]:.0%})",
            )
    if len(configs) == 1 or not fits[1:].any():
        why = "no candidate" if len(configs) == 1 else "no candidate fits the budget/deadline"
        return Decision(False, current, cur, cur, 0.0, f"stay on {current.label}: {why}")
    i = 1 + int(np.nanargmin(np.where(fits[1:], value[1:], np.inf)))
    best, best_value = configs[i], float(value[i])
    if not math.isfinite(cur):
        return Decision(
            False,
            best,
            cur,
            best_value,
            0.0,
            f"stay on {current.label}: its remaining work cannot be predicted (no GNS)",
        )
    gain = (cur - best_value) / cur if cur > 0 else 0.0
    if not fits[0]:
        return Decision(
            True,
            best,
            cur,
            best_value,
            gain,
            f"switch to {best.label}: the current configuration would break the "
            f"budget/deadline; {best_value:.4g} {unit} to finish{_how(alone[i])}",
        )
    if gain > margin:
        return Decision(
            True,
            best,
            cur,
            best_value,
            gain,
            f"switch to {best.label}: {best_value:.4g} {unit} to finish against {cur:.4g} "
            f"({gain:.0%} better, restart included; margin {margin:.0%}){_how(alone[i])}",
        )
    return Decision(
        False,
        best,
        cur,
        best_value,
        gain,
        f"stay on {current.label}: the best alternative ({best.label}) gains {gain:.1%}, "
        f"not more than the {margin:.0%} margin",
    )


def _how(alone: bool) -> str:
    return "" if alone else " (the deadline kept by a fallback from the next re-plan)"


def _hold_share(
    train: Array, done_fraction: float, recheck_s: float | None, recheck_fraction: float | None
) -> Array | None:
    """The share of the remaining work each config does before the next re-plan (None: no
    re-plan to rely on)."""
    if recheck_s is None and recheck_fraction is None:
        return None
    share = np.ones_like(train)
    if recheck_s is not None:
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.minimum(share, np.where(train > 0, recheck_s / train, 1.0))
    if recheck_fraction is not None:
        left = max(1.0 - min(max(done_fraction, 0.0), 1.0), 1e-9)
        share = np.minimum(share, recheck_fraction / left)
    out: Array = np.clip(np.nan_to_num(share, nan=1.0), 0.0, 1.0)
    return out
