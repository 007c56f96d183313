"""Fit the spot preemption model (``kplan.planner.spot``) to the shared spot traces.

    .venv/bin/python -m scripts.fit_spot_model [--data DIR] [--out FILE] [--check]

(``--data``: the shared data folder, default $KPLAN_SHARED_DATA or ../shared/data.)

One ``SpotRisk`` per trace (AWS p3 and g4dn from the Bamboo autoscaling-group events, GCP a2
and n1 from the running-VM counts) and one ``*`` row per cloud pooled from its traces; writes
``kplan/catalogs/data/spot_model.json`` and prints a table. ``--check`` compares the fit with the
shipped file instead of writing it. The definitions (lifetime, loss event, wait, outage) are
those of ``kplan.planner.spottrace``; the estimators are below:

- lifetime: Weibull by maximum likelihood with right-censoring (nodes never removed) and
  left-truncation (nodes already ``age`` old when the fitted span begins), the scale profiled
  out (``scale**k = sum(t**k - a**k) / removals``) and the shape found by golden section;
- co_loss: the value at which the model's loss events of a cluster of ``n`` nodes,
  ``n * rate / (1 + (n - 1) * co_loss)``, match the events that clusters of ``n`` nodes drawn
  at random from the alive pool saw (an event of ``b`` removals out of ``N`` hits such a
  cluster with probability ``1 - C(N-b, n) / C(N, n)`` and takes ``n * b / N`` of its nodes on
  average), summed over n = 2..8 (kplan's multi-node plans);
- outage: over the loss events that do not continue an earlier outage, ``prob`` = the fraction
  whose wait for the pool's next ``add`` is longer than the restart (300 s), ``durations_h`` =
  those waits, whole (from the loss to the add: the replacement launches then and is up a
  restart later; with no outage it launches at the loss). A wait still running at the end of
  the trace is a lower bound: kept when already longer than the restart, else dropped;
- region_prob: 1.0 (assumed: no shared trace watches several zones at once; see ``REGION``);
- regimes: ``pooled_regimes`` (the spread between 2-hour blocks beyond chance) and
  ``long_rate_sigma`` (its lasting part); the spread between periods: ``period_sigma`` (the
  traces' halves), one value for every row;
- markets (``with_markets``): the rows applied to zones, regions or families no trace watched
  (region ``*``) carry the spread between the traced markets of their cloud
  (``spotpool.market_spread``); the cloud's ``*`` row is centred on the predictive's median.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from math import comb
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from kplan.catalogs.spot_traces import from_bamboo_csv, from_gcp_counts
from kplan.planner.spot import (
    MODEL_FILE,
    REGIME_BLOCK_H,
    Outage,
    RecoveryPolicy,
    SpotModel,
    SpotRisk,
    Weibull,
)
from kplan.planner.spotpool import MarketSpread, market_spread
from kplan.planner.spottrace import (
    LOSS_WINDOW_S,
    SpotTrace,
    loss_events,
    node_lives,
)

Array = NDArray[np.float64]
ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = Path(os.environ.get("KPLAN_SHARED_DATA") or ROOT.parent / "shared" / "data")
DEFAULT_OUT = ROOT / "kplan" / "catalogs" / "data" / MODEL_FILE
TRACES = Path("spot") / "bamboo-nsdi23-traces" / "traces"
CLUSTER_SIZES = tuple(range(2, 9))  # co_loss is fitted for clusters of 2 to 8 nodes
RESTART_S = RecoveryPolicy().restart_s
REGION = (
    "region_prob 1.0 assumed (failover never helps, the cautious choice): no shared trace "
    "watches several zones at once (the 2020 capacity probes in doc/data are one zone at a "
    "time, on different days), and a pool's wait for its next add already counts capacity "
    "anywhere the pool could get it"
)
# (cloud, family, region, file under TRACES, kind, what the region rests on)
SOURCES = (
    ("aws", "p3", "*", "p3-trace.csv", "bamboo", "region not stated in the shared data"),
    ("aws", "g4dn", "*", "g4dn-trace.csv", "bamboo", "region not stated in the shared data"),
    ("gcp", "a2", "us-east1", "gcloud/a100x1-east1b.txt", "gcp", "zone us-east1-b"),
    ("gcp", "n1", "us-east1", "gcloud/v100x1-east1c.txt", "gcp", "zone us-east1-c"),
)


# --- estimators ------------------------------------------------------------------------------


def _profile_loglik(k: float, t: Array, a: Array, removed: NDArray[np.bool_]) -> float:
    d = int(np.count_nonzero(removed))
    s = float(np.sum(t**k - a**k))
    return d * math.log(k) + (k - 1.0) * float(np.sum(np.log(t[removed]))) - d * math.log(s / d) - d


def weibull_mle(
    life_h: Array, removed: NDArray[np.bool_], entry_h: Array | None = None
) -> tuple[Weibull, float]:
    """Weibull (shape, scale) by censored, truncated maximum likelihood; and the shape's
    standard error (observed information of the profile likelihood)."""
    t = np.asarray(life_h, dtype=float)
    a = np.zeros_like(t) if entry_h is None else np.asarray(entry_h, dtype=float)
    removed = np.asarray(removed, dtype=bool)
    keep = t > a
    t, a, removed = t[keep], a[keep], removed[keep]
    if np.count_nonzero(removed) < 2:
        raise ValueError("a Weibull fit needs at least 2 removals")
    scale_t = float(np.median(t))  # work in units of the median life: well-conditioned powers
    t, a = t / scale_t, a / scale_t

    def f(x: float) -> float:
        return _profile_loglik(math.exp(x), t, a, removed)

    lo, hi = math.log(0.05), math.log(20.0)
    grid = np.linspace(lo, hi, 121)
    vals = [f(x) for x in grid]
    i = int(np.argmax(vals))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    g = (math.sqrt(5.0) - 1.0) / 2.0
    c, d = hi - g * (hi - lo), lo + g * (hi - lo)
    for _ in range(100):
        if f(c) > f(d):
            hi, d = d, c
            c = hi - g * (hi - lo)
        else:
            lo, c = c, d
            d = lo + g * (hi - lo)
    k = math.exp((lo + hi) / 2.0)
    dcount = int(np.count_nonzero(removed))
    scale = (float(np.sum(t**k - a**k)) / dcount) ** (1.0 / k) * scale_t
    h = 1e-3 * k
    curv = (
        _profile_loglik(k + h, t, a, removed)
        - 2 * _profile_loglik(k, t, a, removed)
        + _profile_loglik(k - h, t, a, removed)
    ) / h**2
    se = 1.0 / math.sqrt(-curv) if curv < 0 else math.inf
    return Weibull(k, scale), se


def co_loss_estimate(
    size: NDArray[np.int64], pool: NDArray[np.int64], cluster_sizes: Sequence[int] = CLUSTER_SIZES
) -> float:
    """The co_loss at which the model's loss events of clusters of ``cluster_sizes`` nodes
    match those that clusters drawn at random from the pool saw (see the module docstring)."""
    terms: list[tuple[int, float, float]] = []  # (nodes, expected lost, P(hit))
    for b, big_n in zip(size.tolist(), pool.tolist(), strict=True):
        if big_n < 2:
            continue
        for n in cluster_sizes:
            m = min(n, big_n)
            if m < 2:
                continue
            hit = 1.0 - comb(big_n - min(b, big_n), m) / comb(big_n, m)
            terms.append((m, m * b / big_n, hit))
    if not terms:
        return 0.0
    ns = np.array([x[0] for x in terms], dtype=float)
    lost = np.array([x[1] for x in terms])
    hits = float(np.sum([x[2] for x in terms]))

    def excess(c: float) -> float:
        return float(np.sum(lost / (1.0 + (ns - 1.0) * c))) - hits

    if excess(0.0) <= 0:
        return 0.0
    if excess(1.0) >= 0:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if excess(mid) > 0 else (lo, mid)
    return (lo + hi) / 2


@dataclass(frozen=True)
class OutageFit:
    prob: float
    durations_h: tuple[float, ...]
    events: int  # loss events that could start an outage (with a known wait)
    outages: int
    lower_bounds: int  # outages still on at the end of the trace (their length is a floor)


TAIL_POINTS = 40  # quantiles of the fitted log-normal kept as the outage durations


def lognormal_durations(
    durations_h: tuple[float, ...], restart_s: float, points: int = TAIL_POINTS
) -> tuple[float, ...]:
    """The recorded waits as ``points`` quantiles of a log-normal fitted (maximum likelihood in
    log space) to their part beyond the restart: sampling them reproduces the recorded median
    and spread, and gives waits longer than the few recorded (a trace of hours sees a handful
    of outages; the next one may be longer). Fewer than 3 waits: kept as recorded."""
    d = np.asarray(durations_h, dtype=float) * 3600.0 - restart_s
    if d.size < 3 or np.any(d <= 0):
        return durations_h
    logs = np.log(d)
    mu, sigma = float(logs.mean()), float(logs.std(ddof=1))
    if not sigma > 0:
        return durations_h
    from scipy.stats import norm

    q = (np.arange(points) + 0.5) / points
    excess = np.exp(mu + sigma * norm.ppf(q))
    return tuple(round(float(x), 4) for x in (restart_s + excess) / 3600.0)


def outage_estimate(
    wait_s: Array,
    censored: NDArray[np.bool_],
    continues: NDArray[np.bool_],
    restart_s: float = RESTART_S,
    pool_view: bool = True,
) -> OutageFit:
    """``prob`` and ``durations_h`` (whole waits, hours) of the capacity waits after losses.

    With ``pool_view`` (the default) a loss that comes while an earlier loss's outage is still
    on counts too, with its own (residual) wait: a cluster of a few nodes drawn from the pool
    waits through the pool's outages, not only through those its own losses start. Without
    it, only the losses that start an outage count (the pool as one cluster)."""
    wait = np.asarray(wait_s, dtype=float)
    own = np.ones(wait.shape, dtype=bool) if pool_view else ~np.asarray(continues, dtype=bool)
    cens = np.asarray(censored, dtype=bool)
    out = own & (wait > restart_s)
    known = own & (~cens | out)  # a censored short wait may still become an outage: unknown
    n, k = int(np.count_nonzero(known)), int(np.count_nonzero(out))
    durations = tuple(round(float(w) / 3600.0, 4) for w in np.sort(wait[out]))
    return OutageFit(
        prob=k / n if n else 0.0,
        durations_h=durations,
        events=n,
        outages=k,
        lower_bounds=int(np.count_nonzero(out & cens)),
    )


# --- from traces to a SpotRisk ---------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """What one trace (or one span of it) gives the estimators."""

    name: str
    life_h: Array
    removed: NDArray[np.bool_]
    entry_h: Array
    size: NDArray[np.int64]
    pool: NDArray[np.int64]
    wait_s: Array
    censored: NDArray[np.bool_]
    continues: NDArray[np.bool_]
    hours: float
    node_hours: float
    removals: int


def sample(
    trace: SpotTrace,
    since_s: float | None = None,
    until_s: float | None = None,
    restart_s: float = RESTART_S,
) -> Sample:
    """The lifetimes and loss events of ``trace`` in ``[since_s, until_s)``: a node added before
    ``since_s`` enters at its age then (left-truncation); the end is ``until_s`` (right-censoring,
    and no wait looks past it)."""
    since = 0.0 if since_s is None else max(float(since_s), 0.0)
    until = trace.end_s if until_s is None else min(float(until_s), trace.end_s)
    if not until > since:
        raise ValueError(f"empty span [{since}, {until})")
    cut = trace if until >= trace.end_s else trace.window(0.0, until)
    lives = node_lives(cut)
    stop = np.minimum(lives.stop_s, until)
    inside = stop > since
    entry = np.maximum(since - lives.start_s, 0.0)
    ev = loss_events(cut, LOSS_WINDOW_S, restart_s)
    mine = ev.start_s >= since
    span = cut.window(since, until) if since > 0 else cut
    return Sample(
        name=trace.name,
        life_h=(stop - lives.start_s)[inside] / 3600.0,
        removed=lives.removed[inside],
        entry_h=entry[inside] / 3600.0,
        size=ev.size[mine],
        pool=ev.pool[mine],
        wait_s=ev.wait_s[mine],
        censored=ev.censored[mine],
        continues=ev.continues[mine],
        hours=(until - since) / 3600.0,
        node_hours=span.node_hours(),
        removals=span.removals,
    )


BLOCK_H = REGIME_BLOCK_H  # the market periods whose spread the regimes measure (jobs of hours)


def blocks(
    trace: SpotTrace,
    since_s: float | None = None,
    until_s: float | None = None,
    block_h: float = BLOCK_H,
    restart_s: float = RESTART_S,
) -> list[Sample]:
    """The span cut into whole blocks of ``block_h`` (a last part shorter than half a block is
    left out): one Sample each."""
    since = 0.0 if since_s is None else max(float(since_s), 0.0)
    until = trace.end_s if until_s is None else min(float(until_s), trace.end_s)
    step = block_h * 3600.0
    out = []
    a = since
    while until - a >= 0.5 * step:
        b = min(a + step, until)
        out.append(sample(trace, a, b, restart_s))
        a = b
    return out


MIN_BLOCKS = 6  # fewer blocks than this in a row's own span: the cloud's pooled spread


Regimes = tuple[float, float, float]  # (rate_sigma, outage_sigma, rate_sigma_long)
MAX_MERGE = 8  # the lasting spread: windows of 1 to 8 blocks (2 to 16 hours)


def regime_sigmas(parts: Sequence[Sample], restart_s: float = RESTART_S) -> Regimes:
    """(rate_sigma, outage_sigma, rate_sigma_long) of one span cut into blocks; see
    ``pooled_regimes``."""
    return pooled_regimes([parts], restart_s)


def _own_mean_factor(x: Array) -> Array:
    """``1 - 2 w_j + sum(w^2)`` with ``w = x / sum(x)``: the share of a window's variance
    left in its deviation from its group's mean, which the window itself pulls toward it
    (about ``(k - 1) / k`` for ``k`` equal windows; without it two halves read half their
    spread)."""
    w = x / x.sum()
    out: Array = 1.0 - 2.0 * w + float(np.sum(w**2))
    return out


def _rate_var(groups: Sequence[tuple[Array, Array]]) -> tuple[float, int, int]:
    """The log-normal variance of the rate multiplier between windows beyond chance (method
    of moments; see ``pooled_regimes``) from each group's (removals, node-hours) per window,
    each window against its own group's rate (``_own_mean_factor`` takes out the pull of the
    window on that rate); with the number of windows and of groups used (groups of fewer
    than 2 windows, or with no removals, are left out)."""
    num = den = 0.0
    windows = used = 0
    for r, e in groups:
        if len(r) < 2 or not (e.sum() > 0 and r.sum() > 0):
            continue
        mu = r.sum() / e.sum() * e
        c = _own_mean_factor(e)
        num += float(np.sum((r - mu) ** 2 - c * mu))
        den += float(np.sum(c * mu**2))
        windows += len(r)
        used += 1
    return (math.log1p(max(num / den, 0.0)) if den > 0 else 0.0), windows, used


def _merged(parts: Sequence[Sample], m: int) -> tuple[Array, Array]:
    """Removals and node-hours of consecutive windows of ``m`` blocks (a last part of fewer
    than ``m`` blocks is left out)."""
    k = len(parts) // m
    r = np.array([float(p.removals) for p in parts[: k * m]]).reshape(k, m).sum(axis=1)
    e = np.array([float(p.node_hours) for p in parts[: k * m]]).reshape(k, m).sum(axis=1)
    return r, e


def long_rate_sigma(groups: Sequence[Sequence[Sample]], rate_sigma: float) -> float:
    """The part of the rate's spread that lasts however long a run is (``SpotRisk``'s
    ``rate_sigma_long``). The blocks are merged into windows of ``m = 1 .. MAX_MERGE`` blocks
    and the spread between windows measured at each width (``_rate_var``; a width with fewer
    than 3 windows is not measured); a block-to-block part averages out as ``1 / m`` and a
    lasting part does not, so ``var(m) = a + c / m`` is fitted by least squares weighted by
    each width's degrees of freedom (windows less groups), and the lasting part is ``sqrt(a)``,
    at most ``rate_sigma``. With fewer than two widths measured, or a spread that does not
    fall as the windows grow (``c <= 0``), all of ``rate_sigma`` lasts (the cautious
    reading: nothing is averaged away)."""
    xs, ys, ws = [], [], []
    for m in range(1, MAX_MERGE + 1):
        var, windows, used = _rate_var([_merged(g, m) for g in groups])
        if windows < 3:
            break
        xs.append(1.0 / m)
        ys.append(var)
        ws.append(max(windows - used, 1))
    if len(xs) < 2:
        return rate_sigma
    w = np.sqrt(np.asarray(ws, dtype=float))
    design = np.column_stack([np.ones(len(xs)), np.asarray(xs)]) * w[:, None]
    a, c = np.linalg.lstsq(design, np.asarray(ys) * w, rcond=None)[0]
    if not c > 0:
        return rate_sigma
    return round(min(math.sqrt(max(float(a), 0.0)), rate_sigma), 4)


def pooled_regimes(groups: Sequence[Sequence[Sample]], restart_s: float = RESTART_S) -> Regimes:
    """(rate_sigma, outage_sigma, rate_sigma_long): the spread of the loss rate and of the
    outage chance between blocks beyond chance (method of moments), each block against its
    own group's (trace's) rate, and the part of the rate's that lasts (``long_rate_sigma``).
    Rate: removals r_j in e_j node-hours against the common rate rho, Var(r_j) =
    rho e_j + (rho e_j)^2 s^2 for a rate multiplier of variance s^2, so
    s^2 = sum((r_j - rho e_j)^2 - rho e_j) / sum((rho e_j)^2) and the log-normal's
    sigma^2 = log(1 + s^2). Outage: k_j outages in n_j losses; the binomial's excess variance
    over sum(n_j^2 (p (1 - p))^2) is the variance of the logit. Fewer than 2 blocks: 0."""
    num_o = den_o = 0.0
    count = sum(len(parts) for parts in groups if len(parts) >= 2)
    if count < 2:
        return 0.0, 0.0, 0.0
    var_r, _, _ = _rate_var([_merged(parts, 1) for parts in groups])
    for parts in groups:
        if len(parts) < 2:
            continue
        fits = [outage_estimate(p.wait_s, p.censored, p.continues, restart_s) for p in parts]
        n = np.array([float(f.events) for f in fits])
        k = np.array([float(f.outages) for f in fits])
        if n.sum() > 0 and 0 < k.sum() < n.sum():
            q = k.sum() / n.sum()
            v = q * (1.0 - q)
            c = _own_mean_factor(n)
            num_o += float(np.sum((k - q * n) ** 2 - c * v * n))
            den_o += float(np.sum(c * (n * v) ** 2))
    rate = round(min(math.sqrt(var_r), 5.0), 4)
    outage = math.sqrt(max(num_o / den_o, 0.0)) if den_o > 0 else 0.0
    return rate, round(min(outage, 5.0), 4), long_rate_sigma(groups, rate)


def row_regimes(
    own: Sequence[Sample], cloud_groups: Sequence[Sequence[Sample]]
) -> tuple[Regimes, str]:
    """A row's regimes: its own span's spread when it has ``MIN_BLOCKS`` blocks, else the
    spread pooled over the cloud's traces (a span of a few blocks cannot show it)."""
    if len(own) >= MIN_BLOCKS:
        return regime_sigmas(own), f"its own {len(own)} blocks"
    n = sum(len(g) for g in cloud_groups)
    return pooled_regimes(cloud_groups), f"the cloud's {n} blocks pooled (own: {len(own)})"


