"""Fit the step-time model (``perfmodel``) to measured configurations.

Robust by construction: residuals are in log space (relative error), with a soft-L1 loss so a
noisy row cannot drag the fit; every parameter is bounded; a parameter that the measurements
cannot identify (inter-node terms from a one-node profile, the two-node factor without both two
and more nodes, ...) is held at a physical prior instead of wandering. Priors come from the
gradient size and the catalog's nominal bandwidths when they are known.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from kplan.core.errors import InputError
from kplan.planner import nanstat, perfmodel
from kplan.planner.perfmodel import PerfParams
from kplan.planner.profile import Measurement

# Priors where the data say nothing; a fit replaces them as soon as the profile measures the
# link. Efficiencies are fractions of the catalog's nominal link bandwidth.
# PRIOR_ETA_INTRA: fitted offline (bench/sync_model.py, part a) on nccl-tests all-reduce times
# measured by vTrain (shared/data/gpu/vtrain-micro24/trace/{a100,v100}/AR_GPU<k>_*_LUT, k=2..8,
# 1 MB..1 GB) as t = c0 + S * 2(k-1)/k / (eta * BW), BW = 2400 (A100) / 1200 (V100) Gbit/s:
# eta = 0.665 on both (A100 alone 0.73, V100 alone 0.57), c0 = 58 us per call.
# PRIOR_ETA_INTER: the RDMA (EFA / InfiniBand) prior: no inter-node NCCL-over-RDMA measurement
# in the shared data; NCCL drives such a NIC with the same ring protocol, so the intra-node ring
# efficiency is transferred (an assumption; the former 0.25 made a 400 Gbit/s EFA node look
# like 100 and is what bench/sync_model.py part b shows against DGX multi-node throughput).
# It does not hold over plain TCP: see PRIOR_ETA_INTER_BY_FABRIC. Latencies per ring hop:
# ~10 us in a node, ~50 us across nodes over TCP (assumed; the NCCL data shows no per-hop
# growth inside a node).
PRIOR_ETA_INTRA = 0.665
PRIOR_ETA_INTER = PRIOR_ETA_INTRA
PRIOR_GAMMA = 2.5  # overlap exponent of compute and the all-reduce (assumed typical DDP)
# Per NIC fabric (catalog.nic_fabric): "rdma" (NCCL over EFA/RoCE/IB, as NVLink's ring) keeps
# the transferred NCCL efficiency above and the one-node overlap. "tcp" (NCCL's socket transport
# on a plain NIC) is fitted on the multi-node rows of the Pollux T4 traces (g4dn.12xlarge, 50
# Gbit/s, no EFA; bench/multinode_transfer.py): from each model's one-node fit, one efficiency
# and one inter-node overlap exponent shared by five models (cifar10, imagenet, bert,
# deepspeech2, yolov3; 4840 rows, 2 to 16 nodes). Held out one model at a time, eta 0.075-0.092
# and gamma 1.38-2.33: about 4 Gbit/s of a 50 Gbit/s NIC, barely overlapped. The transferred
# 0.665 (and the one-node gamma) predicted these rows 0.59x of the measured time (36% MAPE).
# Per GPU link of the node (catalog.InstanceType.interconnect), where the profile measured no
# all-reduce between a node's GPUs (a one-GPU profile): NVLink keeps the nccl-tests efficiency
# above and PRIOR_GAMMA; PCIe is fitted on the one-node rows of the Pollux T4 traces
# (g4dn.12xlarge: 4 x T4 on PCIe gen3; bench/intranode_transfer.py) from each model's one-GPU
# fit: one efficiency and one overlap exponent shared by five models (108 rows, 2-4 GPUs). Held
# out one model at a time, eta 0.27-0.69 and gamma 1.0-1.2 (the sync barely overlaps compute);
# the NVLink prior predicted these rows 0.89x of the measured time, held out 0.99x.
PRIOR_ETA_INTRA_BY_LINK: dict[str, float] = {"nvlink": PRIOR_ETA_INTRA, "pcie": 0.418}
PRIOR_GAMMA_INTRA_BY_LINK: dict[str, float] = {"nvlink": PRIOR_GAMMA, "pcie": 1.0}
# One-sigma log error of a prediction whose intra-node all-reduce is this prior: the RMS of the
# held-out (leave-one-model-out) log errors of bench/intranode_transfer.py.
PRIOR_INTRA_LOG_SIGMA = 0.132
LINKS = tuple(PRIOR_ETA_INTRA_BY_LINK)
PRIOR_ETA_INTER_BY_FABRIC: dict[str, float] = {"rdma": PRIOR_ETA_INTER, "tcp": 0.082}
PRIOR_GAMMA_INTER_BY_FABRIC: dict[str, float | None] = {"rdma": None, "tcp": 1.64}
# One-sigma log error of a multi-node prediction whose inter-node terms are this prior: the RMS
# of the held-out (leave-one-model-out) log errors of bench/multinode_transfer.py.
PRIOR_INTER_LOG_SIGMA = 0.20
# One-sigma log error added for a node count below the largest measured that no row measured
# (e.g. 3 nodes from rows at 1, 2 and 4): bench/multinode_transfer.py, part "unmeasured node
# counts", fits each Pollux T4 model on its one-node rows and some multi-node counts and predicts
# the other counts below the largest; the excess of the held-out mean square log error over the
# fit's own sigma. With one multi-node count measured (or two nodes not among them, so the
# two-node term is not identified: 2 nodes came out 0.63-0.88x from 3 or 4) 0.118 over 18,260
# rows; with two or more including 2, 0.078 over 16,100 rows.
PRIOR_NODES_LOG_SIGMA = 0.118
PRIOR_NODES_LOG_SIGMA_WITH_TWO = 0.078
FABRICS = tuple(PRIOR_ETA_INTER_BY_FABRIC)
PRIOR_NCCL_CALL = 58e-6  # c0 of the fit above: one NCCL all-reduce call inside a node
PRIOR_LAT_INTRA = 10e-6
PRIOR_LAT_INTER = 50e-6
PRIOR_ALPHA = 1e-3
MIN_LOG_SIGMA = 0.05  # never claim better than 5% accuracy
# The step time's sigma grows by this per doubling of nodes past the largest the profile measured.
EXTRAPOLATION_LOG_SIGMA_PER_DOUBLING = 0.05
# ... and by this per doubling of workers past the most measured (`kplan model predict`): an
# assumption, as the local plan's (kplan/app/local_plan.py: workers contend for what the fit
# never saw them share).
WORKERS_EXTRAPOLATION_LOG_SIGMA_PER_DOUBLING = 0.15

_NAMES = perfmodel.FITTED
_LOWER = np.array([0.0, 1e-12, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
_UPPER = np.array([1e4, 1e3, 10.0, 1e3, 1e4, 1.0, 1e3, 1e4, 1.0, 3.0])


@dataclass(frozen=True)
class FitInputs:
    """Measurements as arrays, plus what is known of the hardware."""

    nodes: NDArray[np.float64]
    workers: NDArray[np.float64]
    local_batch: NDArray[np.float64]
    step_time: NDArray[np.float64]
    sync_time: NDArray[np.float64]  # NaN where not measured
    accum_steps: NDArray[np.float64]

    @staticmethod
    def from_measurements(rows: Sequence[Measurement]) -> FitInputs:
        if not rows:
            raise InputError("no measurements to fit", hint="give at least one measured row")
        return FitInputs(
            nodes=np.array([m.nodes for m in rows], dtype=float),
            workers=np.array([m.workers for m in rows], dtype=float),
            local_batch=np.array([m.local_batch for m in rows], dtype=float),
            step_time=np.array([m.step_time for m in rows], dtype=float),
            sync_time=np.array(
                [np.nan if m.sync_time is None else m.sync_time for m in rows], dtype=float
            ),
            accum_steps=np.array([m.accum_steps for m in rows], dtype=float),
        )


def _priors(
    gradient_bytes: float | None,
    intra_gbps: float | None,
    inter_gbps: float | None,
    inter_eta: float = PRIOR_ETA_INTER,
    intra_eta: float = PRIOR_ETA_INTRA,
    gamma: float = PRIOR_GAMMA,
) -> NDArray[np.float64]:
    def beta(gbps: float | None, eta: float) -> float:
        if gradient_bytes and gbps:
            return gradient_bytes / (eta * gbps * 1e9 / 8)
        return 0.0

    return np.array(
        [
            0.0,
            0.0,
            gamma,
            PRIOR_ALPHA,
            beta(intra_gbps, intra_eta),
            PRIOR_LAT_INTRA,
            PRIOR_ALPHA,
            beta(inter_gbps, inter_eta),
            PRIOR_LAT_INTER,
            0.0,
        ]
    )


def _free_mask(d: FitInputs) -> NDArray[np.bool_]:
    """Which parameters the measurements can identify."""
    multi = d.workers > 1
    intra_rows = multi & (d.nodes == 1)
    inter_rows = multi & (d.nodes > 1)
    batches = np.unique(d.local_batch)
    free = np.zeros(len(_NAMES), dtype=bool)
    free[1] = True  # compute_b
    free[0] = len(batches) >= 2
    # gamma needs sync-bearing rows at several batch sizes (overlap changes with compute).
    free[2] = len(np.unique(d.local_batch[multi])) >= 2
    if intra_rows.any():
        free[4] = True
        ks = np.unique(d.workers[intra_rows])
        free[3] = free[5] = len(ks) >= 3  # alpha, beta, lat need three worker counts
    if inter_rows.any():
        free[7] = True
        combos = {
            (int(n), int(k))
            for n, k in zip(d.nodes[inter_rows], d.workers[inter_rows], strict=True)
        }
        free[6] = len(combos) >= 2
        free[8] = len({k for _, k in combos}) >= 2
        ns = set(d.nodes[inter_rows].astype(int))
        free[9] = 2 in ns and any(n > 2 for n in ns)
    return free


def _initial(d: FitInputs, prior: NDArray[np.float64]) -> NDArray[np.float64]:
    x = prior.copy()
    compute = d.step_time / d.accum_steps
    has_sync = ~np.isnan(d.sync_time)
    compute = np.where(
        has_sync, (d.step_time - np.nan_to_num(d.sync_time)) / d.accum_steps, compute
    )
    single = d.workers == 1
    use = single if single.sum() >= 2 else np.ones_like(single)
    b = d.local_batch[use]
    c = compute[use]
    if len(np.unique(b)) >= 2:
        slope, intercept = np.polyfit(b, c, 1)
        slope = max(float(slope), float(np.min(c / b)) * 0.05, 1e-9)
        intercept = max(float(intercept), 0.0)
    else:
        slope, intercept = float(np.mean(c / b)), 0.0
    x[0], x[1] = intercept, slope
    multi = d.workers > 1
    extra = np.maximum(d.step_time / d.accum_steps - (intercept + slope * d.local_batch), 1e-6)
    for rows, beta_i in ((multi & (d.nodes == 1), 4), (multi & (d.nodes > 1), 7)):
        if rows.any() and x[beta_i] == 0.0:
            x[beta_i] = float(nanstat.median(extra[rows])) / 1.5
    return np.clip(x, _LOWER, _UPPER)


def fit_perf_params(
    rows: Sequence[Measurement] | FitInputs,
    *,
    gradient_bytes: float | None = None,
    intra_gbps: float | None = None,
    inter_gbps: float | None = None,
    gpu: str | None = None,
    gpus_per_node: int | None = None,
    bucket_bytes: float | None = None,
    inter_fabric: str = "tcp",
    intra_link: str | None = None,
) -> PerfParams:
    """Least-squares fit of the step-time model in log space (robust soft-L1 loss).

    ``bucket_bytes``: DDP's bucket size, for the last-bucket floor (``perfmodel``); needs
    ``gradient_bytes``. None fits without the floor. ``inter_fabric``: the NIC's fabric
    (``catalog.nic_fabric``: "tcp" or "rdma"), which picks the inter-node priors where the rows
    do not measure them; "tcp" (a plain NIC) unless the instance is known to use EFA or RDMA.
    ``intra_link``: the GPU link in a node ("nvlink", "pcie"; ``InstanceType.interconnect``),
    which picks the intra-node priors (efficiency and overlap) where no row measures them;
    None or "none": the NVLink-fitted ones.
    """
    d = rows if isinstance(rows, FitInputs) else FitInputs.from_measurements(rows)
    floor_bytes, floor_bucket = (gradient_bytes, bucket_bytes) if gradient_bytes else (None, None)
    eta_inter, gamma_inter = prior_inter(inter_fabric)
    eta_intra, gamma_intra = prior_intra(intra_link)
    prior = _priors(gradient_bytes, intra_gbps, inter_gbps, eta_inter, eta_intra, gamma_intra)
    log_step = np.log(d.step_time)
    fitted = _least_squares(d, prior, floor_bytes=floor_bytes, floor_bucket=floor_bucket)
    pred = perfmodel.step_time(fitted, d.nodes, d.workers, d.local_batch, d.accum_steps)
    resid = np.log(pred) - log_step
    dof = max(len(resid) - int(_free_mask(d).sum()), 1)
    sigma = max(math.sqrt(float(np.sum(resid**2)) / dof), MIN_LOG_SIGMA)
    return _params(
        np.array([getattr(fitted, n) for n in _NAMES]),
        log_sigma=sigma,
        gradient_bytes=gradient_bytes,
        intra_gbps=intra_gbps,
        inter_gbps=inter_gbps,
        gpu=gpu,
        gpus_per_node=gpus_per_node,
        bucket_bytes=floor_bucket,
        max_nodes_measured=int(d.nodes.max()),
        nodes_measured=tuple(int(n) for n in np.unique(d.nodes)),
        max_workers_measured=int(d.workers.max()),
        inter_measured=bool((d.nodes > 1).any()),
        # measured rows across nodes fit the overlap there (with gamma, on every row); a
        # one-node profile cannot, and takes the fabric's prior
        inter_gamma=None if (d.nodes > 1).any() else gamma_inter,
    )


def _least_squares(
    d: FitInputs,
    prior: NDArray[np.float64],
    *,
    floor_bytes: float | None,
    floor_bucket: float | None,
) -> PerfParams:
    """The parameters that fit the rows' step times (and compute times, where the sync time
    was measured) from the initial guess, the others held at ``prior``'s values."""
    from scipy.optimize import least_squares  # scipy only on the fitting path

    free = _free_mask(d)
    x0 = _initial(d, prior)
    has_sync = ~np.isnan(d.sync_time)
    compute_obs = np.maximum((d.step_time - np.nan_to_num(d.sync_time)) / d.accum_steps, 1e-9)
    log_step = np.log(d.step_time)
    # Weak pull of each free parameter toward its initial guess keeps flat directions finite.
    ridge = 1e-3
    typical = np.full(len(_NAMES), float(nanstat.median(d.step_time)))
    typical[2] = typical[9] = 1.0  # gamma and two_node are dimensionless
    typical[5] = typical[8] = 1e-4  # per-hop latencies
    scale = np.maximum(np.abs(x0), typical)[free]

    def unpack(z: NDArray[np.float64]) -> PerfParams:
        x = x0.copy()
        x[free] = z
        return _params(x, log_sigma=0.0, gradient_bytes=floor_bytes, bucket_bytes=floor_bucket)

    def residuals(z: NDArray[np.float64]) -> NDArray[np.float64]:
        p = unpack(z)
        pred = perfmodel.step_time(p, d.nodes, d.workers, d.local_batch, d.accum_steps)
        r_step = np.log(np.maximum(pred, 1e-12)) - log_step
        tc = perfmodel.compute_time(p, d.local_batch[has_sync])
        r_comp = 0.5 * (np.log(np.maximum(tc, 1e-12)) - np.log(compute_obs[has_sync]))
        return np.concatenate([r_step, r_comp, ridge * (z - x0[free]) / scale])

    result = least_squares(
        residuals,
        x0[free],
        bounds=(_LOWER[free], _UPPER[free]),
        loss="soft_l1",
        f_scale=0.1,
        max_nfev=2000,
    )
    return unpack(result.x)


