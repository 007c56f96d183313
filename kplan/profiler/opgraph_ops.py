"""One dispatcher call -> one ``OpCall`` (kplan/planner/opgraph.py): kind, dims, FLOPs, bytes.

Imported only when a step is traced (it imports torch). The classes and their ``dims`` are the
ones opgraph.py documents. FLOPs count a multiply-add as two; for the memory-bound classes they
are a per-element estimate (the op-level model times those from their bytes):

- matmul: mm, addmm, bmm, baddbmm (and linear/matmul, which reach the dispatcher as those).
- conv: convolution and convolution_backward (each gradient it computes costs one forward);
  ``dims`` are the square-equivalent kernel and input side (the root of their areas).
- attention: the fused scaled-dot-product kernels and their backward (four matmuls of
  ``L_q x L_k x head_dim`` forward, eight backward; a causal mask keeps about half the pairs).
- softmax, norm (layer, batch, group norm and their backward), reduction (ops tagged
  ``reduction`` by torch, and the NLL loss), elementwise (ops tagged ``pointwise``, dropout),
  embedding (forward and dense backward).
- optimizer: every call made inside ``optimizer.step()`` (the ``_foreach_*`` and fused kernels,
  or per-tensor updates), ``dims`` = the elements it updates.
- dropped: views and other metadata-only calls, reads of a scalar to the host, profiler marks,
  anything outside the ``aten`` namespace (collectives included: they are timed by the profile).
- other: the rest (copies and casts, concatenation, fills, indexing), ``dims`` = elements moved.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch  # noqa: TID253 (imported only when a step is traced)
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: TID253

from kplan.planner.opgraph import OpCall

_DTYPES = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float64: "fp64",
    torch.int64: "int64",
    torch.int32: "int32",
    torch.int8: "int8",
    torch.uint8: "int8",
    torch.bool: "bool",
}
_BY_SIZE = {1: "int8", 2: "fp16", 4: "fp32", 8: "fp64"}

MATMUL = {"mm", "addmm", "bmm", "baddbmm"}
CONV = {"convolution", "convolution_backward", "cudnn_convolution", "mkldnn_convolution"}
ATTENTION = {
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_flash_attention_forward",
    "_efficient_attention_forward",
}
SOFTMAX = {"_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data"}
NORM_LAST = {"native_layer_norm", "native_layer_norm_backward"}
NORM_CHANNEL = {
    "native_batch_norm",
    "_native_batch_norm_legit",
    "_native_batch_norm_legit_functional",
    "_native_batch_norm_legit_no_training",
    "native_batch_norm_backward",
    "cudnn_batch_norm",
    "cudnn_batch_norm_backward",
    "miopen_batch_norm",
}
NORM_GROUP = {"native_group_norm", "native_group_norm_backward"}
EMBEDDING = {"embedding", "embedding_dense_backward", "_embedding_bag"}
REDUCTION_EXTRA = {"nll_loss_forward", "nll_loss2d_forward", "_local_scalar_dense"}
ELEMENTWISE_EXTRA = {"native_dropout", "native_dropout_backward", "nll_loss_backward"}
DROP = {"_local_scalar_dense", "lift_fresh", "lift_fresh_copy", "_unsafe_view", "empty_like"}
DROP_PREFIX = ("empty", "_record_function", "sym_", "_assert", "resize_")
# FLOPs per element of the memory-bound classes (an estimate: their time is their bytes).
PER_ELEMENT = {"softmax": 5.0, "norm": 8.0, "elementwise": 1.0, "reduction": 1.0, "other": 0.0}


def tensors(value: Any) -> Iterator[torch.Tensor]:
    """The tensors in an argument (lists and tuples flattened)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, list | tuple):
        for v in value:
            yield from tensors(v)


def nbytes(value: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors(value))


def dtype_name(t: torch.Tensor) -> str:
    return _DTYPES.get(t.dtype) or _BY_SIZE.get(t.element_size(), "fp32")


