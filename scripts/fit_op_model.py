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

Fit: per operator class, ``t = t_roof / u + floor`` with ``u`` a sigmoid-bounded network of
the class's shape features (``opmodel.ClassFit``, ``opmodel.features``), least squares in
``log t`` by full-batch L-BFGS (torch, CPU, one thread, seeded: deterministic) on a seeded draw
of 5000 kernels per GPU, each GPU weighted equally. The form and its settings were chosen by
leave-one-GPU-out over the five fitted GPUs only (kernels and their labelled steps), never on
H100, L4 or A100-80GB. Sigmas: leave one GPU out (refit without it, predict its kernels):
``bias`` is the root mean square of the held-out GPU's weighted mean log error, ``kernel`` the
spread of single kernels about that mean. Needs torch (a development dependency here: the
product evaluates the fitted network with numpy). The tensor-core
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

from kplan.planner.opgraph import OpGraph
from kplan.planner.opmodel import (
    CLASSES,
    FEATURES,
    OP_MODEL_SCHEMA,
    Z90,
    OpDevice,
    OpModel,
    class_fit_from_dict,
    device_from_gpu,
    features,
)
from kplan.planner.opwork import matmul_work
from scripts import neusight_data as nd

OUT = Path(__file__).resolve().parents[1] / "kplan" / "catalogs" / "data" / "op_model.json"
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


# The bound on each class's utilisation: 1 for matmul and the memory-bound classes, 4 for conv
# (cuDNN's FFT and Winograd kernels do fewer FLOPs than the direct convolution counted).
U_MAX = {"matmul": 1.0, "conv": 4.0, "softmax": 1.0, "norm": 1.0, "elementwise": 1.0}
HIDDEN = 8  # tanh units of the utilisation network
PER_GPU = 5000  # kernels drawn per GPU and class (seeded), to keep a fit to seconds
WEIGHT_CAP_S = 0.05  # a kernel weighs sqrt(min(t_roof, this)): long ones count, not alone
L2 = 1e-3  # weight decay on the network's weights
ITERS = 300  # L-BFGS iterations