def concat_samples(samples: Sequence[Sample], name: str) -> Sample:
    def c(attr: str) -> NDArray[np.generic]:
        return np.concatenate([getattr(s, attr) for s in samples])

    return Sample(
        name=name,
        life_h=c("life_h").astype(float),
        removed=c("removed").astype(bool),
        entry_h=c("entry_h").astype(float),
        size=c("size").astype(np.int64),
        pool=c("pool").astype(np.int64),
        wait_s=c("wait_s").astype(float),
        censored=c("censored").astype(bool),
        continues=c("continues").astype(bool),
        hours=sum(s.hours for s in samples),
        node_hours=sum(s.node_hours for s in samples),
        removals=sum(s.removals for s in samples),
    )


def risk_from_sample(
    s: Sample,
    *,
    cloud: str,
    family: str,
    region: str,
    note: str = "",
    restart_s: float = RESTART_S,
    cluster_sizes: Sequence[int] = CLUSTER_SIZES,
    pool_view: bool = True,
    smooth_tail: bool = True,
    regimes: Regimes = (0.0, 0.0, 0.0),
) -> SpotRisk:
    life, se = weibull_mle(s.life_h, s.removed, s.entry_h)
    co = co_loss_estimate(s.size, s.pool, cluster_sizes)
    out = outage_estimate(s.wait_s, s.censored, s.continues, restart_s, pool_view)
    durations = lognormal_durations(out.durations_h, restart_s) if smooth_tail else out.durations_h
    tail = (
        f" Durations: {TAIL_POINTS} quantiles of a log-normal fitted to the recorded waits "
        f"beyond the restart (longest recorded {max(out.durations_h, default=0.0):.2f} h)."
        if durations != out.durations_h
        else ""
    )
    lifetime = Weibull(round(life.shape, 4), round(life.scale_h, 4))
    naive = s.removals / s.node_hours if s.node_hours > 0 else math.nan
    source = (
        f"{s.name}: {s.hours:.1f} h, {s.node_hours:.1f} node-hours, {s.removals} removals "
        f"({naive:.3f}/node-h), {len(s.size)} loss events (removals within "
        f"{LOSS_WINDOW_S:g} s), {len(s.life_h)} lifetimes ({int(np.sum(s.removed))} ended). "
        f"Lifetime: Weibull censored MLE, shape {lifetime.shape:.3f} +- {se:.3f}. "
        f"co_loss: matches the loss events of random clusters of "
        f"{min(cluster_sizes)}-{max(cluster_sizes)} nodes of the pool. "
        f"Outage: {out.outages} of {out.events} losses (those during another loss's outage "
        f"too: {pool_view}) waited > {restart_s:g} s for the pool's next add "
        f"({out.lower_bounds} still waiting at the end: lower bounds); durations are "
        f"the whole waits.{tail} Regimes: the spread between {BLOCK_H:g} h blocks beyond "
        f"chance, rate sigma {regimes[0]:.2f} ({regimes[2]:.2f} of it lasting: the spread "
        f"between windows of up to {MAX_MERGE} blocks), outage logit sigma {regimes[1]:.2f}. "
        f"{REGION}." + (f" {note}" if note else "")
    )
    return SpotRisk(
        cloud=cloud,
        family=family,
        region=region,
        lifetime=lifetime,
        co_loss=round(co, 4),
        outage=Outage(prob=round(out.prob, 4), durations_h=durations, region_prob=1.0),
        source=source,
        rate_sigma=regimes[0],
        outage_sigma=regimes[1],
        rate_sigma_long=regimes[2],
    )


