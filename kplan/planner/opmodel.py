"""Time an operator graph on a GPU from its specs: a roofline with a learned utilisation.

Each call of an ``OpGraph`` (``kplan.planner.opgraph``) is timed by its operator class:

    matmul (mm, bmm, linear), conv      compute or memory bound, tiled into thread blocks
    softmax, norm, elementwise          memory bound, one pass over (rows, row_length)

``attention`` is timed as its two batched matmuls plus a softmax; ``reduction``, ``embedding``,
``optimizer`` and ``other`` are memory-bound passes timed as elementwise work over their bytes.

The time of one call is ``t = t_roof * exp(g(x))``, where ``t_roof = max(flops / P, bytes /
BW)`` is the roofline time on the GPU's peak ``P`` for the call's precision and its memory
bandwidth ``BW``, and ``g`` is a linear function (per class, fitted offline by
``scripts/fit_op_model.py``) of shape features: the size of the call against a kernel launch
(``softplus`` terms that give every kernel a floor, the launch overhead), the wave quantisation
of its output tiles over the GPU's SMs (tiles per SM, the last wave's fill), how far it sits
from the ridge point (arithmetic intensity against the GPU's peak over bandwidth) and the
lengths of its dimensions. A step's time is the sum over calls of ``t * count``.

Precision: matmul and conv calls in ``tf32``, ``fp16`` or ``bf16`` run at the GPU's tensor-core
peak for that precision (``kplan.planner.devices.peak_tflops``: the same peaks and fallbacks as
the device model, from ``gpus.csv``); the fitted kernels are FP32 only, so a tensor-core call
gets the FP32 utilisation plus ``tensor_offset`` (the mean log error on the fp16 matmul check)
and its sigma is widened by ``tensor_sigma``. Memory-bound calls move ``bytes`` at the call's
dtype (the tracer's count) and run on the CUDA cores in every precision.

The sigma of ``log(step time)`` comes from leave-one-GPU-out residuals of the kernel fit only:
per class, the spread of a held-out GPU's median log error (``bias``, shared by every call on
that GPU, so it adds linearly over the classes a step spends its time in) and the spread of
single kernels about it (``kernel``, which averages out over the step's calls).

Document shape (schema ``kplan.op-model/1.0``; ``kplan.catalogs.op_model`` reads it)::

    {"schema": "kplan.op-model/1.0",
     "classes": {"matmul": {"features": [...], "mean": [...], "scale": [...],
                            "coef": [...], "intercept": 0.1,
                            "sigma": {"bias": 0.1, "kernel": 0.2}}, ...},
     "tensor_offset": 0.0, "tensor_sigma": 0.3,
     "fitted_on": {...}, "held_out": {...}, "source": "..."}

Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from kplan.core.errors import DataFileError, SchemaVersionError
from kplan.planner.catalog import GpuSpec
from kplan.planner.devices import peak_tflops
from kplan.planner.opgraph import OpCall, OpGraph

OP_MODEL_SCHEMA: Final = "kplan.op-model/1.0"
CLASSES: Final = ("matmul", "conv", "softmax", "norm", "elementwise")
TENSOR_PRECISIONS: Final = ("tf32", "fp16", "bf16")
ITEMSIZE: Final = {"fp64": 8, "fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "int64": 8, "int32": 4}
_LAUNCH_SCALE = 1e-5  # seconds: the size of a kernel launch, where the floor terms sit
_KNOTS: Final = (-2.0, 0.0, 2.0)  # softplus knots in log(t_roof / launch scale)
TRANSCENDENTAL: Final = frozenset({"gelu", "tanh", "pow", "powu", "exp", "log", "sigmoid"})
Z90: Final = 1.2815515655446004  # the standard normal's 90th percentile


@dataclass(frozen=True)
class OpDevice:
    """What the op model reads of a GPU: peaks (TFLOPS), bandwidth (GB/s), SM count."""

    name: str
    fp32_tflops: float
    mem_bw_gbs: float
    sm_count: int
    tensor_tflops: Mapping[str, float]  # tf32/fp16/bf16 tensor-core peaks it has (dense)

    def __post_init__(self) -> None:
        for what, value in (("fp32_tflops", self.fp32_tflops), ("mem_bw_gbs", self.mem_bw_gbs)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"GPU {self.name!r}: {what}={value!r} must be positive")
        if self.sm_count < 1:
            raise ValueError(f"GPU {self.name!r}: sm_count={self.sm_count} must be >= 1")

    def peak(self, precision: str, kind: str) -> float:
        """FLOP/s for a call: tensor cores for matmul/conv in a tensor precision it has."""
        if kind in ("matmul", "conv") and precision in self.tensor_tflops:
            return self.tensor_tflops[precision] * 1e12
        return self.fp32_tflops * 1e12


def device_from_gpu(gpu: GpuSpec) -> OpDevice:
    """The op model's view of a catalog GPU (its SM count must be known)."""
    if not gpu.sm_count:
        raise ValueError(f"GPU {gpu.name!r} has no SM count in the catalog")
    tensor = {}
    for p in TENSOR_PRECISIONS:
        peak = peak_tflops(gpu, p)
        if peak > gpu.fp32_tflops * 1.01:  # a precision it runs on tensor cores
            tensor[p] = peak
    return OpDevice(gpu.name, gpu.fp32_tflops, gpu.mem_bw_gbs, int(gpu.sm_count), tensor)


