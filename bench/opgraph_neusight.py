"""The op-level model on NeuSight's (ASPLOS'25) protocol: training step times on unseen GPUs.

Run from the repository root (about 5 minutes: 16 fits, one per GPU subset; the shared data
folder is $KPLAN_SHARED_DATA, else ../shared/data beside the repository)::

    .venv/bin/python -m bench.opgraph_neusight

1. NeuSight's protocol: fit ``kplan.planner.opmodel`` (``scripts/fit_op_model.py``) on the
   FP32 kernels of P4, P100, T4, V100 and A100-40GB only; predict the measured single-GPU
   training iterations (``label/<GPU>/<model>-train-*.json``, ``e2e_latency``) of BERT-Large,
   GPT-2 Large, GPT-3 XL / 2.7B and OPT-1.3B on H100, L4 and A100-80GB from their operator
   graphs (``opgraph/``, read by ``scripts/neusight_data.py``: the traced layer repeated
   ``num_layer`` times). Goal: mean error <= 8% per GPU.
2. Leave one GPU out over every NVIDIA GPU with labels (train and forward-only inference
   iterations): a GPU whose kernels are in the fit set is refitted without them; H100, L4 and
   A100-80GB have no kernels, so their fit is the protocol's. Leave one model out: nothing in
   the fit sees a model's step times, so leaving a model out changes no prediction; its errors
   are listed per model.
   Calibration: the share of measured times within the stated +-1 sigma (goal 60-76%) and at
   or below the stated p90 (goal 85-95%), per path (``outright``: a step predicted from its
   graph, as from a CPU profile; ``ratio``: a measured step moved to another GPU) and per
   precision. The shipped model's path sigma is fitted on these held-out residuals of all
   eight GPUs (``fit_op_model.calibrate``); here each GPU's sigma is fitted the same way on the
   other seven GPUs' residuals only (a ratio pair on the pairs touching neither of its GPUs),
   so no sigma has seen the GPU it is checked on. Everything here is FP32: the data has no
   other precision (kplan's tensor-core path is checked only on ten fp16 matmuls, in the fit).

Left out: data-, tensor- and pipeline-parallel runs (dp4/tp4/pp4: they need a communication
model), the fused-kernel inference runs, Switch Transformer (MoE) and the AMD GPUs.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections import defaultdict
from collections.abc import Sequence

from kplan.planner.opgraph import OpGraph
from kplan.planner.opmodel import Z90, OpModel
from scripts import fit_op_model as fit
from scripts import neusight_data as nd


def _models(rows: fit.Rows) -> dict[str, OpModel]:
    """The model used for each labelled GPU: fitted without its own kernels."""
    protocol = OpModel.from_dict(fit.build_document(gpus=nd.TRAIN_GPUS, rows=rows, extra=()))
    out = {g: protocol for g in nd.TEST_GPUS}
    for g in nd.TRAIN_GPUS:
        rest = [x for x in nd.TRAIN_GPUS if x != g]
        out[g] = OpModel.from_dict(fit.build_document(gpus=rest, rows=rows, extra=()))
    return out


def calibrate_held_out(rows: list[dict[str, object]], key: str, *keys: str) -> None:
    """Set each row's sigma, ``in_1sigma`` and ``below_p90``: the path's sigma fitted as the
    shipped model's is (``fit_op_model.robust_sigma``) on the held-out residuals of every
    OTHER GPU (rows whose ``key`` or ``keys`` name the row's GPU left out), with the row's own
    kernel spread in quadrature: no sigma sees the GPU it is checked on."""
    for r in rows:
        gpu = r[key]
        others = [
            (float(str(o["log_error"])), float(str(o["spread"])), str(o[key]))
            for o in rows
            if all(o[k] != gpu for k in (key, *keys))
        ]
        sigma = math.hypot(fit.robust_sigma(others), float(str(r["spread"])))
        log_err = float(str(r["log_error"]))
        r.update(sigma=sigma, in_1sigma=abs(log_err) <= sigma, below_p90=log_err <= Z90 * sigma)


def run(
    transfers: list[dict[str, object]] | None = None,
) -> list[dict[str, object]]:
    """Every labelled step predicted outright; with ``transfers``, also every step moved from
    another labelled GPU's measurement by the model's ratio (appended to it)."""
    rows = fit.build_rows(nd.TRAIN_GPUS)
    models = _models(rows)
    graphs: dict[str, OpGraph] = {}
    results = []
    labels = list(nd.labels())
    for label in labels:
        if label.workload not in graphs:
            path = nd.root() / "opgraph" / f"{label.workload}.csv"
            graphs[label.workload] = nd.read_opgraph(path, label.num_layer)
        step = models[label.gpu].step_time(graphs[label.workload], nd.device(label.gpu))
        err = label.seconds / step.seconds - 1.0
        log_err = math.log(label.seconds / step.seconds)
        results.append(
            {
                "gpu": nd.SHORT[label.gpu],
                "test": label.gpu in nd.TEST_GPUS,
                "workload": label.workload,
                "model": label.model,
                "mode": label.mode,
                "measured_ms": label.seconds * 1e3,
                "predicted_ms": step.seconds * 1e3,
                "error": err,
                "log_error": log_err,
                "spread": step.spread,
            }
        )
    calibrate_held_out(results, "gpu")
    if transfers is not None:
        moved = _transfers(labels, graphs, models)
        calibrate_held_out(moved, "dst", "src")
        transfers.extend(moved)
    return results


def _transfers(
    labels: Sequence[nd.Label], graphs: dict[str, OpGraph], models: dict[str, OpModel]
) -> list[dict[str, object]]:
    """Measured on src, moved to dst by the ratio of the model fitted without dst's kernels;
    beside it, the ratio of FP32 peaks (the naive answer)."""
    out = []
    for src in labels:
        for dst in labels:
            if src.workload != dst.workload or src.gpu == dst.gpu:
                continue
            a, b = nd.device(src.gpu), nd.device(dst.gpu)
            ta, tb = models[dst.gpu].step_times(graphs[src.workload], [a, b])
            log_err = math.log(dst.seconds / (src.seconds * tb.seconds / ta.seconds))
            naive = src.seconds * a.fp32_tflops / b.fp32_tflops
            out.append(
                {
                    "pair": f"{nd.SHORT[src.gpu]}->{nd.SHORT[dst.gpu]}",
                    "src": nd.SHORT[src.gpu],
                    "dst": nd.SHORT[dst.gpu],
                    "error": math.expm1(log_err),
                    "peak_error": dst.seconds / naive - 1.0,
                    "log_error": log_err,
                    "spread": math.hypot(ta.spread, tb.spread),
                }
            )
    return out


def transfer_report(rows: Sequence[dict[str, object]]) -> str:
    out = [
        "Measured on one GPU, moved to another by the model's ratio (fitted without dst):",
        "| destination | pairs | mean abs error | FP32 peak ratio's | mean sigma "
        "| within +-1 sigma | <= p90 |",
        "|---|---|---|---|---|---|---|",
    ]
    by_dst: dict[str, list[dict[str, object]]] = defaultdict(list)
    for r in rows:
        by_dst[str(r["dst"])].append(r)
    for name, rs in [*by_dst.items(), ("all", list(rows))]:
        err = statistics.fmean(abs(float(str(r["error"]))) for r in rs)
        peak = statistics.fmean(abs(float(str(r["peak_error"]))) for r in rs)
        sig = statistics.fmean(float(str(r["sigma"])) for r in rs)
        inside = sum(bool(r["in_1sigma"]) for r in rs) / len(rs)
        p90 = sum(bool(r["below_p90"]) for r in rs) / len(rs)
        cells = f"{err:.1%} | {peak:.1%} | {sig:.3f} | {inside:.0%} | {p90:.0%}"
        out.append(f"| {name} | {len(rs)} | {cells} |")
    return "\n".join(out)


def calibration_report(
    results: Sequence[dict[str, object]], moved: Sequence[dict[str, object]]
) -> str:
    """Per path and precision: rows, mean stated sigma, within +-1 sigma, at or below p90, on
    every GPU held out, on the five fitted GPUs held out and on the three never fitted."""
    out = [
        "Calibration of the stated sigma (goal: 60-76% within +-1 sigma, 85-95% <= p90):",
        "| path | precision | GPUs | n | mean sigma | within +-1 sigma | <= p90 |",
        "|---|---|---|---|---|---|---|",
    ]
    test = {nd.SHORT[g] for g in nd.TEST_GPUS}
    for path, rows, key in (("outright", results, "gpu"), ("ratio", moved, "dst")):
        for name, want in (
            ("all held out", (True, False)),
            ("the five fitted (LOGO)", (False,)),
            ("H100, L4, A100-80GB", (True,)),
        ):
            rs = [r for r in rows if (str(r[key]) in test) in want]
            if not rs:
                continue
            sig = statistics.fmean(float(str(r["sigma"])) for r in rs)
            inside = sum(bool(r["in_1sigma"]) for r in rs) / len(rs)
            p90 = sum(bool(r["below_p90"]) for r in rs) / len(rs)
            out.append(
                f"| {path} | fp32 | {name} | {len(rs)} | {sig:.3f} | {inside:.0%} | {p90:.0%} |"
            )
    out.append(
        "| outright, ratio | fp16, bf16, tf32 | - | 0 | no labelled steps: FP32's sigma "
        "plus the tensor-core widening | - | - |"
    )
    return "\n".join(out)


def _line(name: str, rs: Sequence[dict[str, object]]) -> str:
    errs = [abs(float(r["error"])) for r in rs]  # type: ignore[arg-type]
    sig = statistics.fmean(float(r["sigma"]) for r in rs)  # type: ignore[arg-type]
    inside = sum(bool(r["in_1sigma"]) for r in rs) / len(rs)
    p90 = sum(bool(r["below_p90"]) for r in rs) / len(rs)
    bias = statistics.fmean(float(r["error"]) for r in rs)  # type: ignore[arg-type]
    return (
        f"| {name} | {len(rs)} | {statistics.fmean(errs) * 100:.1f}% | {max(errs) * 100:.1f}% "
        f"| {bias * 100:+.1f}% | {sig:.3f} | {inside:.0%} | {p90:.0%} |"
    )


HEADER = (
    "| group | n | mean abs error | max | mean signed (measured/pred - 1) | mean sigma "
    "| within +-1 sigma | <= p90 |\n|---|---|---|---|---|---|---|---|"
)


def report(results: Sequence[dict[str, object]]) -> str:
    out = ["NeuSight protocol (fit on P4, P100, T4, V100, A100-40GB kernels; training steps):"]
    out.append(HEADER)
    test_train = [r for r in results if r["test"] and r["mode"] == "train"]
    for gpu in ("H100", "L4", "A100-80GB"):
        out.append(_line(gpu, [r for r in test_train if r["gpu"] == gpu]))
    out.append(_line("all three", test_train))
    out.append("")
    out.append("Leave one GPU out (every labelled NVIDIA GPU; train and inference steps):")
    out.append(HEADER)
    by_gpu: dict[str, list[dict[str, object]]] = defaultdict(list)
    by_model: dict[str, list[dict[str, object]]] = defaultdict(list)
    by_mode: dict[str, list[dict[str, object]]] = defaultdict(list)
    for r in results:
        by_gpu[str(r["gpu"])].append(r)
        by_model[str(r["model"])].append(r)
        by_mode[str(r["mode"])].append(r)
    for gpu, rs in by_gpu.items():
        out.append(_line(gpu, rs))
    for mode, rs in by_mode.items():
        out.append(_line(f"all, {mode}", rs))
    out.append(_line("all (fp32)", results))
    out.append("")
    out.append("Leave one model out (no fit sees a model's steps: the same predictions, by model):")
    out.append(HEADER)
    for model, rs in by_model.items():
        out.append(_line(model, rs))
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--rows", action="store_true", help="also print every prediction")
    args = parser.parse_args(argv)
    moved: list[dict[str, object]] = []
    results = run(moved)
    if args.rows:
        for r in results:
            print(
                f"{r['gpu']:10s} {r['workload']:28s} measured {float(r['measured_ms']):9.1f} ms "  # type: ignore[arg-type]
                f"predicted {float(r['predicted_ms']):9.1f} ms  {float(r['error']) * 100:+6.1f}% "  # type: ignore[arg-type]
                f"sigma {float(r['sigma']):.3f}"  # type: ignore[arg-type]
            )
    print(report(results))
    print()
    print(transfer_report(moved))
    print()
    print(calibration_report(results, moved))
    return 0


if __name__ == "__main__":
    sys.exit(main())