def fit_risk(
    trace: SpotTrace,
    *,
    cloud: str,
    family: str,
    region: str,
    since_s: float | None = None,
    until_s: float | None = None,
    restart_s: float = RESTART_S,
    cluster_sizes: Sequence[int] = CLUSTER_SIZES,
    pool_view: bool = True,
    smooth_tail: bool = True,
    regimes: bool = True,
    cloud_blocks: Sequence[Sequence[Sample]] = (),
) -> SpotRisk:
    """The ``SpotRisk`` of ``trace`` fitted on ``[since_s, until_s)`` (seconds; default all):
    fit on the first half of a trace and replay the second half. ``pool_view``: see
    ``outage_estimate`` (False reads the pool as one cluster, as ``synthetic_trace`` draws it).
    ``cloud_blocks``: the blocks (``blocks``) of the cloud's other traces, pooled with this
    span's for the regimes when the span has fewer than ``MIN_BLOCKS`` blocks."""
    s = sample(trace, since_s, until_s, restart_s)
    return risk_from_sample(
        s,
        cloud=cloud,
        family=family,
        region=region,
        restart_s=restart_s,
        cluster_sizes=cluster_sizes,
        pool_view=pool_view,
        smooth_tail=smooth_tail,
        regimes=_span_regimes(trace, since_s, until_s, restart_s, cloud_blocks)
        if regimes
        else (0.0, 0.0, 0.0),
    )