# ---- work of a call (shared by the fitter, the graph readers and the model) -----------------


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


# ---- features --------------------------------------------------------------------------------


def _softplus(x: float) -> float:
    return x if x > 30 else math.log1p(math.exp(x))


def _size_terms(t_roof: float) -> list[float]:
    z = math.log(t_roof / _LAUNCH_SCALE)
    return [z, *(_softplus(a - z) for a in _KNOTS)]


def _wave_terms(tiles: float, sms: int) -> list[float]:
    waves = max(1.0, math.ceil(tiles / sms))
    fill = tiles / (waves * sms)
    return [math.log(fill), math.log(waves), 1.0 / waves]


def _balance(t_c: float, t_m: float) -> list[float]:
    bal = max(-8.0, min(8.0, math.log(max(t_c, 1e-15) / max(t_m, 1e-15))))
    return [bal, _softplus(bal), _softplus(-bal)]


def _gemm_features(
    b: float, m: float, n: float, k: float, t_c: float, t_m: float, sms: int
) -> list[float]:
    tiles128 = b * math.ceil(m / 128) * math.ceil(n / 128)
    tiles64 = b * math.ceil(m / 64) * math.ceil(n / 64)
    return [
        *_wave_terms(tiles128, sms),
        *_wave_terms(tiles64, sms),
        *_balance(t_c, t_m),
        math.log(max(k, 1.0)),
        math.log(max(min(m, n), 1.0)),
        math.log(max(b, 1.0)),
    ]


_SIZE = ("z", "fp-2", "fp0", "fp2")
_GEMM = (
    *("fill128", "waves128", "invwaves128", "fill64", "waves64", "invwaves64"),
    *("bal", "sp_bal", "sp_negbal", "log_k", "log_min_mn", "log_b"),
)
_ROWS = ("fill", "waves", "invwaves", "log_row")
FEATURES: Final[dict[str, tuple[str, ...]]] = {
    "matmul": (*_SIZE, *_GEMM),
    "conv": (*_SIZE, *_GEMM, "log_kernel", "log_stride"),
    "softmax": (*_SIZE, *_ROWS, "log_rows"),
    "norm": (*_SIZE, *_ROWS, "log_rows"),
    "elementwise": (*_SIZE, *_ROWS, "log_n", "binary", "transcendental"),
}


def features(
    cls: str, op: str, dims: Sequence[int], flops: float, nbytes: float, dev: OpDevice, prec: str
) -> tuple[float, list[float]]:
    """(roofline seconds, feature vector) of one call of operator class ``cls`` on ``dev``."""
    kind = "matmul" if cls == "matmul" else ("conv" if cls == "conv" else "vector")
    peak = dev.peak(prec, kind)
    t_c, t_m = flops / peak, nbytes / (dev.mem_bw_gbs * 1e9)
    t_roof = max(t_c, t_m, 1e-9)
    x = _size_terms(t_roof)
    if cls == "matmul":
        b, m, n, k = (float(d) for d in dims)
        x += _gemm_features(b, m, n, k, t_c, t_m, dev.sm_count)
    elif cls == "conv":
        b, cin, cout, ker, size, stride, pad = (int(d) for d in dims)
        out = conv_out(size, ker, stride, pad)
        x += _gemm_features(1.0, b * out * out, cout, cin * ker * ker, t_c, t_m, dev.sm_count)
        x += [math.log(max(ker, 1)), math.log(max(stride, 1))]
    else:
        rows, row = max(1.0, float(dims[0])), max(1.0, float(dims[-1]))
        if cls == "elementwise":
            n = rows * row
            x += _wave_terms(n / 1024.0, dev.sm_count * 2)
            name = op.rsplit(".", 1)[-1]
            binary = 1.0 if name in ("add", "mul", "div", "pow", "sub") else 0.0
            x += [math.log(row), math.log(n), binary, 1.0 if name in TRANSCENDENTAL else 0.0]
        else:
            x += _wave_terms(rows, dev.sm_count * 4)
            x += [math.log(row), math.log(rows)]
    return t_roof, x


