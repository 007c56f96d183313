"""Cross-device compute speed: scale a compute time measured on one GPU (and precision) to another.

The model (schema ``kplan.device-model/2.x``) is a roofline over published specs. The device time
of a step in precision ``p`` on GPU ``g`` is taken as::

    t ~ k_p / P_p(g) + c_p / P_fp32(g) + m_p / BW(g)

where ``P_p(g)`` is g's peak for the precision (TFLOPS; ``peak_tflops``: FP32 CUDA cores for
fp32, TF32 tensor cores for tf32, FP16/BF16 tensor cores for fp16/bf16, with fallbacks on GPUs
that lack them), ``BW(g)`` its memory bandwidth (GB/s), ``k_p`` the compute work per unit of
memory traffic (the roofline share: a large ``k`` is compute-bound) and ``m_p`` the memory
traffic relative to FP32 (16-bit activations move fewer bytes). ``c_p`` (2.1; 0 for fp32/tf32
and in a 2.0 file) is the work of a mixed-precision step that tensor cores do not run
(normalisations, element-wise ops, the FP32 master-weight update): it runs on the FP32 CUDA
cores, so a GPU with much more tensor than FP32 throughput (A100 over V100) gains less than its
tensor peak. A time measured on ``src`` maps
to ``dst`` as ``t_dst = t_src * T(dst) / T(src)``: the identity gives 1, swapping src and dst
inverts the factor, and factors chain. Because ``T`` is a sum, the factor lies between the
smallest and the largest of the ratios of peaks and of bandwidths.

Where the caller knows which share ``f`` of the measured step is fixed per-step work (the
intercept of step time against per-GPU batch on the source GPU, which a profile shows), that
share moves as ``factor ** fixed_exponent`` (fitted: it speeds up less than the device part)
and the step's factor is ``(1 - f) F + f F^gamma``; without it the whole step moves as ``F``.
Where an fp32/tf32 source also measured the workload in another precision, the measured ratio
gives its own tensor-core compute share ``s`` (``T = s k_p / P_p + c_p / P_fp32 + m_p / BW``,
entering as ``s ** workload_exponent``) across GPUs, instead of the precision's fitted one.

``k_p`` and ``m_p`` are fitted offline (``scripts/fit_device_model.py``) on the shared GPU data;
the sigma of ``log(factor)`` comes from held-out errors only (leave one GPU out, one model
out, and one GPU die out with its twins): ``base + per_distance * d`` for a prediction across
GPUs, with ``d`` the spec distance ``|dlog peak| + |dlog bandwidth|``, and a fixed term for a
projection to another precision (``cross_precision`` on the same GPU or across families;
``cross_gpu_projection`` across GPUs within a family, e.g. FP32 on a V100 to TF32 on an A100);
they add in quadrature (``held_out_sigma``). A same-GPU, same-precision prediction has factor 1
and sigma 0 (the profile's own fitted sigma is all there is).

Document shape::

    {"schema": "kplan.device-model/2.1",
     "compute_weight": {"fp32": 0.05, "tf32": 0.02, "bf16": 0.01, "fp16": 0.01},
     "cuda_core_weight": {"fp32": 0.0, "tf32": 0.0, "bf16": 0.005, "fp16": 0.005},
     "memory_weight": {"fp32": 1.0, "tf32": 1.0, "bf16": 0.6, "fp16": 0.6},
     "sigma": {"cross_gpu": {"full": {"base": 0.1, "per_distance": 0.05}, "mixed": {...}},
               "cross_precision": {"full": 0.2, "mixed": 0.25},
               "cross_gpu_projection": {"full": 0.25}},
     "fixed_exponent": 0.5, "workload_exponent": 4.0, "log_sigma": 0.2, "fitted_on": [...],
     "held_out_error": {...}, "source": "..."}

A 1.x document (a geometric FP32/bandwidth blend with no precision) is refused with a hint to
re-create it; a 2.0 file (no ``cuda_core_weight``) reads with it 0;
the shipped file is 2.1. Pure: no I/O. ``kplan.catalogs.device_model`` reads it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from kplan.core.errors import CatalogError, DataFileError, SchemaVersionError
from kplan.core.precision import PRECISIONS
from kplan.planner.catalog import GpuSpec

DEVICE_MODEL_SCHEMA = "kplan.device-model/2.1"
_KIND = "kplan.device-model"
FIT_PRECISIONS: Final[tuple[str, ...]] = tuple(PRECISIONS)
FAMILIES: Final[tuple[str, ...]] = ("full", "mixed")  # fp32/tf32 and fp16/bf16


def precision_family(precision: str) -> str:
    return "mixed" if precision in ("fp16", "bf16") else "full"


def _positive(gpu: GpuSpec, attr: str) -> float:
    value = getattr(gpu, attr)
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not value > 0
        or not math.isfinite(value)
    ):
        raise CatalogError(
            f"GPU {gpu.name!r}: {attr}={value!r} must be a positive number",
            hint="fix the GPU row in the catalog (gpus.csv)",
        )
    return float(value)


def effective_precision(gpu: GpuSpec, precision: str) -> str:
    """What ``precision`` runs as on ``gpu``: TF32 and BF16 need Ampere or later (their peak in
    the catalog); without it, tf32 runs as fp32 and bf16 (emulated) is taken as fp32."""
    if precision == "tf32" and not gpu.tf32_tflops:
        return "fp32"
    if precision == "bf16" and not gpu.bf16_tflops:
        return "fp32"
    if precision not in FIT_PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; known: {', '.join(FIT_PRECISIONS)}")
    return precision


def peak_tflops(gpu: GpuSpec, precision: str) -> float:
    """The right peak for ``precision`` on ``gpu`` (dense, TFLOPS)."""
    eff = effective_precision(gpu, precision)
    attr = {
        "fp32": "fp32_tflops",
        "tf32": "tf32_tflops",
        "fp16": "fp16_tflops",
        "bf16": "bf16_tflops",
    }[eff]
    return _positive(gpu, attr)


def spec_distance(src: GpuSpec, dst: GpuSpec, src_precision: str, dst_precision: str) -> float:
    """``|dlog peak| + |dlog bandwidth|`` between two GPUs (0 for the same GPU)."""
    if src.name == dst.name:
        return 0.0
    dp = math.log(peak_tflops(dst, dst_precision) / peak_tflops(src, src_precision))
    db = math.log(_positive(dst, "mem_bw_gbs") / _positive(src, "mem_bw_gbs"))
    return abs(dp) + abs(db)


@dataclass(frozen=True)
class SpeedEstimate:
    """Multiply a compute time measured on src by ``factor`` to get dst's.

    ``log_sigma`` is the one-sigma uncertainty of ``log(factor)``: the true factor lies in
    ``factor * exp(+-log_sigma)`` about two times in three (held-out error of the fit).
    """

    factor: float
    log_sigma: float

    def __post_init__(self) -> None:
        if not (self.factor > 0 and math.isfinite(self.factor)):
            raise ValueError(f"factor={self.factor!r} must be a positive number")
        if not (self.log_sigma >= 0 and math.isfinite(self.log_sigma)):
            raise ValueError(f"log_sigma={self.log_sigma!r} must be >= 0")


def _default_sigma() -> dict[str, Any]:
    return {"cross_gpu": {}, "cross_precision": {}}


@dataclass(frozen=True)
class DeviceModel:
    """A fitted device-speed model: roofline weights per precision and held-out sigmas."""

    compute_weight: Mapping[str, float]  # k_p, per precision
    memory_weight: Mapping[str, float]  # m_p, per precision (fp32 = 1)
    fitted_on: tuple[str, ...]
    source: str
    sigma: Mapping[str, Any] | None = None
    held_out_error: Mapping[str, Any] = field(default_factory=dict, compare=False)
    # Occupancy: utilisation b / (b + batch_half * SMs / sm_ref) at per-GPU batch b (0: off).
    batch_half: float = 0.0
    sm_ref: float = 80.0
    # The fixed per-step part of a step (launches, host work) moves as ``factor ** gamma``
    # (1: like the rest; 0: not at all); used only when the caller knows that part's share.
    fixed_exponent: float = 1.0
    # A workload's own compute share from its measured speed-up between two precisions on the
    # source GPU, damped as ``scale ** workload_exponent`` (0: off, one share per precision).
    workload_exponent: float = 0.0
    # c_p, per precision: the part of a step on the FP32 CUDA cores (missing precisions: 0).
    cuda_core_weight: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, table in (
            ("compute_weight", self.compute_weight),
            ("memory_weight", self.memory_weight),
        ):
            missing = [p for p in FIT_PRECISIONS if p not in table]
            if missing:
                raise ValueError(f"{name} lacks precision(s) {missing}")
            for p in FIT_PRECISIONS:
                v = table[p]
                if (
                    isinstance(v, bool)
                    or not isinstance(v, int | float)
                    or not (v > 0 and math.isfinite(v))
                ):
                    raise ValueError(f"{name}.{p}={v!r} must be a positive number")
        for p, v in self.cuda_core_weight.items():
            if p not in FIT_PRECISIONS:
                raise ValueError(f"cuda_core_weight: unknown precision {p!r}")
            if (
                isinstance(v, bool)
                or not isinstance(v, int | float)
                or not (v >= 0 and math.isfinite(v))
            ):
                raise ValueError(f"cuda_core_weight.{p}={v!r} must be a number >= 0")
        full = {p: float(self.cuda_core_weight.get(p, 0.0)) for p in FIT_PRECISIONS}
        object.__setattr__(self, "cuda_core_weight", full)
        for g in (self.fixed_exponent, self.workload_exponent):
            if (
                isinstance(g, bool)
                or not isinstance(g, int | float)
                or not (g >= 0 and math.isfinite(g))
            ):
                raise ValueError(f"fixed_exponent/workload_exponent={g!r} must be a number >= 0")
        sigma = self.sigma if self.sigma is not None else _default_sigma()
        object.__setattr__(self, "sigma", sigma)
        for fam, g in dict(sigma.get("cross_gpu", {})).items():
            if fam not in FAMILIES or not isinstance(g, Mapping):
                raise ValueError(
                    f"sigma.cross_gpu.{fam}: expected 'full' or 'mixed' with base, per_distance"
                )
            for key in ("base", "per_distance"):
                w = g.get(key)
                if (
                    isinstance(w, bool)
                    or not isinstance(w, int | float)
                    or not (w >= 0 and math.isfinite(w))
                ):
                    raise ValueError(f"sigma.cross_gpu.{fam}.{key}={w!r} must be a number >= 0")
        for key in ("cross_precision", "cross_gpu_projection"):
            for fam, v in dict(sigma.get(key, {})).items():
                if fam not in FAMILIES:
                    raise ValueError(f"sigma.{key}.{fam}: expected 'full' or 'mixed'")
                if (
                    isinstance(v, bool)
                    or not isinstance(v, int | float)
                    or not (v >= 0 and math.isfinite(v))
                ):
                    raise ValueError(f"sigma.{key}.{fam}={v!r} must be a number >= 0")

    def with_fixed_part(self, factor: float, fixed_fraction: float | None) -> float:
        """The whole step's factor when ``fixed_fraction`` of the source step is fixed per-step
        work, which moves as ``factor ** fixed_exponent``: ``(1 - f) F + f F^gamma``."""
        if not fixed_fraction:
            return factor
        f = fixed_fraction
        return float((1.0 - f) * factor + f * factor**self.fixed_exponent)

    def utilisation(self, gpu: GpuSpec, batch: float | None) -> float:
        """Share of ``gpu`` a per-GPU batch keeps busy (1 when unknown or the model has none)."""
        if not self.batch_half or batch is None or not gpu.sm_count or batch <= 0:
            return 1.0
        return batch / (batch + self.batch_half * gpu.sm_count / self.sm_ref)

    @property
    def log_sigma(self) -> float:
        """A summary: the cross-GPU sigma at distance 1 for fp32/tf32 (0 when unfitted)."""
        assert self.sigma is not None
        g = self.sigma.get("cross_gpu", {}).get("full")
        return float(g["base"] + g["per_distance"]) if g else 0.0

    def device_time(self, gpu: GpuSpec, precision: str, scale: float = 1.0) -> float:
        """``T(g, p) = s k_p / P_p(g) + c_p / P_fp32(g) + m_p / BW(g)``: relative step time
        (only ratios matter); ``scale`` (s) is the workload's share of work at the precision's
        peak relative to the fitted one."""
        eff = effective_precision(gpu, precision)
        return scale * self.compute_weight[eff] / peak_tflops(gpu, eff) + self._rest(gpu, eff)

    def _rest(self, gpu: GpuSpec, eff: str) -> float:
        """The part of ``device_time`` that a workload's share does not scale:
        ``c_p / P_fp32(g) + m_p / BW(g)``."""
        c = self.cuda_core_weight[eff]
        cuda = c / _positive(gpu, "fp32_tflops") if c else 0.0
        return cuda + self.memory_weight[eff] / _positive(gpu, "mem_bw_gbs")

    def workload_scale(
        self, gpu: GpuSpec, precision: str, other_precision: str, ratio: float
    ) -> float:
        """The workload's compute share ``s`` from its measured ``ratio`` = time in
        ``other_precision`` / time in ``precision`` on ``gpu``: ``s`` solves
        ``T(g, other; s) = ratio * T(g, precision; s)``, clipped to ``[1e-3, 1e3]``, damped as
        ``s ** workload_exponent``. 1 when the model has no exponent or the two precisions run
        the same on ``gpu``."""
        p, q = effective_precision(gpu, precision), effective_precision(gpu, other_precision)
        if (
            not self.workload_exponent
            or p == q
            or precision_family(p) != "full"
            or not (ratio > 0 and math.isfinite(ratio))
        ):
            return 1.0
        num = self._rest(gpu, q) - ratio * self._rest(gpu, p)
        den = ratio * self.compute_weight[p] / peak_tflops(gpu, p) - self.compute_weight[
            q
        ] / peak_tflops(gpu, q)
        # Outside what the model can produce (num and den of opposite signs): the nearer bound.
        s = min(max(num / den, 1e-3), 1e3) if num * den > 0 else 1e-3 if den > 0 else 1e3
        return math.exp(max(-50.0, min(50.0, self.workload_exponent * math.log(s))))

    def sigma_for(
        self,
        src: GpuSpec,
        dst: GpuSpec,
        src_precision: str,
        dst_precision: str,
        *,
        projected: bool | None = None,
    ) -> float:
        """Held-out one-sigma log error of the src -> dst (and precision) projection."""
        assert self.sigma is not None
        if projected is None:
            projected = is_projection(src, dst, src_precision, dst_precision)
        return held_out_sigma(self.sigma, src, dst, src_precision, dst_precision, projected)

    @classmethod
    def from_dict(cls, doc: Any, source: str = "device model") -> DeviceModel:
        """Validate a parsed ``kplan.device-model/2.x`` document.

        Raises ``SchemaVersionError`` for an unknown major version, ``DataFileError`` for a 1.x
        document (no precision; re-create it) and for anything malformed (naming the field).
        """
        _check_schema(doc, source)
        weights = {}
        for key in ("compute_weight", "memory_weight"):
            table = _field(doc, key, source)
            if not isinstance(table, dict):
                raise DataFileError(
                    f"{source}: {key!r} must be an object of precision -> number, got {table!r}",
                    hint=f"give one number for each of {', '.join(FIT_PRECISIONS)}",
                )
            weights[key] = {p: _number(table.get(p), source, f"{key}.{p}") for p in FIT_PRECISIONS}
        fitted_on = _field(doc, "fitted_on", source)
        if not isinstance(fitted_on, list) or not all(isinstance(g, str) for g in fitted_on):
            raise DataFileError(
                f"{source}: 'fitted_on' must be a list of GPU names, got {fitted_on!r}",
                hint="list the GPUs whose measurements the model was fitted on",
            )
        held_out = doc.get("held_out_error", {})
        if not isinstance(held_out, dict):
            raise DataFileError(
                f"{source}: 'held_out_error' must be an object, got {held_out!r}", hint="fix it"
            )
        sigma = doc.get("sigma", _default_sigma())
        if not isinstance(sigma, dict):
            raise DataFileError(
                f"{source}: 'sigma' must be an object, got {sigma!r}", hint="fix it"
            )
        src_text = _field(doc, "source", source)
        if not isinstance(src_text, str):
            raise DataFileError(f"{source}: 'source' must be text, got {src_text!r}", hint="fix it")
        try:
            return cls(
                compute_weight=weights["compute_weight"],
                memory_weight=weights["memory_weight"],
                fitted_on=tuple(fitted_on),
                source=src_text,
                sigma=sigma,
                held_out_error=held_out,
                batch_half=_number(doc.get("batch_half", 0.0), source, "batch_half"),
                sm_ref=_number(doc.get("sm_ref", 80.0), source, "sm_ref"),
                fixed_exponent=_number(doc.get("fixed_exponent", 1.0), source, "fixed_exponent"),
                workload_exponent=_number(
                    doc.get("workload_exponent", 0.0), source, "workload_exponent"
                ),
                cuda_core_weight=_cuda_core_weight(doc, source),
            )
        except (ValueError, TypeError, AttributeError) as err:
            raise DataFileError(
                f"{source}: {err}", hint="re-create the device model file"
            ) from None

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (inverse of ``from_dict``)."""
        return {
            "schema": DEVICE_MODEL_SCHEMA,
            "compute_weight": dict(self.compute_weight),
            "memory_weight": dict(self.memory_weight),
            "cuda_core_weight": dict(self.cuda_core_weight),
            "batch_half": self.batch_half,
            "sm_ref": self.sm_ref,
            "fixed_exponent": self.fixed_exponent,
            "workload_exponent": self.workload_exponent,
            "sigma": dict(self.sigma or {}),
            "log_sigma": round(self.log_sigma, 4),
            "fitted_on": list(self.fitted_on),
            "held_out_error": dict(self.held_out_error),
            "source": self.source,
        }


