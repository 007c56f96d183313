"""The work of one operator call: its FLOPs and the bytes it reads and writes, by shape.

Shared by the op-level model (``kplan.planner.opmodel``), the NeuSight data reader and the
fitter (``scripts/``). A multiply-add counts as two FLOPs.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence


def matmul_work(dims: Sequence[int], itemsize: int = 4) -> tuple[float, float]:
    """(flops, bytes) of C[B,M,N] = A[B,M,K] @ W[B,K,N]."""
    b, m, n, k = (float(d) for d in dims)
    return 2.0 * b * m * n * k, itemsize * b * (m * k + k * n + m * n)


def conv_out(size: int, kernel: int, stride: int, padding: int) -> int:
    return max(1, (size + 2 * padding - kernel) // max(1, stride) + 1)


def conv_work(dims: Sequence[int], itemsize: int = 4) -> tuple[float, float]:
    """(flops, bytes) of a square conv, as its implicit GEMM."""
    b, cin, cout, k, size, stride, pad = (int(d) for d in dims)
    out = conv_out(size, k, stride, pad)
    flops = 2.0 * b * out * out * cout * cin * k * k
    nbytes = itemsize * (b * cin * size * size + cout * cin * k * k + b * cout * out * out)
    return flops, float(nbytes)


def vector_work(op: str, dims: Sequence[int], itemsize: int = 4) -> tuple[float, float]:
    """(flops, bytes) of a pass over (rows, row_length): binary ops read two tensors."""
    n = float(dims[0]) * float(dims[-1])
    name = op.rsplit(".", 1)[-1]
    tensors = 3 if name in ("add", "mul", "div", "pow", "sub") else 2
    per = {"softmax": 5.0, "ln": 8.0, "layer_norm": 8.0}.get(name, 1.0)
    return per * n, float(itemsize) * tensors * n