def _sample(gpu: np.ndarray, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    keep = []
    for g in np.unique(gpu):
        idx = np.flatnonzero(gpu == g)
        keep.append(np.sort(rng.choice(idx, PER_GPU, replace=False)) if len(idx) > PER_GPU else idx)
    return np.concatenate(keep)


def _weights(t_roof: np.ndarray, gpu: np.ndarray) -> np.ndarray:
    """sqrt(min(t_roof, cap)), then each GPU the same total (a step's time is a sum)."""
    w: np.ndarray = np.sqrt(np.minimum(t_roof, WEIGHT_CAP_S))
    for g in np.unique(gpu):
        mask = gpu == g
        w[mask] *= len(w) / (len(np.unique(gpu)) * w[mask].sum())
    return w


def _fit_class(cls: str, x: np.ndarray, y: np.ndarray, gpu: np.ndarray) -> dict[str, Any]:
    """Least squares in log(time) of ``t = t_roof / u + floor`` with ``u`` the bounded network
    (``opmodel.ClassFit``), by full-batch L-BFGS from a seeded start (deterministic)."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    keep = _sample(gpu, seed=0)
    x, y, gpu = x[keep], y[keep], gpu[keep]
    mean, scale = x.mean(axis=0), x.std(axis=0)
    scale[scale < 1e-9] = 1.0
    t_roof = np.exp(x[:, 0]) * 1e-5  # feature 0 is log(t_roof / 10 us)
    z, target = torch.tensor((x - mean) / scale), torch.tensor(y)
    weight, log_roof = torch.tensor(_weights(t_roof, gpu)), torch.tensor(np.log(t_roof))
    f64 = torch.float64
    w1 = torch.nn.Parameter(torch.randn(HIDDEN, x.shape[1], dtype=f64) * 0.3)
    b1 = torch.nn.Parameter(torch.zeros(HIDDEN, dtype=f64))
    w2 = torch.nn.Parameter(torch.randn(HIDDEN, dtype=f64) * 0.3)
    b2 = torch.nn.Parameter(torch.zeros((), dtype=f64))
    # The launch floor: the median over GPUs of the class's fastest kernel (fixed, not fitted:
    # the network alone could mimic a floor inside the measured sizes but not below them).
    seconds = np.exp(y) * t_roof
    floor = float(np.median([seconds[gpu == g].min() for g in np.unique(gpu)]))
    log_floor = torch.tensor(math.log(floor), dtype=f64)
    log_umax = math.log(U_MAX[cls])

    def loss() -> Any:
        h = torch.tanh(z @ w1.T + b1) @ w2 + b2
        log_u = log_umax - torch.nn.functional.softplus(-h)
        pred = torch.logaddexp(-log_u, log_floor - log_roof)  # log(t / t_roof)
        return (weight * (pred - target) ** 2).mean() + L2 * (w1.pow(2).sum() + w2.pow(2).sum())

    opt = torch.optim.LBFGS(
        [w1, b1, w2, b2],
        max_iter=ITERS,
        history_size=20,
        line_search_fn="strong_wolfe",
        tolerance_grad=1e-9,
        tolerance_change=1e-12,
    )

    def closure() -> Any:
        opt.zero_grad()
        value = loss()
        value.backward()
        return value

    opt.step(closure)  # type: ignore[no-untyped-call]

    def r(values: Any) -> Any:
        return np.round(np.asarray(values, dtype=float), 6).tolist()

    return {
        "mean": r(mean),
        "scale": r(scale),
        "hidden_w": r(w1.detach().numpy()),
        "hidden_b": r(b1.detach().numpy()),
        "out_w": r(w2.detach().numpy()),
        "out_b": round(float(b2.detach()), 6),
        "u_max": U_MAX[cls],
        "floor_s": round(floor, 9),
    }


def _predict(fit: Mapping[str, Any], cls: str, x: np.ndarray) -> np.ndarray:
    """log(t / t_roof) of kernels with features ``x`` under a class fit (a document row)."""
    model = class_fit_from_dict({**fit, "sigma": {"bias": 0.0, "kernel": 0.0}}, cls)
    t_roof = np.exp(x[:, 0]) * 1e-5
    out: np.ndarray = np.log(model.seconds(t_roof, x, np.zeros(len(x))) / t_roof)
    return out


_FITS: dict[tuple[int, tuple[str, ...]], tuple[Rows, dict[str, dict[str, Any]]]] = {}


def fit_classes(rows: Rows, gpus: Sequence[str]) -> dict[str, dict[str, Any]]:
    """One bounded-utilisation fit per class on the rows of ``gpus`` (remembered for the same
    rows and GPUs: the benchmark's nested leave-one-GPU-out fits each subset once)."""
    key = (id(rows), tuple(sorted(gpus)))
    if key in _FITS and _FITS[key][0] is rows:  # the rows kept alive: their id is not reused
        return _FITS[key][1]
    out = {}
    for cls in CLASSES:
        r = rows[cls]
        keep = np.isin(r["gpu"], list(gpus))
        out[cls] = {
            "features": FEATURES[cls],
            **_fit_class(cls, r["x"][keep], r["y"][keep], r["gpu"][keep]),
        }
    _FITS[key] = (rows, out)
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
            err = r["y"][mask] - _predict(fits[cls], cls, r["x"][mask])  # log(measured / predicted)
            # The GPU's bias: the mean log error weighted as in the fit (square root of time).
            roof = np.exp(r["x"][mask][:, 0]) * 1e-5
            med = float(np.average(err, weights=np.sqrt(np.minimum(roof, WEIGHT_CAP_S))))
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


# ---- calibration of the step sigma on held-out steps ------------------------------------------

ONE_SIGMA = 0.6827  # the share of a normal within +-1 sigma
_GRAPHS: dict[str, OpGraph] = {}


def _graph(label: nd.Label) -> OpGraph:
    if label.workload not in _GRAPHS:
        path = nd.root() / "opgraph" / f"{label.workload}.csv"
        _GRAPHS[label.workload] = nd.read_opgraph(path, label.num_layer)
    return _GRAPHS[label.workload]


def step_residuals(
    rows: Rows,
    gpus: Sequence[str],
    classes: Mapping[str, Mapping[str, Any]],
    extra: Sequence[str] = (),
) -> dict[str, list[tuple[float, float, str]]]:
    """Held-out residuals on the labelled steps of ``gpus`` (leave one GPU out: the model
    fitted without the step's GPU) and of ``extra`` (labelled GPUs with no kernels in the fit:
    the model fitted on all of ``gpus``): per path, (log(measured / predicted), the
    prediction's kernel spread, the held-out GPU) of every step. ``outright``: the step's time
    from its graph; ``ratio``: the same graph measured on another labelled GPU, moved by the
    model's ratio. No model's step times enter any fit, so these are also leave-one-model-out
    residuals."""
    labels = [lab for lab in nd.labels() if lab.gpu in (*gpus, *extra)]
    out: dict[str, list[tuple[float, float, str]]] = {"outright": [], "ratio": []}
    for held in (*gpus, *extra):
        fits = fit_classes(rows, [g for g in gpus if g != held])
        doc = {c: {**fits[c], "sigma": classes[c]["sigma"]} for c in CLASSES}
        model = OpModel.from_dict({"schema": OP_MODEL_SCHEMA, "classes": doc, **_NO_TENSOR})
        for dst in (lab for lab in labels if lab.gpu == held):
            step = model.step_time(_graph(dst), nd.device(held))
            out["outright"].append((math.log(dst.seconds / step.seconds), step.spread, held))
            for src in labels:
                if src.workload != dst.workload or src.gpu == held:
                    continue
                a, b = model.step_times(_graph(dst), [nd.device(src.gpu), nd.device(held)])
                r = math.log(dst.seconds / (src.seconds * b.seconds / a.seconds))
                out["ratio"].append((r, math.hypot(a.spread, b.spread), held))
    return out


_NO_TENSOR = {"tensor_offset": 0.0, "tensor_sigma": 0.0}


def robust_sigma(resid: Sequence[tuple[float, float, str]]) -> float:
    """The scale ``s`` with ``ONE_SIGMA`` of the residuals inside ``hypot(s, spread)``, each
    held-out GPU weighing the same (its steps share its bias): a weighted quantile of
    ``sqrt(r^2 - spread^2)``, robust to one GPU far off (not a max, not a mean square). Each
    point sits at the middle of its weight and the quantile is interpolated between points:
    with five GPUs, the plain inverse of the weighted CDF would always round up to the next
    GPU's error (the 68% quantile of five is the fourth largest, the 80% point)."""
    per_gpu: dict[str, int] = {}
    for _, _, g in resid:
        per_gpu[g] = per_gpu.get(g, 0) + 1
    pts = sorted(
        (math.sqrt(max(r * r - sp * sp, 0.0)), 1.0 / (per_gpu[g] * len(per_gpu)))
        for r, sp, g in resid
    )
    values = np.asarray([v for v, _ in pts])
    weights = np.asarray([w for _, w in pts])
    middle = np.cumsum(weights) - weights / 2.0
    return max(float(np.interp(ONE_SIGMA, middle, values)), 1e-3)


def calibrate(
    rows: Rows,
    gpus: Sequence[str],
    classes: Mapping[str, Mapping[str, Any]],
    extra: Sequence[str] = (),
) -> dict[str, dict[str, dict[str, Any]]]:
    """Per path, the FP32 step sigma from the held-out residuals of ``gpus`` and ``extra``
    (``step_residuals``; the labelled steps are all FP32: no other precision has a row) and
    how the residuals sit about it."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for path, resid in step_residuals(rows, gpus, classes, extra).items():
        if not resid:
            continue
        s = robust_sigma(resid)
        inside = [abs(r) <= math.hypot(s, sp) for r, sp, _ in resid]
        below = [r <= Z90 * math.hypot(s, sp) for r, sp, _ in resid]
        out[path] = {
            "fp32": {
                "sigma": round(s, 4),
                "steps": len(resid),
                "gpus": len({g for _, _, g in resid}),
                "median_log_error": round(float(np.median([r for r, _, _ in resid])), 4),
                "within_1sigma": round(sum(inside) / len(resid), 3),
                "below_p90": round(sum(below) / len(resid), 3),
            }
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
    base: Path | None = None,
    gpus: Sequence[str] = nd.TRAIN_GPUS,
    rows: Rows | None = None,
    extra: Sequence[str] = nd.TEST_GPUS,
) -> dict[str, Any]:
    """The whole op-model document fitted on the kernels of ``gpus`` (``rows``: prebuilt), its
    step sigmas calibrated on held-out steps of ``gpus`` (leave one GPU out) and of ``extra``
    (labelled GPUs without kernels in the fit, never seen by it)."""
    rows = rows if rows is not None else build_rows(gpus, base)
    classes = fit_classes(rows, gpus)
    held = held_out(rows, gpus) if len(gpus) > 1 else {c: {} for c in CLASSES}
    sig = _sigmas(held) if len(gpus) > 1 else {c: {"bias": 0.3, "kernel": 0.3} for c in CLASSES}
    classes = {c: {**classes[c], "sigma": sig[c]} for c in CLASSES}
    doc: dict[str, Any] = {
        "schema": OP_MODEL_SCHEMA,
        "classes": classes,
        "tensor_offset": 0.0,
        "tensor_sigma": 0.0,
    }
    if len(gpus) > 1:
        doc["calibration"] = calibrate(rows, gpus, classes, extra)
    check = tensor_check(OpModel.from_dict(doc), h100_spec(), base)
    doc["tensor_offset"] = round(check["offset"], 4)
    doc["tensor_sigma"] = round(math.hypot(check["spread"], sig["matmul"]["bias"]), 4)
    doc["fitted_on"] = {
        "data": "NeuSight (ASPLOS'25) kernels/, FP32, PyTorch 2.1 / CUDA 12.1",
        "gpus": [nd.SHORT[g] for g in gpus],
        "kernels": {c: int(np.isin(rows[c]["gpu"], list(gpus)).sum()) for c in CLASSES},
        "method": f"t = t_roof / u + floor, u = u_max * sigmoid(MLP {HIDDEN} tanh units) of the "
        f"standardised features; L-BFGS on log time, {PER_GPU} kernels per GPU and class, "
        f"weights sqrt(min(t_roof, {WEIGHT_CAP_S} s)), each GPU the same total",
        "tensor_check": f"kernels/fp16mm.csv, {check['rows']} fp16 bmm rows taken as H100",
        "calibration": "held-out labelled single-GPU steps (label/, FP32): the fitted GPUs' "
        f"left out one at a time, and {', '.join(nd.SHORT[g] for g in extra) or 'no other GPU'}"
        f" (never fitted); per path the weighted {ONE_SIGMA:.1%} quantile (midpoints, "
        "interpolated) of sqrt(r^2 - spread^2), each held-out GPU weighing the same",
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
    for path, per in doc.get("calibration", {}).items():
        for prec, row in per.items():
            print(f"calibration {path} {prec}: {row}")
    if not args.dry_run:
        args.out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
