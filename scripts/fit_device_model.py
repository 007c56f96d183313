"""Fit kplan's cross-device compute-speed model on NeuSight's measured iteration times.

Run from the repository root::

    .venv/bin/python -m scripts.fit_device_model            # writes catalogs/data/device_model.json
    .venv/bin/python -m scripts.fit_device_model --dry-run  # prints the document only

Data: ``gpu/neusight-asplos25`` of the shared data folder ($KPLAN_SHARED_DATA, else
../shared/data beside the repository): per-iteration FP32 latencies of BERT, GPT-2, GPT-3, OPT
and Switch Transformer layers stacks (``label/<GPU>/<model>-<train|inf>-<seq>-<batch>.json``) and
the GPUs' specs (``device_configs/``).

Model (see ``kplan.planner.devices``): ``log(t_dst/t_src) = c_F * dlog(FP32 peak) + c_B *
dlog(memory bandwidth)`` over pairs of GPUs that ran the same workload. The shipped fit constrains
``c_F + c_B = -1`` (a roofline blend ``t ~ F^-a * BW^-(1-a)``), one free parameter. Errors are
measured on GPUs held out of the fit (leave one GPU out, and a fixed H100 + L4 hold-out).

Scope: single-GPU entries of the NVIDIA GPUs, training and inference (inference is forward only,
but it is what gives T4, P4, P100 and A100-40GB any data; the benchmark shows it lowers the
held-out error on training pairs). AMD GPUs are left out of the shipped fit: no cloud in kplan's
catalog offers them, their FP32 peak is ambiguous (vector or matrix cores) and the benchmark shows
that adding them raises the error on NVIDIA GPUs. Multi-GPU entries (-dp4, -tp4, -pp4_1) include
communication; they are a supplementary check only.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kplan.planner.catalog import GpuSpec
from kplan.planner.devices import DEVICE_MODEL_SCHEMA, DeviceModel, compute_scale

NEUSIGHT = Path("gpu") / "neusight-asplos25"
FEATURES = ("log_fp32_tflops", "log_mem_bw_gbs")
NVIDIA = (
    "Tesla_P4",
    "Tesla_T4",
    "Tesla_P100-PCIE-16GB",
    "Tesla_V100-PCIE-32GB",
    "NVIDIA_A100-PCIE-40GB",
    "NVIDIA_A100-SXM4-40GB",  # multi-GPU entries only
    "NVIDIA_A100_80GB_PCIe",
    "NVIDIA_H100_80GB_HBM3",
    "NVIDIA_L4",
)
AMD = ("AMD_Instinct_MI100", "AMD_Instinct_MI210", "AMD_Instinct_MI250")
MULTI_GPU_SUFFIXES = ("-dp4", "-tp4", "-pp4_1")
FIXED_HOLD_OUT = ("NVIDIA_H100_80GB_HBM3", "NVIDIA_L4")
SHIPPED_PATH = Path(__file__).resolve().parents[1] / "catalogs" / "data" / "device_model.json"
SOURCE = (
    "scripts/fit_device_model.py on NeuSight (github.com/sitar-lab/NeuSight @6945927, MIT; "
    "license in LICENSE-neusight.txt): measured per-iteration FP32 latencies (label/) and specs "
    "(device_configs/) of single-GPU training and inference runs on NVIDIA GPUs"
)


def data_root() -> Path:
    """The shared data folder: $KPLAN_SHARED_DATA, else ../shared/data beside the repo."""
    env = os.environ.get("KPLAN_SHARED_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "data"


@dataclass(frozen=True)
class Sample:
    """One measured iteration time of one workload on one GPU."""

    gpu: str
    workload: str  # the label file's name, e.g. "bert_large-train-512-8"
    mode: str  # "train" or "inf"
    ms: float


@dataclass(frozen=True)
class Pairs:
    """The same workload on two GPUs: ``log_ratio = log(t_dst / t_src)``."""

    src: tuple[str, ...]
    dst: tuple[str, ...]
    workload: tuple[str, ...]
    mode: tuple[str, ...]
    log_ratio: NDArray[np.float64]

    def __len__(self) -> int:
        return len(self.src)


# ---------------------------------------------------------------------------------- loading


def load_specs(root: Path, gpus: Iterable[str]) -> dict[str, GpuSpec]:
    """GpuSpec of each NeuSight device: FP32 peak is ``SingleFLOPs`` / 1000 (TFLOPS).

    AMD configs give ``SingleFLOPsVEC`` (vector) and ``SingleFLOPsMM`` (matrix cores); the vector
    peak is used, the counterpart of NVIDIA's non-tensor-core FP32. NeuSight has no FP16 peaks
    and the model does not use them, so ``fp16_tflops`` is NaN here.
    """
    specs = {}
    for gpu in gpus:
        path = root / NEUSIGHT / "device_configs" / f"{gpu}.json"
        cfg = json.loads(path.read_text())
        gflops = cfg.get("SingleFLOPs", cfg.get("SingleFLOPsVEC"))
        specs[gpu] = GpuSpec(
            name=gpu,
            memory_gb=float(cfg["Dev_Mem"]),
            fp32_tflops=float(gflops) / 1000.0,
            fp16_tflops=math.nan,
            mem_bw_gbs=float(cfg["Mem_Bw"]),
            source=f"NeuSight device_configs/{path.name}",
        )
    return specs


def load_samples(root: Path, gpus: Iterable[str], *, multi_gpu: bool = False) -> list[Sample]:
    """Measured e2e latencies; single-GPU entries, or only the multi-GPU ones."""
    samples = []
    for gpu in gpus:
        for path in sorted((root / NEUSIGHT / "label" / gpu).glob("*.json")):
            if path.stem.endswith(MULTI_GPU_SUFFIXES) != multi_gpu:
                continue
            mode = path.stem.split("-")[1]
            if mode not in ("train", "inf"):
                raise ValueError(f"{path}: cannot tell training from inference in {path.stem!r}")
            ms = float(json.loads(path.read_text())["e2e_latency"])
            if not (ms > 0 and math.isfinite(ms)):
                raise ValueError(f"{path}: e2e_latency={ms!r} is not a positive time")
            samples.append(Sample(gpu, path.stem, mode, ms))
    return samples


def make_pairs(samples: Sequence[Sample], *, ordered: bool) -> Pairs:
    """Every pair of GPUs that ran the same workload (both directions when ``ordered``)."""
    by_workload: dict[str, list[Sample]] = {}
    for s in samples:
        by_workload.setdefault(s.workload, []).append(s)
    combos = itertools.permutations if ordered else itertools.combinations
    rows = [
        (a.gpu, b.gpu, w, a.mode, math.log(b.ms / a.ms))
        for w, group in sorted(by_workload.items())
        for a, b in combos(sorted(group, key=lambda s: s.gpu), 2)
    ]
    if not rows:
        return Pairs((), (), (), (), np.zeros(0))
    src, dst, workload, mode, y = zip(*rows, strict=True)
    return Pairs(src, dst, workload, mode, np.array(y, dtype=np.float64))


def spec_differences(pairs: Pairs, specs: dict[str, GpuSpec]) -> NDArray[np.float64]:
    """Design matrix: ``phi(dst) - phi(src)`` with phi = (log FP32 peak, log bandwidth)."""

    def phi(gpu: str) -> tuple[float, float]:
        return math.log(specs[gpu].fp32_tflops), math.log(specs[gpu].mem_bw_gbs)

    if not len(pairs):
        return np.zeros((0, len(FEATURES)))
    return np.array(
        [np.subtract(phi(d), phi(s)) for s, d in zip(pairs.src, pairs.dst, strict=True)]
    )


# ---------------------------------------------------------------------------------- fitting


def fit_coefficients(
    x: NDArray[np.float64], y: NDArray[np.float64], *, sum_to_one: bool = True
) -> NDArray[np.float64]:
    """Least-squares coefficients of ``y ~ x @ c`` with no intercept (the model is antisymmetric).

    ``x`` columns are (dlog FP32 peak, dlog bandwidth); ``y`` is log(t_dst / t_src). With
    ``sum_to_one`` the coefficients are ``(-a, -(1 - a))``: substituting gives
    ``y + dB = -a * (dF - dB)``, a one-feature regression. Ridge shrinkage towards zero would
    pull towards "every GPU is equally fast", so the constraint is the regularizer instead.
    """
    from sklearn.linear_model import LinearRegression

    if x.ndim != 2 or x.shape[1] != 2 or len(x) != len(y):
        raise ValueError(f"need x of shape (n, 2) and y of length n, got {x.shape} and {y.shape}")
    if len(y) < 2:
        raise ValueError(f"need at least 2 pairs to fit, got {len(y)}")
    if sum_to_one:
        u = (x[:, 0] - x[:, 1]).reshape(-1, 1)
        reg = LinearRegression(fit_intercept=False).fit(u, y + x[:, 1])
        a = -float(reg.coef_[0])
        return np.array([-a, -(1.0 - a)])
    reg = LinearRegression(fit_intercept=False).fit(x, y)
    return np.asarray(reg.coef_, dtype=np.float64)


Fitter = Callable[[NDArray[np.float64], NDArray[np.float64]], NDArray[np.float64]]


def _fixed(coefficients: tuple[float, float]) -> Fitter:
    return lambda x, y: np.array(coefficients)


# name -> how it gets its coefficients; the first is the shipped method.
METHODS: dict[str, Fitter] = {
    "blend a+b=1 (shipped)": lambda x, y: fit_coefficients(x, y, sum_to_one=True),
    "free a, b": lambda x, y: fit_coefficients(x, y, sum_to_one=False),
    "a=b=0.5 (no fit)": _fixed((-0.5, -0.5)),
    "FP32 ratio": _fixed((-1.0, 0.0)),
    "bandwidth ratio": _fixed((0.0, -1.0)),
}
SHIPPED_METHOD = next(iter(METHODS))


def as_model(coefficients: NDArray[np.float64], log_sigma: float = 0.0) -> DeviceModel:
    return DeviceModel(
        features=FEATURES,
        coefficients=tuple(float(c) for c in coefficients),
        log_sigma=log_sigma,
        fitted_on=(),
        source="in-memory fit",
    )


# ------------------------------------------------------------------------------- evaluation


@dataclass(frozen=True)
class HeldOut:
    """Predictions for pairs involving held-out GPUs: ``residual = log(pred / measured)``."""

    pairs: Pairs
    residual: NDArray[np.float64]
    coefficients: NDArray[np.float64]


def predict_held_out(
    fit_samples: Sequence[Sample],
    eval_samples: Sequence[Sample],
    specs: dict[str, GpuSpec],
    held_out: Sequence[str],
    fitter: Fitter,
) -> HeldOut:
    """Fit on pairs without the held-out GPUs; predict every ordered pair involving one.

    Predictions go through ``kplan.planner.devices.compute_scale``, the planner's own path.
    """
    train = make_pairs([s for s in fit_samples if s.gpu not in held_out], ordered=False)
    coefficients = fitter(spec_differences(train, specs), train.log_ratio)
    model = as_model(coefficients)
    test = make_pairs(eval_samples, ordered=True)
    keep = [i for i in range(len(test)) if test.src[i] in held_out or test.dst[i] in held_out]
    test = Pairs(
        tuple(test.src[i] for i in keep),
        tuple(test.dst[i] for i in keep),
        tuple(test.workload[i] for i in keep),
        tuple(test.mode[i] for i in keep),
        test.log_ratio[keep],
    )
    predicted = np.array(
        [
            math.log(compute_scale(model, specs[s], specs[d]).factor)
            for s, d in zip(test.src, test.dst, strict=True)
        ]
    )
    return HeldOut(test, predicted - test.log_ratio, coefficients)


def leave_one_gpu_out(
    fit_samples: Sequence[Sample],
    eval_samples: Sequence[Sample],
    specs: dict[str, GpuSpec],
    fitter: Fitter,
) -> dict[str, HeldOut]:
    """Hold out each GPU of ``eval_samples`` in turn."""
    gpus = sorted({s.gpu for s in eval_samples})
    return {g: predict_held_out(fit_samples, eval_samples, specs, [g], fitter) for g in gpus}


def error_summary(residual: NDArray[np.float64]) -> dict[str, float]:
    """APE = |predicted / measured - 1| of t_dst; rms_log = RMS of log(predicted / measured)."""
    if not len(residual):
        return {"n_pairs": 0}
    ape = np.abs(np.expm1(residual))
    return {
        "mape": round(float(ape.mean()), 4),
        "median_ape": round(float(np.median(ape)), 4),
        "p90_ape": round(float(np.quantile(ape, 0.9)), 4),
        "rms_log": round(float(np.sqrt(np.mean(residual**2))), 4),
        "n_pairs": len(residual),
    }


def by_mode(results: Iterable[HeldOut]) -> dict[str, dict[str, float]]:
    """Error summaries of training pairs and of inference pairs, pooled over ``results``."""
    results = list(results)
    out = {}
    for mode in ("train", "inf"):
        res = [r.residual[np.array(r.pairs.mode) == mode] for r in results if len(r.pairs)]
        pooled = np.concatenate(res) if res else np.zeros(0)
        if len(pooled):
            out[mode] = error_summary(pooled)
    return out


# -------------------------------------------------------------------------------- the fit


@dataclass(frozen=True)
class Dataset:
    specs: dict[str, GpuSpec]
    nvidia: list[Sample]  # single-GPU entries, the fit and evaluation set
    amd: list[Sample]  # single-GPU entries, ablation only
    multi_gpu: list[Sample]  # NVIDIA -dp4/-tp4/-pp4_1 entries, supplementary check


def load_dataset(root: Path | None = None) -> Dataset:
    root = root or data_root()
    return Dataset(
        specs=load_specs(root, NVIDIA + AMD),
        nvidia=load_samples(root, NVIDIA),
        amd=load_samples(root, AMD),
        multi_gpu=load_samples(root, NVIDIA, multi_gpu=True),
    )


def fit_document(data: Dataset) -> dict[str, Any]:
    """Fit the shipped model on every NVIDIA single-GPU entry and measure its held-out error."""
    fitter = METHODS[SHIPPED_METHOD]
    pairs = make_pairs(data.nvidia, ordered=False)
    coefficients = fitter(spec_differences(pairs, data.specs), pairs.log_ratio)
    logo = leave_one_gpu_out(data.nvidia, data.nvidia, data.specs, fitter)
    fixed = predict_held_out(data.nvidia, data.nvidia, data.specs, FIXED_HOLD_OUT, fitter)
    pooled = by_mode(logo.values())
    fold_a = [-float(r.coefficients[0]) for r in logo.values()]
    baselines = {
        name: by_mode(leave_one_gpu_out(data.nvidia, data.nvidia, data.specs, f).values())
        for name, f in METHODS.items()
        if name != SHIPPED_METHOD
    }
    held_out_error = {
        "metric": "APE = |predicted / measured - 1| of the destination GPU's iteration time, "
        "over ordered (src, dst) pairs of the same workload with a held-out GPU on either side; "
        "'train' pairs are training iterations, 'inf' pairs forward-only inference",
        "leave_one_gpu_out": {
            **pooled,
            "per_gpu": {g: by_mode([r]) for g, r in logo.items()},
            "fp32_exponent_range": [round(min(fold_a), 4), round(max(fold_a), 4)],
        },
        "fixed_split": {"held_out": list(FIXED_HOLD_OUT), **by_mode([fixed])},
        "baselines_leave_one_gpu_out": baselines,
    }
    return {
        "schema": DEVICE_MODEL_SCHEMA,
        "features": list(FEATURES),
        "coefficients": {
            f: round(float(c), 6) for f, c in zip(FEATURES, coefficients, strict=True)
        },
        "intercept": 0.0,
        # The uncertainty of a training-time prediction: RMS log error of held-out training pairs.
        "log_sigma": pooled["train"]["rms_log"],
        "fitted_on": sorted({s.gpu for s in data.nvidia}),
        "held_out_error": held_out_error,
        "source": SOURCE,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--data", type=Path, default=None, help="shared data folder")
    parser.add_argument("--out", type=Path, default=SHIPPED_PATH, help="where to write the JSON")
    parser.add_argument("--dry-run", action="store_true", help="print the document, write nothing")
    args = parser.parse_args(argv)
    doc = fit_document(load_dataset(args.data))
    DeviceModel.from_dict(doc, source="fitted document")  # what the planner will read
    text = json.dumps(doc, indent=2) + "\n"
    if args.dry_run:
        sys.stdout.write(text)
        return 0
    args.out.write_text(text)
    coef = doc["coefficients"]
    logo = doc["held_out_error"]["leave_one_gpu_out"]
    print(f"wrote {args.out}: coefficients {coef}, log_sigma {doc['log_sigma']}")
    print(
        f"leave-one-GPU-out MAPE: train pairs {logo['train']['mape']:.1%}, "
        f"inference pairs {logo['inf']['mape']:.1%}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
