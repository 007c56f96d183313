"""Each configuration's parameters for the spot Monte-Carlo (``spotsim.simulate``), by name,
and each run's market period (``draw_regimes``): read once before the event loop."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kplan.planner import spotdraws
from kplan.planner.spot import RecoveryPolicy, SpotRisk

Array = NDArray[np.float64]
INF = math.inf


def config_params(
    risk_list: list[SpotRisk | None],
    pol: list[RecoveryPolicy],
    n_f: Array,
    prices: tuple[Array, Array, Array, Array],
    work_s: Array,
) -> dict[str, NDArray[Any]]:
    """Each configuration's parameters, by name (one entry per configuration). ``work_s``:
    each configuration's training time without losses, the length of market its regimes
    average over (``SpotRisk.rate_sigma_for``)."""

    def per_cfg(vals: Sequence[float]) -> Array:
        return np.asarray(vals, dtype=float)

    co_loss = per_cfg([r.co_loss if r else 0.0 for r in risk_list])
    interval = per_cfg([p.checkpoint_interval_s for p in pol])
    ck_s = per_cfg([p.checkpoint_s for p in pol])
    bmin, binc, p_spot, p_od = prices
    return {
        "k_inv": per_cfg([1.0 / r.lifetime.shape if r else 1.0 for r in risk_list]),
        # each slot's loss clock: the life's scale stretched by 1 + co_loss (n - 1) (spot.py);
        # the markets' mean life where the row is applied to markets it never saw
        "scale": per_cfg([r.market_lifetime.scale_h * 3600.0 if r else INF for r in risk_list])
        * (1.0 + co_loss * (n_f - 1.0)),
        "co": co_loss.astype(np.float32),
        "out_p": per_cfg([r.outage.prob if r else 0.0 for r in risk_list]),
        "rate_sd": per_cfg(
            [
                float(r.rate_sigma_for(w / 3600.0)) if r else 0.0
                for r, w in zip(risk_list, work_s, strict=True)
            ]
        ),
        "region_p": per_cfg([r.outage.region_prob if r else 0.0 for r in risk_list]),
        "allow_od": np.array([p.allow_on_demand for p in pol]),
        "restart": per_cfg([p.restart_s for p in pol]),
        "interval": interval,
        "ck": ck_s,
        "cycle": interval + ck_s,
        "max_rep": per_cfg([float(p.max_replacements) for p in pol]),
        "cap": per_cfg([p.capacity_wait_s for p in pol]),
        "n_dur": np.array([len(r.outage.durations_h) if r else 0 for r in risk_list]),
        "last_dur": np.array(
            [max(len(r.outage.durations_h) - 1, 0) if r else 0 for r in risk_list]
        ),
        "no_failover": np.array([not p.zone_failover for p in pol]),
        "deadline": per_cfg([INF if p.deadline_s is None else p.deadline_s for p in pol]),
        "notice": per_cfg([p.notice_stop_or_inf for p in pol]),
        "bmin": bmin,
        "binc": binc,
        "p_spot": p_spot,
        "p_od": p_od,
        "cf": np.arange(len(pol)),
    }


def draw_regimes(
    P: dict[str, NDArray[Any]], risks: list[SpotRisk | None], cf: NDArray[np.intp]
) -> None:
    """Each run's market period (spot.py, Regimes): the loss hazard times ``exp(s z - s^2/2)``
    (a Weibull's scale times that to the power -1/k) and the outage chance's logit plus
    ``s' z'``, with ``s`` the configuration's spread over its run (``rate_sd``). Drawn from
    their own slots: with no spread the runs are unchanged."""
    rate_sd = P.pop("rate_sd")
    out_sd = np.array([r.outage_sigma_total if r else 0.0 for r in risks])[cf]
    if not (np.any(rate_sd > 0) or np.any(out_sd > 0)):
        return
    d = spotdraws
    z1 = d.normal(P["lane"], np.zeros(cf.size, np.int64), d.REGIME_Z1, d.REGIME_Z2)
    z2 = d.normal(P["lane"], np.zeros(cf.size, np.int64), d.REGIME_Z3, d.REGIME_Z4)
    mult = np.exp(rate_sd * z1 - rate_sd**2 / 2.0)
    with np.errstate(invalid="ignore", over="ignore"):
        P["scale"] = np.where(np.isfinite(P["scale"]), P["scale"] * mult ** (-P["k_inv"]), INF)
    p = np.clip(P["out_p"], 0.0, 1.0)
    inner = (p > 0) & (p < 1)
    logit = np.log(np.where(inner, p, 0.5) / np.where(inner, 1.0 - p, 0.5)) + out_sd * z2
    P["out_p"] = np.where(inner, 1.0 / (1.0 + np.exp(-logit)), p)
