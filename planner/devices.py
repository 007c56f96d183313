"""Cross-device compute speed: scale a compute time measured on one GPU type to another.

The model is a roofline-style geometric blend over published specs. A job's compute time on a
GPU with FP32 peak ``F`` and memory bandwidth ``BW`` is taken as ``t ~ F^-a * BW^-b``, so the
time measured on ``src`` maps to ``dst`` as::

    log(t_dst / t_src) = sum_k c_k * (phi_k(dst) - phi_k(src)),   phi = (log F, log BW)

with ``c = (-a, -b)`` fitted offline (``scripts/fit_device_model.py``, scikit-learn) on measured
iteration times of the same workloads on several GPUs. The shipped fit constrains
``a + b = 1`` (a GPU faster by k in both FLOPs and bandwidth runs k times faster). The model is
antisymmetric, so it has no intercept: identity gives factor 1 and swapping src and dst inverts
the factor. ``log_sigma`` is the root-mean-square log error on GPUs held out of the fit.

Document shape (``schema`` = ``kplan.device-model/1.x``)::

    {"schema": "kplan.device-model/1.0",
     "features": ["log_fp32_tflops", "log_mem_bw_gbs"],
     "coefficients": {"log_fp32_tflops": -0.43, "log_mem_bw_gbs": -0.57},
     "intercept": 0.0, "log_sigma": 0.28,
     "fitted_on": ["Tesla_T4", ...], "held_out_error": {...}, "source": "..."}

Pure: no I/O. ``kplan.catalogs.device_model`` reads the shipped file.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kplan.errors import CatalogError, DataFileError
from kplan.planner.catalog import GpuSpec
from kplan.planner.profile import check_schema

DEVICE_MODEL_SCHEMA = "kplan.device-model/1.0"
_KIND = "kplan.device-model"


def _positive_log(gpu: GpuSpec, attr: str) -> float:
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
    return math.log(value)


# The spec features a device model may use: name -> function of a GPU's published specs.
FEATURES: dict[str, Callable[[GpuSpec], float]] = {
    "log_fp32_tflops": lambda g: _positive_log(g, "fp32_tflops"),
    "log_mem_bw_gbs": lambda g: _positive_log(g, "mem_bw_gbs"),
}


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

    def factor_at(self, z: float) -> float:
        """The factor ``z`` standard deviations out, e.g. ``z=1.2816`` for a p90 compute time."""
        return self.factor * math.exp(z * self.log_sigma)


@dataclass(frozen=True)
class DeviceModel:
    """A fitted device-speed model: coefficients on spec-feature differences."""

    features: tuple[str, ...]
    coefficients: tuple[float, ...]  # aligned with features
    log_sigma: float  # RMS log error of held-out predictions
    fitted_on: tuple[str, ...]
    source: str
    intercept: float = 0.0  # always 0: the model is antisymmetric in (src, dst)
    held_out_error: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not self.features:
            raise ValueError("features is empty: a device model needs at least one feature")
        unknown = [f for f in self.features if f not in FEATURES]
        if unknown:
            raise ValueError(f"unknown features {unknown}; known: {sorted(FEATURES)}")
        if len(set(self.features)) != len(self.features):
            raise ValueError(f"features {list(self.features)} has duplicates")
        if len(self.coefficients) != len(self.features):
            raise ValueError(
                f"{len(self.coefficients)} coefficients for {len(self.features)} features"
            )
        for name, c in zip(self.features, self.coefficients, strict=True):
            if not math.isfinite(c):
                raise ValueError(f"coefficient {name}={c!r} must be finite")
        if self.intercept != 0.0:
            raise ValueError(
                f"intercept={self.intercept!r} must be 0: a non-zero intercept would make a GPU "
                "differ from itself"
            )
        if not (self.log_sigma >= 0 and math.isfinite(self.log_sigma)):
            raise ValueError(f"log_sigma={self.log_sigma!r} must be a number >= 0")

    @classmethod
    def from_dict(cls, doc: Any, source: str = "device model") -> DeviceModel:
        """Validate a parsed ``kplan.device-model/1.x`` document.

        Raises ``SchemaVersionError`` for an unknown major version and ``DataFileError``
        (naming the field and echoing the bad value) for anything else malformed.
        """
        check_schema(doc, _KIND, source)
        features = _field(doc, "features", source)
        if not isinstance(features, list) or not all(isinstance(f, str) for f in features):
            raise DataFileError(
                f"{source}: 'features' must be a list of names, got {features!r}",
                hint=f"known features: {sorted(FEATURES)}",
            )
        coefs = _field(doc, "coefficients", source)
        if not isinstance(coefs, dict):
            raise DataFileError(
                f"{source}: 'coefficients' must be an object, got {coefs!r}",
                hint="map each feature name to its coefficient",
            )
        missing = [f for f in features if f not in coefs]
        extra = [k for k in coefs if k not in features]
        if missing or extra:
            raise DataFileError(
                f"{source}: coefficients do not match features (missing {missing}, extra {extra})",
                hint="give exactly one coefficient per feature",
            )
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
        src_text = _field(doc, "source", source)
        if not isinstance(src_text, str):
            raise DataFileError(f"{source}: 'source' must be text, got {src_text!r}", hint="fix it")
        try:
            return cls(
                features=tuple(features),
                coefficients=tuple(
                    _number(coefs[f], source, f"coefficients.{f}") for f in features
                ),
                log_sigma=_number(_field(doc, "log_sigma", source), source, "log_sigma"),
                fitted_on=tuple(fitted_on),
                source=src_text,
                intercept=_number(_field(doc, "intercept", source), source, "intercept"),
                held_out_error=held_out,
            )
        except ValueError as err:
            raise DataFileError(
                f"{source}: {err}", hint="re-create the device model file"
            ) from None

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (inverse of ``from_dict``)."""
        return {
            "schema": DEVICE_MODEL_SCHEMA,
            "features": list(self.features),
            "coefficients": dict(zip(self.features, self.coefficients, strict=True)),
            "intercept": self.intercept,
            "log_sigma": self.log_sigma,
            "fitted_on": list(self.fitted_on),
            "held_out_error": dict(self.held_out_error),
            "source": self.source,
        }


