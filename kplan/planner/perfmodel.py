"""The step-time model: compute, all-reduce, overlap and accumulation (DESIGN.md, "The models").

Notation: ``n`` nodes, ``k`` workers in all, per-worker batch ``b``, accumulation ``s``.

    T_c(b)     = a_c + b_c * b                                  compute of one micro-batch
    ring(k)    = 2 (k - 1) / k                                  bytes each worker moves, / P
    T_sync     = 0                                              k == 1
               = alpha_i + beta_i * ring(k) + lat_i * 2(k-1)    one node (PCIe / NVLink)
               = (alpha_n + beta_n * ring(k) + lat_n * 2(k-1))
                 * (1 + two_node * [n == 2])                    across nodes (the NIC)
    T          = (T_c^g + T_sync^g)^(1/g),  g in [1, 10]        compute/sync overlap
                 (g = inter_gamma across nodes where it is set)
                 with T_sync less the last bucket, + T_last          DDP bucket floor (below)
    T_step     = (s - 1) * T_c + T                              with accumulation

``beta = P / (eta * BW)``: gradient bytes over the nominal link bandwidth times a fitted
efficiency ``eta``. Keeping ``P`` and ``BW`` separate lets a model fitted on one instance type
predict another (``transfer``) and extrapolate to node counts never profiled. ``two_node``: NCCL
picks its algorithm and channels by node count, and on two nodes both ring directions share one
NIC pair; a two-node all-reduce often runs at its own efficiency. It is fitted when the
measurements have two nodes and more than two, and held at 0 otherwise.

Across nodes the ring's bytes cross each node's NIC once: NCCL's ring visits every node once,
so each node sends and receives ``ring(k) * P`` over its NICs whatever its GPU count (the same
bytes as a hierarchical reduce-scatter / inter-node all-reduce / all-gather, ``2(n-1)/n * P``
per node, within ``k/(k-1)``), and ``BW_nic`` is the node's aggregate NIC bandwidth
(catalog ``network_gbps``: 4 x 100 Gbit/s EFA on p4d = 400), not a per-GPU share.

Overlap across nodes: ``inter_gamma`` (None: ``gamma``) is the overlap exponent of rows that
span nodes. A fit with multi-node rows measures the overlap there and leaves it None; a fit of a
one-node profile cannot (its sync is a short PCIe/NVLink all-reduce, so the one-node ``gamma``
is poorly identified: 1.0 to 5.2 on the Pollux traces), and the fit sets the fabric's prior
(``fit.PRIOR_GAMMA_INTER_BY_FABRIC``: over plain TCP sockets the inter-node all-reduce is
several times the compute and overlaps little).

Bucket floor: DDP all-reduces gradients in buckets of ``DDP_BUCKET_BYTES`` while backward runs,
but the last bucket (the first layers' gradients) is ready only when backward ends, so at least
its all-reduce is exposed: ``T = overlap(T_c, T_sync - T_last) + T_last`` with ``T_last`` the
all-reduce of ``min(P, bucket)`` bytes (alpha and per-hop latency in full, the bandwidth term
for one bucket), so the exposed sync is never below ``T_last`` and a gradient of one bucket
does not overlap at all. Applied where the gradient size is known and ``bucket_bytes`` is set
(``with_bucket_floor``; fits of kplan profiles and ``workload.for_instance`` set it).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from kplan.core.compression_spec import DDP_BUCKET_BYTES  # DDP's default, shared with the runtime
from kplan.core.errors import DataFileError
from kplan.planner.profile import MAX_WORKERS, check_schema

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
    # DDP bucket size in bytes: the last bucket's all-reduce is never hidden by compute (see
    # the module notes). None: no floor (models saved before issue 15, synthetic fixtures).
    bucket_bytes: float | None = None
    # Overlap exponent of rows across nodes (None: gamma); a fabric prior where the inter-node
    # terms are priors (fit.PRIOR_GAMMA_INTER_BY_FABRIC), None once multi-node rows are fitted.
    inter_gamma: float | None = None
    # The node counts the rows measured (sorted); None: not recorded (models saved before,
    # taken as every count up to max_nodes_measured). A count below the largest that no row
    # measured is interpolated, with its own error (fit.PRIOR_NODES_LOG_SIGMA).
    nodes_measured: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.nodes_measured is not None:
            counts = tuple(sorted({int(n) for n in self.nodes_measured}))
            if not counts or counts[0] < 1 or len(counts) != len(self.nodes_measured):
                raise ValueError(
                    f"nodes_measured={self.nodes_measured!r} must be distinct counts >= 1"
                )
            object.__setattr__(self, "nodes_measured", counts)
        for name in (*(n for n in FITTED if n != "gamma"), "log_sigma"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}={value!r} must be a finite number >= 0")
        if not 1.0 <= self.gamma <= 10.0:
            raise ValueError(f"gamma={self.gamma!r} must be in [1, 10]")
        if self.inter_gamma is not None and not 1.0 <= self.inter_gamma <= 10.0:
            raise ValueError(f"inter_gamma={self.inter_gamma!r} must be in [1, 10]")
        if self.compute_a + self.compute_b <= 0:
            raise ValueError("compute_a + compute_b must be > 0")
        if self.bucket_bytes is not None and not (
            math.isfinite(self.bucket_bytes) and self.bucket_bytes > 0
        ):
            raise ValueError(f"bucket_bytes={self.bucket_bytes!r} must be a number > 0")

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


def last_bucket_sync_time(p: PerfParams, nodes: ArrayLike, workers: ArrayLike) -> Array:
    """All-reduce time of DDP's last bucket, which no compute can hide.

    0 where the gradient size or the bucket size is unknown (no floor).
    """
    k = np.asarray(workers, dtype=float)
    if not p.gradient_bytes or not p.bucket_bytes:
        return np.zeros(np.broadcast(np.asarray(nodes, dtype=float), k).shape)
    frac = min(1.0, p.bucket_bytes / p.gradient_bytes)
    one = replace(p, intra_beta=p.intra_beta * frac, inter_beta=p.inter_beta * frac)
    return sync_time(one, nodes, workers)


def overlapped(p: PerfParams, compute: ArrayLike, nodes: ArrayLike, workers: ArrayLike) -> Array:
    """Compute and sync of one step: the buckets before the last overlap, the last does not."""
    tc = np.asarray(compute, dtype=float)
    sync = sync_time(p, nodes, workers)
    last = np.minimum(last_bucket_sync_time(p, nodes, workers), sync)
    return overlap(tc, sync - last, overlap_gamma(p, nodes)) + last


def overlap_gamma(p: PerfParams, nodes: ArrayLike) -> Array:
    """The overlap exponent of each row: ``inter_gamma`` across nodes where set, else gamma."""
    n = np.asarray(nodes, dtype=float)
    inter = p.gamma if p.inter_gamma is None else p.inter_gamma
    out: Array = np.where(n > 1, inter, p.gamma)
    return out


def with_bucket_floor(p: PerfParams, bucket_bytes: float = DDP_BUCKET_BYTES) -> PerfParams:
    """``p`` with DDP's last-bucket floor on (a no-op where the gradient size is unknown)."""
    return replace(p, bucket_bytes=bucket_bytes) if p.gradient_bytes else p


