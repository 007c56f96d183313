"""Fit kplan's operator-level time model (``kplan.planner.opmodel``) on NeuSight's kernel timings.

Run from the repository root::

    .venv/bin/python -m scripts.fit_op_model            # writes catalogs/data/op_model.json
    .venv/bin/python -m scripts.fit_op_model --dry-run  # prints the held-out errors only

Data: ``gpu/neusight-asplos25/kernels`` in the shared folder ($KPLAN_SHARED_DATA, else
../shared/data beside the repository): every kernel shape of bmm, linear, conv, softmax,
layer norm and eleven elementwise ops measured in FP32 on P4, P100, T4, V100 and A100 (40 GB;
conv on the 80 GB), about 250k timings. Those five GPUs are NeuSight's own training set: the
model never sees H100, L4 or A100-80GB kernels, so the benchmark
(``bench/opgraph_neusight.py``) can test on them.

Fit: per operator class, ``log(t / t_roof)`` against the class's shape features
(``opmodel.features``) by ridge regression on standardised features, each GPU weighted
equally; the closed-form Cholesky solve makes it deterministic. Sigmas: leave one GPU out
(refit without it, predict its kernels): ``bias`` is the root mean square of the held-out GPU's
median log error, ``kernel`` the spread of single kernels about that median. The tensor-core
term: ``kernels/fp16mm.csv`` holds ten fp16 batched matmuls on a GPU the file does not name;
at up to 370 TFLOPS it is faster than an A100's 312 TFLOPS fp16 peak, so it is taken as the
H100 (SXM, HBM3: the only Hopper in the data); their mean log error is ``tensor_offset`` and
their spread about it, added in quadrature to the FP32 bias, is ``tensor_sigma``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kplan.planner.opmodel import (
    CLASSES,
    FEATURES,
    OP_MODEL_SCHEMA,
    OpDevice,
    OpModel,
    device_from_gpu,
    features,
    matmul_work,
)
from scripts import neusight_data as nd

OUT = Path(__file__).resolve().parents[1] / "kplan" / "catalogs" / "data" / "op_model.json"
ALPHA = 1.0  # ridge penalty on standardised features (weights sum to the sample count)
Rows = dict[str, dict[str, Any]]  # class -> {"x", "y", "gpu"} arrays


def build_rows(gpus: Iterable[str], base: Path | None = None) -> Rows:
    """Feature rows of every kernel of ``gpus``: x, y = log(t / t_roof), the GPU of each."""
    acc: dict[str, tuple[list[list[float]], list[float], list[str]]] = {
        c: ([], [], []) for c in CLASSES
    }
    for gpu in gpus:
        dev = nd.device(gpu, base)
        for k in nd.kernels(gpu, base):
            t_roof, x = features(k.cls, k.op, k.dims, k.flops, k.bytes, dev, "fp32")
            xs, ys, gs = acc[k.cls]
            xs.append(x)
            ys.append(math.log(k.seconds / t_roof))
            gs.append(gpu)
    return {
        c: {"x": np.asarray(xs, float), "y": np.asarray(ys, float), "gpu": np.asarray(gs)}
        for c, (xs, ys, gs) in acc.items()
    }


def _fit_class(x: np.ndarray, y: np.ndarray, gpu: np.ndarray) -> dict[str, Any]:
    from sklearn.linear_model import Ridge

    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale[scale < 1e-9] = 1.0
    # Longer kernels weigh more (a step's time is a sum), as the square root of their
    # roofline time; then each GPU counts the same.
    weight = np.sqrt(np.exp(x[:, 0]))
    for g in np.unique(gpu):
        mask = gpu == g
        weight[mask] *= len(y) / (len(np.unique(gpu)) * weight[mask].sum())
    model = Ridge(alpha=ALPHA, solver="cholesky").fit((x - mean) / scale, y, sample_weight=weight)
    return {
        "mean": [round(float(v), 9) for v in mean],
        "scale": [round(float(v), 9) for v in scale],
        "coef": [round(float(v), 9) for v in model.coef_],
        "intercept": round(float(model.intercept_), 9),
    }


def _predict(fit: Mapping[str, Any], x: np.ndarray) -> np.ndarray:
    z = (x - np.asarray(fit["mean"])) / np.asarray(fit["scale"])
    out: np.ndarray = np.clip(z @ np.asarray(fit["coef"]) + fit["intercept"], -12.0, 12.0)
    return out


def fit_classes(rows: Rows, gpus: Sequence[str]) -> dict[str, dict[str, Any]]:
    """One ridge fit per class on the rows of ``gpus``."""
    out = {}
    for cls in CLASSES:
        r = rows[cls]
        keep = np.isin(r["gpu"], list(gpus))
        out[cls] = {
            "features": FEATURES[cls],
            **_fit_class(r["x"][keep], r["y"][keep], r["gpu"][keep]),
        }
    return out


def held_out(rows: Rows, gpus: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Leave one GPU out: per class, each held-out GPU's median and spread of log error."""
    result: dict[str, dict[str, Any]] = {c: {} for c in CLASSES}
    for out in gpus:
        fits = fit_classes(rows, [g for g in gpus if g != out])
        for cls in CLASSES:
            r = rows[cls]
            mask = r["gpu"] == out
            if not mask.any():
                continue
            err = r["y"][mask] - _predict(fits[cls], r["x"][mask])  # log(measured / predicted)
            # The GPU's bias: the mean log error weighted as in the fit (square root of time).
            med = float(np.average(err, weights=np.sqrt(np.exp(r["x"][mask][:, 0]))))
            result[cls][nd.SHORT[out]] = {
                "bias_log_error": round(med, 4),
                "kernel_spread": round(float(np.std(err - med)), 4),
                "mean_abs_pct": round(float(np.mean(np.abs(np.expm1(-err)))) * 100, 1),
                "kernels": int(mask.sum()),
            }
    return result


