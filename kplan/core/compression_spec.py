"""Gradient compression options (the spec) and the wire-cost model of each option: shared
vocabulary of the planner, which prices them, and the runtime, which runs them
(kplan/runtime/compression/); no torch.

``KPLAN_COMPRESSION`` / ``RuntimeConfig(compression=...)``:

- ``none``: the weighted dense all-reduce (sync.py).
- ``fp16``, ``bf16``: the weighted gradient is cast to 16 bits, all-reduced, cast back.
- ``powersgd:RANK``: rank-RANK PowerSGD (Vogels et al. 2019) per weight matrix, with error
  feedback and warm-started Q; vectors (biases, norms) go dense.
- ``topk:RATIO[:ar|ag|auto]``: per parameter the ``ceil(RATIO x numel)`` largest entries of the
  error-compensated weighted gradient (RATIO in (0, 1]: the fraction kept), error feedback (the
  rest stays in a per-worker residual added to the next step's gradient). ``ag``: all-gather of
  every worker's (values, indices); ``ar``: one index set for all workers (the top-k of one
  designated worker, rotating with the step, broadcast), then an all-reduce of the selected
  values (AR-Topk); ``auto`` (default): the cheaper of the two for the whole gradient by
  :func:`topk_collective` with the bandwidth and latency measured at start.
- ``topk:RATIO[:ar|ag|auto]:wSTEPS``: top-k with Deep Gradient Compression's sparsity
  warm-up (Lin et al. 2018, section 3.4): the ratio starts at WARMUP_START_RATIO (25%, DGC's
  75% sparsity) and decays exponentially to RATIO over the first STEPS optimizer steps
  (:func:`warmup_ratio`, a function of the step: the same on every rank and after a resume).
  The first steps, where the loss falls fastest and the error-feedback residual has not built
  up, send far more of the gradient; the planner prices the steady RATIO.
- ``adaptive[:MIN:MAX][:ar|ag|auto]``: top-k whose ratio changes online (GraVAC-style) from the
  measured compression gain (kplan/runtime/compression/adaptive.py), within [MIN, MAX]
  (default [0.001, 0.1]), starting at MAX.

Cost model (seconds for one worker's part of one collective; ``n`` workers, ``BW`` bytes/s of
the bottleneck link, ``lat`` seconds per message; ring all-reduce and all-gather, binomial-tree
broadcast; 4-byte values and 4-byte indices)::

    dense all-reduce of P bytes:  2(n-1)*lat + 2(n-1)/n * P/BW
    AG top-k (k per worker):       (n-1)*lat + (n-1) * 8k/BW
    AR top-k:                      ceil(log2 n)*(lat + 4k/BW)  +  2(n-1)*lat + 2(n-1)/n * 4k/BW
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from kplan.core.errors import InputError

CompressionKind = Literal["none", "fp16", "bf16", "powersgd", "topk", "adaptive"]
Collective = Literal["ar", "ag", "auto"]
COLLECTIVES: tuple[Collective, ...] = ("ar", "ag", "auto")
KINDS: tuple[CompressionKind, ...] = ("none", "fp16", "bf16", "powersgd", "topk", "adaptive")
WARMUP_START_RATIO = 0.25
"""Top-k's ratio at step 0 of a sparsity warm-up (DGC: 75% sparsity in its first epoch)."""
ADAPTIVE_MIN = 0.001
ADAPTIVE_MAX = 0.1
VALUE_BYTES = 4
INDEX_BYTES = 4

DDP_BUCKET_BYTES = 25 << 20  # DistributedDataParallel's default bucket_cap_mb, in bytes


def exchange_buckets(numels: Sequence[int], bucket_bytes: int = DDP_BUCKET_BYTES) -> list[int]:
    """Elements per DDP bucket of FP32 parameters of ``numels`` (in reverse order, as DDP fills
    and launches them; a parameter larger than a bucket is a bucket of its own)."""
    out: list[int] = []
    size = 0
    for n in reversed(list(numels)):
        if size and (size + n) * VALUE_BYTES > bucket_bytes:
            out.append(size)
            size = 0
        size += n
    if size:
        out.append(size)
    return out


_HINT = (
    "use none, fp16, bf16, powersgd:RANK (RANK >= 1), topk:RATIO[:ar|ag|auto] "
    "(0 < RATIO <= 1, the fraction kept; :wSTEPS adds a sparsity warm-up over STEPS steps) "
    "or adaptive[:MIN:MAX][:ar|ag|auto]"
)