# ---- the model -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClassFit:
    """``log(t / t_roof) = intercept + sum(coef * (x - mean) / scale)`` for one class."""

    features: tuple[str, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    coef: tuple[float, ...]
    intercept: float
    sigma_bias: float  # held-out spread of a GPU's median log error
    sigma_kernel: float  # held-out spread of single kernels about it

    def log_util(self, x: Sequence[float]) -> float:
        acc = self.intercept
        for xi, mu, sc, w in zip(x, self.mean, self.scale, self.coef, strict=True):
            acc += w * (xi - mu) / sc
        return max(-12.0, min(12.0, acc))


@dataclass(frozen=True)
class StepTime:
    """A step's predicted device time (seconds) and the sigma of its log."""

    seconds: float
    log_sigma: float
    by_class: Mapping[str, float]  # seconds per operator class
    note: str  # "" or what widened the sigma

    @property
    def p90(self) -> float:
        return self.seconds * math.exp(Z90 * self.log_sigma)


@dataclass(frozen=True)
class OpModel:
    classes: Mapping[str, ClassFit]
    tensor_offset: float
    tensor_sigma: float
    doc: Mapping[str, Any]  # provenance: fitted_on, held_out, source

    def call_seconds(
        self,
        cls: str,
        op: str,
        dims: Sequence[int],
        flops: float,
        nbytes: float,
        dev: OpDevice,
        prec: str,
    ) -> float:
        """Seconds of one call of class ``cls`` (one of ``CLASSES``)."""
        t_roof, x = features(cls, op, dims, flops, nbytes, dev, prec)
        log_u = self.classes[cls].log_util(x)
        if cls in ("matmul", "conv") and prec in dev.tensor_tflops:
            log_u += self.tensor_offset
        return t_roof * math.exp(log_u)

    def time_call(
        self, call: OpCall, dev: OpDevice, step_precision: str = "fp32"
    ) -> tuple[str, float]:
        """(class, seconds of ONE call) of a graph call on ``dev`` in a step of that precision."""
        prec = _call_precision(call, step_precision)
        if call.kind in ("matmul", "conv"):
            return call.kind, self.call_seconds(
                call.kind, call.op, call.dims, call.flops, call.bytes, dev, prec
            )
        if call.kind == "attention":
            bh, lq, lk, hd = call.dims
            size = ITEMSIZE.get(call.dtype, 4)
            qk = self.call_seconds(
                "matmul", "bmm", (bh, lq, lk, hd), *matmul_work((bh, lq, lk, hd), size), dev, prec
            )
            pv = self.call_seconds(
                "matmul", "bmm", (bh, lq, hd, lk), *matmul_work((bh, lq, hd, lk), size), dev, prec
            )
            sm = self.call_seconds(
                "softmax",
                "softmax",
                (bh * lq, lk),
                *vector_work("softmax", (bh * lq, lk), size),
                dev,
                prec,
            )
            return "matmul", qk + pv + sm
        if call.kind in ("softmax", "norm", "elementwise"):
            return call.kind, self.call_seconds(
                call.kind, call.op, call.dims, call.flops, call.bytes, dev, prec
            )
        # reduction, embedding, optimizer, other: a memory-bound pass over their bytes.
        size = ITEMSIZE.get(call.dtype, 4)
        n = max(1, int(call.bytes / (2 * size)))
        dims = (max(1, n // 1024), min(n, 1024)) if len(call.dims) != 2 else call.dims
        return "elementwise", self.call_seconds(
            "elementwise", "copy", dims, call.flops, call.bytes, dev, prec
        )

    def step_time(self, graph: OpGraph, dev: OpDevice) -> StepTime:
        """The summed time of every call in ``graph`` on ``dev`` and its held-out sigma."""
        by_class: dict[str, float] = {}
        counts: dict[str, int] = {}
        tensor = 0.0
        for call in graph.ops:
            cls, sec = self.time_call(call, dev, graph.precision)
            by_class[cls] = by_class.get(cls, 0.0) + sec * call.count
            counts[cls] = counts.get(cls, 0) + call.count
            if (
                cls in ("matmul", "conv")
                and _call_precision(call, graph.precision) in dev.tensor_tflops
            ):
                tensor += sec * call.count
        total = sum(by_class.values())
        if not total > 0:
            raise ValueError("the operator graph has no work to time")
        bias = sum(by_class[c] / total * self.classes[c].sigma_bias for c in by_class)
        spread = sum(
            (by_class[c] / total * self.classes[c].sigma_kernel) ** 2 / counts[c] for c in by_class
        )
        share = tensor / total
        sigma = math.sqrt(bias**2 + spread + (share * self.tensor_sigma) ** 2)
        note = (
            f"{share:.0%} of the step is tensor-core work, timed from FP32 kernels "
            "(no measured kernels in that precision): sigma widened"
            if share > 0.01
            else ""
        )
        return StepTime(total, sigma, by_class, note)

    def ratio(self, graph: OpGraph, src: OpDevice, dst: OpDevice) -> tuple[float, float]:
        """(time on dst / time on src, sigma of its log) for the same graph."""
        a, b = self.step_time(graph, src), self.step_time(graph, dst)
        if src.name == dst.name:
            return 1.0, 0.0
        return b.seconds / a.seconds, math.hypot(a.log_sigma, b.log_sigma)

    @classmethod
    def from_dict(cls, doc: Any, source: str = "op model") -> OpModel:
        if not isinstance(doc, dict) or not isinstance(doc.get("schema"), str):
            raise DataFileError(f"{source}: not an op-model document", hint="re-fit it")
        schema = doc["schema"]
        if schema.split("/")[0] != OP_MODEL_SCHEMA.split("/")[0] or not schema.endswith("/1.0"):
            raise SchemaVersionError(
                f"{source}: schema {schema!r} is not {OP_MODEL_SCHEMA}",
                hint="re-create it with scripts/fit_op_model.py",
            )
        try:
            classes = {name: _class_fit(doc["classes"][name], name) for name in CLASSES}
            offset, widen = float(doc["tensor_offset"]), float(doc["tensor_sigma"])
        except (KeyError, TypeError, ValueError) as err:
            raise DataFileError(f"{source}: bad op model ({err})", hint="re-fit it") from None
        if not (math.isfinite(offset) and math.isfinite(widen) and widen >= 0):
            raise DataFileError(f"{source}: bad tensor_offset/tensor_sigma", hint="re-fit it")
        return cls(classes, offset, widen, doc)


def _class_fit(row: Any, name: str) -> ClassFit:
    fit = ClassFit(
        features=tuple(str(f) for f in row["features"]),
        mean=tuple(float(v) for v in row["mean"]),
        scale=tuple(float(v) for v in row["scale"]),
        coef=tuple(float(v) for v in row["coef"]),
        intercept=float(row["intercept"]),
        sigma_bias=float(row["sigma"]["bias"]),
        sigma_kernel=float(row["sigma"]["kernel"]),
    )
    n = len(FEATURES[name])
    if fit.features != FEATURES[name]:
        raise ValueError(f"class {name}: features {fit.features} are not {FEATURES[name]}")
    if not (len(fit.mean) == len(fit.scale) == len(fit.coef) == n):
        raise ValueError(f"class {name}: {n} features need as many means, scales and coefs")
    values = (*fit.mean, *fit.scale, *fit.coef, fit.intercept, fit.sigma_bias, fit.sigma_kernel)
    if not all(math.isfinite(v) for v in values) or min(fit.scale) <= 0:
        raise ValueError(f"class {name}: non-finite numbers or a non-positive scale")
    if fit.sigma_bias < 0 or fit.sigma_kernel < 0:
        raise ValueError(f"class {name}: negative sigma")
    return fit


def _call_precision(call: OpCall, step_precision: str = "fp32") -> str:
    """The precision a call's math runs in: its dtype, except that an fp32 matmul or conv of a
    ``tf32`` step runs on TF32 tensor cores (TF32 is FP32 storage)."""
    if call.dtype == "fp32" and step_precision == "tf32" and call.kind in ("matmul", "conv"):
        return "tf32"
    return {"fp16": "fp16", "bf16": "bf16", "tf32": "tf32"}.get(call.dtype, "fp32")
