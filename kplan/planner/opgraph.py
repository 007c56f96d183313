"""The operator graph of one training step: what a profile records and the op-level model reads.

A training step is a bag of operator calls (forward, backward, optimizer). Calls of the same
operator on the same shapes and dtype are folded into one ``OpCall`` with a ``count``, so the
record stays small (a ResNet-50 step has ~50 distinct convolutions, not 160 calls).

``dims`` is the operator's shape in the form its class is modelled in::

    matmul     (B, M, N, K)          C[B,M,N] = A[B,M,K] @ W[B,K,N]; B = 1 for mm/addmm/linear
    conv       (B, C_in, C_out, kernel, size, stride, padding)   square kernel and input
    attention  (B*heads, L_q, L_k, head_dim)
    softmax, norm, elementwise, reduction   (rows, row_length)  the last dim is the row
    embedding  (lookups, dim)
    optimizer  (elements,)                  one fused or per-tensor parameter update
    other      (elements,)                  anything else (copies, views that move memory, ...)

``flops`` and ``bytes`` (read plus written, at the call's dtype) are for ONE call; the step's
totals multiply by ``count``. Document shape (inside a profile, key ``opgraph``; schema of the
profile 1.4)::

    {"local_batch": 32, "precision": "fp32", "how": "traced on meta with TorchDispatchMode",
     "ops": [{"kind": "matmul", "op": "aten.mm", "phase": "forward", "dtype": "fp32",
              "dims": [1, 32, 1000, 2048], "flops": 131072000, "bytes": 8450048, "count": 1}, ...]}

Pure: no I/O, no torch. The tracer is ``kplan.profiler.opgraph_trace``; the model that times a
graph on a GPU is ``kplan.planner.opmodel``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from kplan.core.errors import DataFileError

KINDS: Final = (
    "matmul",
    "conv",
    "attention",
    "softmax",
    "norm",
    "elementwise",
    "reduction",
    "embedding",
    "optimizer",
    "other",
)
DIMS_PER_KIND: Final = {
    "matmul": 4,
    "conv": 7,
    "attention": 4,
    "softmax": 2,
    "norm": 2,
    "elementwise": 2,
    "reduction": 2,
    "embedding": 2,
    "optimizer": 1,
    "other": 1,
}
PHASES: Final = ("forward", "backward", "optimizer")
DTYPES: Final = ("fp32", "tf32", "fp16", "bf16", "fp64", "int64", "int32", "int8", "bool")
MAX_OPS: Final = 20_000  # distinct calls recorded; a step with more is summarised as "other"
MAX_COUNT: Final = 10**9
MAX_DIM: Final = 2**40
MAX_WORK: Final = 1e21  # flops or bytes of one call


@dataclass(frozen=True)
class OpCall:
    """One operator applied ``count`` times in a step on the same shapes and dtype."""

    kind: str
    op: str  # the dispatcher's name, e.g. "aten.convolution_backward" (for the reader)
    phase: str
    dtype: str
    dims: tuple[int, ...]
    flops: float  # of one call
    bytes: float  # read + written by one call
    count: int = 1

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.phase not in PHASES:
            raise ValueError(f"phase {self.phase!r} is not one of {', '.join(PHASES)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        if len(self.dims) != DIMS_PER_KIND[self.kind]:
            raise ValueError(
                f"a {self.kind} call has {DIMS_PER_KIND[self.kind]} dims, got {len(self.dims)}"
            )
        if any(d < 0 or d > MAX_DIM for d in self.dims):
            raise ValueError(f"dims {self.dims} must be in [0, 2**40]")
        for name, value in (("flops", self.flops), ("bytes", self.bytes)):
            if not (math.isfinite(value) and 0 <= value <= MAX_WORK):
                raise ValueError(f"{name}={value!r} must be in [0, 1e21]")
        if not 1 <= self.count <= MAX_COUNT:
            raise ValueError(f"count={self.count} must be in [1, 10**9]")

    def key(self) -> tuple[str, str, str, str, tuple[int, ...]]:
        return (self.kind, self.op, self.phase, self.dtype, self.dims)


@dataclass(frozen=True)
class OpGraph:
    """The operator calls of one optimizer step at ``local_batch`` samples per GPU."""

    ops: tuple[OpCall, ...]
    local_batch: int
    precision: str  # the step's precision (kplan.core.precision), not each call's dtype
    how: str  # how it was traced: device, tool, what the step ran

    def total(self, what: str = "flops", phase: str | None = None) -> float:
        """The step's total flops or bytes, of one phase or all."""
        return sum(
            float(getattr(o, what)) * o.count for o in self.ops if phase is None or o.phase == phase
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "local_batch": self.local_batch,
            "precision": self.precision,
            "how": self.how,
            "ops": [
                {
                    "kind": o.kind,
                    "op": o.op,
                    "phase": o.phase,
                    "dtype": o.dtype,
                    "dims": list(o.dims),
                    "flops": o.flops,
                    "bytes": o.bytes,
                    "count": o.count,
                }
                for o in self.ops
            ],
        }