def _span_regimes(
    trace: SpotTrace,
    since_s: float | None,
    until_s: float | None,
    restart_s: float,
    cloud_blocks: Sequence[Sequence[Sample]],
) -> Regimes:
    own = blocks(trace, since_s, until_s, restart_s=restart_s)
    return row_regimes(own, [*cloud_blocks, own] if cloud_blocks else [own])[0]


def load_traces(data: Path) -> list[tuple[str, str, str, SpotTrace, str]]:
    out = []
    for cloud, family, region, rel, kind, where in SOURCES:
        path = data / TRACES / rel
        trace = from_bamboo_csv(path) if kind == "bamboo" else from_gcp_counts(path)
        note = f"Region: {where}."
        if kind == "gcp":
            alt = {
                o: weibull_mle(*_lives(from_gcp_counts(path, removal=o)))[0].shape
                for o in ("youngest", "oldest")
            }
            note += (
                " Node ids are synthetic (counts): a fall removes a random alive node (seed 0; "
                f"youngest-first would give shape {alt['youngest']:.2f}, oldest-first "
                f"{alt['oldest']:.2f}: the counts cannot tell). They miss churn between "
                "samples: the rate is a lower bound. Waits are read at the sample times "
                f"(median gap {_median_gap_s(path):.0f} s)."
            )
        out.append((cloud, family, region, trace, note))
    return out


