"""Time an operator graph on a GPU from its specs: a roofline with a learned utilisation.

Each call of an ``OpGraph`` (``kplan.planner.opgraph``) is timed by its operator class:

    matmul (mm, bmm, linear), conv      compute or memory bound, tiled into thread blocks
    softmax, norm, elementwise          memory bound, one pass over (rows, row_length)

``attention`` is timed as its two batched matmuls plus a softmax, their work scaled by the
call's FLOPs (a backward twice a forward, a causal mask about half); ``reduction``, ``embedding``,
``optimizer`` and ``other`` are memory-bound passes timed as elementwise work over their bytes.

The time of one call timed alone is ``t = t_roof / u + floor``, where ``t_roof = max(flops / P,
bytes / BW)`` is the roofline time on the GPU's peak ``P`` for the call's precision and its
memory bandwidth ``BW``, ``floor`` the class's per-kernel floor (its fastest kernel measured
alone: 24-47 us on every fitted GPU, mostly the host's dispatch and synchronisation) and ``u`` a
utilisation bounded in (0, ``u_max``): a sigmoid of a small network (one tanh layer,
``ClassFit``, fitted offline per class by ``scripts/fit_op_model.py``) of shape features: the
size of the call against a kernel launch, the wave quantisation of its output tiles over the
GPU's SMs (tiles per SM, the last wave's fill, for 128- and 64-wide tiles), how far it sits from
the ridge point (arithmetic intensity against the GPU's peak over bandwidth) and the lengths of
its dimensions. The GPU enters only through its peak, bandwidth and SM count (the roofline and
the waves): specs as features of the utilisation itself (FLOPS and GB/s per SM, SM count) were
tried and rejected on a leave-one-GPU-out over the five fitted GPUs (five GPUs do not teach a
device trend). The sigmoid keeps any input, however far from the fitted ones, to a physical
utilisation. A kernel timed alone pays both its device time and the floor (``call_seconds``).
In a step the host queues each phase's kernels asynchronously (``queued``): a phase (forward,
backward, optimizer: layer after layer, a repeating stream) lasts the longer of its device
time ``sum(t_roof / u * count)`` and its host's dispatch time ``sum(floor * count)``, so the
host runs ahead during long kernels and the floor neither adds to nor swallows device work.
Every class is evaluated as one numpy batch over the calls and GPUs.

Precision: matmul and conv calls in ``tf32``, ``fp16`` or ``bf16`` run at the GPU's tensor-core
peak for that precision (``kplan.planner.devices.peak_tflops``: the same peaks and fallbacks as
the device model, from ``gpus.csv``); the fitted kernels are FP32 only, so a tensor-core call
gets the FP32 utilisation plus ``tensor_offset`` (the mean log error on the fp16 matmul check)
and its sigma is widened by ``tensor_sigma``. Memory-bound calls move ``bytes`` at the call's
dtype (the tracer's count) and run on the CUDA cores in every precision.

The sigma of ``log(step time)`` is calibrated on held-out step times (``calibration``, written by
``scripts/fit_op_model.py``): per path (``outright``: a step's time predicted from its graph;
``ratio``: a measured step moved to another GPU by the ratio of the graph's times) and per
precision with data, a robust scale of the log residuals of labelled steps on GPUs left out of
the fit. Added in quadrature: the spread of single kernels (``kernel`` per class, from the
kernel fit's leave-one-GPU-out, which averages out over a step's calls) and, for tensor-core
work, ``tensor_sigma``. A document without ``calibration`` (schema 2.0) falls back to each
class's held-out kernel bias (``bias``), weighted by the step's time in the class.

Document shape (schema ``kplan.op-model/2.1``, 2.0 still read; ``kplan.catalogs.op_model``)::

    {"schema": "kplan.op-model/2.1",
     "classes": {"matmul": {"features": [...], "mean": [...], "scale": [...],
                            "hidden_w": [[...], ...], "hidden_b": [...], "out_w": [...],
                            "out_b": 0.1, "u_max": 1.0, "floor_s": 2e-05,
                            "sigma": {"bias": 0.1, "kernel": 0.2}}, ...},
     "tensor_offset": 0.0, "tensor_sigma": 0.3,
     "calibration": {"outright": {"fp32": {"sigma": 0.15, ...}}, "ratio": {"fp32": {...}}},
     "fitted_on": {...}, "held_out": {...}, "source": "..."}

Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from kplan.core.errors import DataFileError, SchemaVersionError
from kplan.planner.catalog import GpuSpec
from kplan.planner.devices import peak_tflops
from kplan.planner.opgraph import OpCall, OpGraph
from kplan.planner.opwork import conv_out, matmul_work, vector_work

OP_MODEL_SCHEMA: Final = "kplan.op-model/2.1"
READ_SCHEMAS: Final = (OP_MODEL_SCHEMA, "kplan.op-model/2.0")
PATH_KEYS: Final = ("outright", "ratio")  # the calibrated paths
CLASSES: Final = ("matmul", "conv", "softmax", "norm", "elementwise")
TENSOR_PRECISIONS: Final = ("tf32", "fp16", "bf16")
ITEMSIZE: Final = {"fp64": 8, "fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "int64": 8, "int32": 4}
# FP32 FLOPs per byte of bandwidth of the five fitted GPUs (NeuSight's specs: A100-40GB 12.5 to
# P4 29.7). A GPU's ridge enters the features only inside this range: beyond it (an L4's 104,
# any tensor-core peak) a feature would extrapolate a device trend learnt from five GPUs.
FITTED_RIDGE: Final = (12.5, 29.7)
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


def _balance(flops: float, nbytes: float, ridge: float) -> list[float]:
    """How far the call sits from the ridge point (log of its FLOPs per byte over the GPU's),
    with the GPU's ridge held inside the fitted GPUs' range (``FITTED_RIDGE``)."""
    ridge = min(max(ridge, FITTED_RIDGE[0]), FITTED_RIDGE[1])
    bal = max(-8.0, min(8.0, math.log(max(flops, 1e-6) / max(nbytes, 1e-6) / ridge)))
    return [bal, _softplus(bal), _softplus(-bal)]


def _gemm_features(
    b: float, m: float, n: float, k: float, sms: int, work: tuple[float, float], ridge: float
) -> list[float]:
    tiles128 = b * math.ceil(m / 128) * math.ceil(n / 128)
    tiles64 = b * math.ceil(m / 64) * math.ceil(n / 64)
    return [
        *_wave_terms(tiles128, sms),
        *_wave_terms(tiles64, sms),
        *_balance(*work, ridge),
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
    ridge = peak / (dev.mem_bw_gbs * 1e9)
    x = _size_terms(t_roof)
    if cls == "matmul":
        b, m, n, k = (float(d) for d in dims)
        x += _gemm_features(b, m, n, k, dev.sm_count, (flops, nbytes), ridge)
    elif cls == "conv":
        b, cin, cout, ker, size, stride, pad = (int(d) for d in dims)
        out = conv_out(size, ker, stride, pad)
        x += _gemm_features(
            1.0, b * out * out, cout, cin * ker * ker, dev.sm_count, (flops, nbytes), ridge
        )
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


def _np_softplus(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.logaddexp(0.0, x)
    return out


def _np_waves(tiles: np.ndarray, sms: np.ndarray) -> list[np.ndarray]:
    waves = np.maximum(1.0, np.ceil(tiles / sms))
    return [np.log(tiles / (waves * sms)), np.log(waves), 1.0 / waves]


def features_batch(
    cls: str, pieces: Sequence[_Piece], devs: Sequence[OpDevice]
) -> tuple[np.ndarray, np.ndarray]:
    """``features`` of every piece of class ``cls`` on every GPU at once: roofline seconds
    (GPUs, pieces) and features (GPUs, pieces, features), the same numbers as ``features``."""
    kind = "matmul" if cls == "matmul" else ("conv" if cls == "conv" else "vector")
    n_dev, n = len(devs), len(pieces)
    flops = np.asarray([p[3] for p in pieces], float)
    nbytes = np.asarray([p[4] for p in pieces], float)
    peak = np.empty((n_dev, n))
    for prec in {p[5] for p in pieces}:
        cols = np.asarray([p[5] == prec for p in pieces])
        peak[:, cols] = np.asarray([[d.peak(prec, kind)] for d in devs])
    bw = np.asarray([[d.mem_bw_gbs * 1e9] for d in devs])
    sms = np.asarray([[float(d.sm_count)] for d in devs])
    t_roof = np.maximum(np.maximum(flops / peak, nbytes / bw), 1e-9)
    z = np.log(t_roof / _LAUNCH_SCALE)
    x: list[np.ndarray] = [z, *(_np_softplus(a - z) for a in _KNOTS)]
    full = np.ones((n_dev, n))
    if kind in ("matmul", "conv"):
        if kind == "matmul":
            b, m, nn, k = (np.asarray([float(p[2][i]) for p in pieces]) for i in range(4))
        else:
            d7 = np.asarray([[int(v) for v in p[2]] for p in pieces]).reshape(n, 7)
            out = np.maximum(1, (d7[:, 4] + 2 * d7[:, 6] - d7[:, 3]) // np.maximum(1, d7[:, 5]) + 1)
            b, m = np.ones(n), (d7[:, 0] * out * out).astype(float)
            nn, k = d7[:, 2].astype(float), (d7[:, 1] * d7[:, 3] * d7[:, 3]).astype(float)
        for tile in (128.0, 64.0):
            x += _np_waves(b * np.ceil(m / tile) * np.ceil(nn / tile) * full, sms)
        ridge = np.clip(peak / bw, *FITTED_RIDGE)
        inten = np.maximum(flops, 1e-6) / np.maximum(nbytes, 1e-6)
        bal = np.clip(np.log(inten / ridge), -8.0, 8.0)
        x += [bal, _np_softplus(bal), _np_softplus(-bal)]
        logs = [np.log(np.maximum(k, 1.0)), np.log(np.maximum(np.minimum(m, nn), 1.0))]
        x += [v * full for v in (*logs, np.log(np.maximum(b, 1.0)))]
        if kind == "conv":
            x += [np.log(np.maximum(d7[:, 3], 1)) * full, np.log(np.maximum(d7[:, 5], 1)) * full]
    else:
        rows = np.maximum(1.0, np.asarray([float(p[2][0]) for p in pieces]))
        row = np.maximum(1.0, np.asarray([float(p[2][-1]) for p in pieces]))
        if cls == "elementwise":
            names = [p[1].rsplit(".", 1)[-1] for p in pieces]
            binary = np.asarray([nm in ("add", "mul", "div", "pow", "sub") for nm in names], float)
            trans = np.asarray([nm in TRANSCENDENTAL for nm in names], float)
            x += _np_waves(rows * row / 1024.0 * full, sms * 2)
            x += [v * full for v in (np.log(row), np.log(rows * row), binary, trans)]
        else:
            x += _np_waves(rows * full, sms * 4)
            x += [np.log(row) * full, np.log(rows) * full]
    return t_roof, np.stack(x, axis=-1)


# ---- the model -------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class ClassFit:
    """The utilisation of one operator class, bounded in (0, ``u_max``)::

        z = (x - mean) / scale
        u = u_max * sigmoid(out_b + out_w . tanh(hidden_w @ z + hidden_b))
        t = t_roof / u + floor_s

    A one-hidden-layer network whose output passes a sigmoid: however far a new GPU's specs
    sit from the fitted ones, the utilisation stays between 0 and ``u_max`` (1 for matmul and
    the memory-bound classes; above 1 for conv, whose FFT and Winograd kernels beat the direct
    convolution's FLOP count). ``floor_s`` is the class's per-kernel launch floor."""

    features: tuple[str, ...]
    mean: np.ndarray
    scale: np.ndarray
    hidden_w: np.ndarray  # (hidden, features)
    hidden_b: np.ndarray
    out_w: np.ndarray
    out_b: float
    u_max: float
    floor_s: float
    sigma_bias: float  # held-out spread of a GPU's mean log error
    sigma_kernel: float  # held-out spread of single kernels about it

    def log_util(self, x: np.ndarray) -> np.ndarray:
        """log(u) for rows of features ``x`` (calls, features)."""
        z = (np.atleast_2d(x) - self.mean) / self.scale
        h = np.tanh(z @ self.hidden_w.T + self.hidden_b) @ self.out_w + self.out_b
        out: np.ndarray = math.log(self.u_max) - np.logaddexp(0.0, -np.clip(h, -30.0, 30.0))
        return out

    def body(self, t_roof: np.ndarray, x: np.ndarray, offset: np.ndarray) -> np.ndarray:
        """The device's seconds ``t_roof / u`` of calls with roofline times ``t_roof``,
        features ``x`` and a log-time ``offset`` (the tensor-core correction), floor apart."""
        out: np.ndarray = t_roof * np.exp(offset - self.log_util(x))
        return out

    def seconds(self, t_roof: np.ndarray, x: np.ndarray, offset: np.ndarray) -> np.ndarray:
        """Seconds of calls each timed alone, as the fitted kernels were: the floor added."""
        out: np.ndarray = self.body(t_roof, x, offset) + self.floor_s
        return out


@dataclass(frozen=True)
class StepTime:
    """A step's predicted device time (seconds) and the sigma of its log."""

    seconds: float
    log_sigma: float
    by_class: Mapping[str, float]  # seconds per operator class
    note: str  # "" or what widened the sigma
    spread: float = 0.0  # the single kernels' share of log_sigma (averaged over the calls)
    tensor: float = 0.0  # the tensor-core widening's share of log_sigma

    @property
    def p90(self) -> float:
        return self.seconds * math.exp(Z90 * self.log_sigma)


# One kernel a graph call runs: (class fitted, op, dims, flops, bytes, precision, weight).
_Piece = tuple[str, str, Sequence[int], float, float, str, int]


@dataclass(frozen=True)
class OpModel:
    classes: Mapping[str, ClassFit]
    tensor_offset: float
    tensor_sigma: float
    doc: Mapping[str, Any]  # provenance: fitted_on, held_out, source
    # path -> precision -> held-out sigma of a step's log time (empty: a schema 2.0 document)
    calibration: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

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
        """Seconds of one call of class ``cls`` (one of ``CLASSES``), timed alone (as the
        fitted kernels were: the per-kernel floor added)."""
        body, floor = self._parts_on([(cls, op, dims, flops, nbytes, prec, 1)], [dev])
        return float(body[0, 0] + floor[0, 0])

    def _parts_on(
        self, pieces: Sequence[_Piece], devs: Sequence[OpDevice]
    ) -> tuple[np.ndarray, np.ndarray]:
        """(device seconds ``t_roof / u``, the class's per-kernel floor) of each piece on each
        GPU, (GPUs, pieces) each: every class one numpy batch over all calls and GPUs."""
        out = np.zeros((len(devs), len(pieces)))
        floor = np.zeros((len(devs), len(pieces)))
        by_cls: dict[str, list[int]] = {}
        for i, p in enumerate(pieces):
            by_cls.setdefault(p[0], []).append(i)
        for cls, idx in by_cls.items():
            mine = [pieces[i] for i in idx]
            t_roof, x = features_batch(cls, mine, devs)
            offs = np.asarray(
                [
                    [self.tensor_offset if _tensor(cls, p[5], dev) else 0.0 for p in mine]
                    for dev in devs
                ]
            )
            fit = self.classes[cls]
            sec = fit.body(t_roof.ravel(), x.reshape(-1, x.shape[-1]), offs.ravel())
            out[:, idx] = sec.reshape(len(devs), len(idx))
            floor[:, idx] = fit.floor_s
        return out, floor

    def pieces(self, call: OpCall, step_precision: str = "fp32") -> tuple[str, list[_Piece]]:
        """(class reported, kernels) of a graph call: attention is its two batched matmuls and
        a softmax; reduction, embedding, optimizer and other are memory-bound passes."""
        prec = _call_precision(call, step_precision)
        if call.kind in ("matmul", "conv", "softmax", "norm", "elementwise"):
            return call.kind, [
                (call.kind, call.op, call.dims, call.flops, call.bytes, prec, call.count)
            ]
        size = ITEMSIZE.get(call.dtype, 4)
        if call.kind == "attention":
            return "matmul", _attention_pieces(call, prec, size)
        n = max(1, int(call.bytes / (2 * size)))
        dims = (max(1, n // 1024), min(n, 1024)) if len(call.dims) != 2 else call.dims
        return "elementwise", [
            ("elementwise", "copy", dims, call.flops, call.bytes, prec, call.count)
        ]

    def time_call(
        self, call: OpCall, dev: OpDevice, step_precision: str = "fp32"
    ) -> tuple[str, float]:
        """(class, seconds of ONE call) of a graph call on ``dev`` in a step of that precision,
        on its own in the step's queue: its device time or its host's floor, the larger."""
        cls, pieces = self.pieces(call, step_precision)
        body, floor = self._parts_on(pieces, [dev])
        return cls, float(np.maximum(body, floor).sum())

    def step_time(self, graph: OpGraph, dev: OpDevice) -> StepTime:
        """The summed time of every call in ``graph`` on ``dev`` and its held-out sigma."""
        return self.step_times(graph, [dev])[0]

    def step_times(self, graph: OpGraph, devs: Sequence[OpDevice]) -> list[StepTime]:
        """``step_time`` of ``graph`` on each of ``devs``, evaluated together (one numpy batch
        per operator class over every call and GPU)."""
        pieces: list[_Piece] = []
        owner: list[str] = []
        phases: list[str] = []
        for call in graph.ops:
            cls, ps = self.pieces(call, graph.precision)
            pieces += ps
            owner += [cls] * len(ps)
            phases += [call.phase] * len(ps)
        if not pieces:
            raise ValueError("the operator graph has no work to time")
        counts = np.asarray([p[6] for p in pieces], float)
        body, floor = self._parts_on(pieces, devs)
        times = queued(body * counts, floor * counts, np.asarray(phases))
        return [
            self._summed(pieces, owner, row, dev, graph.precision)
            for row, dev in zip(times, devs, strict=True)
        ]

    def _summed(
        self,
        pieces: Sequence[_Piece],
        owner: Sequence[str],
        sec: np.ndarray,
        dev: OpDevice,
        precision: str,
    ) -> StepTime:
        by_class: dict[str, float] = {}
        counts: dict[str, int] = {}
        tensor = 0.0
        for p, cls, s in zip(pieces, owner, sec, strict=True):
            by_class[cls] = by_class.get(cls, 0.0) + float(s)
            counts[cls] = counts.get(cls, 0) + p[6]
            if p[0] in ("matmul", "conv") and p[5] in dev.tensor_tflops:
                tensor += float(s)
        total = sum(by_class.values())
        if not total > 0:
            raise ValueError("the operator graph has no work to time")
        spread = math.sqrt(
            sum(
                (by_class[c] / total * self.classes[c].sigma_kernel) ** 2 / counts[c]
                for c in by_class
            )
        )
        share = tensor / total
        widen = share * self.tensor_sigma
        notes = []
        if share > 0.01:
            notes.append(
                f"{share:.0%} of the step is tensor-core work, timed from FP32 kernels "
                "(no measured kernels in that precision): sigma widened"
            )
        base, why = self.path_sigma("outright", precision)
        if base is None:  # a 2.0 document: the classes' held-out kernel biases
            base = sum(by_class[c] / total * self.classes[c].sigma_bias for c in by_class)
        notes += [why] if why else []
        sigma = math.sqrt(base**2 + spread**2 + widen**2)
        return StepTime(total, sigma, by_class, "; ".join(notes), spread, widen)

    def path_sigma(self, path: str, precision: str) -> tuple[float | None, str]:
        """(calibrated sigma of ``path`` in ``precision``, note): a precision without held-out
        steps takes FP32's (TF32 is FP32 storage; the tensor-core widening is added apart) and
        says so; None without a calibration (a schema 2.0 document)."""
        table = self.calibration.get(path, {})
        if not table:
            return None, ""
        if precision in table:
            return table[precision], ""
        if "fp32" in table:
            why = "" if precision == "tf32" else f"no held-out {precision} steps: FP32's sigma"
            return table["fp32"], why
        return max(table.values()), f"no held-out {precision} steps: the largest path sigma"

    def ratio_sigma(self, a: StepTime, b: StepTime, precision: str) -> float:
        """The held-out sigma of ``log(b / a)``, the same graph's ratio of times on two GPUs:
        the ratio path's calibrated sigma (else both steps' sigmas in quadrature) with both
        steps' kernel spread and tensor-core widening."""
        base, _ = self.path_sigma("ratio", precision)
        if base is None:
            return math.hypot(a.log_sigma, b.log_sigma)
        return math.sqrt(base**2 + a.spread**2 + b.spread**2 + a.tensor**2 + b.tensor**2)

    def ratio(self, graph: OpGraph, src: OpDevice, dst: OpDevice) -> tuple[float, float]:
        """(time on dst / time on src, sigma of its log) for the same graph."""
        if src.name == dst.name:
            return 1.0, 0.0
        a, b = self.step_times(graph, [src, dst])
        return b.seconds / a.seconds, self.ratio_sigma(a, b, graph.precision)

    @classmethod
    def from_dict(cls, doc: Any, source: str = "op model") -> OpModel:
        if not isinstance(doc, dict) or not isinstance(doc.get("schema"), str):
            raise DataFileError(f"{source}: not an op-model document", hint="re-fit it")
        schema = doc["schema"]
        if schema not in READ_SCHEMAS:
            raise SchemaVersionError(
                f"{source}: schema {schema!r} is not {' or '.join(READ_SCHEMAS)}",
                hint="re-create it with scripts/fit_op_model.py",
            )
        try:
            classes = {name: class_fit_from_dict(doc["classes"][name], name) for name in CLASSES}
            offset, widen = float(doc["tensor_offset"]), float(doc["tensor_sigma"])
            calib = _calibration(doc.get("calibration", {})) if schema == OP_MODEL_SCHEMA else {}
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise DataFileError(f"{source}: bad op model ({err})", hint="re-fit it") from None
        if not (math.isfinite(offset) and math.isfinite(widen) and widen >= 0):
            raise DataFileError(f"{source}: bad tensor_offset/tensor_sigma", hint="re-fit it")
        return cls(classes, offset, widen, doc, calib)


def _calibration(doc: Any) -> dict[str, dict[str, float]]:
    """``calibration`` of a 2.1 document: path -> precision -> {"sigma": s, ...}."""
    out: dict[str, dict[str, float]] = {}
    for path, per_precision in doc.items():
        if path not in PATH_KEYS:
            raise ValueError(f"calibration path {path!r} is not one of {PATH_KEYS}")
        out[path] = {}
        for prec, row in per_precision.items():
            sigma = float(row["sigma"])
            if not (math.isfinite(sigma) and sigma > 0):
                raise ValueError(f"calibration {path}/{prec}: sigma {sigma!r} must be positive")
            out[path][str(prec)] = sigma
    return out


def _array(values: Any, shape: tuple[int, ...], what: str) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    if arr.shape != shape or not np.isfinite(arr).all():
        raise ValueError(f"{what} must be {shape} finite numbers")
    return arr


def class_fit_from_dict(row: Any, name: str) -> ClassFit:
    feats = tuple(str(f) for f in row["features"])
    if feats != FEATURES[name]:
        raise ValueError(f"class {name}: features {feats} are not {FEATURES[name]}")
    n, h = len(feats), len(row["out_w"])
    fit = ClassFit(
        features=feats,
        mean=_array(row["mean"], (n,), f"class {name}: mean"),
        scale=_array(row["scale"], (n,), f"class {name}: scale"),
        hidden_w=_array(row["hidden_w"], (h, n), f"class {name}: hidden_w"),
        hidden_b=_array(row["hidden_b"], (h,), f"class {name}: hidden_b"),
        out_w=_array(row["out_w"], (h,), f"class {name}: out_w"),
        out_b=float(row["out_b"]),
        u_max=float(row["u_max"]),
        floor_s=float(row["floor_s"]),
        sigma_bias=float(row["sigma"]["bias"]),
        sigma_kernel=float(row["sigma"]["kernel"]),
    )
    scalars = (fit.out_b, fit.u_max, fit.floor_s, fit.sigma_bias, fit.sigma_kernel)
    if not all(math.isfinite(v) for v in scalars) or fit.scale.min() <= 0 or fit.u_max <= 0:
        raise ValueError(f"class {name}: non-finite numbers or a non-positive scale or u_max")
    if fit.sigma_bias < 0 or fit.sigma_kernel < 0 or fit.floor_s < 0:
        raise ValueError(f"class {name}: negative sigma or floor")
    return fit


def queued(body: np.ndarray, floor: np.ndarray, phases: np.ndarray) -> np.ndarray:
    """Each kernel's share of a step's time (GPUs, kernels) when the host queues the kernels
    of a phase (forward, backward, optimizer) asynchronously: the device runs ``body`` seconds,
    the host spends ``floor`` per kernel dispatching. A phase is a repeating stream (layer after
    layer), so in steady state it lasts its device time or its host time, whichever is longer:
    the host runs ahead during long kernels and short ones wait for neither. The host's excess
    over the device (idle device) is shared out by each kernel's dispatch cost."""
    out = body.copy()
    for phase in np.unique(phases):
        cols = phases == phase
        b, f = body[:, cols], floor[:, cols]
        idle = np.maximum(f.sum(axis=1) - b.sum(axis=1), 0.0)
        out[:, cols] = b + idle[:, None] * f / np.maximum(f.sum(axis=1), 1e-30)[:, None]
    return out


def _attention_pieces(call: OpCall, prec: str, size: int) -> list[_Piece]:
    """A fused attention call as its QK^T and PV batched matmuls and its softmax, their work
    scaled by the call's FLOPs over one dense forward's (``4 B L_q L_k head_dim``): 2 for a
    backward, about half for a causal mask (the tracer's count); 1 when the call has none."""
    bh, lq, lk, hd = call.dims
    qk, pv, rows = (bh, lq, lk, hd), (bh, lq, hd, lk), (bh * lq, lk)
    dense = 4.0 * bh * lq * lk * hd
    scale = call.flops / dense if call.flops > 0 and dense > 0 else 1.0
    out: list[_Piece] = []
    for cls, op, dims, (flops, nbytes) in (
        ("matmul", "bmm", qk, matmul_work(qk, size)),
        ("matmul", "bmm", pv, matmul_work(pv, size)),
        ("softmax", "softmax", rows, vector_work("softmax", rows, size)),
    ):
        out.append((cls, op, dims, flops * scale, nbytes * scale, prec, call.count))
    return out


def _tensor(cls: str, prec: str, dev: OpDevice) -> bool:
    return cls in ("matmul", "conv") and prec in dev.tensor_tflops


def _call_precision(call: OpCall, step_precision: str = "fp32") -> str:
    """The precision a call's math runs in: its dtype, except that an fp32 matmul or conv of a
    ``tf32`` step runs on TF32 tensor cores (TF32 is FP32 storage)."""
    if call.dtype == "fp32" and step_precision == "tf32" and call.kind in ("matmul", "conv"):
        return "tf32"
    return {"fp16": "fp16", "bf16": "bf16", "tf32": "tf32"}.get(call.dtype, "fp32")