def _check_schema(doc: Any, source: str) -> None:
    """``kplan.device-model/2.x``; a 1.x document is refused with a hint to re-create it."""
    if not isinstance(doc, dict):
        raise DataFileError(
            f"{source}: expected a JSON object, got {type(doc).__name__}",
            hint=f"the file must be a {_KIND} document with a 'schema' field",
        )
    schema = doc.get("schema")
    kind, _, version = schema.partition("/") if isinstance(schema, str) else ("", "", "")
    if kind != _KIND or not version.split(".")[0].isdigit():
        raise DataFileError(
            f"{source}: missing or malformed 'schema' field ({schema!r})",
            hint=f"expected '{DEVICE_MODEL_SCHEMA}'",
        )
    major = int(version.split(".")[0])
    if major == 1:
        raise DataFileError(
            f"{source}: {schema} is an old device model (FP32 only, no precision)",
            hint="re-create it with scripts/fit_device_model.py (schema 2.0), "
            "or omit it to use the shipped one",
        )
    if major != 2:
        raise SchemaVersionError(
            f"{source}: {_KIND} schema version {version} is not supported",
            hint="this kplan reads major version 2; upgrade kplan or re-create the file",
        )


def _cuda_core_weight(doc: dict[str, Any], source: str) -> dict[str, float]:
    """``cuda_core_weight`` (2.1): precision -> number >= 0; absent (a 2.0 file): none."""
    table = doc.get("cuda_core_weight", {})
    if not isinstance(table, dict):
        raise DataFileError(
            f"{source}: 'cuda_core_weight' must be an object of precision -> number, got {table!r}",
            hint=f"give a number >= 0 for each of {', '.join(FIT_PRECISIONS)}, or leave it out",
        )
    return {str(p): _number(v, source, f"cuda_core_weight.{p}") for p, v in table.items()}


