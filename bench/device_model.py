"""Held-out error of the cross-device speed model, side by side with naive baselines.

Run from the repository root: ``.venv/bin/python -m bench.device_model``.

Every number is measured on GPUs left out of the fit (scripts/fit_device_model.py): leave one
GPU out (each NVIDIA GPU in turn, predicting every pair of the same workload that involves it,
in both directions) and a fixed split that never fits on H100 or L4. Predictions go through the
planner's ``compute_scale``. Errors are APE = |predicted / measured - 1| of the destination
GPU's iteration time; cells read "MAPE (median APE)".
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

import numpy as np

from kplan.catalogs.device_model import load_device_model
from kplan.planner.devices import compute_scale
from scripts.fit_device_model import (
    FIXED_HOLD_OUT,
    METHODS,
    SHIPPED_METHOD,
    SHIPPED_PATH,
    Dataset,
    by_mode,
    fit_document,
    leave_one_gpu_out,
    load_dataset,
    make_pairs,
    predict_held_out,
)


def _cell(summary: dict[str, float] | None) -> str:
    if not summary:
        return "-"
    return f"{summary['mape']:.1%} ({summary['median_ape']:.1%})"


def _table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join("-" * w for w in widths)
    out = [title, "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)), line]
    out += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(row.rstrip() for row in out)


def logo_tables(data: Dataset) -> str:
    """Per held-out GPU, every method, training pairs and inference pairs."""
    results = {
        name: leave_one_gpu_out(data.nvidia, data.nvidia, data.specs, fitter)
        for name, fitter in METHODS.items()
    }
    gpus = sorted({s.gpu for s in data.nvidia})
    parts = []
    for mode, label in (("train", "training"), ("inf", "inference")):
        rows = []
        for g in gpus:
            cells = [_cell(by_mode([results[m][g]]).get(mode)) for m in METHODS]
            if any(c != "-" for c in cells):
                n = by_mode([results[SHIPPED_METHOD][g]])[mode]["n_pairs"]
                rows.append([g, str(n), *cells])
        pooled = {m: by_mode(results[m].values()).get(mode) for m in METHODS}
        shipped = pooled[SHIPPED_METHOD]
        n_all = shipped["n_pairs"] if shipped else 0
        rows.append(["all held-out pairs", str(n_all), *[_cell(pooled[m]) for m in METHODS]])
        parts.append(
            _table(
                f"Leave one GPU out, {label} pairs: MAPE (median APE)",
                ["held-out GPU", "pairs", *METHODS],
                rows,
            )
        )
    folds = results[SHIPPED_METHOD].values()
    a = [-float(r.coefficients[0]) for r in folds]
    parts.append(f"Shipped method's FP32 exponent a over the folds: {min(a):.3f} to {max(a):.3f}")
    return "\n\n".join(parts)


def fixed_split_table(data: Dataset) -> str:
    rows = []
    for name, fitter in METHODS.items():
        held = predict_held_out(data.nvidia, data.nvidia, data.specs, FIXED_HOLD_OUT, fitter)
        res = by_mode([held])
        c_fp32, c_bw = (float(c) for c in held.coefficients)
        rows.append(
            [
                name,
                f"{0.0 - c_fp32:.3f}, {0.0 - c_bw:.3f}",
                _cell(res.get("train")),
                _cell(res.get("inf")),
                str(res["train"]["n_pairs"]),
                str(res["inf"]["n_pairs"]),
            ]
        )
    return _table(
        f"Fixed split: never fitted on {', '.join(FIXED_HOLD_OUT)}",
        ["method", "exponents a, b", "training pairs", "inference pairs", "n train", "n inf"],
        rows,
    )


def ablation_table(data: Dataset) -> str:
    """Which entries to fit on (evaluation always on NVIDIA pairs, leave one GPU out)."""
    fitter = METHODS[SHIPPED_METHOD]
    variants = {
        "NVIDIA training + inference (shipped)": data.nvidia,
        "NVIDIA training entries only": [s for s in data.nvidia if s.mode == "train"],
        "NVIDIA + AMD (FP32 = vector peak)": data.nvidia + data.amd,
    }
    rows = []
    for name, fit_samples in variants.items():
        res = by_mode(leave_one_gpu_out(fit_samples, data.nvidia, data.specs, fitter).values())
        rows.append([name, _cell(res.get("train")), _cell(res.get("inf"))])
    return _table(
        "Ablation, what the blend is fitted on (leave one GPU out)",
        ["fitted on", "training pairs", "inference pairs"],
        rows,
    )


def multi_gpu_table(data: Dataset) -> str:
    """Supplementary: 4-GPU iterations (compute plus NVLink communication), shipped model."""
    model = load_device_model()
    pairs = make_pairs(data.multi_gpu, ordered=True)
    rows = []
    for i in range(len(pairs)):
        src, dst = data.specs[pairs.src[i]], data.specs[pairs.dst[i]]
        predicted = compute_scale(model, src, dst).factor
        measured = math.exp(pairs.log_ratio[i])
        rows.append(
            [
                pairs.workload[i],
                f"{src.name} -> {dst.name}",
                f"{measured:.3f}",
                f"{predicted:.3f}",
                f"{abs(predicted / measured - 1):.1%}",
            ]
        )
    return _table(
        "Supplementary: 4-GPU runs (A100-SXM4 has no single-GPU entries; H100 is in the fit)",
        ["workload", "src -> dst", "measured t_dst/t_src", "predicted", "APE"],
        rows,
    )


def shipped_check(data: Dataset) -> str:
    """Is the shipped JSON what the fit script produces from this data?"""
    shipped = json.loads(SHIPPED_PATH.read_text())
    refit = fit_document(data)
    same = np.allclose(
        [shipped["coefficients"][f] for f in refit["coefficients"]],
        list(refit["coefficients"].values()),
    ) and math.isclose(shipped["log_sigma"], refit["log_sigma"])
    state = "matches a refit" if same else "DIFFERS from a refit: run scripts.fit_device_model"
    return (
        f"Shipped model ({SHIPPED_PATH.name}) {state}: coefficients "
        f"{shipped['coefficients']}, log_sigma {shipped['log_sigma']}"
    )


def main() -> None:
    data = load_dataset()
    n_gpus = len({s.gpu for s in data.nvidia})
    n_train = sum(s.mode == "train" for s in data.nvidia)
    print(
        f"NeuSight single-GPU entries: {len(data.nvidia)} on {n_gpus} NVIDIA GPUs "
        f"({n_train} training, {len(data.nvidia) - n_train} inference)\n"
    )
    print(logo_tables(data), end="\n\n")
    print(fixed_split_table(data), end="\n\n")
    print(ablation_table(data), end="\n\n")
    print(multi_gpu_table(data), end="\n\n")
    print(shipped_check(data))


if __name__ == "__main__":
    main()
