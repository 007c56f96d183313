"""Spot markets as the traces show them: who gets preempted, when, together, and for how long.

The contract shared by the planner's Monte-Carlo (``spotsim``), the trace replay and the
launcher's recovery rules (``kplan/launcher/lifecycle.py``), so that all three follow one story:

- **Lifetimes**: a spot node lives a Weibull time (the fitted marginal life of a node in the
  pool: shapes 0.94-1.09 on the AWS traces, 0.73-0.78 from the GCP counts; below 1 a fresh
  node is the most likely to go soon). A node of age ``a`` has the residual life of a Weibull
  conditioned on surviving ``a``.
- **Losses come together**: when a node of a cluster is preempted, each other node of the same
  cluster (one zone, one market) is lost in the same event with probability ``co_loss``. So
  that each node's loss rate stays ``1 / mean life`` in a cluster of ``n`` (co-losses
  included), each node slot's own clock is ``Weibull(shape, scale_h * (1 + co_loss * (n-1)))``,
  drawn when its node is launched after the slot's clock fired; a co-lost node's replacement
  keeps the slot's running clock (``spottrace.synthetic_trace`` is the reference).
- **Capacity outages**: after a loss, with probability ``outage.prob`` the zone has no capacity
  for a time ``D`` drawn from ``outage.durations_h`` (the whole wait from the loss, each longer
  than the restart: replacements launch at ``loss + D``, up a restart later); otherwise a
  replacement launches at the loss and is up after the restart. A loss during an outage finds
  it out until the same time.
  With probability ``outage.region_prob`` every other zone of the region is out at the same time
  (zone failover does not help).
- **Regimes**: the traces are calm for hours, then busy: each run draws its period's loss rate
  and outage chance around the fitted ones (``rate_sigma``, ``outage_sigma``: the spread
  between 2-hour blocks of the traces beyond what chance alone gives). A run longer than a
  block sees the mean of its blocks' rates: the part of the spread that lasts
  (``rate_sigma_long``, from how the spread falls as the blocks are merged into longer
  windows) stays, the rest shrinks as one over the run's length in blocks
  (``SpotRisk.rate_sigma_for``). A plan runs in a later period than the trace it was fitted
  on, and markets move between periods beyond their regimes (the halves of the shared traces
  differ up to 5x): ``period_sigma``, the spread of a market's rate from one half of its trace
  to the other beyond what the regimes draw, lasts a whole run.
- **Markets**: a row fitted on one market (a pool of one type in one zone) and applied to markets
  no trace watched (region ``*``: every zone and region; family ``*``: every family of the
  cloud) draws, for each run, its market around the fitted one: the log rate with
  ``market_sigma``, the outage logit with ``market_outage_sigma`` (the spread between the
  traced markets of a cloud, ``kplan/planner/spotpool.py``). The fitted market is the
  predictive's median, so the mean rate of a market drawn so is ``exp(market_sigma^2 / 2)``
  times the fitted one (``market_lifetime``); the spread lasts a whole run.
- **Recovery** (``RecoveryPolicy``): training stops on any loss and resumes from the last
  checkpoint once every node is back; a replacement goes to the same zone, else another zone of
  the region, else (``allow_on_demand``) on demand, which goes back to spot when capacity returns
  (one restart, no lost work: the workers checkpoint first); with no capacity anywhere the job
  waits up to ``capacity_wait_s`` and then fails; more than ``max_replacements`` lost nodes
  fail the job. With a deadline (``deadline_s``) the rule of ``kplan/planner/deadline.py``
  decides between spot, waiting and on demand, so that the job ends by it.

Fitted parameters live in ``kplan/catalogs/data/spot_model.json`` (``scripts/fit_spot_model.py``)
with their sources, read by ``kplan.catalogs.spot_model_file`` (the planner does no I/O);
``SpotModel.lookup`` takes the most specific row (family prefix, then region) and says which
one it used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from kplan.core.errors import DataFileError
from kplan.planner.deadline import DeadlineRule

Array = NDArray[np.float64]
SCHEMA = "1.0"
MODEL_FILE = "spot_model.json"
REGIME_BLOCK_H = 2.0  # the market period ``rate_sigma`` is measured over (hours)


@dataclass(frozen=True)
class Weibull:
    """Node lifetime: ``P(T > t) = exp(-(t / scale_h) ** shape)``, hours."""

    shape: float
    scale_h: float

    def __post_init__(self) -> None:
        if not (self.shape > 0 and self.scale_h > 0 and math.isfinite(self.scale_h)):
            raise ValueError(f"Weibull shape {self.shape} / scale {self.scale_h} must be > 0")

    @property
    def mean_h(self) -> float:
        return self.scale_h * math.gamma(1.0 + 1.0 / self.shape)

    @property
    def rate_per_hour(self) -> float:
        """Long-run preemptions per node-hour (renewal rate: one over the mean life)."""
        return 1.0 / self.mean_h

    def residual(self, rng: np.random.Generator, age_h: ArrayLike) -> Array:
        """Remaining life (hours) of nodes that have already lived ``age_h``."""
        age = np.maximum(np.asarray(age_h, dtype=float), 0.0)
        e = rng.exponential(1.0, size=age.shape)
        total = self.scale_h * ((age / self.scale_h) ** self.shape + e) ** (1.0 / self.shape)
        out: Array = np.maximum(total - age, 0.0)
        return out


@dataclass(frozen=True)
class Outage:
    """Capacity after a loss: how often none is left in the zone, and for how long."""

    prob: float  # probability that a loss leaves the zone without capacity (beyond a restart)
    durations_h: tuple[float, ...]  # empirical outage lengths, hours (sampled with replacement)
    region_prob: float  # probability that the region's other zones are out at the same time

    def __post_init__(self) -> None:
        for name in ("prob", "region_prob"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"outage {name} {v} must be in [0, 1]")
        if self.prob > 0 and not self.durations_h:
            raise ValueError("an outage probability needs at least one duration")
        if any(not (d >= 0 and math.isfinite(d)) for d in self.durations_h):
            raise ValueError("outage durations must be finite and >= 0")

    @property
    def mean_h(self) -> float:
        return float(np.mean(self.durations_h)) if self.durations_h else 0.0

    def quantile_h(self, q: float) -> float:
        return float(np.quantile(self.durations_h, q)) if self.durations_h else 0.0

    def sample(self, rng: np.random.Generator, size: int | tuple[int, ...]) -> Array:
        if not self.durations_h:
            return np.zeros(size)
        out: Array = rng.choice(np.asarray(self.durations_h, dtype=float), size=size)
        return out


@dataclass(frozen=True)
class SpotRisk:
    """The preemption model of one cloud, instance family and region (``*`` = any)."""

    cloud: str
    family: str  # instance-type prefix ("p3", "g4dn", "a2"); "*" the cloud's default
    region: str  # "*" any region
    lifetime: Weibull
    co_loss: float  # probability that each other node of the cluster goes in the same event
    outage: Outage
    source: str  # where the numbers come from (trace, span, how fitted), or why assumed
    # Regimes: the market is calmer or busier from one period to the next. Each run of a job
    # draws its period's loss rate (x exp(rate_sigma z - rate_sigma^2 / 2), mean 1) and its
    # outage chance (logit + outage_sigma z'); 0: the same market throughout.
    rate_sigma: float = 0.0
    outage_sigma: float = 0.0
    # The part of ``rate_sigma`` a longer run does not average away (the spread of the rate
    # over long windows: markets that stay busy for a day); None: all of it lasts.
    rate_sigma_long: float | None = None
    # The spread of the market's log rate between the period it was fitted on and another (a
    # plan runs in a later one), beyond what the regimes draw: lasts a whole run. 0 for a row
    # pooled over markets, whose spread between markets holds it.
    period_sigma: float = 0.0
    # The spread between the market the row was fitted on and one it is applied to (module
    # docstring, Markets): of the log rate and of the outage logit; 0: the row's own market.
    market_sigma: float = 0.0
    market_outage_sigma: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.co_loss <= 1.0:
            raise ValueError(f"co_loss {self.co_loss} must be in [0, 1]")
        for name in (
            "rate_sigma",
            "outage_sigma",
            "period_sigma",
            "market_sigma",
            "market_outage_sigma",
        ):
            v = getattr(self, name)
            if not (0.0 <= v <= 5.0):
                raise ValueError(f"{name} {v} must be in [0, 5]")
        long = self.rate_sigma_long
        if long is not None and not (0.0 <= long <= self.rate_sigma):
            raise ValueError(f"rate_sigma_long {long} must be in [0, rate_sigma]")

    def rate_sigma_for(self, run_h: ArrayLike) -> Array:
        """The spread of the loss rate over a run of ``run_h`` hours: the period's and the
        regimes' lasting part, plus the block-to-block part over the run's number of blocks
        (one at most: a run shorter than a block sees one block's spread)."""
        total = self.rate_sigma**2
        long = total if self.rate_sigma_long is None else self.rate_sigma_long**2
        h = np.asarray(run_h, dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(h > REGIME_BLOCK_H, REGIME_BLOCK_H / h, 1.0)
        lasting = self.period_sigma**2 + self.market_sigma**2 + long
        out: Array = np.sqrt(lasting + (total - long) * share)
        return out

    @property
    def market_lifetime(self) -> Weibull:
        """The lifetime whose rate is the mean over the markets the row is applied to: the
        fitted one's with the scale shortened by ``exp(market_sigma^2 / 2)`` (the fitted market
        is the median market). Each run then draws its market with a mean-1 multiplier."""
        if not self.market_sigma:
            return self.lifetime
        shrink = math.exp(-(self.market_sigma**2) / 2.0)
        return Weibull(self.lifetime.shape, self.lifetime.scale_h * shrink)

    @property
    def outage_sigma_total(self) -> float:
        """The spread of a run's outage logit: the regimes' and the market's."""
        return math.hypot(self.outage_sigma, self.market_outage_sigma)

    @property
    def rate_per_hour(self) -> float:
        """The mean loss rate of a run's market (``market_lifetime``)."""
        return self.market_lifetime.rate_per_hour

    def to_dict(self) -> dict[str, Any]:
        return {
            "cloud": self.cloud,
            "family": self.family,
            "region": self.region,
            "lifetime": {"shape": self.lifetime.shape, "scale_h": self.lifetime.scale_h},
            "co_loss": self.co_loss,
            "outage": {
                "prob": self.outage.prob,
                "durations_h": list(self.outage.durations_h),
                "region_prob": self.outage.region_prob,
            },
            "rate_sigma": self.rate_sigma,
            "outage_sigma": self.outage_sigma,
            **({} if self.rate_sigma_long is None else {"rate_sigma_long": self.rate_sigma_long}),
            **({"period_sigma": self.period_sigma} if self.period_sigma else {}),
            **({"market_sigma": self.market_sigma} if self.market_sigma else {}),
            **(
                {"market_outage_sigma": self.market_outage_sigma}
                if self.market_outage_sigma
                else {}
            ),
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SpotRisk:
        life, out = d["lifetime"], d["outage"]
        return cls(
            cloud=str(d["cloud"]),
            family=str(d["family"]),
            region=str(d.get("region", "*")),
            lifetime=Weibull(float(life["shape"]), float(life["scale_h"])),
            co_loss=float(d["co_loss"]),
            outage=Outage(
                prob=float(out["prob"]),
                durations_h=tuple(float(x) for x in out["durations_h"]),
                region_prob=float(out["region_prob"]),
            ),
            source=str(d["source"]),
            rate_sigma=float(d.get("rate_sigma", 0.0)),
            outage_sigma=float(d.get("outage_sigma", 0.0)),
            rate_sigma_long=None
            if d.get("rate_sigma_long") is None
            else float(d["rate_sigma_long"]),
            period_sigma=float(d.get("period_sigma", 0.0)),
            market_sigma=float(d.get("market_sigma", 0.0)),
            market_outage_sigma=float(d.get("market_outage_sigma", 0.0)),
        )


@dataclass(frozen=True)
class SpotModel:
    risks: tuple[SpotRisk, ...]
    fitted: str = ""  # date and command of the fit

    def lookup(self, cloud: str, instance_type: str, region: str) -> SpotRisk:
        """The most specific row: longest family prefix of the type, then exact region."""
        best: tuple[int, int, SpotRisk] | None = None
        for r in self.risks:
            if r.cloud != cloud:
                continue
            fam = 0 if r.family == "*" else len(r.family)
            if r.family != "*" and not instance_type.startswith(r.family):
                continue
            if r.region not in ("*", region):
                continue
            key = (fam, 1 if r.region == region else 0, r)
            if best is None or key[:2] > best[:2]:
                best = key
        if best is None:
            raise DataFileError(
                f"spot model has no row for {cloud} {instance_type} in {region}",
                hint=f"add a row with family '*' and region '*' for {cloud} to {MODEL_FILE}",
            )
        return best[2]

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "fitted": self.fitted, "risks": [r.to_dict() for r in self.risks]}

    @classmethod
    def from_dict(cls, d: dict[str, Any], label: str = MODEL_FILE) -> SpotModel:
        schema = str(d.get("schema", ""))
        if schema.split(".", maxsplit=1)[0] != SCHEMA.split(".", maxsplit=1)[0]:
            raise DataFileError(
                f"{label}: spot model schema {schema!r} is not {SCHEMA}",
                hint="refit with: python -m scripts.fit_spot_model",
            )
        try:
            risks = tuple(SpotRisk.from_dict(r) for r in d["risks"])
        except (KeyError, TypeError, ValueError) as exc:
            raise DataFileError(
                f"{label}: bad spot model row ({exc})",
                hint="refit with: python -m scripts.fit_spot_model",
            ) from None
        return cls(risks=risks, fitted=str(d.get("fitted", "")))


@dataclass(frozen=True)
class RecoveryPolicy:
    """The launcher's recovery rules, as the planner prices them and the launcher runs them."""

    restart_s: float = 300.0  # replacement booted, workers rejoined, checkpoint reloaded
    provisioning_s: float = 240.0  # the first boot
    checkpoint_interval_s: float = 1800.0  # of training progress
    checkpoint_s: float = 2.0  # time to write one
    max_replacements: int = 20  # lost nodes replaced before the job gives up
    capacity_wait_s: float = 900.0  # with no spot capacity in the region (and no fallback)
    allow_on_demand: bool = False  # replace on demand when the region has no spot capacity
    zone_failover: bool = True  # a replacement may go to another zone of the region
    # Deadline-safe spot (kplan/planner/deadline.py), seconds from the job's start; None: no
    # deadline. Needs ``allow_on_demand``: the rule falls back to on demand.
    deadline_s: float | None = None
    # The spot notice (kplan/planner/spotnotice.py): the workers stop with a checkpoint this
    # long before a preemption, so a loss keeps the progress made until then. None: no notice
    # is counted on (a loss falls back to the last periodic checkpoint). Not in the repr, which
    # keys a Monte-Carlo row's random stream (spotdraws.row_keys): a row draws the same
    # numbers with the notice and without it, so the two compare run by run.
    notice_stop_s: float | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        for name in ("restart_s", "provisioning_s", "checkpoint_s", "capacity_wait_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0")
        if self.notice_stop_s is not None and not self.notice_stop_s >= 0:
            raise ValueError("notice_stop_s must be >= 0")
        if not self.checkpoint_interval_s > 0 or self.max_replacements < 0:
            raise ValueError("checkpoint_interval_s must be > 0 and max_replacements >= 0")
        if self.deadline_s is not None and not (self.deadline_s > 0 and self.allow_on_demand):
            raise ValueError("a deadline must be > 0 and needs allow_on_demand")

    @property
    def notice_stop_or_inf(self) -> float:
        """``notice_stop_s``, inf where no notice is counted on (the models' arrays)."""
        return math.inf if self.notice_stop_s is None else self.notice_stop_s

    def deadline_rule(self) -> DeadlineRule | None:
        """The deadline rule these recovery rules run (None: no deadline)."""
        if self.deadline_s is None:
            return None
        return DeadlineRule(
            self.deadline_s, self.restart_s, self.checkpoint_interval_s, self.checkpoint_s
        )