def overlap(compute: ArrayLike, sync: ArrayLike, gamma: float | ArrayLike) -> Array:
    """(T_c^g + T_sync^g)^(1/g), computed stably (``gamma`` a number or one per row)."""
    gamma = np.asarray(gamma, dtype=float)
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
    return (s - 1.0) * tc + overlapped(p, tc, nodes, workers)


def exposed_sync_time(
    p: PerfParams, nodes: ArrayLike, workers: ArrayLike, local_batch: ArrayLike
) -> Array:
    """The part of the sync that compute does not hide (what profilers measure as sync_time)."""
    tc = compute_time(p, local_batch)
    return overlapped(p, tc, nodes, workers) - tc


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


def projected_gradient_bytes(gradient_bytes: float, measured: str, target: str) -> float:
    """Gradient bytes of a profile measured in one precision, sent in another.

    DDP reduces gradients in the parameters' dtype (``precision.GRADIENT_BYTES``), so the bytes
    scale by the ratio of bytes per element; the sync model takes them from here.
    """
    from kplan.core.precision import GRADIENT_BYTES, check_precision

    src = GRADIENT_BYTES[check_precision(measured, "measured precision")]
    dst = GRADIENT_BYTES[check_precision(target)]
    return gradient_bytes * dst / src


def term_sources(
    p: PerfParams, *, gpu: str | None = None, nodes: int = 1, workers: int = 1
) -> dict[str, str]:
    """Which terms of a prediction were measured and which were transferred or assumed.

    ``p`` is the profile's fitted model (before ``transfer``), ``gpu`` the device predicted for,
    ``nodes``/``workers`` the configuration. Values: "measured", "transferred from <GPU>",
    "scaled by link bandwidth" (measured on another link), "extrapolated from N nodes",
    "prior" (built from fit.py's priors and the catalog's links) or "none" (no such term).
    """
    same = gpu is None or p.gpu is None or p.gpu.lower() == gpu.lower()
    compute = "measured" if same else f"transferred from {p.gpu}"
    if workers <= nodes:
        intra = "none"
    elif p.max_workers_measured <= 1 or (not same and p.intra_gbps is None):
        intra = "prior"
    else:
        intra = "measured" if same else "scaled by link bandwidth"
    if nodes <= 1:
        inter = "none"
    elif not p.inter_measured:
        inter = "prior"
    elif not same:
        inter = "scaled by link bandwidth"
    elif nodes > p.max_nodes_measured:
        inter = f"extrapolated from {p.max_nodes_measured} nodes"
    elif p.nodes_measured is not None and nodes not in p.nodes_measured:
        shown = ", ".join(str(n) for n in p.nodes_measured)
        inter = f"interpolated between measured node counts ({shown})"
    else:
        inter = "measured"
    return {"compute": compute, "intra_sync": intra, "inter_sync": inter}