def _median_gap_s(path: Path) -> float:
    stamps = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            day, clock, _ = (p.strip() for p in line.split(","))
            stamps.append(dt.datetime.fromisoformat(f"{day} {clock}").timestamp())
    gaps = np.diff(stamps)
    return float(np.median(gaps[gaps > 0]))


def _lives(trace: SpotTrace) -> tuple[Array, NDArray[np.bool_]]:
    lv = node_lives(trace)
    return lv.life_h, lv.removed


def halves(trace: SpotTrace, restart_s: float = RESTART_S) -> tuple[Array, Array]:
    """Removals and node-hours of the trace's two halves in time."""
    mid = trace.end_s / 2.0
    a, b = sample(trace, None, mid, restart_s), sample(trace, mid, None, restart_s)
    r = np.array([float(a.removals), float(b.removals)])
    return r, np.array([a.node_hours, b.node_hours])


def period_sigma(fits: Sequence[tuple[SpotTrace, SpotRisk]]) -> tuple[float, str]:
    """The spread of a market's log rate from one period to another beyond what its regimes
    draw (``SpotRisk.period_sigma``), with how it was found: the spread between the two halves
    of each trace beyond chance (``_rate_var``, pooled over the traces) less the mean of what
    each trace's row draws for a run of half its trace (``rate_sigma_for``). 0 where the
    regimes already draw as much."""
    var, _, used = _rate_var([halves(t) for t, _ in fits])
    drawn = [float(r.rate_sigma_for(t.end_s / 7200.0)) ** 2 for t, r in fits]
    excess = max(var - float(np.mean(drawn)), 0.0) if fits else 0.0
    names = ", ".join(t.name for t, _ in fits)
    why = (
        f"Period: the halves of {used} traces ({names}) differ by a log-sd of "
        f"{math.sqrt(var):.2f} beyond chance, the regimes draw {math.sqrt(np.mean(drawn)):.2f} "
        f"for a half: period_sigma {math.sqrt(excess):.2f}."
    )
    return round(math.sqrt(excess), 4), why