@dataclass(frozen=True)
class Compression:
    """One gradient-compression setting (see the module docstring)."""

    kind: CompressionKind = "none"
    rank: int = 0
    """PowerSGD's matrix rank."""
    ratio: float = 1.0
    """Top-k: fraction of each parameter's entries sent; adaptive: the starting ratio (MAX)."""
    collective: Collective = "auto"
    min_ratio: float = ADAPTIVE_MIN
    max_ratio: float = ADAPTIVE_MAX
    warmup: int = 0
    """Top-k: steps of the sparsity warm-up (0: none); see :func:`warmup_ratio`."""

    @property
    def lossy(self) -> bool:
        """True for the options that drop information (error feedback keeps the rest)."""
        return self.kind in ("powersgd", "topk", "adaptive")

    @property
    def sparse(self) -> bool:
        return self.kind in ("topk", "adaptive")

    def spec(self) -> str:
        """The ``KPLAN_COMPRESSION`` text that parses back to this setting."""
        if self.kind == "powersgd":
            return f"powersgd:{self.rank}"
        if self.kind == "topk":
            warm = f":w{self.warmup}" if self.warmup else ""
            return f"topk:{self.ratio:g}:{self.collective}{warm}"
        if self.kind == "adaptive":
            return f"adaptive:{self.min_ratio:g}:{self.max_ratio:g}:{self.collective}"
        return self.kind


def parse_compression(text: str, source: str = "compression") -> Compression:
    """Parse a compression spec; ``source`` names the setting in the error (the variable)."""
    raw = text.strip().lower()
    parts = raw.split(":")
    kind = parts[0]

    def bad(why: str) -> InputError:
        return InputError(f"{source}={text!r}: {why}", _HINT)

    if kind in ("none", "fp16", "bf16"):
        if len(parts) != 1:
            raise bad(f"{kind} takes no parameters")
        return Compression(kind)  # type: ignore[arg-type]
    if kind == "powersgd":
        if len(parts) != 2 or not parts[1].isdigit() or int(parts[1]) < 1:
            raise bad("the rank must be an integer >= 1 (powersgd:RANK)")
        return Compression("powersgd", rank=int(parts[1]))
    if kind in ("topk", "adaptive"):
        args = parts[1:]
        warmup = 0
        if kind == "topk" and len(args) > 1 and args[-1].startswith("w"):
            if not args[-1][1:].isdigit() or int(args[-1][1:]) < 1:
                raise bad(f"the warm-up {args[-1]!r} must be w followed by steps >= 1 (e.g. w100)")
            warmup = int(args.pop()[1:])
        collective: Collective = "auto"
        if args and args[-1] in COLLECTIVES:
            collective = args.pop()  # type: ignore[assignment]
        if kind == "topk":
            if len(args) != 1:
                raise bad("expected topk:RATIO[:ar|ag|auto][:wSTEPS]")
            ratio = _ratio(args[0], bad)
            return Compression("topk", ratio=ratio, collective=collective, warmup=warmup)
        if len(args) not in (0, 2):
            raise bad("expected adaptive or adaptive:MIN:MAX[:ar|ag|auto]")
        lo, hi = (ADAPTIVE_MIN, ADAPTIVE_MAX) if not args else (_ratio(a, bad) for a in args)
        if lo > hi:
            raise bad(f"MIN {lo:g} is above MAX {hi:g}")
        return Compression("adaptive", ratio=hi, collective=collective, min_ratio=lo, max_ratio=hi)
    raise bad(f"{kind!r} is not a compression")


def _ratio(text: str, bad: object) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0.0 < value <= 1.0):
        raise bad(f"ratio {text!r} is not a number in (0, 1]")  # type: ignore[operator]
    return value


# --- the cost model ---------------------------------------------------------------------------


def warmup_ratio(ratio: float, warmup: int, step: int) -> float:
    """Top-k's ratio at ``step`` under a sparsity warm-up of ``warmup`` steps (DGC):
    ``max(ratio, s0 (ratio / s0)^(step / warmup))`` with ``s0 = WARMUP_START_RATIO``, so the
    ratio falls by the same factor every step and reaches ``ratio`` at ``step = warmup``;
    ``ratio`` itself without a warm-up, after it, or when ``ratio >= s0``."""
    if warmup <= 0 or step >= warmup or ratio >= WARMUP_START_RATIO:
        return ratio
    s0 = WARMUP_START_RATIO
    return max(ratio, s0 * math.exp(math.log(ratio / s0) * max(step, 0) / warmup))


def topk_count(numel: int, ratio: float) -> int:
    """Entries top-k sends of a tensor of ``numel`` entries: ceil(ratio x numel), at least 1."""
    return max(1, min(numel, math.ceil(ratio * numel)))


def dense_allreduce_seconds(
    nbytes: float, workers: int, bandwidth_Bps: float, latency_s: float
) -> float:
    """Ring all-reduce: ``2(n-1)*lat + 2(n-1)/n * bytes/BW`` (0 for one worker)."""
    n = workers
    if n <= 1:
        return 0.0
    return 2 * (n - 1) * latency_s + 2 * (n - 1) / n * nbytes / bandwidth_Bps


@dataclass(frozen=True)
class TopkCost:
    """The predicted seconds of AR-Topk and AG-Topk for one tensor, and the cheaper one."""

    choice: Literal["ar", "ag"]
    ar_s: float
    ag_s: float
    k: int


