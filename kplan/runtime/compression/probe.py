"""Start-up probes of the job's network: the link's bandwidth and latency (``probe_network``)
and AR-Topk against AG-Topk timed on the job's own buckets (``probe_topk_exchange``, whose
``TopkExchange`` is what ``topk:RATIO:auto`` runs)."""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch  # noqa: TID253 (torch is the runtime's core dependency)
import torch.distributed as dist  # noqa: TID253

from kplan.core.compression_spec import (
    VALUE_BYTES,
    link_from_probe,
    topk_count,
)
from kplan.runtime.compression.kernels import all_gather_topk, combine_gathered, scatter_reduced
from kplan.runtime.distributed import Context

Future = torch.futures.Future


@dataclasses.dataclass(frozen=True)
class TopkExchange:
    """AR-Topk against AG-Topk timed on the job's own buckets (``probe_topk_exchange``)."""

    ratio: float
    ar_s: float  # median seconds of the AR exchange
    ag_s: float  # median seconds of the AG exchange
    ar_wins: int  # pairs in which AR was the faster
    pairs: int

    @property
    def decided(self) -> str | None:
        """The faster collective where a sign test over the pairs says so at 5% (two-sided:
        6 of 6, 12 of 15, 13 of 16), else None (too close to tell apart: ``choice`` takes the
        lower median)."""
        if not self.pairs or sign_test(self.ar_wins, self.pairs) >= 0.05:
            return None
        return "ar" if 2 * self.ar_wins > self.pairs else "ag"

    @property
    def choice(self) -> str | None:
        """What ``auto`` runs: ``decided``, else the one of the lower median (None: nothing was
        timed). Too close to tell apart, either costs about the same, and the probe's medians,
        which hold the decode and the collective library's own costs, are the better guess: the
        wire cost model says AG at two workers on latency alone, where AR's full steps were
        faster in all 6 of the last two bench runs' settings (bench/comm_bed.py)."""
        if not self.pairs:
            return None
        return self.decided or ("ar" if self.ar_s <= self.ag_s else "ag")


def sign_test(wins: int, n: int) -> float:
    """Two-sided p-value of ``wins`` of ``n`` pairs under a fair coin."""
    tail = min(wins, n - wins)
    return min(1.0, 2.0 * sum(math.comb(n, i) for i in range(tail + 1)) / float(2**n))


PROBE_PAIRS = 6  # the start-up probe's AR/AG pairs before it may stop (6 of 6 decide at 5%)
PROBE_MAX_PAIRS = 16  # ... and at most, while the sign test cannot tell the two apart
PROBE_BUDGET_S = 10.0  # measured seconds after which no further pair starts


def probe_topk_exchange(
    ctx: Context,
    buckets: Sequence[int],
    ratio: float,
    pairs: int = PROBE_PAIRS,
    max_pairs: int = PROBE_MAX_PAIRS,
    budget_s: float = PROBE_BUDGET_S,
) -> TopkExchange:
    """AR-Topk against AG-Topk: the measured exchange of a top-k gradient at ``ratio`` over DDP
    buckets of ``buckets`` elements, with the collectives ``_topk`` issues per bucket (AR: the
    index broadcast waited for, then the values' all-reduce; AG: the two all-gathers), all
    waited for as a step does, and each bucket's decode as ``_topk`` does it (AR: the reduced
    values scattered into the dense bucket; AG: every worker's part summed into it,
    ``combine_gathered``), which costs AG more as workers grow (on 2 emulated hosts it made
    AR's full step 6-11% the faster where the exchanges alone tied).

    Random indices and values of each bucket's k: the selection is left out, as either puts
    one on the step's critical path (AG: every worker's at once; AR: the designated worker's,
    the others waiting for its indices). One warm-up of each, then AR/AG pairs in alternating
    order, each from a barrier to the slowest rank's end (MAX: every rank gets the same times,
    so the same choice and the same number of pairs): ``pairs`` of them, then more, up to
    ``max_pairs``, until the sign test tells the two apart (``TopkExchange.decided``) or the
    pairs took ``budget_s``. The medians, and in how many pairs AR was the faster.
    """
    world = ctx.world_size
    if not ctx.distributed or world == 1:
        return TopkExchange(ratio, 0.0, 0.0, 0, 0)
    device = ctx.device
    gen = torch.Generator().manual_seed(ctx.rank)
    data = []
    for n in buckets:
        k = topk_count(n, ratio)
        idx = torch.randint(0, n, (k,), generator=gen, dtype=torch.int32).to(device)
        data.append((torch.randn(k, generator=gen).to(device), idx))

    def once(collective: str, step: int) -> float:
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        works: list[Any] = []
        decodes: list[Callable[[], torch.Tensor]] = []
        for n, (values, idx) in zip(buckets, data, strict=True):
            if collective == "ar":
                sent = idx.clone() if ctx.rank == step % world else torch.empty_like(idx)
                dist.broadcast(sent, src=step % world)
                reduced = values.clone()
                works.append(dist.all_reduce(reduced, async_op=True))
                decodes.append(functools.partial(scatter_reduced, n, sent, reduced))
            else:
                vals, ids = all_gather_topk(works, values, idx, world)
                parts = list(zip(ids, vals, strict=True))
                decodes.append(functools.partial(combine_gathered, n, parts, values))
        for work in works:
            work.wait()
        for decode in decodes:
            decode()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        took = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        return float(took[0])

    for collective in ("ar", "ag"):  # warm-up: connections and buffers of every collective
        once(collective, 0)
    times: dict[str, list[float]] = {"ar": [], "ag": []}
    done = 0
    while done < max(pairs, max_pairs):
        for collective in ("ar", "ag") if done % 2 == 0 else ("ag", "ar"):
            times[collective].append(once(collective, done))
        done += 1
        wins = sum(a < b for a, b in zip(times["ar"], times["ag"], strict=True))
        got = TopkExchange(
            ratio, statistics.median(times["ar"]), statistics.median(times["ag"]), wins, done
        )
        spent = sum(times["ar"]) + sum(times["ag"])  # the same on every rank (MAX)
        if done >= pairs and (got.decided is not None or spent >= budget_s):
            break
    return got


def probe_network(ctx: Context, nbytes: int = 4 << 20, repeats: int = 5) -> tuple[float, float]:
    """(bandwidth bytes/s, latency s) of this group, from timed all-reduces (every rank agrees).

    ``compress.link_from_probe`` of the median time of a 1-element and of an ``nbytes``
    all-reduce (each rank's medians combined with MAX: the slowest link decides). Each timed
    all-reduce starts after a barrier, so a rank that arrives first does not count its wait for
    the others as link latency (at two workers AR and AG move the same bytes and ``auto``
    decides on latency alone).
    """
    n = ctx.world_size
    if not ctx.distributed or n == 1:
        return (math.inf, 0.0)
    device = ctx.device

    def timed(numel: int) -> float:
        buf = torch.zeros(numel, dtype=torch.float32, device=device)
        dist.all_reduce(buf)  # warm-up
        times = []
        for _ in range(repeats):
            dist.barrier()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            dist.all_reduce(buf)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    small, big = timed(1), timed(nbytes // VALUE_BYTES)
    both = torch.tensor([small, big], dtype=torch.float64, device=device)
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    return link_from_probe(float(both[0]), float(both[1]), nbytes, n)
