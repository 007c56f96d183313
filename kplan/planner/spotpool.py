"""A spot market the model never saw: the fitted markets as draws of a two-level population.

Each fitted ``SpotRisk`` is one market (a pool of one cloud, type and zone over one period). A
market not among them is another draw of the same population: a random-effects model with
two levels, markets within clouds (log rate = grand mean + cloud effect + market effect), its
variances fitted by the method of moments, each market one vote:

- each market's log rate ``y_m`` (one over its mean life) is known up to the noise of a mean
  over its trace's periods, ``v_m = rate_sigma_m^2 / blocks_m`` (its regimes are the spread
  between ``blocks_m`` 2-hour blocks). That noise is taken out of the spread between markets
  before it counts: otherwise the period variation, which every run already draws through the
  regimes, would count twice (once in ``rate_sigma``, once in the between-market spread);
- ``tau_m^2``: the spread between markets of one cloud (pooled over the clouds with two or
  more markets) beyond that noise; ``tau_c^2``: the spread between the clouds' means beyond
  what ``tau_m`` and the noise give them. With no cloud holding two markets the two levels
  cannot be told apart and all of the spread is between markets;
- the unseen market of a seen cloud: its cloud's mean shrunk toward the grand mean (the
  weight ``tau_c^2 / (tau_c^2 + (tau_m^2 + v) / n)``), with the uncertainty of that estimate
  plus ``tau_m^2``; of an unseen cloud: the grand mean, plus ``tau_c^2``. Its log rate is then
  ``N(m, s^2)`` (the posterior predictive, normal);
- each run draws its market and its period: the pooled row's ``rate_sigma`` is
  ``sqrt(mean(rate_sigma_m^2) + s^2)`` and its ``rate_per_hour`` (the mean of the regimes'
  mean-1 multiplier) ``exp(m + s^2 / 2)``, so the median run's rate is the predictive's median
  market's median period, ``exp(m - mean(rate_sigma_m^2) / 2)``. The spread between markets
  is a run's whole length (a run stays in its market), so it is in the lasting part too:
  ``rate_sigma_long = sqrt(mean(rate_sigma_long_m^2) + s^2)`` (``SpotRisk.rate_sigma_for``).
  Each market was seen in one period, so the spread between them holds the spread between
  periods too: the markets' ``period_sigma`` is not added, and the pooled row's is 0.
  Before, ``m`` was the plain
  mean of the markets' log rates and ``s^2`` their spread with the noise in it, clouds not told
  apart: a calm cloud's markets made a busy cloud's unseen market look calm and the reverse;
- outage chance: the same model on the logit (its noise ``outage_sigma_m^2 / blocks_m``), the
  median chance and ``outage_sigma = sqrt(mean(outage_sigma_m^2) + s^2)``; the durations are
  every market's durations together; the Weibull shape, the co-loss and the region share are
  the markets' means.

With one market the pooled row is that market's; ``between`` says how wide the population is.
``market_spread`` gives the spreads the shipped rows carry for markets no trace watched.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kplan.planner.spot import Outage, SpotRisk, Weibull

LOGIT_EPS = 1e-3  # outage chances are clipped to [eps, 1 - eps] on the logit scale
MAX_SIGMA = 5.0  # SpotRisk's bound


def _logit(p: float) -> float:
    q = min(max(p, LOGIT_EPS), 1.0 - LOGIT_EPS)
    return math.log(q / (1.0 - q))


def between(risks: Sequence[SpotRisk]) -> tuple[float, float]:
    """(sd of the log loss rate, sd of the outage logit) between the markets (n - 1), noise
    and clouds not taken apart."""
    if len(risks) < 2:
        return 0.0, 0.0
    log_rate = np.log([r.rate_per_hour for r in risks])
    logit = np.array([_logit(r.outage.prob) for r in risks])
    return float(np.std(log_rate, ddof=1)), float(np.std(logit, ddof=1))


def components(
    y: Sequence[float], v: Sequence[float], clouds: Sequence[str]
) -> tuple[float, float]:
    """(tau_c^2, tau_m^2): the variance between clouds and between the markets of a cloud
    (module docstring), method of moments, each ``y`` known up to its noise variance ``v``."""
    groups = sorted(set(clouds))
    idx = [[i for i, c in enumerate(clouds) if c == g] for g in groups]
    df = sum(len(ix) - 1 for ix in idx)
    if df == 0:  # no cloud with two markets: one level
        if len(y) < 2:
            return 0.0, 0.0
        return 0.0, max(0.0, float(np.var(y, ddof=1)) - float(np.mean(v)))
    within = sum(float(np.sum((np.take(y, ix) - np.mean(np.take(y, ix))) ** 2)) for ix in idx)
    noise = float(np.mean([v[i] for ix in idx if len(ix) > 1 for i in ix]))
    tau_m2 = max(0.0, within / df - noise)
    if len(groups) < 2:
        return 0.0, tau_m2
    means = [float(np.mean(np.take(y, ix))) for ix in idx]
    share = [(tau_m2 + float(np.mean(np.take(v, ix)))) / len(ix) for ix in idx]
    return max(0.0, float(np.var(means, ddof=1)) - float(np.mean(share))), tau_m2


def predict(
    y: Sequence[float], v: Sequence[float], clouds: Sequence[str], cloud: str
) -> tuple[float, float]:
    """(m, s^2): the posterior predictive of an unseen market of ``cloud`` (normal)."""
    tau_c2, tau_m2 = components(y, v, clouds)
    groups = sorted(set(clouds))
    idx = [[i for i, c in enumerate(clouds) if c == g] for g in groups]
    means = np.array([float(np.mean(np.take(y, ix))) for ix in idx])
    share = np.array([(tau_m2 + float(np.mean(np.take(v, ix)))) / len(ix) for ix in idx])
    prec = tau_c2 + share
    if np.all(prec > 0):
        a, var_a = float(np.sum(means / prec) / np.sum(1 / prec)), float(1 / np.sum(1 / prec))
    else:  # a cloud known without noise: the clouds' plain mean
        a, var_a = float(np.mean(means)), 0.0
    if cloud not in groups:
        return a, var_a + tau_c2 + tau_m2
    k = groups.index(cloud)
    if tau_c2 + share[k] == 0:
        return float(means[k]), tau_m2
    w = tau_c2 / (tau_c2 + share[k])
    m = a + w * (float(means[k]) - a)
    return m, w * float(share[k]) + (1 - w) ** 2 * var_a + tau_m2


def pool_markets(
    risks: Sequence[SpotRisk],
    *,
    cloud: str,
    family: str,
    region: str = "*",
    blocks: Sequence[int] | None = None,
) -> SpotRisk:
    """The row of an unseen market of ``cloud`` in the population ``risks`` stand for (module
    docstring). ``blocks``: the number of 2-hour blocks each market's regimes were measured
    on (its mean's noise); None: each market's mean taken as known."""
    if not risks:
        raise ValueError("pooling needs at least one fitted market")
    if blocks is not None and len(blocks) != len(risks):
        raise ValueError(f"{len(blocks)} block counts for {len(risks)} markets")
    n = [max(1, b) for b in blocks] if blocks is not None else None
    clouds = [r.cloud for r in risks]
    rs2 = [r.rate_sigma**2 for r in risks]
    os2 = [r.outage_sigma**2 for r in risks]
    y = [math.log(r.rate_per_hour) for r in risks]
    m, s2 = predict(
        y, [a / b for a, b in zip(rs2, n, strict=True)] if n else [0.0] * len(y), clouds, cloud
    )
    lo = [_logit(r.outage.prob) for r in risks]
    mo, so2 = predict(
        lo, [a / b for a, b in zip(os2, n, strict=True)] if n else [0.0] * len(lo), clouds, cloud
    )
    shape = float(np.mean([r.lifetime.shape for r in risks]))
    mean_life_h = math.exp(-(m + s2 / 2.0))
    rate_sigma = math.sqrt(float(np.mean(rs2)) + s2)
    # the spread between markets lasts however long the run: it is in the long part whole
    long2 = [(r.rate_sigma if r.rate_sigma_long is None else r.rate_sigma_long) ** 2 for r in risks]
    rate_sigma_long = math.sqrt(float(np.mean(long2)) + s2)
    outage_sigma = math.sqrt(float(np.mean(os2)) + so2)
    durations = tuple(sorted(d for r in risks for d in r.outage.durations_h))
    names = "; ".join(r.source.split(":", 1)[0] for r in risks)
    source = (
        f"{len(risks)} markets pooled as a population of markets within clouds ({names}): "
        f"mean life {mean_life_h:.2f} h (the predictive's mean market), predictive sd "
        f"{math.sqrt(s2):.2f} of the log rate and {math.sqrt(so2):.2f} of the outage logit "
        f"(between markets and clouds, beyond the noise of each market's mean), with the regimes"
    )
    return SpotRisk(
        cloud=cloud,
        family=family,
        region=region,
        lifetime=Weibull(shape, mean_life_h / math.gamma(1.0 + 1.0 / shape)),
        co_loss=float(np.mean([r.co_loss for r in risks])),
        outage=Outage(
            prob=1.0 / (1.0 + math.exp(-mo)) if durations else 0.0,
            durations_h=durations,
            region_prob=float(np.mean([r.outage.region_prob for r in risks])),
        ),
        source=source,
        rate_sigma=min(rate_sigma, MAX_SIGMA),
        outage_sigma=min(outage_sigma, MAX_SIGMA),
        rate_sigma_long=min(rate_sigma_long, rate_sigma, MAX_SIGMA),
    )


@dataclass(frozen=True)
class MarketSpread:
    """How far a market of ``cloud`` that no trace watched may lie from the traced ones (the
    predictive above), for the rows applied to such markets (``SpotRisk.market_sigma``):

    - ``sibling``, ``sibling_outage``: a traced family in a zone or region its trace did not
      watch, around its own market: the spread between the markets of a cloud (``tau_m``) of
      the log rate and of the outage logit. The traced markets of a cloud are different
      families watched in one region at the same time, the only pairs the data has: a
      family's zones are taken to differ as much;
    - ``unseen``, ``unseen_outage``, ``median_rate``: a family no trace watched, around the
      predictive's median market (``exp(m)`` per node-hour): ``tau_m`` and the uncertainty of
      the cloud's mean, as ``predict`` gives them."""

    cloud: str
    sibling: float
    sibling_outage: float
    unseen: float
    unseen_outage: float
    median_rate: float

    def note(self) -> str:
        return (
            f"Markets ({self.cloud}): between traced markets of the cloud a log-rate sd of "
            f"{self.sibling:.2f} and an outage-logit sd of {self.sibling_outage:.2f}; an "
            f"untraced family's predictive median {self.median_rate:.3f}/node-h, sd "
            f"{self.unseen:.2f} and {self.unseen_outage:.2f} (spotpool.market_spread)."
        )


def market_spread(risks: Sequence[SpotRisk], cloud: str, blocks: Sequence[int]) -> MarketSpread:
    """``MarketSpread`` of ``cloud`` from the traced markets ``risks`` (one row per trace, its
    regimes measured on ``blocks`` 2-hour blocks: the noise of its mean)."""
    if len(blocks) != len(risks):
        raise ValueError(f"{len(blocks)} block counts for {len(risks)} markets")
    clouds = [r.cloud for r in risks]
    n = [max(1, b) for b in blocks]
    y = [math.log(r.rate_per_hour) for r in risks]
    v = [r.rate_sigma**2 / b for r, b in zip(risks, n, strict=True)]
    lo = [_logit(r.outage.prob) for r in risks]
    vo = [r.outage_sigma**2 / b for r, b in zip(risks, n, strict=True)]
    m, s2 = predict(y, v, clouds, cloud)
    _, so2 = predict(lo, vo, clouds, cloud)
    return MarketSpread(
        cloud=cloud,
        sibling=min(math.sqrt(components(y, v, clouds)[1]), MAX_SIGMA),
        sibling_outage=min(math.sqrt(components(lo, vo, clouds)[1]), MAX_SIGMA),
        unseen=min(math.sqrt(s2), MAX_SIGMA),
        unseen_outage=min(math.sqrt(so2), MAX_SIGMA),
        median_rate=math.exp(m),
    )
