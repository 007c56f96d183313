"""The sync model against measured NCCL all-reduce and NVIDIA's multi-node scaling.

    .venv/bin/python -m bench.sync_model

(a) kplan's intra-node all-reduce (``perfmodel.sync_time`` with the priors ``for_instance``
    uses for an instance it never profiled) against nccl-tests all-reduce times measured by
    vTrain (MICRO'24) on 2..8 A100s (NVSwitch) and V100s (NVLink hybrid cube mesh), 1 MB..1 GB,
    with the catalog's NVLink bandwidth of the matching instance (p4d.24xlarge, p3.16xlarge).
    It also refits the prior constants (efficiency, per-call and per-hop latency) on these rows:
    the values written in ``kplan/planner/fit.py`` come from this fit.
(b) Scaling efficiency (per-GPU throughput at N GPUs / at 1 GPU) that kplan predicts for NVIDIA
    DeepLearningExamples rows with 1, 8 and more GPUs (DGX nodes), against the published
    figures: compute from the 1-GPU row, sync from the priors and the nodes' links.

Reference data: ``../shared/data/gpu`` (or ``$KPLAN_SHARED_DATA/gpu``).
"""

from __future__ import annotations

import csv
import math
import os
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from kplan.planner import fit, perfmodel
from kplan.planner.perfmodel import PerfParams

MB = 2**20
# NVLink bandwidth per GPU and direction, Gbit/s, as in kplan/catalogs/data/instances.csv.
NVLINK_GBPS = {"a100": 2400.0, "v100": 1200.0}  # p4d.24xlarge, p3.16xlarge
SIZES_MB = (1, 4, 16, 64, 256, 1024)

# Published hardware of the DGX systems in the DLE tables (NVIDIA DGX data sheets): GPU link
# per GPU and direction, and the node's aggregate compute-fabric NIC bandwidth.
DGX_LINKS = {
    "A100": (2400.0, 8 * 200.0),  # DGX A100: NVSwitch, 8x HDR InfiniBand 200 Gb/s
    "V100": (1200.0, 4 * 100.0),  # DGX-1V: NVLink hybrid cube mesh, 4x EDR InfiniBand 100 Gb/s
}
# Parameter counts (millions) of the DLE models used, from the models' papers / READMEs.
PARAMS_M = {
    "efficientnet-b0": 5.3,
    "efficientnet-b4": 19.3,
    "EfficientNet v1-B0": 5.3,
    "EfficientNet v1-B4": 19.3,
    "EfficientNet v2-S": 21.5,
    "BART [pre-training; seq len 128]": 406.0,
    "BART [pre-training; seq len 512]": 406.0,
}


def data_root() -> Path:
    env = os.environ.get("KPLAN_SHARED_DATA")
    base = Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "data"
    return base / "gpu"


def load_nccl(gpu: str) -> list[tuple[int, float, float]]:
    """(k, bytes, seconds) rows: the mean of the out-of-place and in-place times."""
    rows = []
    for k in range(2, 9):
        path = data_root() / "vtrain-micro24" / "trace" / gpu / f"AR_GPU{k}_1M_1024M_LUT"
        with path.open() as f:
            for rec in csv.reader(f):
                if not rec or not rec[0].isdigit():
                    continue
                t = (float(rec[3]) + float(rec[5])) / 2 * 1e-9
                rows.append((k, float(rec[0]), t))
    return rows


def fit_nccl(rows: list[tuple[int, float, float]], gbps: dict[int, float]) -> tuple[float, ...]:
    """t = c0 + lat * 2(k-1) + S * ring(k) / (eta * BW): least squares in relative error."""
    from scipy.optimize import nnls  # fitting only, off the estimate path

    a = np.array(
        [
            [1.0, 2.0 * (k - 1), s * 2 * (k - 1) / k / (gbps[i] * 1e9 / 8)]
            for i, (k, s, _) in enumerate(rows)
        ]
    )
    t = np.array([r[2] for r in rows])
    coef, _ = nnls(a / t[:, None], np.ones_like(t))
    c0, lat, inv_eta = (float(c) for c in coef)
    return c0, lat, 1.0 / inv_eta


