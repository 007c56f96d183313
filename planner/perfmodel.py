"""The step-time model: compute, all-reduce, overlap and accumulation (DESIGN.md, "The models").

Notation: ``n`` nodes, ``k`` workers in all, per-worker batch ``b``, accumulation ``s``.

    T_c(b)     = a_c + b_c * b                                  compute of one micro-batch
    ring(k)    = 2 (k - 1) / k                                  bytes each worker moves, / P
    T_sync     = 0                                              k == 1
               = alpha_i + beta_i * ring(k) + lat_i * 2(k-1)    one node (PCIe / NVLink)
               = (alpha_n + beta_n * ring(k) + lat_n * 2(k-1))
                 * (1 + two_node * [n == 2])                    across nodes (the NIC)
    T          = (T_c^g + T_sync^g)^(1/g),  g in [1, 10]        compute/sync overlap
    T_step     = (s - 1) * T_c + T                              with accumulation

``beta = P / (eta * BW)``: gradient bytes over the nominal link bandwidth times a fitted
efficiency ``eta``. Keeping ``P`` and ``BW`` separate lets a model fitted on one instance type
predict another (``transfer``) and extrapolate to node counts never profiled. ``two_node``: NCCL
picks its algorithm and channels by node count, and on two nodes both ring directions share one
NIC pair; a two-node all-reduce often runs at its own efficiency. It is fitted when the
measurements have two nodes and more than two, and held at 0 otherwise.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from kplan.errors import DataFileError
from kplan.planner.profile import check_schema

MODEL_SCHEMA = "kplan.perfmodel/1.0"
_KIND = "kplan.perfmodel"

Array = NDArray[np.float64]


# The parameters a fit estimates, in the order of its parameter vector.
FITTED = (
    "compute_a",
    "compute_b",
    "gamma",
    "intra_alpha",
    "intra_beta",
    "intra_lat",
    "inter_alpha",
    "inter_beta",
    "inter_lat",
    "two_node",
)


@dataclass(frozen=True)
class PerfParams:
    """Fitted step-time parameters (seconds unless noted)."""

    compute_a: float  # fixed compute per micro-batch (kernel launches, optimizer share)
    compute_b: float  # compute per sample
    gamma: float  # overlap exponent: 1 = no overlap, 10 = near-perfect overlap
    intra_alpha: float
    intra_beta: float  # P / (eta_intra * BW_intra): seconds per unit of ring(k)
    intra_lat: float  # seconds per ring hop inside a node
    inter_alpha: float
    inter_beta: float  # P / (eta_inter * BW_nic)
    inter_lat: float  # seconds per ring hop across nodes
    two_node: float  # extra fraction of inter-node sync time at exactly two nodes
    log_sigma: float  # std of log(measured / predicted) on the fitted rows
    gradient_bytes: float | None = None
    intra_gbps: float | None = None  # nominal links the betas were measured on
    inter_gbps: float | None = None
    gpu: str | None = None  # device the compute terms were measured on
    gpus_per_node: int | None = None
    max_nodes_measured: int = 1
    max_workers_measured: int = 1
    inter_measured: bool = False  # False: inter-node terms are priors, not fitted

    def __post_init__(self) -> None:
        for name in (*(n for n in FITTED if n != "gamma"), "log_sigma"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}={value!r} must be a finite number >= 0")
        if not 1.0 <= self.gamma <= 10.0:
            raise ValueError(f"gamma={self.gamma!r} must be in [1, 10]")
        if self.compute_a + self.compute_b <= 0:
            raise ValueError("compute_a + compute_b must be > 0")

    def efficiency(self) -> dict[str, float | None]:
        """Achieved fraction of nominal link bandwidth (eta), where bytes and links are known."""

        def eta(beta: float, gbps: float | None) -> float | None:
            if not self.gradient_bytes or not gbps or beta <= 0:
                return None
            return min(1.0, self.gradient_bytes / (gbps * 1e9 / 8) / beta)

        return {
            "intra": eta(self.intra_beta, self.intra_gbps),
            "inter": eta(self.inter_beta, self.inter_gbps),
        }


def ring_factor(workers: ArrayLike) -> Array:
    k = np.asarray(workers, dtype=float)
    out: Array = 2.0 * (k - 1.0) / k
    return out


def compute_time(p: PerfParams, local_batch: ArrayLike) -> Array:
    """T_c(b) = a_c + b_c * b: compute of one micro-batch of ``b`` samples on one worker."""
    return p.compute_a + p.compute_b * np.asarray(local_batch, dtype=float)


def sync_time(p: PerfParams, nodes: ArrayLike, workers: ArrayLike) -> Array:
    """All-reduce time of the full gradient (before overlap)."""
    n = np.asarray(nodes, dtype=float)
    k = np.asarray(workers, dtype=float)
    ring = ring_factor(k)
    hops = 2.0 * (k - 1.0)
    intra = p.intra_alpha + p.intra_beta * ring + p.intra_lat * hops
    inter = (p.inter_alpha + p.inter_beta * ring + p.inter_lat * hops) * np.where(
        n == 2, 1.0 + p.two_node, 1.0
    )
    return np.where(k <= 1, 0.0, np.where(n <= 1, intra, inter))


def overlap(compute: ArrayLike, sync: ArrayLike, gamma: float) -> Array:
    """(T_c^g + T_sync^g)^(1/g), computed stably."""
    c = np.asarray(compute, dtype=float)
    s = np.asarray(sync, dtype=float)
    hi = np.maximum(c, s)
    hi_safe = np.where(hi > 0, hi, 1.0)
    total = (np.power(c / hi_safe, gamma) + np.power(s / hi_safe, gamma)) ** (1.0 / gamma)
    return np.where(hi > 0, hi * total, 0.0)


def step_time(
    p: PerfParams,
    nodes: ArrayLike,
    workers: ArrayLike,
    local_batch: ArrayLike,
    accum_steps: ArrayLike = 1,
) -> Array:
    """Seconds per optimizer step: (s - 1) * T_c + (T_c^g + T_sync^g)^(1/g)."""
    tc = compute_time(p, local_batch)
    s = np.asarray(accum_steps, dtype=float)
    return (s - 1.0) * tc + overlap(tc, sync_time(p, nodes, workers), p.gamma)


def exposed_sync_time(
    p: PerfParams, nodes: ArrayLike, workers: ArrayLike, local_batch: ArrayLike
) -> Array:
    """The part of the sync that compute does not hide (what profilers measure as sync_time)."""
    tc = compute_time(p, local_batch)
    return overlap(tc, sync_time(p, nodes, workers), p.gamma) - tc


def transfer(
    p: PerfParams,
    *,
    compute_factor: float = 1.0,
    intra_gbps: float | None = None,
    inter_gbps: float | None = None,
    extra_log_sigma: float = 0.0,
    fixed_factor: float = 1.0,
) -> PerfParams:
    """Predict the parameters on another device or instance type.

    The per-sample compute term ``compute_b`` (device work) scales by ``compute_factor`` (from
    the device-speed model). The fixed per-step term ``compute_a`` (host work, kernel launches,
    data loading: the intercept of step time against batch) does not follow the GPU: a faster
    GPU does not make the host faster, so it scales by ``fixed_factor`` (1 by default).
    Bandwidth terms scale by the ratio of nominal link speeds (the fitted efficiency carries
    over); the uncertainty grows by ``extra_log_sigma`` (added in quadrature).
    """
    intra_beta = p.intra_beta
    inter_beta = p.inter_beta
    if intra_gbps and p.intra_gbps:
        intra_beta *= p.intra_gbps / intra_gbps
    if inter_gbps and p.inter_gbps:
        inter_beta *= p.inter_gbps / inter_gbps
    return replace(
        p,
        compute_a=p.compute_a * fixed_factor,
        compute_b=p.compute_b * compute_factor,
        intra_beta=intra_beta,
        inter_beta=inter_beta,
        intra_gbps=intra_gbps or p.intra_gbps,
        inter_gbps=inter_gbps or p.inter_gbps,
        log_sigma=math.hypot(p.log_sigma, extra_log_sigma),
    )


def params_to_dict(p: PerfParams) -> dict[str, Any]:
    return {"schema": MODEL_SCHEMA, **asdict(p)}


def params_from_dict(doc: Any, source: str = "model") -> PerfParams:
    """Validate a model document; raise DataFileError naming the problem."""
    check_schema(doc, _KIND, source)
    fields = {k: v for k, v in doc.items() if k != "schema"}
    try:
        return PerfParams(**fields)
    except TypeError as err:
        raise DataFileError(
            f"{source}: not a kplan performance model ({err})",
            hint="create one with `kplan model fit --measurements m.csv --out model.json`",
        ) from None
    except ValueError as err:
        raise DataFileError(f"{source}: {err}", hint="refit the model") from None


def replace_fields(p: PerfParams, **changes: Any) -> PerfParams:
    """A copy of ``p`` with some fields changed (validated again)."""
    return replace(p, **changes)