def is_dropped(func: Any) -> bool:
    """Views and metadata-only calls: no kernel of their own."""
    if func.namespace != "aten":
        return True
    name = func._schema.name.split("::")[-1]
    if name in DROP or name.startswith(DROP_PREFIX):
        return True
    returns = func._schema.returns
    return bool(returns) and all(
        r.alias_info is not None and not r.alias_info.is_write for r in returns
    )


def classify(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, phase: str, tf32: bool
) -> OpCall | None:
    """The call as an ``OpCall`` (count 1), or None when it is dropped."""
    if is_dropped(func):
        return None
    name = func._schema.name.split("::")[-1]
    ins = [t for t in tensors(list(args) + list(kwargs.values()))]
    outs = list(tensors(out))
    first = ins[0] if ins else (outs[0] if outs else None)
    if first is None:
        return None
    moved = float(sum(t.numel() * t.element_size() for t in ins + outs))
    op = f"aten.{func.__name__.removesuffix('.default')}"
    if phase == "optimizer":
        elements = sum(t.numel() for t in tensors(args[0])) if args else first.numel()
        return OpCall("optimizer", op, phase, dtype_name(first), (elements,), elements, moved)
    kind, dims, flops = _shape(name, func, args, ins, outs)
    dtype = dtype_name(first if kind in ("matmul", "conv", "attention", "embedding") else
                       (outs[0] if outs else first))  # fmt: skip
    if kind == "embedding":
        dtype = dtype_name(outs[0] if outs else first)
    if tf32 and dtype == "fp32" and kind in ("matmul", "conv", "attention"):
        dtype = "tf32"
    return OpCall(kind, op, phase, dtype, tuple(int(d) for d in dims), flops, moved)