def _field(doc: dict[str, Any], key: str, source: str) -> Any:
    if key not in doc:
        raise DataFileError(f"{source}: missing field {key!r}", hint="re-create the file")
    return doc[key]


def _number(value: Any, source: str, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise DataFileError(f"{source}: {name!r} must be a number, got {value!r}", hint="fix it")
    return float(value)


def is_projection(src: GpuSpec, dst: GpuSpec, src_precision: str, dst_precision: str) -> bool:
    """Whether src -> dst runs the job in another precision than it was measured in. TF32 on a
    GPU without it is FP32 exactly (the switch is ignored); BF16 without native support is
    emulated at an unmeasured speed: taken as FP32, but still a projection."""
    ps, pd = effective_precision(src, src_precision), effective_precision(dst, dst_precision)
    return ps != pd or (
        src_precision != dst_precision
        and (_emulated_bf16(src, src_precision) or _emulated_bf16(dst, dst_precision))
    )


def held_out_sigma(
    sigma: Mapping[str, Any],
    src: GpuSpec,
    dst: GpuSpec,
    src_precision: str,
    dst_precision: str,
    projected: bool,
) -> float:
    """The one-sigma log error that the ``sigma`` tables give a src -> dst prediction:
    ``cross_gpu`` (base + per_distance * spec distance) across GPUs; a projection to another
    precision adds, in quadrature, ``cross_precision`` on one GPU or across families, and
    ``cross_gpu_projection`` (2.1; else ``cross_precision``) across GPUs within a family (FP32 on
    one GPU, TF32 tensor cores on the other)."""
    ps, pd = effective_precision(src, src_precision), effective_precision(dst, dst_precision)
    fam = precision_family(pd)
    same_gpu = src.name == dst.name
    gpu_term = 0.0
    if not same_gpu:
        table = sigma.get("cross_gpu", {})
        g = table.get(fam) or next(iter(table.values()), None)
        if g:
            gpu_term = float(g["base"] + g["per_distance"] * spec_distance(src, dst, ps, pd))
    prec_term = 0.0
    if projected:
        table = sigma.get("cross_precision", {})
        prec_term = float(table.get(fam, max(table.values(), default=0.0)))
        within = sigma.get("cross_gpu_projection", {})
        if not same_gpu and precision_family(ps) == fam and fam in within:
            prec_term = float(within[fam])
    return math.hypot(gpu_term, prec_term)


def compute_scale(
    model: DeviceModel,
    src: GpuSpec,
    dst: GpuSpec,
    *,
    src_precision: str = "fp32",
    dst_precision: str = "fp32",
    batch: float | None = None,
    fixed_fraction: float | None = None,
    precision_ratio: tuple[str, float] | None = None,
) -> SpeedEstimate:
    """How a compute time measured on ``src`` in ``src_precision`` scales on ``dst`` in
    ``dst_precision``: ``t_dst = factor * t_src``, with the held-out sigma of that projection.

    ``batch`` (per-GPU, optional): a GPU with more SMs is less used at a small batch.
    ``fixed_fraction`` (optional, 0-1): the share of the measured time that does not grow with
    the batch on ``src`` (the intercept of step time against per-GPU batch, from the profile);
    it moves less than the device part. Leave it out for a time that is all per-sample work.
    ``precision_ratio`` (optional): ``(other precision, time in it / time in src_precision)``
    measured on ``src``: how much the workload gains from the other precision's peak tells how
    compute-bound it is (its own roofline share instead of the precision's fitted one).
    """
    if fixed_fraction is not None and not 0.0 <= fixed_fraction <= 1.0:
        raise ValueError(f"fixed_fraction={fixed_fraction!r} must be between 0 and 1")
    ps, pd = effective_precision(src, src_precision), effective_precision(dst, dst_precision)
    projected = is_projection(src, dst, src_precision, dst_precision)
    if src.name == dst.name and not projected:
        return SpeedEstimate(1.0, 0.0)
    # Across GPUs only: on the same GPU a measured ratio would be the answer, not a share.
    cross = src.name != dst.name
    scale = model.workload_scale(src, ps, *precision_ratio) if precision_ratio and cross else 1.0
    factor = model.device_time(dst, pd, scale) / model.device_time(src, ps, scale)
    factor *= model.utilisation(src, batch) / model.utilisation(dst, batch)
    factor = model.with_fixed_part(factor, fixed_fraction)
    return SpeedEstimate(factor, model.sigma_for(src, dst, ps, pd, projected=projected))


def _emulated_bf16(gpu: GpuSpec, precision: str) -> bool:
    return precision == "bf16" and not gpu.bf16_tflops


def compute_scales(
    model: DeviceModel,
    src: GpuSpec,
    dsts: Sequence[GpuSpec],
    *,
    src_precision: str = "fp32",
    dst_precision: str = "fp32",
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``compute_scale`` for many destination GPUs at once: (factors, log_sigmas) arrays."""
    if not dsts:
        return np.zeros(0), np.zeros(0)
    est = [
        compute_scale(model, src, g, src_precision=src_precision, dst_precision=dst_precision)
        for g in dsts
    ]
    return (
        np.array([e.factor for e in est], dtype=np.float64),
        np.array([e.log_sigma for e in est], dtype=np.float64),
    )