def _field(doc: dict[str, Any], key: str, source: str) -> Any:
    if key not in doc:
        raise DataFileError(f"{source}: missing field {key!r}", hint="re-create the file")
    return doc[key]


def _number(value: Any, source: str, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise DataFileError(f"{source}: {name!r} must be a number, got {value!r}", hint="fix it")
    return float(value)


def feature_vector(model: DeviceModel, gpu: GpuSpec) -> NDArray[np.float64]:
    """phi(gpu): the model's features of one GPU, in ``model.features`` order."""
    return np.array([FEATURES[f](gpu) for f in model.features], dtype=np.float64)


def compute_scale(
    model: DeviceModel,
    src: GpuSpec,
    dst: GpuSpec,
    *,
    src_precision: str = "fp32",
    dst_precision: str = "fp32",
) -> SpeedEstimate:
    """How a compute time measured on ``src`` scales on ``dst``: ``t_dst = factor * t_src``.

    ``src_precision``/``dst_precision``: the precision measured and the precision predicted.
    """
    if src.name == dst.name and src_precision == dst_precision:
        return SpeedEstimate(1.0, 0.0)
    if src_precision != dst_precision:
        # Interim (device model 1.x has no precision term): the FP32 model, with a wide sigma.
        base = compute_scale(model, src, dst)
        return SpeedEstimate(base.factor, math.hypot(base.log_sigma, 0.5))
    coef = np.asarray(model.coefficients, dtype=np.float64)
    log_factor = float(coef @ (feature_vector(model, dst) - feature_vector(model, src)))
    return SpeedEstimate(math.exp(log_factor), model.log_sigma)


def compute_scales(
    model: DeviceModel, src: GpuSpec, dsts: Sequence[GpuSpec]
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``compute_scale`` for many destination GPUs at once: (factors, log_sigmas) arrays."""
    if not dsts:
        return np.zeros(0), np.zeros(0)
    coef = np.asarray(model.coefficients, dtype=np.float64)
    phi = np.stack([feature_vector(model, g) for g in dsts])  # (n, features)
    log_factor = (phi - feature_vector(model, src)) @ coef
    same = np.array([g.name == src.name for g in dsts])
    factors = np.where(same, 1.0, np.exp(log_factor))
    sigmas = np.where(same, 0.0, model.log_sigma)
    return factors.astype(np.float64), sigmas.astype(np.float64)