def prior_params(bytes_: float, gbps: float, *, eta: float, lat: float, alpha: float) -> PerfParams:
    """What ``workload.for_instance`` builds for a link it has no measurement of."""
    return PerfParams(
        compute_a=0.0,
        compute_b=1e-3,
        gamma=fit.PRIOR_GAMMA,
        intra_alpha=alpha,
        intra_beta=bytes_ / (eta * gbps * 1e9 / 8),
        intra_lat=lat,
        inter_alpha=alpha,
        inter_beta=bytes_ / (fit.PRIOR_ETA_INTER * gbps * 1e9 / 8),
        inter_lat=fit.PRIOR_LAT_INTER,
        two_node=0.0,
        log_sigma=0.1,
        gradient_bytes=bytes_,
    )


# The priors before issue 15 (fit.py at 9d4dd23), kept to show what changed.
OLD = {"eta": 0.5, "lat": 10e-6, "alpha": 1e-3, "eta_inter": 0.25, "lat_inter": 50e-6}


def part_a() -> None:
    allrows = {g: load_nccl(g) for g in ("a100", "v100")}
    joined = [(k, s, t, g) for g, rows in allrows.items() for k, s, t in rows]
    c0, lat, eta = fit_nccl(
        [(k, s, t) for k, s, t, _ in joined],
        {i: NVLINK_GBPS[g] for i, (_, _, _, g) in enumerate(joined)},
    )
    print("(a) intra-node all-reduce: kplan's prior model vs nccl-tests (vTrain), time ratio")
    print(
        f"    refit on both GPUs, all k and sizes: c0={c0 * 1e6:.1f} us  lat/hop={lat * 1e6:.2f} us"
        f"  eta={eta:.3f}"
    )
    for g in ("a100", "v100"):
        gc0, glat, geta = fit_nccl(
            allrows[g], dict.fromkeys(range(len(allrows[g])), NVLINK_GBPS[g])
        )
        print(
            f"    {g} alone: c0={gc0 * 1e6:.1f} us  lat/hop={glat * 1e6:.2f} us  eta={geta:.3f}"
            f"  (busbw plateau at k=8: "
            f"{max(s * 2 * 7 / 8 / t for k, s, t in allrows[g] if k == 8) / 1e9:.0f} GB/s)"
        )
    variants = {
        "old priors": (OLD["eta"], OLD["lat"], OLD["alpha"]),
        "old, no alpha": (OLD["eta"], OLD["lat"], 0.0),
        "new, no alpha": (fit.PRIOR_ETA_INTRA, fit.PRIOR_LAT_INTRA, 0.0),
        "new eta, per-call c0, no hop": (fit.PRIOR_ETA_INTRA, 0.0, fit.PRIOR_NCCL_CALL),
    }
    print()
    header = "gpu   k  " + "  ".join(f"{m:>5}MB" for m in SIZES_MB)
    for name, (e, la, al) in variants.items():
        print(
            f"  predicted / measured, {name} (eta={e}, lat/hop={la * 1e6:g} us,"
            f" per-call={al * 1e3:g} ms)"
        )
        print("  " + header)
        errs: dict[str, list[float]] = defaultdict(list)
        for g, rows in allrows.items():
            meas = {(k, int(s)): t for k, s, t in rows}
            for k in range(2, 9):
                cells = []
                for m in SIZES_MB:
                    s = m * MB
                    p = prior_params(s, NVLINK_GBPS[g], eta=e, lat=la, alpha=al)
                    pred = float(perfmodel.sync_time(p, 1, k))
                    ratio = pred / meas[(k, s)]
                    cells.append(f"{ratio:7.2f}")
                for k2, s2, t2 in rows:
                    if k2 != k:
                        continue
                    pr = float(
                        perfmodel.sync_time(
                            prior_params(s2, NVLINK_GBPS[g], eta=e, lat=la, alpha=al), 1, k
                        )
                    )
                    band = "small" if s2 <= 4 * MB else "large" if s2 >= 64 * MB else "mid"
                    errs[f"{g} {band}"].append(abs(pr / t2 - 1))
                print(f"  {g} {k:2d}  " + " ".join(cells))
        print(
            "  MAPE: "
            + "  ".join(f"{key} {100 * float(np.mean(v)):.0f}%" for key, v in sorted(errs.items()))
        )
        print()


def _dle_rows() -> dict[tuple[str, str, str, str], dict[int, float]]:
    path = data_root() / "nvidia-dle" / "training_throughput.csv"
    out: dict[tuple[str, str, str, str], dict[int, float]] = defaultdict(dict)
    with path.open() as f:
        for r in csv.DictReader(f):
            if r["model"] not in PARAMS_M or r["framework"] not in ("pytorch", "tensorflow"):
                continue
            if not ("DGX" in r["system"] or r["system"].startswith("A100")):
                continue
            key = (r["model"], r["system"], r["precision"], r["batch_per_gpu"])
            out[key][int(r["num_gpus"])] = float(r["throughput"])
    # Rows without a per-GPU batch cannot give the compute time of one step: left out.
    return {k: v for k, v in out.items() if 1 in v and max(v) > 8 and k[3]}