def _sigmas(held: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    out = {}
    for cls, per_gpu in held.items():
        meds = [v["bias_log_error"] for v in per_gpu.values()]
        spreads = [v["kernel_spread"] for v in per_gpu.values()]
        out[cls] = {
            "bias": round(math.sqrt(statistics.fmean(m * m for m in meds)), 4),
            "kernel": round(statistics.fmean(spreads), 4),
        }
    return out


def tensor_check(model: OpModel, h100: OpDevice, base: Path | None = None) -> dict[str, Any]:
    """The fp16 matmul rows (taken as H100) against the model with no tensor offset."""
    errs = []
    with ((base or nd.root()) / "kernels" / "fp16mm.csv").open(newline="") as fh:
        for row in csv.DictReader(fh):
            b, m, n, k = (int(row[c]) for c in ("B", "M", "N", "K"))
            dims = (b, m, k, n)
            pred = model.call_seconds("matmul", "bmm", dims, *matmul_work(dims, 2), h100, "fp16")
            errs.append(math.log(float(row["Latency"]) / 1000.0 / pred))
    mean = statistics.fmean(errs)
    return {"offset": mean, "spread": statistics.pstdev(errs), "rows": len(errs)}


def h100_spec() -> OpDevice:
    from kplan.catalogs.loader import shipped_catalog

    return device_from_gpu(shipped_catalog().gpus["H100"])


def build_document(
    base: Path | None = None, gpus: Sequence[str] = nd.TRAIN_GPUS, rows: Rows | None = None
) -> dict[str, Any]:
    """The whole op-model document fitted on the kernels of ``gpus`` (``rows``: prebuilt)."""
    rows = rows if rows is not None else build_rows(gpus, base)
    classes = fit_classes(rows, gpus)
    held = held_out(rows, gpus) if len(gpus) > 1 else {c: {} for c in CLASSES}
    sig = _sigmas(held) if len(gpus) > 1 else {c: {"bias": 0.3, "kernel": 0.3} for c in CLASSES}
    for cls in CLASSES:
        classes[cls]["sigma"] = sig[cls]
    doc: dict[str, Any] = {
        "schema": OP_MODEL_SCHEMA,
        "classes": classes,
        "tensor_offset": 0.0,
        "tensor_sigma": 0.0,
    }
    check = tensor_check(OpModel.from_dict(doc), h100_spec(), base)
    doc["tensor_offset"] = round(check["offset"], 4)
    doc["tensor_sigma"] = round(math.hypot(check["spread"], sig["matmul"]["bias"]), 4)
    doc["fitted_on"] = {
        "data": "NeuSight (ASPLOS'25) kernels/, FP32, PyTorch 2.1 / CUDA 12.1",
        "gpus": [nd.SHORT[g] for g in gpus],
        "kernels": {c: int(np.isin(rows[c]["gpu"], list(gpus)).sum()) for c in CLASSES},
        "method": f"ridge (alpha={ALPHA}, cholesky) on standardised features, weights sqrt(time)"
        ", each GPU the same total",
        "tensor_check": f"kernels/fp16mm.csv, {check['rows']} fp16 bmm rows taken as H100",
    }
    doc["held_out"] = {"leave_one_gpu_out": held}
    doc["source"] = "scripts/fit_op_model.py"
    return doc


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--dry-run", action="store_true", help="print, do not write")
    parser.add_argument("--out", type=Path, default=OUT, help="where to write the model")
    args = parser.parse_args(argv)
    doc = build_document()
    for cls, per_gpu in doc["held_out"]["leave_one_gpu_out"].items():
        cells = "  ".join(
            f"{g} {v['bias_log_error']:+.2f}/{v['mean_abs_pct']:.0f}%" for g, v in per_gpu.items()
        )
        print(f"{cls:12s} sigma bias {doc['classes'][cls]['sigma']['bias']:.3f}  {cells}")
    print(f"tensor offset {doc['tensor_offset']:+.3f}  tensor sigma {doc['tensor_sigma']:.3f}")
    if not args.dry_run:
        args.out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
