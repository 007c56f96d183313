"""Gradient compression priced as a plan dimension (issue 14): wire bytes, latency, codec
compute and the statistical cost of each option, over the fitted step-time model (pure).

The options and their byte counting are shared (``kplan.core.compression_spec``, torch-free):
``none``, ``fp16``, ``bf16``, ``powersgd:RANK``, ``topk:RATIO[:ar|ag|auto]``. The sync model is
``perfmodel.sync_time`` with the option's bytes in place of the dense ring's, per collective:

    T_sync(o) = alpha + beta/P * bytes(o, k) + lat * hops(o, k)   (x (1 + two_node) at n = 2)

``beta/P`` is the fitted seconds per byte of the link (``beta = P / (eta BW)``), so the dense
option (``bytes = 2(k-1)/k P``, ``2(k-1)`` hops) is exactly ``perfmodel.sync_time``. ``alpha``
is the fit's fixed cost of a synchronised step (DDP already runs one collective per bucket), paid
once; each collective round pays its ring or tree hops at the per-hop latency ``lat``:

    option        bytes one worker sends (P: FP32 gradient bytes)      rounds  hops
    none          2(k-1)/k P                                           1       2(k-1)
    fp16, bf16    2(k-1)/k P/2                                         1       2(k-1)
    powersgd:r    2(k-1)/k 4 (sum (rows+cols) r over matrices + vectors)  2    4(k-1)
    topk:x:ag     (k-1) 8 K              (K = sum ceil(x numel), 4+4 bytes) 2  2(k-1)
                  (two all-gathers: the values and the indices)
    topk:x:ar     ceil(log2 k) 4 K + 2(k-1)/k 4 K  (tree broadcast of the   2  ceil(log2 k) + 2(k-1)
                  indices: its critical path, then the AR of the values)

``topk:x:auto`` is priced as the faster of its two steps, AR's and AG's, each with its own
codec (``variants``; AG's decompression sums every worker's part, AR's scatters one); alone,
``traffic`` takes the cheaper on the wire by the runtime's own cost function
(``compress.topk_collective``) at the link's fitted bandwidth and per-hop latency. The running
job measures both exchanges at start and takes the faster (``compressor.probe_topk_exchange``),
so where the collective library's costs differ from the bytes' the job may run the other one.
Every option runs as a DDP communication hook per bucket (``nb = ceil(P / bucket)`` buckets), so
each bucket pays its rounds' hops: the latency term is ``lat * hops * nb`` (dense keeps perfmodel's
fit). A round the hook waits for before it can go on is not overlapped with anything: PowerSGD's P
round (Q = M^T P needs the summed P) and AR-Topk's index broadcast (the values sent depend on the
indices). PowerSGD's P all-reduce is also a barrier inside backward: every worker waits there for
the slowest (0 on identical dedicated devices, the planner's default; on the emulated hosts, where
the workers share cores, bench/comm_bed.py measures ``skew``, the wait at a barrier after one
step's compute). The skew is paid once per step, not at every bucket: the workers drift apart over
the compute, the first bucket's barrier realigns them, and each later barrier waits only for what
they drifted in that bucket's share of backward, in sum a step's drift once. (Until 2026-11-27
every bucket paid it: PowerSGD's blocking term was 20-50 ms where its hook waited 10-17 ms, and its
step was predicted 7-19% too slow in four runs; once a step, the blocking term read 9 and 12 ms
where the hook waited 10 and 17 ms, and the step was within 8%: bench/comm_bed.py.) AR-Topk's
broadcast is not: the others wait for the designated worker's selection (in its codec time) and it
waits for no one. The designated worker sends a bucket's indices and goes on with the next bucket's
backward and selection while they travel; the others, waiting for them, were waiting for its
selection anyway. So of the broadcast only the last bucket's share of the bytes is exposed (with
every bucket's latencies), and the earlier buckets' bytes share the link with the overlapped rounds
(``blocking_time``; until 2026-11-27 the whole broadcast was exposed: 26 ms of top-k AR's 0.16 s
step at ratio 0.05 on the emulated hosts, 11 ms now; bench/comm_bed.py). The other rounds overlap
backward. The codec compute (compress + decompress: casts, PowerSGD's matmuls and
orthogonalisation, top-k selection and scatter) runs on the worker's own device between backward's
kernels. Where DDP's buckets are known (``p.bucket_bytes``; their layout from the shapes,
``bucket_shares``), the step is a pipeline of them (``pipeline``): forward (its share of T_c
measured by the profile, ``model.forward_share``, else a third) overlaps nothing; each bucket, in
launch order, takes its share (by elements) of backward and of the codec on the worker, then its
share of the asynchronous rounds on the link, which starts once the bucket is compressed and the
link has sent the earlier buckets:

    T_step(o) = (s-1) T_c + pipeline(T_c, T_codec(o), T_async(o)) + T_block(o)
    T_block(o) = beta/P * blocking bytes + nb * lat * blocking hops + skew [a barrier]
    (AR-Topk: T_block's bytes term x the last bucket's share f; the other 1 - f in T_async)

No overlap exponent. Until 2026-11-27 this was perfmodel's power mean, overlap(T_c + T_codec,
T_async - T_last, gamma) + T_last, with dense's gamma. On the emulated hosts that gamma
(1.02-1.21, fitted on dense) made top-k at 0.05 18-31% slow: dense's communication there is ten
times its compute, near-additive for a structural reason (forward cannot overlap, backward runs
before each bucket is sent), while top-k's rounds hide behind the backward and codec of the
buckets that follow. The pipeline, with nothing fitted, was within 8% for every option, dense
included (bench/comm_bed.py). Without a bucket size the power mean remains (no bucket
layout, so no last-bucket floor and nothing hidden); dense (``none``) keeps perfmodel's step,
fitted on real traces. (Before that, until the same day, the codec was added outside the
overlap in full, which predicted top-k at 0.05 20% slow.)

``T_codec`` is measured when the profile has it (profile 1.2 ``codec_seconds``: profiler/codec.py
runs the option's compress + decompress on the model's own parameter shapes on the profiling
device) and scaled to the target GPU by the ratio of memory bandwidths (the codec streams
the gradient: memory-bound, so the compute time's FLOP-based factor would overstate a faster
GPU's gain; ``InstancePrediction.codec_factor``, the compute factor from a CPU profile);
else ``CODEC_S_PER_ELEMENT`` x elements (a prior). The shapes are the profile's
``model.gradient_shapes`` when recorded, else ``assumed_shapes``.
``codec_for`` picks, and says which ("codec measured" or "codec prior") in the row's why.

Top-k's sparsity warm-up (``:wSTEPS``) is priced at its steady ratio: its first steps send
more, a cost that is small against a run of many times STEPS steps.

The statistical cost is a multiplier on the samples (steps) to the target, ``StatCost``: a
documented prior per option (below) that measurements replace (``StatCost.updated``: the
measured steps-to-loss ratio of a compressed and a dense run, e.g. bench/comm_bed.py or a job's
own curves, combined with the prior by their uncertainties in log space).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from kplan.core import compression_spec as rc
from kplan.core.compression_spec import Compression
from kplan.planner import perfmodel
from kplan.planner.commtraffic import Traffic, sync_terms, traffic
from kplan.planner.compstats import (
    MEASURED_SIGMA,
    MIN_MEASURED_SIGMA,
    TOPK_PRIOR_SIGMA,
    StatCost,
    parse,
    parse_measured,
    prior,
    stat_for,
)
from kplan.planner.perfmodel import PerfParams

if TYPE_CHECKING:
    from kplan.planner.workload import Workload

__all__ = [
    "MEASURED_SIGMA",
    "MIN_MEASURED_SIGMA",
    "TOPK_PRIOR_SIGMA",
    "StatCost",
    "Traffic",
    "parse",
    "parse_measured",
    "prior",
    "stat_for",
    "traffic",
]

Array = NDArray[np.float64]
Shapes = tuple[tuple[int, ...], ...]

# Considered on multi-node plans when --compression is not pinned.
DEFAULT_OPTIONS: tuple[str, ...] = ("fp16", "powersgd:4", "topk:0.01:auto")
# Without the model's parameter shapes, the gradient is taken as square matrices of this side
# (a transformer block's projections are 1-8k wide): PowerSGD's ratio 2r/side. Optimistic for
# models of many small or vector parameters; a profile's shapes replace it.
ASSUMED_SIDE = 4096
# Codec seconds per gradient element on a GPU when not measured (memory-bound passes over the
# gradient at ~1 TB/s: a cast reads 4 and writes 2 bytes and back; PowerSGD reads the matrix
# twice plus its error buffer; top-k's selection is ~10 passes). Priors, replaced by
# ``measured`` codec times (kplan/profiler/codec.py measures them on the real tensors).
CODEC_S_PER_ELEMENT: dict[str, float] = {
    "none": 0.0,
    "fp16": 1.2e-11,
    "bf16": 1.2e-11,
    "powersgd": 3e-11,
    "topk": 1.5e-10,
}


def assumed_shapes(gradient_bytes: float, element_bytes: int = 4) -> Shapes:
    """Square ASSUMED_SIDE matrices (smaller for small models) holding the gradient's elements,
    the remainder as one vector: the planner's stand-in when the shapes are not profiled."""
    numel = max(1, int(gradient_bytes // element_bytes))
    side = max(1, min(ASSUMED_SIDE, math.isqrt(numel)))
    count, rest = divmod(numel, side * side)
    shapes: list[tuple[int, ...]] = [(side, side)] * count
    if rest:
        shapes.append((rest,))
    return tuple(shapes)


def _link(p: PerfParams, n: Array, gradient_bytes: float) -> tuple[Array, Array, Array, Array]:
    """(alpha, seconds per byte, latency per hop, two-node factor) per configuration."""
    inter = n > 1
    alpha = np.where(inter, p.inter_alpha, p.intra_alpha)
    per_byte = np.where(inter, p.inter_beta, p.intra_beta) / gradient_bytes
    lat = np.where(inter, p.inter_lat, p.intra_lat)
    two = np.where(inter & (n == 2), 1.0 + p.two_node, 1.0)
    return alpha, per_byte, lat, two


def buckets(p: PerfParams, shapes: Sequence[tuple[int, ...]]) -> int:
    """DDP buckets per step: ceil(gradient bytes / bucket bytes), 1 without a bucket size."""
    pbytes = float(p.gradient_bytes or 4 * sum(math.prod(s) for s in shapes))
    if not p.bucket_bytes:
        return 1
    return max(1, math.ceil(pbytes / p.bucket_bytes))


def sync_time(
    p: PerfParams,
    c: Compression,
    shapes: Sequence[tuple[int, ...]],
    nodes: ArrayLike,
    workers: ArrayLike,
    fraction: float = 1.0,
    part: Literal["all", "overlapped", "blocking"] = "all",
    skew_s: float = 0.0,
) -> tuple[Array, list[str]]:
    """Communication time of the option and the top-k collective per entry; ``fraction`` of
    the bytes (the last bucket's share) with alpha and latencies in full. Every bucket runs
    the option's rounds, so the per-hop latencies count once per bucket (``buckets``).
    ``part``: all of it, the rounds that overlap backward (``alpha`` with them), or the
    rounds the hook waits for (module notes) plus ``skew_s`` once where one is a barrier
    (``step_time``)."""
    n, k = np.broadcast_arrays(np.asarray(nodes, dtype=float), np.asarray(workers, dtype=float))
    t_bytes, t_hops, t_wait, colls = sync_terms(p, c, shapes, n, k, part, skew_s)
    pbytes = float(p.gradient_bytes or 4 * sum(math.prod(s) for s in shapes))
    alpha, per_byte, lat, two = _link(p, n, pbytes)
    if part == "blocking":
        alpha = np.zeros_like(alpha)
    hops = t_hops * (buckets(p, shapes) if c.kind != "none" else 1)
    out: Array = np.where(
        k > 1, two * (alpha + per_byte * t_bytes * fraction + lat * hops) + t_wait, 0.0
    )
    return out, colls


def _steady(c: Compression) -> str:
    """The option after its sparsity warm-up (the warm-up is not priced: module notes)."""
    return replace(c, warmup=0).spec()


def variants(c: Compression) -> list[Compression]:
    """The collectives ``c`` may run, each priced with its own codec: AR and AG for top-k's
    ``auto`` (the planner prices the faster of the two steps, as the job runs the faster of the
    two it measures), else ``c`` itself."""
    if c.sparse and c.collective == "auto":
        return [replace(c, collective="ar"), replace(c, collective="ag")]
    return [c]


def _codec_keys(c: Compression) -> list[str]:
    """Where ``c``'s measured codec time is found: its spec, its steady spec (a warm-up's), and
    for a fixed top-k collective the ``auto`` spec (profiles before 2026-11-27 timed ``auto``
    only, as AG)."""
    keys = [c.spec(), _steady(c)]
    if c.sparse and c.collective != "auto":
        keys.append(replace(c, collective="auto", warmup=0).spec())
    return keys


def codec_seconds(
    c: Compression, shapes: Sequence[tuple[int, ...]], measured: dict[str, float] | None = None
) -> float:
    """Compress + decompress seconds per step: ``measured`` under ``_codec_keys`` (or by kind)
    when given, else the per-element prior of its kind."""
    if c.kind == "none":
        return 0.0
    if measured:
        for key in (*_codec_keys(c), c.kind):
            if key in measured:
                return float(measured[key])
    numel = sum(math.prod(s) for s in shapes)
    return CODEC_S_PER_ELEMENT[c.kind] * numel


def codec_for(
    c: Compression,
    shapes: Sequence[tuple[int, ...]],
    measured: dict[str, float] | None = None,
    factor: float = 1.0,
    device: str = "",
) -> tuple[float, str]:
    """(codec seconds on the target, basis): ``measured`` under ``_codec_keys(c)`` (the same
    option, measured on ``device``) x ``factor`` (``InstancePrediction.codec_factor`` to the
    target GPU), else the per-element prior on ``shapes``."""
    if c.kind == "none":
        return 0.0, ""
    for key in _codec_keys(c):
        if measured and key in measured:
            scaled = f" x{factor:.3g} device factor" if factor != 1.0 else ""
            return measured[key] * factor, f"codec measured on {device or 'the profiler'}{scaled}"
    return codec_seconds(c, shapes), "codec prior"


def job_inputs(
    c: Compression, workload: Workload, gradient_bytes: float, factor: float
) -> tuple[Shapes, tuple[float, str]]:
    """The job's gradient shapes (profiled, else ``assumed_shapes(gradient_bytes)``) and
    ``codec_for`` with its measured codec times scaled by ``factor`` (the instance's
    ``codec_factor``)."""
    shapes = workload.gradient_shapes or assumed_shapes(gradient_bytes)
    codec = workload.codec
    measured = codec.as_dict() if codec is not None else None
    return shapes, codec_for(c, shapes, measured, factor, codec.device if codec else "")


def variant_inputs(
    c: Compression, workload: Workload, gradient_bytes: float, factor: float
) -> list[tuple[Compression, Shapes, tuple[float, str]]]:
    """``job_inputs`` of each of ``variants(c)``: what the planner prices ``c`` with (``auto``:
    AR and AG, each with its own codec; the faster is taken)."""
    return [(v, *job_inputs(v, workload, gradient_bytes, factor)) for v in variants(c)]


def step_time(
    p: PerfParams,
    c: Compression,
    shapes: Sequence[tuple[int, ...]],
    nodes: ArrayLike,
    workers: ArrayLike,
    local_batch: ArrayLike,
    accum_steps: ArrayLike = 1,
    codec_s: float = 0.0,
    skew_s: float = 0.0,
    forward_share: float | None = None,
    pairs: tuple[Array, Array, NDArray[np.intp]] | None = None,
) -> Array:
    """Seconds per optimizer step with ``c`` (module notes); ``none`` is perfmodel's exactly.
    ``skew_s``: a worker's mean wait at a barrier after a step's compute beyond the link's
    latency (the others still computing), paid once a step where a blocking round is a barrier
    (module notes).
    ``forward_share``: the part of the compute no round overlaps (the profile's measured
    ``model.forward_share``; None: ``FORWARD_SHARE``).
    ``pairs``: the distinct (nodes, workers) pairs and each entry's index, as
    ``distinct_pairs`` gives them, where the caller has them already."""
    if c.kind == "none":
        return perfmodel.step_time(p, nodes, workers, local_batch, accum_steps)
    tc = perfmodel.compute_time(p, local_batch)
    s = np.asarray(accum_steps, dtype=float)
    # the rounds depend on (nodes, workers) alone: priced once per distinct pair
    n, k = np.broadcast_arrays(np.asarray(nodes, dtype=float), np.asarray(workers, dtype=float))
    un, uk, inv = distinct_pairs(n, k) if pairs is None else pairs
    sync = sync_time(p, c, shapes, un, uk, part="overlapped")[0][inv]
    codec = np.where(k > 1, codec_s, 0.0)
    blocking, hidden = (x[inv] for x in blocking_time(p, c, shapes, un, uk, skew_s))
    if p.gradient_bytes and p.bucket_bytes:
        # DDP's buckets as a pipeline (module notes): no overlap exponent
        shares = bucket_shares(shapes, p.bucket_bytes)
        ahead = FORWARD_SHARE if forward_share is None else forward_share
        return (s - 1.0) * tc + pipeline(tc, codec, sync + hidden, shares, ahead) + blocking
    # no bucket layout: perfmodel's power mean (nothing is hidden, no last bucket is known)
    gamma = perfmodel.overlap_gamma(p, nodes)  # across nodes a fabric prior's own overlap
    return (s - 1.0) * tc + perfmodel.overlap(tc + codec, sync, gamma) + blocking


def node_pairs(nodes: Array, gpus: int) -> tuple[Array, Array, NDArray[np.intp]] | None:
    """``distinct_pairs(nodes, nodes * gpus)`` of node counts in ascending order (a type grid's:
    the workers follow from the nodes), from the change points; None where not ascending."""
    if nodes.size == 0 or np.any(nodes[1:] < nodes[:-1]):
        return None
    first = np.ones(nodes.size, dtype=bool)
    first[1:] = nodes[1:] != nodes[:-1]
    un = nodes[first]
    return un, un * float(gpus), np.cumsum(first) - 1


def distinct_pairs(n: Array, k: Array) -> tuple[Array, Array, NDArray[np.intp]]:
    """The distinct (nodes, workers) pairs and each entry's index into them (whole counts are
    keyed as one number: far faster than a unique over rows)."""
    top = float(k.max(initial=0.0)) + 1.0
    if (
        np.all(n == np.round(n))
        and np.all(k == np.round(k))
        and top * (n.max(initial=0.0) + 1) < 2**52
    ):
        keys, inv = np.unique(n * top + k, return_inverse=True)
        un = np.floor(keys / top)
        return un, keys - un * top, inv.reshape(n.shape)
    pairs, inv = np.unique(np.stack([n.ravel(), k.ravel()], axis=1), axis=0, return_inverse=True)
    return pairs[:, 0], pairs[:, 1], inv.reshape(n.shape)


FORWARD_SHARE = 1.0 / 3.0
"""Forward's share of forward + backward where the profile did not measure it (backward costs
about twice forward): it overlaps no bucket's rounds (DDP reduces the step's buckets before the
optimizer, and the next forward needs the updated parameters)."""


def bucket_shares(shapes: Sequence[tuple[int, ...]], bucket_bytes: float) -> tuple[float, ...]:
    """Each DDP bucket's share of the gradient's elements, in launch order (the last
    parameters first, as backward produces them; ``compress.exchange_buckets``). Cached: the
    step and its blocking term both read it, for every configuration priced."""
    return _bucket_shares(tuple(math.prod(sh) for sh in shapes), int(bucket_bytes))


@functools.lru_cache(maxsize=256)
def _bucket_shares(numels: tuple[int, ...], bucket_bytes: int) -> tuple[float, ...]:
    sizes = rc.exchange_buckets(numels, bucket_bytes)
    total = float(sum(sizes)) or 1.0
    return tuple(n / total for n in sizes)


def pipeline(
    compute: ArrayLike,
    codec: ArrayLike,
    rounds: ArrayLike,
    shares: Sequence[float],
    forward_share: float = FORWARD_SHARE,
) -> Array:
    """Seconds from forward's start until the last bucket's asynchronous rounds are done:
    forward (``forward_share`` of ``compute``) overlaps nothing; then each bucket, in launch
    order, takes its share of backward and of the codec on the worker, and its share of
    ``rounds`` on the link, which starts once the bucket is compressed and the link has sent
    the buckets before it."""
    tc = np.asarray(compute, dtype=float)
    work = (1.0 - forward_share) * tc + np.asarray(codec, dtype=float)
    wire = np.asarray(rounds, dtype=float)
    host = forward_share * tc
    link = np.zeros_like(host * wire)
    for f in shares:
        host = host + work * f
        link = np.maximum(link, host) + wire * f
    out: Array = np.maximum(host, link)
    return out


def blocking_time(
    p: PerfParams,
    c: Compression,
    shapes: Sequence[tuple[int, ...]],
    nodes: ArrayLike,
    workers: ArrayLike,
    skew_s: float = 0.0,
) -> tuple[Array, Array]:
    """(exposed, hidden) seconds of the rounds the hook waits for (module notes): PowerSGD's P
    round is a barrier, exposed in full; of AR-Topk's broadcast only the last bucket's share of
    the bytes is exposed, the rest travels while the designated worker goes on (hidden: it is
    added to the overlapped rounds)."""
    whole, _ = sync_time(p, c, shapes, nodes, workers, part="blocking", skew_s=skew_s)
    if not c.sparse or not (p.gradient_bytes and p.bucket_bytes):
        return whole, np.zeros_like(whole)
    frac = bucket_shares(shapes, p.bucket_bytes)[-1]  # the last bucket's
    exposed, _ = sync_time(p, c, shapes, nodes, workers, frac, part="blocking", skew_s=skew_s)
    return exposed, whole - exposed


@dataclass(frozen=True)
class Priced:
    """One option on one configuration: its step time, the dense one's, and why."""

    compression: str
    step_s: float
    dense_step_s: float
    sync_s: float
    dense_sync_s: float
    codec_s: float
    stat: StatCost
    collective: str
    codec_basis: str = "codec prior"

    @property
    def time_ratio(self) -> float:
        """Time to train with the option / dense (step time x samples multiplier)."""
        return self.step_s * self.stat.multiplier / self.dense_step_s

    def why(self) -> str:
        coll = f" ({self.collective.upper()})" if self.collective else ""
        return (
            f"{self.compression}{coll}: all-reduce {self.dense_sync_s:.3g} s -> "
            f"{self.sync_s:.3g} s per step, codec +{self.codec_s:.2g} s ({self.codec_basis}), "
            f"x{self.stat.multiplier:.3g} steps ({self.stat.source}): "
            + (
                f"{1 - self.time_ratio:.0%} less time than dense"
                if self.time_ratio <= 1
                else f"{self.time_ratio - 1:.0%} more time than dense"
            )
        )


def price(
    p: PerfParams,
    c: Compression,
    shapes: Sequence[tuple[int, ...]],
    nodes: int,
    workers: int,
    local_batch: int,
    accum_steps: int = 1,
    measured_codec: dict[str, float] | None = None,
    stat: StatCost | None = None,
    codec_s: tuple[float, str] | None = None,
    forward_share: float | None = None,
) -> Priced:
    """Price ``c`` on one configuration against dense (``codec_s``: ``codec_for``'s answer;
    ``forward_share``: ``step_time``'s)."""
    if codec_s is not None:
        codec, basis = codec_s
    else:
        codec = codec_seconds(c, shapes, measured_codec)
        hit = measured_codec and (c.spec() in measured_codec or c.kind in measured_codec)
        basis = "codec measured" if hit else "codec prior"
    step = float(
        step_time(
            p,
            c,
            shapes,
            [nodes],
            [workers],
            [local_batch],
            accum_steps,
            codec,
            forward_share=forward_share,
        )[0]
    )
    dense = float(perfmodel.step_time(p, nodes, workers, local_batch, accum_steps))
    sync, colls = sync_time(p, c, shapes, [nodes], [workers])
    return Priced(
        c.spec(),
        step,
        dense,
        float(sync[0]),
        float(perfmodel.sync_time(p, nodes, workers)),
        codec,
        stat or prior(c),
        colls[0],
        basis,
    )