def topk_collective(
    numel: int, ratio: float, workers: int, bandwidth_Bps: float, latency_s: float
) -> TopkCost:
    """AR or AG for top-k of ``numel`` entries at ``ratio`` on ``workers`` (module docstring).

    AG moves (n-1) x 8k bytes through each link in two all-gathers (values and indices, as
    the runtime issues them: 2(n-1) latencies); AR moves about 2 x 4k bytes plus the broadcast
    of k indices, with 2(n-1) + ceil(log2 n) latencies. So AG wins for small k (latency-bound)
    or two workers; AR wins when k x (n - 2) is large.
    """
    k = topk_count(numel, ratio)
    n = workers
    if n <= 1:
        return TopkCost("ar", 0.0, 0.0, k)
    ag = 2 * (n - 1) * latency_s + (n - 1) * (VALUE_BYTES + INDEX_BYTES) * k / bandwidth_Bps
    rounds = math.ceil(math.log2(n))
    bcast = rounds * (latency_s + INDEX_BYTES * k / bandwidth_Bps)
    ar = bcast + dense_allreduce_seconds(VALUE_BYTES * k, n, bandwidth_Bps, latency_s)
    return TopkCost("ar" if ar <= ag else "ag", ar, ag, k)


def ring_allreduce_bytes(nbytes: float, workers: int) -> float:
    """Bytes one worker sends in a ring all-reduce of ``nbytes``: 2(n-1)/n x bytes."""
    return 0.0 if workers <= 1 else 2 * (workers - 1) / workers * nbytes


def allgather_bytes(nbytes: float, workers: int) -> float:
    """Bytes one worker sends in a ring all-gather of ``nbytes`` per worker: (n-1) x bytes."""
    return 0.0 if workers <= 1 else (workers - 1) * nbytes


def broadcast_bytes(nbytes: float, workers: int) -> float:
    """Mean bytes per worker of a tree broadcast of ``nbytes``: (n-1)/n x bytes."""
    return 0.0 if workers <= 1 else (workers - 1) / workers * nbytes


def wire_bytes(
    compression: Compression,
    shapes: Sequence[tuple[int, ...]],
    workers: int,
    collective: Literal["ar", "ag"] = "ag",
    ratio: float | None = None,
) -> float:
    """Bytes one worker sends per synchronised step for FP32 parameters of ``shapes``.

    The same counting the runtime reports as ``bytes_sent`` (from tensor sizes, under the ring
    and tree algorithms above). ``ratio`` overrides the top-k ratio (adaptive's current one).
    """
    numels = [math.prod(s) for s in shapes]
    total = sum(numels)
    kind = compression.kind
    if kind == "none":
        return ring_allreduce_bytes(VALUE_BYTES * total, workers)
    if kind in ("fp16", "bf16"):
        return ring_allreduce_bytes(2 * total, workers)
    if kind == "powersgd":
        p_elems, q_elems, dense = powersgd_elements(compression.rank, shapes)
        return ring_allreduce_bytes(VALUE_BYTES * p_elems, workers) + ring_allreduce_bytes(
            VALUE_BYTES * (q_elems + dense), workers
        )
    keep = compression.ratio if ratio is None else ratio
    k = sum(topk_count(numel, keep) for numel in numels)
    if collective == "ag":
        return allgather_bytes((VALUE_BYTES + INDEX_BYTES) * k, workers)
    return broadcast_bytes(INDEX_BYTES * k, workers) + ring_allreduce_bytes(
        VALUE_BYTES * k, workers
    )


def powersgd_elements(rank: int, shapes: Sequence[tuple[int, ...]]) -> tuple[int, int, int]:
    """(P, Q, dense) elements one worker all-reduces with rank-``rank`` PowerSGD: the first
    round carries P (rows x r per matrix), the second Q (cols x r) and the parameters sent
    dense (vectors, and matrices where r(rows+cols) >= numel)."""
    p_elems = q_elems = dense = 0
    for shape in shapes:
        numel = math.prod(shape)
        n, m = powersgd_matrix(shape)
        r = min(rank, n, m)
        if len(shape) >= 2 and r * (n + m) < numel:
            p_elems += n * r
            q_elems += m * r
        else:
            dense += numel
    return p_elems, q_elems, dense


def link_from_probe(
    small_s: float, big_s: float, big_bytes: float, workers: int
) -> tuple[float, float]:
    """(bandwidth bytes/s, latency s per message) of the ring model above from two timed
    all-reduces: ``small_s`` of one element and ``big_s`` of ``big_bytes``.

    latency = small_s / (2(n-1)) (a one-element ring all-reduce is 2(n-1) messages);
    bandwidth = 2(n-1)/n x big_bytes / (big_s - small_s). The runtime's start-up probe and the
    bench's link probe both read their times through this one function, so the planner's
    ``topk_collective`` and the runtime's see the link the same way.
    """
    n = workers
    if n <= 1:
        return math.inf, 0.0
    latency = max(small_s, 0.0) / (2 * (n - 1))
    transfer = max(big_s - small_s, 1e-9)
    return 2 * (n - 1) / n * big_bytes / transfer, latency


def powersgd_matrix(shape: tuple[int, ...]) -> tuple[int, int]:
    """The (rows, columns) PowerSGD views a parameter of ``shape`` as: first dim x the rest."""
    if not shape:
        return 1, 1
    rows = shape[0]
    return rows, max(1, math.prod(shape) // max(rows, 1))