def predicted_efficiency(
    *,
    params_m: float,
    compute_s: float,
    n: int,
    k: int,
    intra: float,
    inter: float,
    old: bool,
    floor: bool = False,
) -> float:
    bytes_ = params_m * 1e6 * 4.0  # DDP reduces FP32 gradients (precision.GRADIENT_BYTES)
    eta_i, lat_i, al = (
        (OLD["eta"], OLD["lat"], OLD["alpha"])
        if old
        else (fit.PRIOR_ETA_INTRA, fit.PRIOR_LAT_INTRA, fit.PRIOR_ALPHA)
    )
    eta_n, lat_n = (
        (OLD["eta_inter"], OLD["lat_inter"]) if old else (fit.PRIOR_ETA_INTER, fit.PRIOR_LAT_INTER)
    )
    p = PerfParams(
        compute_a=0.0,
        compute_b=compute_s,
        gamma=fit.PRIOR_GAMMA,
        intra_alpha=al,
        intra_beta=bytes_ / (eta_i * intra * 1e9 / 8),
        intra_lat=lat_i,
        inter_alpha=al,
        inter_beta=bytes_ / (eta_n * inter * 1e9 / 8),
        inter_lat=lat_n,
        two_node=0.0,
        log_sigma=0.1,
        gradient_bytes=None if old else bytes_,
        gpus_per_node=8,
    )
    if floor:
        p = perfmodel.with_bucket_floor(p)
    return compute_s / float(perfmodel.step_time(p, n, k, 1))


def part_b() -> None:
    print("(b) scaling efficiency, per-GPU throughput at N GPUs / at 1 GPU (NVIDIA DLE, DGX)")
    print(
        f"  {'model':34} {'system':26} {'prec':4} {'N':>3} {'meas':>5} {'old':>5} {'new':>5}"
        f" {'+flr':>5} {'p3.16x old':>10} {'p3.16x':>6} {'p3dn':>5} {'p4d':>5}"
    )
    err_old: list[float] = []
    err_new: list[float] = []
    err_floor: list[float] = []
    for (model, system, prec, batch), by_n in sorted(_dle_rows().items()):
        gpu = "A100" if "A100" in system else "V100"
        intra, inter = DGX_LINKS[gpu]
        b = float(batch)
        compute = b / by_n[1]
        for n_gpus in sorted(by_n):
            if n_gpus == 1:
                continue
            nodes = max(1, n_gpus // 8)
            meas = by_n[n_gpus] / n_gpus / by_n[1]
            pm = PARAMS_M[model]

            def eff(
                i: float,
                x: float,
                old: bool,
                floor: bool = False,
                pm: float = pm,
                c: float = compute,
                n: int = nodes,
                k: int = n_gpus,
            ) -> float:
                return predicted_efficiency(
                    params_m=pm, compute_s=c, n=n, k=k, intra=i, inter=x, old=old, floor=floor
                )

            old = eff(intra, inter, True)
            new = eff(intra, inter, False)
            floored = eff(intra, inter, False, True)
            cloud = [
                eff(i, x, False) for i, x in ((1200.0, 25.0), (1200.0, 100.0), (2400.0, 400.0))
            ]
            if nodes > 1:
                err_old.append(abs(math.log(old / meas)))
                err_new.append(abs(math.log(new / meas)))
                err_floor.append(abs(math.log(floored / meas)))
            print(
                f"  {model[:34]:34} {system[:26]:26} {prec:4} {n_gpus:3d} {meas:5.2f} {old:5.2f}"
                f" {new:5.2f} {floored:5.2f} {eff(1200.0, 25.0, True):10.2f} "
                + " ".join(f"{c:5.2f}" for c in cloud)
            )
    if err_new:
        print(
            f"  multi-node rows: {len(err_new)}; mean |log(pred/meas)| old {np.mean(err_old):.3f}"
            f"  new {np.mean(err_new):.3f}  new + bucket floor {np.mean(err_floor):.3f}"
        )


def main() -> int:
    part_a()
    part_b()
    return 0


if __name__ == "__main__":
    sys.exit(main())