def fold(calls: Iterable[OpCall]) -> tuple[OpCall, ...]:
    """Fold calls with the same (kind, op, phase, dtype, dims) into one with the summed count."""
    merged: dict[tuple[str, str, str, str, tuple[int, ...]], OpCall] = {}
    for call in calls:
        seen = merged.get(call.key())
        merged[call.key()] = (
            call
            if seen is None
            else OpCall(
                seen.kind,
                seen.op,
                seen.phase,
                seen.dtype,
                seen.dims,
                seen.flops,
                seen.bytes,
                min(seen.count + call.count, MAX_COUNT),
            )
        )
    return tuple(merged.values())


def opgraph_from_dict(doc: Any, source: str) -> OpGraph:
    """Validate an ``opgraph`` section; raise DataFileError naming the bad entry."""
    if not isinstance(doc, dict):
        raise DataFileError(f"{source}: 'opgraph' must be an object", hint="fix or remove it")
    ops = doc.get("ops")
    if not isinstance(ops, list) or not ops:
        raise DataFileError(
            f"{source}: 'opgraph.ops' must be a non-empty list", hint="re-run kplan profile"
        )
    if len(ops) > MAX_OPS:
        raise DataFileError(
            f"{source}: 'opgraph.ops' has {len(ops)} entries, more than {MAX_OPS}",
            hint="re-run kplan profile (it folds identical calls)",
        )
    calls = tuple(_call(row, source, i) for i, row in enumerate(ops))
    batch = doc.get("local_batch")
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= 2**24:
        raise DataFileError(
            f"{source}: 'opgraph.local_batch' must be an integer in [1, 2**24], got {batch!r}",
            hint="fix or remove the opgraph",
        )
    precision, how = doc.get("precision"), doc.get("how", "")
    if not isinstance(precision, str) or not isinstance(how, str) or len(how) > 512:
        raise DataFileError(
            f"{source}: 'opgraph.precision' and 'opgraph.how' must be strings",
            hint="fix or remove the opgraph",
        )
    return OpGraph(ops=calls, local_batch=batch, precision=precision, how=how)


def _call(row: Any, source: str, index: int) -> OpCall:
    where = f"{source}: opgraph.ops[{index}]"
    if not isinstance(row, dict):
        raise DataFileError(f"{where} must be an object", hint="fix or remove the opgraph")
    try:
        dims = row["dims"]
        if not isinstance(dims, list) or not all(_is_int(d) for d in dims):
            raise ValueError(f"dims {dims!r} must be a list of integers")
        count = row.get("count", 1)
        if not _is_int(count):
            raise ValueError(f"count {count!r} must be an integer")
        flops, nbytes = row["flops"], row["bytes"]
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (flops, nbytes)):
            raise ValueError("flops and bytes must be numbers")
        names = [row["kind"], row["op"], row["phase"], row["dtype"]]
        if not all(isinstance(n, str) and len(n) <= 128 for n in names):
            raise ValueError("kind, op, phase and dtype must be short strings")
        return OpCall(
            kind=names[0],
            op=names[1],
            phase=names[2],
            dtype=names[3],
            dims=tuple(dims),
            flops=float(flops),
            bytes=float(nbytes),
            count=count,
        )
    except KeyError as err:
        raise DataFileError(f"{where}: missing {err}", hint="fix or remove the opgraph") from None
    except ValueError as err:
        raise DataFileError(f"{where}: {err}", hint="fix or remove the opgraph") from None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