def params_to_dict(p: PerfParams) -> dict[str, Any]:
    return {"schema": MODEL_SCHEMA, **asdict(p)}


_FLOATS = (*FITTED, "log_sigma", "gradient_bytes", "intra_gbps", "inter_gbps", "bucket_bytes",
           "inter_gamma")  # fmt: skip
_REQUIRED = (*FITTED, "log_sigma")
_COUNTS = ("gpus_per_node", "max_nodes_measured", "max_workers_measured")
_FIT_HINT = "create one with `kplan model fit --measurements m.csv --out model.json`"


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_WORKERS


def _wrong_type(key: str, value: Any) -> str | None:
    """What ``key`` must be when ``value`` is not of its type (JSON booleans are not numbers);
    None when the type is right (the values are ``PerfParams``'s to check)."""
    if value is None and key not in _REQUIRED:
        return None
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if key in _FLOATS and not number:
        return "a number"
    if key in _COUNTS and not _count(value):
        return f"an integer in [1, {MAX_WORKERS}]"
    if key == "inter_measured" and not isinstance(value, bool):
        return "true or false"
    if key == "nodes_measured" and not (
        isinstance(value, list) and value and all(_count(n) for n in value)
    ):
        return f"a list of node counts in [1, {MAX_WORKERS}]"
    if key == "gpu" and not (isinstance(value, str) and len(value) <= 64):
        return "a GPU name"
    return None


def params_from_dict(doc: Any, source: str = "model") -> PerfParams:
    """The one validation of a model document (``kplan model``'s file, a profile's ``fit``):
    its schema, each field's type, then the values (``PerfParams``); DataFileError naming the
    problem."""
    check_schema(doc, _KIND, source)
    fields = {k: v for k, v in doc.items() if k != "schema"}
    for key, value in fields.items():
        if (bad := _wrong_type(key, value)) is not None:
            raise DataFileError(
                f"{source}: '{key}' must be {bad}, got {repr(value)[:40]}", hint=_FIT_HINT
            )
    try:
        return PerfParams(**fields)
    except TypeError as err:
        raise DataFileError(
            f"{source}: not a kplan performance model ({err})", hint=_FIT_HINT
        ) from None
    except ValueError as err:
        raise DataFileError(f"{source}: {err}", hint="refit the model") from None


def replace_fields(p: PerfParams, **changes: Any) -> PerfParams:
    """A copy of ``p`` with some fields changed (validated again)."""
    return replace(p, **changes)