def prior_inter(fabric: str) -> tuple[float, float | None]:
    """(efficiency of the nominal NIC bandwidth, overlap exponent or None) of a fabric."""
    if fabric not in PRIOR_ETA_INTER_BY_FABRIC:
        raise InputError(f"unknown NIC fabric {fabric!r}", hint=f"use one of {', '.join(FABRICS)}")
    return PRIOR_ETA_INTER_BY_FABRIC[fabric], PRIOR_GAMMA_INTER_BY_FABRIC[fabric]


def prior_intra(link: str | None) -> tuple[float, float]:
    """(efficiency of the nominal GPU link, one-node overlap exponent) of a node's GPU link
    (None or "none": the NVLink-fitted priors, as before links had their own)."""
    link = "nvlink" if link in (None, "none") else link
    if link not in PRIOR_ETA_INTRA_BY_LINK:
        raise InputError(f"unknown GPU link {link!r}", hint=f"use one of {', '.join(LINKS)}")
    return PRIOR_ETA_INTRA_BY_LINK[link], PRIOR_GAMMA_INTRA_BY_LINK[link]


def unmeasured_nodes_sigma(nodes_measured: Sequence[int]) -> float:
    """The sigma added at a node count between measured ones (``PRIOR_NODES_LOG_SIGMA*``)."""
    multi = [n for n in nodes_measured if n > 1]
    return (
        PRIOR_NODES_LOG_SIGMA_WITH_TWO if len(multi) >= 2 and 2 in multi else PRIOR_NODES_LOG_SIGMA
    )