def fit_all(data: Path) -> SpotModel:
    """A row per trace and a ``*`` row per cloud (its traces' lifetimes, loss events and waits
    together), each with the spread between periods of every trace (``period_sigma``)."""
    by_cloud: dict[str, list[Sample]] = {}
    groups: dict[str, list[list[Sample]]] = {}
    loaded = load_traces(data)
    for cloud, _family, _region, trace, _note in loaded:
        groups.setdefault(cloud, []).append(blocks(trace))
    fits: list[tuple[SpotTrace, SpotRisk]] = []
    for cloud, family, region, trace, note in loaded:
        s = sample(trace)
        by_cloud.setdefault(cloud, []).append(s)
        regimes, basis = row_regimes(blocks(trace), groups[cloud])
        risk = risk_from_sample(
            s,
            cloud=cloud,
            family=family,
            region=region,
            note=f"{note} Regimes from {basis}.",
            regimes=regimes,
        )
        fits.append((trace, risk))
    risks = [r for _, r in fits]
    for cloud, samples in by_cloud.items():
        names = " + ".join(s.name for s in samples)
        risks.append(
            risk_from_sample(
                concat_samples(samples, f"pooled {names}"),
                cloud=cloud,
                family="*",
                region="*",
                note=(
                    f"Fallback for {cloud} families and regions without a trace: the "
                    f"{cloud} traces pooled (lifetimes, loss events and waits together)."
                ),
                regimes=pooled_regimes(groups[cloud]),
            )
        )
    period, why = period_sigma(fits)
    n_blocks = [len(blocks(t)) for t, _ in fits]
    traced = [r for _, r in fits]
    spreads = {c: market_spread(traced, c, n_blocks) for c in by_cloud}
    return SpotModel(
        risks=tuple(
            with_markets(replace(r, period_sigma=period, source=f"{r.source} {why}"), spreads)
            for r in risks
        ),
        fitted="",
    )


