"""Gradient compression inside the DDP communication hook (options: core/compression_spec.py).

Each worker's bucket arrives here already weighted by its batch share (w_i g_i, sync.py), so
every option reduces with SUM and the weighting for unequal batches composes with it (the
compression sees the contribution the worker actually makes). Error-feedback state is kept per
*parameter* (by its index in the job's parameter list), not per DDP bucket: DDP rebuilds its
buckets after the first step (and again in a restarted process), so per-bucket state would not
survive a restart; per-parameter state does, which is what makes resume exact.

- fp16/bf16: cast, SUM all-reduce, cast back (no error feedback).
- top-k (``topk``, ``adaptive``): a = w_i g_i + r_i (r_i the residual; with momentum SGD
  s x w_i g_i, and the result is turned into the G the optimizer needs: momentum_fold.py); per
  parameter the k = ceil(ratio x numel) largest |a| entries are sent and r_i <- a with those
  entries zeroed, so sent + residual = a exactly. AG: one all-gather of values and one of int32
  indices, summed in rank order (the same bits on every rank). AR: the designated worker
  (rank = step mod n) chooses the indices from its own a and broadcasts them; every worker
  sends its a at those indices in one SUM all-reduce. Parameters of 2^16 elements or more
  select with a sampled threshold (fast_topk_select, seeded by job seed, step and parameter:
  the same on every run) and torch.topk among the candidates: the same k as torch.topk over
  all of a, several times faster on a CPU. ``auto`` takes the faster of the two measured at
  start (``probe_topk_exchange``; ``TopkExchange.choice``), and at another ratio the cost
  model's (``collective``).
- PowerSGD (rank r, per weight matrix M = a viewed as rows x rest): P = M Q (Q warm-started
  from the previous step, first drawn from a generator seeded by the job seed and the
  parameter's index), SUM all-reduce P, orthonormalise (QR), Q_i = M^T P, local error
  e_i = M - P Q_i^T, SUM all-reduce Q; the result is P (Σ Q_i)^T. Vectors (and matrices where
  r(rows+cols) >= numel) go dense in the second all-reduce. Two collectives per bucket: the
  first is waited for inside the hook.

``bytes_sent`` counts, from the tensor sizes, what this worker sends under the ring
(all-reduce, all-gather) and tree (broadcast) algorithms (kplan/core/compression_spec.py); it
is not measured on the wire. The compression gain |C(a)|² / |a|² (sent over error-compensated,
this worker's local values) drives the adaptive ratio (adaptive.py).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NotRequired, TypedDict

import torch  # noqa: TID253 (torch is the runtime's core dependency)
import torch.distributed as dist  # noqa: TID253

from kplan.core.compression_spec import (
    INDEX_BYTES,
    VALUE_BYTES,
    Compression,
    allgather_bytes,
    broadcast_bytes,
    powersgd_matrix,
    ring_allreduce_bytes,
    topk_collective,
    topk_count,
    warmup_ratio,
)
from kplan.core.errors import InputError
from kplan.runtime.compression.adaptive import AdaptiveRatio, AdaptiveState
from kplan.runtime.compression.kernels import (
    all_gather_topk,
    combine_gathered,
    orthonormalise,
    scatter_reduced,
    split_sent,
    topk_select,
)
from kplan.runtime.compression.probe import TopkExchange
from kplan.runtime.distributed import Context
from kplan.runtime.momentum_fold import MomentumFold, unfolded_warning

Future = torch.futures.Future


# --- the compressor ---------------------------------------------------------------------------


class CompressorState(TypedDict):
    """A :class:`Compressor`'s part of a rank's checkpoint: its error feedback by bucket index
    (tensors on the CPU), the adaptive ratio's window, auto's network figures and top-k's
    exchange timing (``TopkExchange``'s fields in order)."""

    spec: str
    residual: dict[int, torch.Tensor]
    q_memory: dict[int, torch.Tensor]
    error: dict[int, torch.Tensor]
    adaptive: NotRequired[AdaptiveState | None]
    network: NotRequired[list[float] | None]
    exchange: NotRequired[tuple[float, float, float, int, int] | None]


class Compressor:
    """Compresses and reduces weighted gradient buckets; holds the error-feedback state."""

    def __init__(
        self,
        spec: Compression,
        params: Sequence[torch.Tensor],
        ctx: Context,
        seed: int = 0,
        network: tuple[float, float] | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        precision: str = "fp32",
        exchange: TopkExchange | None = None,
    ) -> None:
        self.spec = spec
        self.params = list(params)
        self.ctx = ctx
        self.seed = seed
        self.network = network
        """(bandwidth bytes/s, latency s) measured at start, for ``auto``; None otherwise."""
        self.exchange = exchange
        """AR-Topk against AG-Topk measured at start, for ``auto``; None otherwise."""
        self.adaptive = (
            AdaptiveRatio(spec.min_ratio, spec.max_ratio) if spec.kind == "adaptive" else None
        )
        self._ratio = spec.ratio
        self.residual: dict[int, torch.Tensor] = {}
        self.q_memory: dict[int, torch.Tensor] = {}
        self.error: dict[int, torch.Tensor] = {}
        self.step = 0
        self.dense = False
        self.bytes_sent = 0.0
        self.dense_bytes = 0.0
        self.blocked_s = 0.0
        """Seconds this step's hooks waited in the collectives they block on (PowerSGD's P
        round, AR-Topk's index broadcast): host-timed, on a CPU device only."""
        self.sq_in = self._zero()
        self.sq_out = self._zero()
        """This step's local |a|² and |C(a)|² (0-d float64 on the device: no host sync)."""
        self.collectives: set[str] = set()
        self.stats: torch.Tensor | None = None
        """The reduced statistics vector of the bucket that carried it."""
        self._stats_fn: Callable[[], torch.Tensor] | None = None
        self._pending: collections.deque[_Round] = collections.deque()
        """Rounds launched whose decode waits for the calling thread (``decodes_on_caller``)."""
        self.momentum: MomentumFold | None = None
        """Top-k and adaptive with momentum SGD: EF at the SGD-equivalent step; else None."""
        if spec.sparse and optimizer is not None and MomentumFold.needed(optimizer):
            MomentumFold.check(optimizer, spec.spec())
            if precision == "fp16":
                raise InputError(
                    f"compression {spec.spec()} with momentum SGD cannot run under fp16 loss "
                    "scaling (its error feedback would mix loss scales)",
                    "use precision bf16 or fp32, or compression powersgd:RANK",
                )
            self.momentum = MomentumFold(optimizer, self.params)
        self.warning: str | None = None
        """A caveat of this setting, printed once at start (rank 0)."""
        if spec.sparse and optimizer is not None and self.momentum is None:
            self.warning = unfolded_warning(spec.spec(), optimizer)
        if self.warning is not None and ctx.rank == 0:
            print(self.warning, file=sys.stderr, flush=True)

    @property
    def ratio(self) -> float:
        """The top-k ratio in use (adaptive: its current value; a warm-up: this step's)."""
        if self.adaptive is not None:
            return self.adaptive.ratio
        return warmup_ratio(self._ratio, self.spec.warmup, self.step)

    @property
    def active(self) -> bool:
        """Whether this step's buckets go through here (else the dense weighted all-reduce)."""
        return self.spec.kind != "none" and not self.dense and self.ctx.world_size > 1

    def begin_step(self, step: int, dense: bool, weight: float = 1.0) -> None:
        """Start a step; ``weight``: this worker's batch share b_i/B (the buckets carry it)."""
        self.step = step
        self.dense = dense
        if self.momentum is not None:
            self.momentum.weight = weight
        self.bytes_sent = 0.0
        self.dense_bytes = 0.0
        self.blocked_s = 0.0
        self.sq_in = self._zero()
        self.sq_out = self._zero()
        self.collectives = set()
        self._pending.clear()  # a step that failed part-way leaves rounds nobody waits for

    @property
    def times_blocking(self) -> bool:
        """Whether ``blocked_s`` is timed: on a CPU device a collective returns when done; a
        CUDA one returns at enqueue, so there it is not."""
        return self.ctx.device.type == "cpu"

    @contextlib.contextmanager
    def _blocking(self) -> Iterator[None]:
        """Time a collective the hook waits for (``times_blocking``)."""
        if not self.times_blocking:
            yield
            return
        start = time.perf_counter()
        try:
            yield
        finally:
            self.blocked_s += time.perf_counter() - start

    @property
    def decodes_on_caller(self) -> bool:
        """Whether a round's decode (decompression, error-feedback updates) runs on the thread
        that calls :meth:`reduce` rather than as a callback of its collective.

        On a CPU device the callback would run on the backend's (gloo's) thread, competing for
        the worker's cores with the main thread that compresses the next bucket, and the waits
        at PowerSGD's P round turn that contention into stalls of both workers (2 emulated
        hosts at 1 Gbit/s, bench/cpu_decode.py: PowerSGD rank 4's mean step 0.69-0.75x that of
        the callbacks, top-k 0.01 0.83-0.98x, fp16 1.00-1.03x). So there the collectives still
        run asynchronously, and each round is decoded by the next :meth:`reduce` once its
        collectives are done, or by the step's final one, which waits for them. On CUDA a
        callback only enqueues kernels: it stays a callback."""
        return self.ctx.device.type == "cpu"

    def _zero(self) -> torch.Tensor:
        return torch.zeros((), dtype=torch.float64, device=self.ctx.device)

    def count_dense(self, numel: int, element_size: int) -> None:
        """A bucket reduced dense (by sync.py's hook)."""
        nbytes = ring_allreduce_bytes(numel * element_size, self.ctx.world_size)
        self.bytes_sent += nbytes
        self.dense_bytes += nbytes

    def reduce(
        self,
        flat: torch.Tensor,
        indices: list[int],
        stats_fn: Callable[[], torch.Tensor] | None = None,
        final: bool = True,
    ) -> Future[torch.Tensor]:
        """SUM over workers of the weighted ``flat`` (params ``indices``, in buffer order),
        compressed. ``stats_fn`` (the last bucket's) builds the step's statistics vector after
        this bucket was compressed (so its gain counts); it is SUM-all-reduced alongside and
        left in :attr:`stats`. ``final``: no other bucket follows this step, so every round
        still pending is decoded before returning (``decodes_on_caller``: else a future
        returned here would wait for a later call that never comes)."""
        self._decode(wait=False)
        self.dense_bytes += ring_allreduce_bytes(flat.numel() * VALUE_BYTES, self.ctx.world_size)
        self._stats_fn = stats_fn
        self.stats = None
        kind = self.spec.kind
        if kind in ("fp16", "bf16"):
            out = self._cast(flat)
        elif kind == "powersgd":
            out = self._powersgd(flat, indices)
        else:
            out = self._topk(flat, indices)
        if final:
            self._decode(wait=True)
        return out

    def _decode(self, wait: bool) -> None:
        """Decode the pending rounds in launch order: those whose collectives are done, or
        (``wait``) all of them, waiting. A collective's error goes to that round's future."""
        while self._pending:
            r = self._pending[0]
            if not wait and not all(f.done() for f in r.futures):
                return
            self._pending.popleft()
            try:
                torch.futures.wait_all(r.futures)
                r.result.set_result(r.decode(None))
            except Exception as e:  # DDP re-raises it where it waits for the bucket
                r.result.set_exception(e)  # type: ignore[arg-type]  # torch types it as T

    def _launch(
        self, works: list[Any], then: Callable[[Any], torch.Tensor]
    ) -> Future[torch.Tensor]:
        """Add the statistics all-reduce (if due) and chain ``then`` after all of ``works``."""
        if self._stats_fn is not None:
            stats = self._stats_fn()
            works.append(dist.all_reduce(stats, op=dist.ReduceOp.SUM, async_op=True))
            self.stats = stats
        futures = [w.get_future() for w in works]
        if not self.decodes_on_caller:
            return torch.futures.collect_all(futures).then(then)
        result: Future[torch.Tensor] = Future()
        self._pending.append(_Round(futures, then, result))
        return result

    # --- options ---

    def _cast(self, flat: torch.Tensor) -> Future[torch.Tensor]:
        dtype = torch.float16 if self.spec.kind == "fp16" else torch.bfloat16
        payload = flat.to(dtype)
        works = [dist.all_reduce(payload, op=dist.ReduceOp.SUM, async_op=True)]
        self.bytes_sent += ring_allreduce_bytes(payload.numel() * 2, self.ctx.world_size)
        self.collectives.add(self.spec.kind)

        def done(_: Any) -> torch.Tensor:
            return payload.to(flat.dtype)

        return self._launch(works, done)

    def _segments(self, indices: list[int]) -> list[tuple[int, int, int]]:
        out, offset = [], 0
        for j in indices:
            n = self.params[j].numel()
            out.append((j, offset, n))
            offset += n
        return out

    def _compensated(self, flat: torch.Tensor, segs: list[tuple[int, int, int]]) -> torch.Tensor:
        """a = residual + the weighted gradient (with momentum SGD: s times it, MomentumFold)
        per parameter."""
        a = flat.clone()
        mc = self.momentum
        for j, o, n in segs:
            if mc is not None:
                inc = mc.increment(j, flat[o : o + n])
                if inc is not None:
                    a[o : o + n] = inc
            r = self.residual.get(j)
            if r is not None:
                a[o : o + n].add_(r)
        return a

    def _inverses(
        self, segs: list[tuple[int, int, int]]
    ) -> list[tuple[int, int, float, torch.Tensor | None]]:
        """Per folded parameter (offset, numel, c, z): G = c (D - z) (MomentumFold)."""
        out: list[tuple[int, int, float, torch.Tensor | None]] = []
        if self.momentum is None:
            return out
        for j, o, n in segs:
            inv = self.momentum.inverse(j)
            if inv is not None:
                out.append((o, n, *inv))
        return out

    @staticmethod
    def _apply_inverse(
        out: torch.Tensor, inverses: list[tuple[int, int, float, torch.Tensor | None]]
    ) -> torch.Tensor:
        for o, n, c, z in inverses:
            seg = out[o : o + n]
            if z is not None:
                seg.sub_(z)
            if c != 1.0:
                seg.mul_(c)
        return out

    def dense_momentum(
        self, flat: torch.Tensor, indices: list[int]
    ) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """A dense step under :class:`MomentumFold` (call before ``flat``, the weighted
        gradient, is reduced): s w g' minus the w g sent stays in the residual; the returned
        function turns the reduced gradient into the G the optimizer needs. None without it."""
        mc = self.momentum
        if mc is None or not self.spec.sparse:
            return None
        segs = self._segments(indices)
        for j, o, n in segs:
            seg = flat[o : o + n]
            inc = mc.increment(j, seg)
            if inc is None:
                continue
            kept = inc.sub_(seg)  # increment() returned a new tensor
            r = self.residual.get(j)
            self.residual[j] = kept if r is None else r.add_(kept)
        inverses = self._inverses(segs)
        return lambda reduced: self._apply_inverse(reduced, inverses)

    def _topk(self, flat: torch.Tensor, indices: list[int]) -> Future[torch.Tensor]:
        world, ratio = self.ctx.world_size, self.ratio
        segs = self._segments(indices)
        a = self._compensated(flat, segs)
        total_k = sum(topk_count(n, ratio) for _, _, n in segs)
        collective = self.collective(ratio)
        self.collectives.add(collective)
        if collective == "ag" or world == 1:
            idx = self._local_topk(a, segs, ratio)
        else:
            root = self.step % world
            if self.ctx.rank == root:
                idx = self._local_topk(a, segs, ratio).to(torch.int32)
            else:
                idx = torch.empty(total_k, dtype=torch.int32, device=a.device)
            with self._blocking():
                dist.broadcast(idx, src=root)  # waited for: the values depend on it
            self.bytes_sent += broadcast_bytes(INDEX_BYTES * total_k, world)
            idx = idx.long()
        values, residual = split_sent(a, idx)
        for j, o, n in segs:
            self.residual[j] = residual[o : o + n].clone()
        inverses = self._inverses(segs)
        self.sq_in = self.sq_in + torch.dot(a, a).double()
        self.sq_out = self.sq_out + torch.dot(values, values).double()
        numel = flat.numel()
        works: list[Any] = []
        if collective == "ag" and world > 1:
            vals, ids = all_gather_topk(works, values, idx.to(torch.int32), world)
            self.bytes_sent += allgather_bytes((VALUE_BYTES + INDEX_BYTES) * total_k, world)

            def gathered(_: Any) -> torch.Tensor:
                out = combine_gathered(numel, list(zip(ids, vals, strict=True)), flat)
                return self._apply_inverse(out, inverses)

            return self._launch(works, gathered)
        works.append(dist.all_reduce(values, op=dist.ReduceOp.SUM, async_op=True))
        self.bytes_sent += ring_allreduce_bytes(VALUE_BYTES * total_k, world)

        def reduced(_: Any) -> torch.Tensor:
            return self._apply_inverse(scatter_reduced(numel, idx, values), inverses)

        return self._launch(works, reduced)

    def collective(self, ratio: float) -> str:
        """Top-k's collective at ``ratio``: the spec's; for ``auto`` the faster one measured at
        start (``probe_topk_exchange``, ``TopkExchange.choice``) at that ratio, else (another
        ratio: a warm-up's first steps, adaptive's changes) the wire cost function
        (``compress.topk_collective``, as ``planner.compression.traffic`` calls it) for the
        whole gradient (DDP's bucket layout changes) on the link probed at start."""
        if self.spec.collective != "auto":
            return self.spec.collective
        if self.exchange is not None and self.exchange.ratio == ratio and self.exchange.choice:
            return self.exchange.choice
        bw, lat = self.network or (1e9, 1e-4)
        total = sum(p.numel() for p in self.params)
        return topk_collective(total, ratio, self.ctx.world_size, bw, lat).choice

    def _local_topk(
        self, a: torch.Tensor, segs: list[tuple[int, int, int]], ratio: float
    ) -> torch.Tensor:
        parts = [
            topk_select(a[o : o + n], topk_count(n, ratio), self._select_seed(j)) + o
            for j, o, n in segs
        ]
        return torch.cat(parts)

    def _select_seed(self, j: int) -> int:
        """Seed of parameter ``j``'s selection sample at this step (job seed, step, index)."""
        return (self.seed * 1_000_003 + self.step) * 1_000_033 + j

    def _powersgd(self, flat: torch.Tensor, indices: list[int]) -> Future[torch.Tensor]:
        world, rank = self.ctx.world_size, self.spec.rank
        segs = self._segments(indices)
        mats: list[tuple[int, int, int, torch.Tensor, torch.Tensor]] = []  # j, o, n, M, Q
        dense: list[tuple[int, int]] = []
        for j, o, n in segs:
            shape = tuple(self.params[j].shape)
            rows, cols = powersgd_matrix(shape)
            r = min(rank, rows, cols)
            if len(shape) < 2 or r * (rows + cols) >= n:
                dense.append((o, n))
                continue
            m = flat[o : o + n].clone()
            err = self.error.get(j)
            if err is not None:
                m.add_(err)
            q = self.q_memory.get(j)
            if q is None:
                gen = torch.Generator().manual_seed(self.seed * 1_000_003 + j)
                q = torch.randn(cols, r, generator=gen, dtype=flat.dtype).to(flat.device)
            mats.append((j, o, n, m.view(rows, cols), q))
        self.collectives.add("powersgd")
        if mats:
            p_all = torch.cat([(mm @ q).reshape(-1) for _, _, _, mm, q in mats])
            with self._blocking():
                dist.all_reduce(p_all, op=dist.ReduceOp.SUM)  # waited for: Q needs it
            self.bytes_sent += ring_allreduce_bytes(VALUE_BYTES * p_all.numel(), world)
        q_parts, hats, offset = [], [], 0
        for j, _o, _n, mm, q in mats:
            size = mm.shape[0] * q.shape[1]
            p_hat = orthonormalise(p_all[offset : offset + size].view(mm.shape[0], q.shape[1]))
            offset += size
            q_local = mm.t() @ p_hat
            approx = p_hat @ q_local.t()
            self.error[j] = (mm - approx).reshape(-1)
            self.sq_in = self.sq_in + (mm * mm).sum().double()
            self.sq_out = self.sq_out + (approx * approx).sum().double()
            q_parts.append(q_local.reshape(-1))
            hats.append(p_hat)
        payload = torch.cat([*q_parts, *(flat[o : o + n] for o, n in dense)])
        works = [dist.all_reduce(payload, op=dist.ReduceOp.SUM, async_op=True)]
        self.bytes_sent += ring_allreduce_bytes(VALUE_BYTES * payload.numel(), world)

        def done(_: Any) -> torch.Tensor:
            out = torch.empty_like(flat)
            at = 0
            for (j, o, n, mm, _q), p_hat in zip(mats, hats, strict=True):
                size = mm.shape[1] * p_hat.shape[1]
                q_sum = payload[at : at + size].view(mm.shape[1], p_hat.shape[1])
                at += size
                out[o : o + n] = (p_hat @ q_sum.t()).reshape(-1)
                self.q_memory[j] = q_sum.clone()
            for o, n in dense:
                out[o : o + n] = payload[at : at + n]
                at += n
            return out

        return self._launch(works, done)

    # --- after the step -----------------------------------------------------------------------

    def observe_gain(self, sq_in: float, sq_out: float) -> float | None:
        """The all-gathered |a|² and |C(a)|² of a compressed step; adaptive: the window's gain
        when this step closed one (``AdaptiveRatio.observe``), else None."""
        if self.adaptive is None:
            return None
        return self.adaptive.observe(sq_in, sq_out)

    def state_dict(self) -> CompressorState:
        """This worker's error-feedback state (per rank: the residuals differ)."""
        return {
            "spec": self.spec.spec(),
            "residual": {j: t.detach().cpu().clone() for j, t in self.residual.items()},
            "q_memory": {j: t.detach().cpu().clone() for j, t in self.q_memory.items()},
            "error": {j: t.detach().cpu().clone() for j, t in self.error.items()},
            "adaptive": None if self.adaptive is None else self.adaptive.state_dict(),
            "network": None if self.network is None else list(self.network),
            "exchange": None if self.exchange is None else dataclasses.astuple(self.exchange),
        }

    def load_state_dict(self, state: CompressorState) -> bool:
        """Restore :meth:`state_dict`'s values; False (nothing loaded) for another spec."""
        if state.get("spec") != self.spec.spec():
            return False
        device = self.ctx.device
        self.residual = {int(j): t.to(device) for j, t in state["residual"].items()}
        self.q_memory = {int(j): t.to(device) for j, t in state["q_memory"].items()}
        self.error = {int(j): t.to(device) for j, t in state["error"].items()}
        adaptive, network = state.get("adaptive"), state.get("network")
        exchange = state.get("exchange")
        if self.adaptive is not None and adaptive is not None:
            self.adaptive.load_state_dict(adaptive)
        if self.network is not None and network is not None:
            # auto's AR/AG choices continue as before the restart (not a fresh measurement)
            bandwidth, latency = network
            self.network = (float(bandwidth), float(latency))
        if self.exchange is not None and exchange is not None:
            ratio, ar_s, ag_s, ar_wins, pairs = exchange
            self.exchange = TopkExchange(
                float(ratio), float(ar_s), float(ag_s), int(ar_wins), int(pairs)
            )
        return True


@dataclasses.dataclass
class _Round:
    """A launched round whose decode waits for the caller's thread (``decodes_on_caller``)."""

    futures: list[Future[Any]]
    decode: Callable[[Any], torch.Tensor]
    result: Future[torch.Tensor]