def prior_log_sigma(
    p: PerfParams, nodes: ArrayLike, workers: ArrayLike | None = None
) -> NDArray[np.float64]:
    """The step time's one-sigma log error that a plan states: the fit's, widened by
    ``EXTRAPOLATION_LOG_SIGMA_PER_DOUBLING`` per doubling of nodes past the largest measured,
    by ``PRIOR_INTRA_LOG_SIGMA`` where a node's GPUs share an all-reduce no row measured (a
    one-GPU profile; ``workers`` given), by ``PRIOR_INTER_LOG_SIGMA`` across nodes where no
    multi-node row was measured and by ``PRIOR_NODES_LOG_SIGMA`` at a node count below the
    largest measured that no row measured (each the held-out error of its benchmark). One rule
    for ``kplan estimate`` (planner/pricing.py) and the online re-planner (planner/online.py)."""
    n = np.asarray(nodes, dtype=float)
    doublings = np.log2(np.maximum(n / max(p.max_nodes_measured, 1), 1.0))
    out: NDArray[np.float64] = np.hypot(
        p.log_sigma, EXTRAPOLATION_LOG_SIGMA_PER_DOUBLING * doublings
    )
    if p.inter_measured and p.nodes_measured is not None:
        measured = np.isin(n, np.asarray(p.nodes_measured, dtype=float))
        between = (n > 1) & (n < p.max_nodes_measured) & ~measured
        out = np.where(between, np.hypot(out, unmeasured_nodes_sigma(p.nodes_measured)), out)
    if workers is not None and p.max_workers_measured <= 1:
        w = np.asarray(workers, dtype=float)
        out = np.where(w > n, np.hypot(out, PRIOR_INTRA_LOG_SIGMA), out)
    if not p.inter_measured:
        out = np.where(n > 1, np.hypot(out, PRIOR_INTER_LOG_SIGMA), out)
    return out