def with_markets(risk: SpotRisk, spreads: dict[str, MarketSpread]) -> SpotRisk:
    """The row as applied to the markets it stands for (``SpotRisk.market_sigma``): a row of
    one zone or region is its market's; a traced family's ``*`` row (the trace's region not
    known) draws the spread between markets of its cloud around its own; the cloud's ``*``
    row (an untraced family) is centred on the predictive's median market, with its spread
    (shape, co-loss and outages stay those of the cloud's traces together)."""
    if risk.region != "*":
        return risk
    sp = spreads[risk.cloud]
    if risk.family != "*":
        return replace(
            risk,
            market_sigma=round(sp.sibling, 4),
            market_outage_sigma=round(sp.sibling_outage, 4),
            source=f"{risk.source} {sp.note()} Applied around this market: the sibling sd.",
        )
    k = risk.lifetime.shape
    return replace(
        risk,
        lifetime=Weibull(k, 1.0 / sp.median_rate / math.gamma(1.0 + 1.0 / k)),
        market_sigma=round(sp.unseen, 4),
        market_outage_sigma=round(sp.unseen_outage, 4),
        source=(
            f"{risk.source} {sp.note()} The lifetime's rate is the predictive's median market "
            f"(the traces together: {risk.rate_per_hour:.3f}/node-h), with the unseen sd."
        ),
    )