def _shape(
    name: str, func: Any, args: tuple[Any, ...], ins: list[torch.Tensor], outs: list[torch.Tensor]
) -> tuple[str, tuple[int, ...], float]:
    """(kind, dims, flops of one call) of a kept call."""
    if name in MATMUL:
        return _matmul(name, args)
    if name in CONV:
        return _conv(name, args, outs)
    if name in ATTENTION or name.removesuffix("_backward") in ATTENTION:
        return _attention(name, func, args)
    if name in EMBEDDING:
        indices = args[1]
        dim = outs[0].shape[-1] if name == "embedding" else args[0].shape[-1]
        adds = 0.0 if name == "embedding" else indices.numel() * float(dim)
        return "embedding", (indices.numel(), dim), adds
    big = max(ins + outs, key=lambda t: t.numel())
    n = big.numel()
    if name in SOFTMAX:
        return "softmax", _rows(big), PER_ELEMENT["softmax"] * n
    if name in NORM_LAST:
        row = math.prod(args[1]) if name == "native_layer_norm" else math.prod(args[2])
        return "norm", (n // max(row, 1), row), PER_ELEMENT["norm"] * n
    if name in NORM_CHANNEL:
        channels = big.shape[1] if big.dim() > 1 else 1
        return "norm", (channels, n // max(channels, 1)), PER_ELEMENT["norm"] * n
    if name in NORM_GROUP:
        n_at, g_at = (3, 6) if name == "native_group_norm" else (5, 8)
        rows = int(args[n_at]) * int(args[g_at])
        return "norm", (rows, n // max(rows, 1)), PER_ELEMENT["norm"] * n
    tags = func.tags
    if torch.Tag.reduction in tags or name in REDUCTION_EXTRA:
        source = ins[0].numel()
        kept = max(outs[0].numel(), 1) if outs else 1
        return "reduction", (kept, source // kept), PER_ELEMENT["reduction"] * source
    if torch.Tag.pointwise in tags or name in ELEMENTWISE_EXTRA:
        return "elementwise", _rows(big), PER_ELEMENT["elementwise"] * n
    return "other", (n,), 0.0


def _attention(name: str, func: Any, args: tuple[Any, ...]) -> tuple[str, tuple[int, ...], float]:
    """A fused attention call: its QK^T and PV matmuls (4 L_q L_k head_dim FLOPs per head
    forward, twice that backward) over the (query, key) pairs it computes: all of them, or with
    a causal mask (``is_causal``, or a non-zero ``custom_mask_type``) only the key positions up
    to each query's (top-left aligned, as torch's ``is_causal``), about half. The arguments are
    read by their schema names (a backward's first tensor is the output's gradient)."""
    names = [a.name for a in func._schema.arguments]
    bound = dict(zip(names, args, strict=False))
    q, k = bound.get("query", args[0]), bound.get("key", args[1])
    bh, lq, lk, hd = math.prod(q.shape[:-2]), q.shape[-2], k.shape[-2], q.shape[-1]
    causal = bool(bound.get("is_causal", False)) or bool(bound.get("custom_mask_type", 0))
    flops = 4.0 * bh * hd * (causal_pairs(lq, lk) if causal else lq * lk)
    flops *= 2.0 if name.endswith("_backward") else 1.0
    return "attention", (bh, lq, lk, hd), flops


def causal_pairs(lq: int, lk: int) -> int:
    """(query, key) pairs a top-left-aligned causal mask keeps: query i sees keys 0..i."""
    inside = min(lq, lk)
    return inside * (inside + 1) // 2 + max(0, lq - lk) * lk


def _rows(t: torch.Tensor) -> tuple[int, int]:
    row = int(t.shape[-1]) if t.dim() else 1
    return (t.numel() // max(row, 1), row)


def _matmul(name: str, args: tuple[Any, ...]) -> tuple[str, tuple[int, ...], float]:
    a, b = (args[1], args[2]) if name in ("addmm", "baddbmm") else (args[0], args[1])
    if a.dim() == 3:
        batch, m, k = a.shape
    else:
        batch, (m, k) = 1, a.shape
    n = b.shape[-1]
    return "matmul", (batch, m, n, k), 2.0 * batch * m * n * k


def _conv(
    name: str, args: tuple[Any, ...], outs: list[torch.Tensor]
) -> tuple[str, tuple[int, ...], float]:
    """convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
    groups); convolution_backward(grad_out, input, weight, bias_sizes, stride, padding, dilation,
    transposed, output_padding, groups, output_mask)."""
    backward = name == "convolution_backward"
    if backward:
        grad_out, x, w = args[0], args[1], args[2]
        stride, padding, transposed, groups, mask = args[4], args[5], args[7], args[9], args[10]
    else:
        x, w = args[0], args[1]
        stride, padding = args[3], args[4]
        transposed, groups = (args[6], args[8]) if len(args) > 8 else (False, 1)
        grad_out = None
    spatial = tuple(x.shape[2:])
    kernel = tuple(w.shape[2:])
    c_in, c_out = int(x.shape[1]), int(w.shape[1] * groups if transposed else w.shape[0])
    out_elems = outs[0].numel() if grad_out is None else grad_out.numel()
    per_out = (c_in // groups) * math.prod(kernel)
    if transposed:  # each input element scatters over c_out/groups x kernel outputs
        per_out = (c_out // groups) * math.prod(kernel)
        out_elems = x.numel()
    flops = 2.0 * out_elems * per_out
    if backward:
        flops *= int(bool(mask[0])) + int(bool(mask[1]))
    side = round(math.prod(spatial) ** (1 / max(len(spatial), 1)))
    k_side = round(math.prod(kernel) ** (1 / max(len(kernel), 1)))
    s = int(stride[0]) if isinstance(stride, list | tuple) else int(stride)
    p = int(padding[0]) if isinstance(padding, list | tuple) else int(padding)
    return "conv", (int(x.shape[0]), c_in, c_out, k_side, side, s, p), flops


class Recorder(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Appends an ``OpCall`` for every kept aten call; tracks the step's phase."""

    def __init__(self, tf32: bool) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.calls: list[OpCall] = []
        self.phase = "forward"
        self.tf32 = tf32
        self.unread = 0  # calls whose arguments could not be read (left out)

    def optimizer_starts(self, *_: Any) -> None:
        self.phase = "optimizer"

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.phase == "forward" and torch._C._current_autograd_node() is not None:
            self.phase = "backward"
        try:
            call = classify(func, args, kwargs, out, self.phase, self.tf32)
        except (IndexError, TypeError, ValueError, AttributeError, RuntimeError):
            self.unread += 1
            call = None
        if call is not None:
            self.calls.append(call)
        return out