def _params(x: NDArray[np.float64], **meta: Any) -> PerfParams:
    """PerfParams from the fitted vector (``_NAMES`` order) plus provenance fields."""
    v = [float(e) for e in x]
    return PerfParams(
        compute_a=v[0],
        compute_b=v[1],
        gamma=v[2],
        intra_alpha=v[3],
        intra_beta=v[4],
        intra_lat=v[5],
        inter_alpha=v[6],
        inter_beta=v[7],
        inter_lat=v[8],
        two_node=v[9],
        **meta,
    )


def unknown_link(p: PerfParams, nodes: int, workers: int) -> str | None:
    """Why ``p`` cannot predict ``nodes`` x ``workers`` at all (None: it can): an all-reduce
    over a link no row measured and no bandwidth was given for, whose prior cost is therefore
    0 (``_priors``: no gradient bytes or no link speed). Predicting it would price the link as
    free: a 2-node, 8-worker row came out 3x faster than the measured 1 node of 2."""
    if nodes > 1 and not p.inter_measured and p.inter_beta <= 0.0:
        return (
            f"{nodes} nodes: the model measured {p.max_nodes_measured} node(s) and knows no "
            "network between nodes (no row across nodes, no --inter-gbps and --gradient-bytes)"
        )
    per_node = workers / nodes
    if per_node > 1 and p.max_workers_measured <= 1 and p.intra_beta <= 0.0:
        return (
            f"{per_node:g} workers per node: the model measured one worker and knows no link "
            "between a node's GPUs (no row with several, no --intra-gbps and --gradient-bytes)"
        )
    return None


