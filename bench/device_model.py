"""Held-out error and calibration of the cross-device speed model, next to naive baselines.

Run from the repository root: ``.venv/bin/python -m bench.device_model`` (about 30 s).

Every number is measured on data left out of the fit (``scripts/fit_device_model.py``):

- leave one GPU out: each GPU in turn is removed from the fit; every pair of the same job
  (model, per-GPU batch, GPU count) with the held-out GPU on either side, in both directions, in
  the same precision family, is predicted;
- leave one model out: each model (NeuSight model, DLE model directory) in turn; its cross-GPU
  pairs, and its same-GPU projections from one precision to another;
- leave one GPU die out (stricter): a GPU's twins on the same die (V100 16/32 GB and PCIe, the
  four A100s) leave the fit with it, as for a GPU with no twin in the data; FP32 <-> TF32
  pairs are not judged there (no fold keeps one to fit them on).

Predictions go through the planner's ``compute_scale``. Baselines on the same pairs: the ratio
of the precision's peaks (``peak_tflops``) and the ratio of memory bandwidths. APE =
|predicted / measured - 1| of the destination's step time; cells are "MAPE (median APE)".
Calibration is nested: the sigma each fold is judged with is fitted on the other folds only,
and it is the sigma the planner states (``held_out_sigma``: the spec-distance term, plus a
precision term where the pair changes precision, e.g. FP32 on a V100 to TF32 on an A100). The
shipped sigma is fitted on the one-precision residuals (the planner's default path).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kplan.catalogs.device_model import load_device_model
from scripts.fit_device_model import (
    Prediction,
    calibration,
    coverage,
    fit_document,
    held_out,
    load_dataset,
    one_precision,
    summary,
    table,
)


def _cell(s: dict[str, float]) -> str:
    return f"{s['mape']:.1%} ({s['median_ape']:.1%})" if s.get("n_pairs") else "-"


def _render(title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    out = [title, "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    out.append("  ".join("-" * w for w in widths))
    out += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(line.rstrip() for line in out)


def error_table(title: str, preds: Sequence[Prediction], group: str) -> str:
    rows = []
    groups = table(preds, group)
    for key, t in groups.items():
        rows.append(
            [
                key,
                str(t["kplan"]["n_pairs"]),
                _cell(t["kplan"]),
                _cell(t["peak_ratio"]),
                _cell(t["bandwidth_ratio"]),
            ]
        )
    if group != "all":
        t = table(preds, "all")["all"]
        rows.append(
            [
                "all",
                str(t["kplan"]["n_pairs"]),
                _cell(t["kplan"]),
                _cell(t["peak_ratio"]),
                _cell(t["bandwidth_ratio"]),
            ]
        )
    header = [group, "pairs", "kplan", "peak ratio", "bandwidth ratio"]
    return _render(title, header, rows)


def main() -> None:
    data = load_dataset()
    gpus = sorted({s.gpu for s in data.samples})
    print(f"{len(data.samples)} measured step times on {len(gpus)} GPUs: {', '.join(gpus)}\n")
    logo = [p for p in held_out(data, "gpu") if p.pair.cross_gpu]
    lomo_all = held_out(data, "model")
    lomo = [p for p in lomo_all if p.pair.cross_gpu]
    proj = [p for p in lomo_all if not p.pair.cross_gpu]
    print(
        error_table(
            "Leave one GPU out, by precision, with the precision ratio where the data have it "
            "(kplan estimate --profile A --profile B): MAPE (median APE)",
            logo,
            "precision",
        )
    )
    print()
    print(error_table("Leave one GPU out, by held-out GPU", logo, "fold"))
    print()
    print(error_table("Leave one model out, by precision", lomo, "precision"))
    print()
    s = summary([p.residual for p in proj])
    print(
        f"Leave one model out, same GPU, projected to another precision: {_cell(s)} over "
        f"{s['n_pairs']} pairs (rms log {s['rms_log']})\n"
    )
    # What the planner can use today: a profile records one precision, so no workload has a
    # measured precision ratio (only the fixed share, from its own batch sweep, remains).
    one = one_precision(data)
    logo_one = [p for p in held_out(one, "gpu") if p.pair.cross_gpu]
    lomo_one = [p for p in held_out(one, "model") if p.pair.cross_gpu]
    print(
        error_table(
            "Leave one GPU out, from a one-precision profile (no measured precision ratio: "
            "kplan estimate with one profile)",
            logo_one,
            "precision",
        )
    )
    print()
    print(
        error_table(
            "Leave one model out, from a one-precision profile (kplan estimate with one profile)",
            lomo_one,
            "precision",
        )
    )
    print()
    die = [p for p in held_out(data, "die") if p.pair.cross_gpu]
    print(
        error_table(
            "Leave one GPU die out (stricter: a GPU's twins on the same die leave with it; "
            "FP32 <-> TF32 pairs are not judged, no fold keeps a pair to fit that on)",
            die,
            "precision",
        )
    )
    print()
    print(error_table("Leave one GPU die out, by held-out die", die, "fold"))
    print()
    rows = []
    for name, preds in (
        ("leave one GPU out", logo),
        ("leave one model out", lomo),
        ("one GPU out, one-precision profile", logo_one),
        ("one model out, one-precision profile", lomo_one),
        ("leave one die out", die),
    ):
        for prec in ("fp16", "fp32", "tf32", None):
            c = calibration(preds, prec)
            if not c["n_pairs"]:
                continue  # no FP32 <-> TF32 pair is judged leaving a die out
            rows.append(
                [
                    name,
                    prec or "all",
                    str(c["n_pairs"]),
                    f"{c['within_1_sigma']:.1%}",
                    f"{c['at_or_below_p90']:.1%}",
                ]
            )
    print(
        _render(
            "Calibration of the sigma the planner states (nested; targets: 60-76% within "
            "+-1 sigma, 85-95% at or below p90)",
            ["protocol", "precision", "pairs", "within +-1 sigma", "at or below p90"],
            rows,
        )
    )
    sigma = dict(load_device_model().sigma or {})
    rows = []
    protocols = (
        ("leave one GPU out", logo),
        ("leave one model out", lomo),
        ("leave one die out", die),
    )
    for name, preds in protocols:
        for prec in ("fp16", "fp32", "tf32", None):
            sel = [p for p in preds if prec in (None, p.pair.dst.precision)]
            if sel:
                c = coverage(sel, sigma)
                rows.append(
                    [
                        name,
                        prec or "all",
                        str(c["n_pairs"]),
                        f"{c['within_1_sigma']:.1%}",
                        f"{c['at_or_below_p90']:.1%}",
                    ]
                )
    print()
    print(
        _render(
            "The shipped sigma (fitted on the one-precision residuals of all three protocols; "
            "not nested) on the same pairs",
            ["protocol", "precision", "pairs", "within +-1 sigma", "at or below p90"],
            rows,
        )
    )
    shipped = load_device_model().to_dict()
    fresh = fit_document(data)
    keys = ("compute_weight", "cuda_core_weight", "memory_weight", "sigma")
    worst = _max_rel_diff({k: fresh[k] for k in keys}, {k: shipped[k] for k in keys})
    print(
        "\nShipped kplan/catalogs/data/device_model.json against a fresh fit (weights and sigma): "
        f"largest relative difference {worst:.1e} "
        f"({'matches' if worst <= 1e-2 else 'STALE: rerun scripts.fit_device_model'}; "
        "the optimiser's stopping tolerance moves the 3rd-4th digit)"
    )


def _max_rel_diff(a: object, b: object) -> float:
    """Largest relative difference between two nested documents of numbers (inf if their
    shapes differ)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return math.inf
        return max((_max_rel_diff(a[k], b[k]) for k in a), default=0.0)
    if isinstance(a, int | float) and isinstance(b, int | float):
        return abs(a - b) / max(abs(a), abs(b), 1e-12)
    return 0.0 if a == b else math.inf


if __name__ == "__main__":
    main()
