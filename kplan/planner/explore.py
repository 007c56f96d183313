"""Choose short trials by Bayesian optimisation, seeded by the performance model (pure).

The model predicts the value (USD or seconds to finish) of every configuration in a finite list,
with a log-space error ``sigma``. A Gaussian process (scikit-learn) learns where the model is
wrong from the trials:

    log measured(x) = log predicted(x) + sigma(x) * g(x),   g ~ GP(0, RBF) with unit variance

over features of the configuration (log2 nodes, workers, per-worker batch and accumulation, a
multi-node flag, one-hot instance type and market). The GP's prior variance is the model's own
uncertainty, so a few trials move the belief about hundreds of configurations: one measured
multi-node trial corrects every multi-node prediction near it. The next trial maximises the
expected improvement over the best measured value, net of the trial's overhead:

    EI(x) = E[max(v* - V(x), 0)],  V log-normal  ->  v* Phi(z) - exp(m + s^2/2) Phi(z - s)
    suggest argmax EI(x) - overhead(x), or nothing when that is below min_gain * v*

and stops when the overhead budget or the trial count is spent. scikit-learn is imported only
here, inside the functions that fit (``kplan estimate`` never loads it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from kplan.core.errors import InputError
from kplan.planner.online import Config

Array = NDArray[np.float64]


def config_features(configs: Sequence[Config]) -> Array:
    """One row per config: log2 nodes, workers, local batch, accumulation, multi-node, one-hots."""
    nodes = np.array([c.nodes for c in configs], dtype=float)
    cols = [
        np.log2(nodes),
        np.log2([c.workers for c in configs]),
        np.log2([c.local_batch for c in configs]),
        np.log2([c.accum_steps for c in configs]),
        (nodes > 1).astype(float),
    ]
    for attr in ("instance_type", "market"):
        values = [getattr(c, attr) for c in configs]
        kinds = sorted(set(values))
        if len(kinds) > 1:
            cols.extend(np.array([v == k for v in values], dtype=float) for k in kinds)
    return np.column_stack(cols)


def _positive(values: ArrayLike, n: int, name: str) -> Array:
    out = np.broadcast_to(np.asarray(values, dtype=float), (n,)).copy()
    if np.any(~(out > 0) & ~np.isnan(out)):
        raise InputError(f"{name} must be > 0 (NaN marks an unknown value)", hint=f"got {out}")
    return out


class Explorer:
    """Trials over ``configs`` by expected improvement, within an overhead budget."""

    def __init__(
        self,
        configs: Sequence[Config],
        predicted: ArrayLike,
        *,
        log_sigma: ArrayLike = 0.1,
        trial_overhead: ArrayLike = 0.0,
        overhead_budget: float = math.inf,
        min_gain: float = 0.01,
        max_trials: int | None = None,
        length_scale: float = 1.5,
        noise: float = 0.03,
        constrained: ArrayLike | None = None,
        limit: float | None = None,
    ) -> None:
        if not configs:
            raise InputError("no configurations to explore", hint="give at least one")
        if not overhead_budget >= 0:
            raise InputError(f"overhead_budget={overhead_budget} must be >= 0", hint="e.g. 5.0")
        if not min_gain >= 0:
            raise InputError(f"min_gain={min_gain} must be >= 0", hint="e.g. 0.01")
        if max_trials is not None and max_trials < 1:
            raise InputError(f"max_trials={max_trials} must be >= 1", hint="e.g. 8")
        if not (length_scale > 0 and noise > 0):
            raise InputError(
                f"length_scale={length_scale}, noise={noise} must be > 0", hint="e.g. 1.5, 0.03"
            )
        self.configs = tuple(configs)
        self.features = config_features(self.configs)
        self.overhead_budget = overhead_budget
        self.min_gain = min_gain
        self.max_trials = max_trials
        self.length_scale = length_scale
        self.noise = noise
        self._overhead = np.zeros(len(self.configs))
        self.set_overheads(trial_overhead)
        self._pred = np.zeros(len(self.configs))
        self._sigma = np.zeros(len(self.configs))
        self._cons: Array | None = None
        self.limit = limit
        self.set_prior(predicted, log_sigma, constrained)
        self._measured: dict[int, float] = {}
        self._order: list[int] = []
        self._spent = 0.0

    # -- inputs -------------------------------------------------------------------------------

    def set_prior(
        self, predicted: ArrayLike, log_sigma: ArrayLike, constrained: ArrayLike | None = None
    ) -> None:
        """Re-seed with new model predictions (after a refit); measured trials are kept.

        ``constrained`` (with ``limit``): a second predicted quantity with the same relative
        error as ``predicted`` (the hours when minimising cost, say) that must stay <= limit.
        """
        n = len(self.configs)
        if (constrained is None) != (self.limit is None):
            raise InputError(
                "give both constrained values and a limit, or neither",
                hint="e.g. predicted hours and a deadline",
            )
        if constrained is not None:
            self._cons = _positive(constrained, n, "constrained")
        pred = np.asarray(predicted, dtype=float)
        if pred.shape != (n,):
            raise InputError(
                f"predicted has shape {pred.shape}, expected ({n},)", hint="one value per config"
            )
        self._pred = _positive(pred, n, "predicted")
        self._sigma = np.maximum(_positive(log_sigma, n, "log_sigma"), 1e-3)

    def set_overheads(self, trial_overhead: ArrayLike) -> None:
        """The expected overhead of a trial of each config from where the job is now."""
        over = np.broadcast_to(np.asarray(trial_overhead, dtype=float), (len(self.configs),))
        if np.any(~(over >= 0)):
            raise InputError("trial_overhead must be >= 0", hint=f"got {over}")
        self._overhead = over.copy()

    def add(
        self,
        config: Config,
        predicted: float = math.nan,
        *,
        log_sigma: float = 0.1,
        trial_overhead: float = 0.0,
        constrained: float = math.nan,
    ) -> int:
        """Append a config (e.g. the one running, if the list lacks it); return its index.

        Without a predicted value it is never suggested, but a trial of it still counts.
        """
        if not (math.isnan(predicted) or predicted > 0):
            raise InputError(f"predicted={predicted!r} must be > 0 or NaN", hint="USD or s")
        self.configs = (*self.configs, config)
        self.features = config_features(self.configs)
        self._pred = np.append(self._pred, predicted)
        self._sigma = np.append(self._sigma, max(log_sigma, 1e-3))
        self._overhead = np.append(self._overhead, max(trial_overhead, 0.0))
        if self._cons is not None:
            self._cons = np.append(self._cons, constrained)
        return len(self.configs) - 1

    def observe(self, index: int, measured_value: float, overhead: float = 0.0) -> None:
        """Record a trial of ``configs[index]``: its measured value and what it cost."""
        if not 0 <= index < len(self.configs):
            raise InputError(f"index {index} is out of range", hint=f"0..{len(self.configs) - 1}")
        if not (math.isfinite(measured_value) and measured_value > 0):
            raise InputError(f"measured_value={measured_value!r} must be > 0", hint="USD or s")
        if not (math.isfinite(overhead) and overhead >= 0):
            raise InputError(f"overhead={overhead!r} must be >= 0", hint="USD or s")
        self._measured[index] = measured_value
        self._order.append(index)
        self._spent += overhead

    # -- state ----------------------------------------------------------------------------------

    @property
    def overhead_spent(self) -> float:
        return self._spent

    @property
    def trials(self) -> tuple[int, ...]:
        """Indices of the trials, in order (a config tried twice appears twice)."""
        return tuple(self._order)

    def measured(self, index: int) -> float | None:
        return self._measured.get(index)

    def feasible(self, index: int) -> bool | None:
        """Whether a trial met the limit (None: not tried); True when there is no limit."""
        if index not in self._measured:
            return None
        if self._cons is None or self.limit is None:
            return True
        ratio = self._measured[index] / self._pred[index]
        return bool(self._cons[index] * ratio <= self.limit)

    def _incumbent(self) -> float | None:
        ok = [v for i, v in self._measured.items() if self.feasible(i)]
        return min(ok) if ok else None

    def best(self) -> int:
        """The tried config with the lowest measured value among those that met the limit.

        Before any trial: the model's best (among those predicted to meet the limit). When no
        trial met the limit: the tried config closest to it.
        """
        ok = [i for i in self._measured if self.feasible(i)]
        if ok:
            return min(ok, key=lambda i: self._measured[i])
        if self._measured and self._cons is not None:
            return min(self._measured, key=self._cons_measured)
        return int(np.argmin(self._seed_score(np.isfinite(self._pred))))

    def _cons_measured(self, i: int) -> float:
        cons = np.nan if self._cons is None else self._cons[i]
        return float(cons * self._measured[i] / self._pred[i])

    def _seed_score(self, open_: NDArray[np.bool_]) -> Array:
        """The model's ranking without trials: value where predicted feasible, else far behind."""
        score = np.where(open_, self._pred, np.inf)
        if self._cons is not None and self.limit is not None:
            fits = self._cons <= self.limit
            if (fits & open_).any():
                score = np.where(fits, score, np.inf)
            else:  # nothing fits: the closest to the limit
                score = np.where(open_, self._cons, np.inf)
        out: Array = score
        return out

    def feasibility(self) -> Array:
        """Posterior probability that each config meets the limit (1 without a limit)."""
        if self._cons is None or self.limit is None:
            return np.ones(len(self.configs))
        from scipy.special import ndtr

        mean, std = self.posterior()
        shift = mean - np.log(self._pred)  # the learned log ratio measured / predicted
        out: Array = ndtr((math.log(self.limit) - np.log(self._cons) - shift) / std)
        return np.where(np.isfinite(out), out, 0.0)

    def posterior(self) -> tuple[Array, Array]:
        """(mean, std) of log value for every config, given the trials."""
        log_pred = np.log(self._pred)
        if not self._measured:
            return log_pred, self._sigma.copy()
        idx = np.array(sorted(self._measured))
        values = np.array([self._measured[i] for i in idx])
        sig = self._sigma[idx]
        target = (np.log(values) - log_pred[idx]) / sig
        known = np.isfinite(target)
        mean, std = log_pred.copy(), self._sigma.copy()
        if known.any():
            mean, std = self._gp(known, idx, sig, target)
        for i, v in zip(idx, values, strict=True):  # where the model had no value, use the trial
            if np.isnan(mean[i]):
                mean[i], std[i] = math.log(v), self.noise
        return mean, std

    def _gp(
        self, known: NDArray[np.bool_], idx: NDArray[np.int64], sig: Array, target: Array
    ) -> tuple[Array, Array]:
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.gaussian_process.kernels import RBF

        gp = GaussianProcessRegressor(
            kernel=RBF(length_scale=self.length_scale, length_scale_bounds="fixed"),
            alpha=(self.noise / sig[known]) ** 2,
            optimizer=None,
            normalize_y=False,
        )
        gp.fit(self.features[idx[known]], target[known])
        g_mean, g_std = gp.predict(self.features, return_std=True)
        mean = np.log(self._pred) + self._sigma * np.asarray(g_mean, dtype=float)
        std = self._sigma * np.maximum(np.asarray(g_std, dtype=float), 1e-6)
        return mean, std

    def expected_improvement(self) -> Array:
        """Expected saving over the best feasible measured value, per config (value units).

        Zero before a feasible trial. With a limit, weighted by the probability of meeting it.
        """
        v_star = self._incumbent()
        if v_star is None:
            return np.zeros(len(self.configs))
        from scipy.special import ndtr  # scipy only on the exploring path

        mean, std = self.posterior()
        z = (math.log(v_star) - mean) / std
        ei = v_star * ndtr(z) - np.exp(mean + std**2 / 2.0) * ndtr(z - std)
        ei = ei * self.feasibility()
        out: Array = np.where(np.isfinite(ei), np.maximum(ei, 0.0), 0.0)
        return out

    def suggest(self) -> int | None:
        """The next config to try, or None: nothing is worth its overhead, or the budget is spent.

        The first trial is the model's own best; later ones maximise the net expected
        improvement. While no trial has met the limit, the next is the model's best among the
        configs likely (p >= 0.5) to meet it. A config already tried is not suggested again.
        """
        if self.max_trials is not None and len(self._order) >= self.max_trials:
            return None
        left = self.overhead_budget - self._spent
        open_ = np.isfinite(self._pred) & (self._overhead <= left)
        open_[list(self._measured)] = False
        if not open_.any():
            return None
        if not self._measured:
            return int(np.argmin(self._seed_score(open_)))
        v_star = self._incumbent()
        if v_star is None:  # nothing tried met the limit yet
            likely = open_ & (self.feasibility() >= 0.5)
            if not likely.any():
                return None
            return int(np.argmin(np.where(likely, self._pred, np.inf)))
        net = self.expected_improvement() - self._overhead
        net = np.where(open_, net, -np.inf)
        i = int(np.argmax(net))
        if net[i] <= self.min_gain * v_star:
            return None
        return i