def table(model: SpotModel, samples: dict[str, float]) -> str:
    head = (
        f"{'cloud':5} {'family':6} {'region':9} {'shape':>6} {'scale_h':>8} {'mean_h':>7} "
        f"{'rate/h':>7} {'naive/h':>8} {'co_loss':>7} {'out_p':>6} {'med_min':>8} {'p90_min':>8}"
        f" {'mkt_sd':>6} {'mkt_o':>5} {'mean/h':>6}"
    )
    lines = [head]
    for r in model.risks:
        lt, o = r.lifetime, r.outage
        naive = samples.get(f"{r.cloud}/{r.family}", math.nan)
        lines.append(
            f"{r.cloud:5} {r.family:6} {r.region:9} {lt.shape:6.3f} {lt.scale_h:8.3f} "
            f"{lt.mean_h:7.3f} {lt.rate_per_hour:7.3f} {naive:8.3f} {r.co_loss:7.3f} "
            f"{o.prob:6.3f} {o.quantile_h(0.5) * 60:8.1f} {o.quantile_h(0.9) * 60:8.1f}"
            f" {r.market_sigma:6.2f} {r.market_outage_sigma:5.2f} {r.rate_per_hour:6.3f}"
        )
    return "\n".join(lines)


def _naive_rates(root: Path) -> dict[str, float]:
    import csv

    path = root / "kplan" / "catalogs" / "data" / "spot_rates.csv"
    with path.open(encoding="utf-8") as f:
        return {f"{r['cloud']}/{r['family']}": float(r["per_hour"]) for r in csv.DictReader(f)}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the shared data folder")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the model file to write")
    ap.add_argument("--check", action="store_true", help="compare with --out, write nothing")
    args = ap.parse_args(argv)
    model = fit_all(args.data)
    print(table(model, _naive_rates(ROOT)))
    print(
        "(mean_h, rate/h: of the fitted Weibull; naive/h: kplan/catalogs/data/spot_rates.csv; "
        "med/p90_min: outage waits, minutes; mkt_sd, mkt_o: the markets' spread of the log "
        "rate and the outage logit; mean/h: the markets' mean rate)"
    )
    if args.check:
        shipped = json.loads(args.out.read_text(encoding="utf-8"))
        same = shipped["risks"] == model.to_dict()["risks"]
        print(f"{args.out}: {'up to date' if same else 'DIFFERS from this fit'}")
        return 0 if same else 1
    fitted = f"{dt.date.today().isoformat()}: python -m scripts.fit_spot_model"
    doc = SpotModel(risks=model.risks, fitted=fitted).to_dict()
    args.out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
