"""A spot market the model never saw: the fitted markets pooled as draws of one population.

Each fitted ``SpotRisk`` is one market (a pool of one cloud, type and zone over one period). A
market not among them is taken as another draw from the same population (a random-effects
model, fitted by the method of moments), so its band holds both the spread between periods of
one market (each row's regimes) and the spread between markets:

- loss rate: the log of each market's rate (one over its mean life) is a draw of
  ``N(mu, tau^2)`` (each market one vote, however many node-hours its trace holds); the new
  market's rate is the population's mean ``exp(mu + tau^2 / 2)`` and its ``rate_sigma`` the
  square root of the markets' mean ``rate_sigma**2`` plus ``tau^2`` (the regimes' multipliers
  have mean 1, so the median draw stays near ``exp(mu)``);
- outage chance: the same on the logit scale (``outage_sigma``); its durations are every
  market's durations together; the Weibull shape, the co-loss and the region share are the
  markets' means.

With one market the pooled row is that market's; ``between`` says how wide the population is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from kplan.planner.spot import Outage, SpotRisk, Weibull

LOGIT_EPS = 1e-3  # outage chances are clipped to [eps, 1 - eps] on the logit scale
MAX_SIGMA = 5.0  # SpotRisk's bound


def _logit(p: float) -> float:
    q = min(max(p, LOGIT_EPS), 1.0 - LOGIT_EPS)
    return math.log(q / (1.0 - q))


def between(risks: Sequence[SpotRisk]) -> tuple[float, float]:
    """(sd of the log loss rate, sd of the outage logit) between the markets (n - 1)."""
    if len(risks) < 2:
        return 0.0, 0.0
    log_rate = np.log([r.rate_per_hour for r in risks])
    logit = np.array([_logit(r.outage.prob) for r in risks])
    return float(np.std(log_rate, ddof=1)), float(np.std(logit, ddof=1))


def pool_markets(
    risks: Sequence[SpotRisk], *, cloud: str, family: str, region: str = "*"
) -> SpotRisk:
    """The row of an unseen market of the population ``risks`` stand for (module docstring)."""
    if not risks:
        raise ValueError("pooling needs at least one fitted market")
    shape = float(np.mean([r.lifetime.shape for r in risks]))
    sd_rate, sd_out = between(risks)
    # the population's mean rate: exp(mu + tau^2 / 2) for log rates ~ N(mu, tau^2); the
    # regimes' multipliers have mean 1, so the draws' median rate stays near exp(mu)
    log_rate = float(np.mean(np.log([r.rate_per_hour for r in risks]))) + sd_rate**2 / 2.0
    mean_life_h = math.exp(-log_rate)
    scale = mean_life_h / math.gamma(1.0 + 1.0 / shape)
    rate_sigma = math.sqrt(np.mean([r.rate_sigma**2 for r in risks]) + sd_rate**2)
    outage_sigma = math.sqrt(np.mean([r.outage_sigma**2 for r in risks]) + sd_out**2)
    p = 1.0 / (1.0 + math.exp(-float(np.mean([_logit(r.outage.prob) for r in risks]))))
    durations = tuple(sorted(d for r in risks for d in r.outage.durations_h))
    names = "; ".join(r.source.split(":", 1)[0] for r in risks)
    source = (
        f"{len(risks)} markets pooled as one population ({names}): mean life "
        f"{mean_life_h:.2f} h (the population's mean rate), between markets sd {sd_rate:.2f} "
        f"of the log rate and {sd_out:.2f} of the outage logit, added to the regimes"
    )
    return SpotRisk(
        cloud=cloud,
        family=family,
        region=region,
        lifetime=Weibull(shape, scale),
        co_loss=float(np.mean([r.co_loss for r in risks])),
        outage=Outage(
            prob=p if durations else 0.0,
            durations_h=durations,
            region_prob=float(np.mean([r.outage.region_prob for r in risks])),
        ),
        source=source,
        rate_sigma=min(rate_sigma, MAX_SIGMA),
        outage_sigma=min(outage_sigma, MAX_SIGMA),
    )