def extrapolated_log_sigma(p: PerfParams, nodes: int, workers: int) -> float:
    """``prior_log_sigma`` of one row, widened by ``WORKERS_EXTRAPOLATION_LOG_SIGMA_PER_DOUBLING``
    per doubling of workers past the most measured."""
    doublings = math.log2(max(workers / max(p.max_workers_measured, 1), 1.0))
    return math.hypot(
        float(prior_log_sigma(p, [nodes], [workers])[0]),
        WORKERS_EXTRAPOLATION_LOG_SIGMA_PER_DOUBLING * doublings,
    )


def extrapolation(p: PerfParams, nodes: int, workers: int) -> str:
    """What of ``nodes`` x ``workers`` lies outside what ``p`` was fitted on ("" when nothing):
    more nodes or workers than measured, or inter-node terms that are a prior. Its sigma is
    widened by ``prior_log_sigma``."""
    parts = []
    if nodes > p.max_nodes_measured:
        parts.append(f"{nodes} nodes > {p.max_nodes_measured} measured")
    if workers > p.max_workers_measured:
        parts.append(f"{workers} workers > {p.max_workers_measured} measured")
    if nodes > 1 and not p.inter_measured:
        parts.append("inter-node all-reduce from a prior")
    return "; ".join(parts)


def two_node_factor(p: PerfParams) -> tuple[float, bool]:
    """(the multiplier of the inter-node sync time at exactly two nodes, 1 + ``two_node``,
    whether it was fitted): fitted only with rows at two nodes and at more (``_free_mask``);
    otherwise held at 1 (no two-node effect), a prior, never a factor of 0."""
    # a model without nodes_measured (before 1.x) measured every count up to its largest
    counts = p.nodes_measured or tuple(range(1, p.max_nodes_measured + 1))
    fitted = p.inter_measured and 2 in counts and max(counts) > 2
    return 1.0 + p.two_node, fitted
