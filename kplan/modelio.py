"""``kplan model fit|predict`` as library calls over the measurements/configurations CSVs."""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kplan.errors import DataFileError, InputError
from kplan.io import cell_number, read_csv_rows, read_json
from kplan.planner import perfmodel
from kplan.planner.fit import fit_perf_params
from kplan.planner.perfmodel import PerfParams, params_from_dict
from kplan.planner.profile import Measurement

MEASUREMENT_REQUIRED = ("nodes", "workers", "local_batch", "step_time")
MEASUREMENT_OPTIONAL = ("sync_time", "accum_steps", "instance_type", "gpu")
CONFIG_REQUIRED = ("nodes", "workers", "local_batch")
CONFIG_OPTIONAL = ("accum_steps", "instance_type", "gpu")


def read_measurements(path: Path) -> list[Measurement]:
    rows = read_csv_rows(path, MEASUREMENT_REQUIRED, MEASUREMENT_OPTIONAL, "measurements")
    out = []
    for line, r in enumerate(rows, start=2):
        sync = r.get("sync_time", "")
        try:
            out.append(
                Measurement(
                    nodes=int(cell_number(r, "nodes", path, line, integer=True)),
                    workers=int(cell_number(r, "workers", path, line, integer=True)),
                    local_batch=int(cell_number(r, "local_batch", path, line, integer=True)),
                    step_time=cell_number(r, "step_time", path, line),
                    sync_time=cell_number(r, "sync_time", path, line, positive=False)
                    if sync
                    else None,
                    accum_steps=int(cell_number(r, "accum_steps", path, line, integer=True))
                    if r.get("accum_steps")
                    else 1,
                    instance_type=r.get("instance_type") or None,
                    gpu=r.get("gpu") or None,
                )
            )
        except ValueError as err:
            raise DataFileError(f"{path}, line {line}: {err}", hint="fix the row") from None
    return out


@dataclass(frozen=True)
class FitReport:
    params: PerfParams
    rows: int
    mape_percent: float


def fit_file(
    measurements: Path,
    *,
    gradient_bytes: float | None = None,
    intra_gbps: float | None = None,
    inter_gbps: float | None = None,
) -> FitReport:
    for name, value in (
        ("--gradient-bytes", gradient_bytes),
        ("--intra-gbps", intra_gbps),
        ("--inter-gbps", inter_gbps),
    ):
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise InputError(f"{name} {value} must be > 0", hint="or leave it out")
    rows = read_measurements(measurements)
    gpus = {m.gpu for m in rows if m.gpu}
    if len(gpus) > 1:
        raise DataFileError(
            f"{measurements}: rows from several GPU types ({', '.join(sorted(gpus))})",
            hint="fit one model per GPU type; other types are predicted from it",
        )
    gpn = max((m.workers // m.nodes for m in rows), default=1)
    params = fit_perf_params(
        rows,
        gradient_bytes=gradient_bytes,
        intra_gbps=intra_gbps,
        inter_gbps=inter_gbps,
        gpu=gpus.pop() if gpus else None,
        gpus_per_node=gpn,
    )
    pred = perfmodel.step_time(
        params,
        [m.nodes for m in rows],
        [m.workers for m in rows],
        [m.local_batch for m in rows],
        [m.accum_steps for m in rows],
    )
    true = np.array([m.step_time for m in rows])
    mape = float(np.mean(np.abs(pred - true) / true) * 100)
    return FitReport(params, len(rows), mape)


def load_model(path: Path) -> PerfParams:
    return params_from_dict(read_json(path, "model"), str(path))


def predict_file(model: PerfParams, configs: Path) -> list[dict[str, Any]]:
    rows = read_csv_rows(configs, CONFIG_REQUIRED, CONFIG_OPTIONAL, "configurations")
    nodes, workers, local, accum = [], [], [], []
    for line, r in enumerate(rows, start=2):
        n = int(cell_number(r, "nodes", configs, line, integer=True))
        k = int(cell_number(r, "workers", configs, line, integer=True))
        if k < n:
            raise DataFileError(
                f"{configs}, line {line}: workers={k} < nodes={n}",
                hint="workers counts every GPU of every node",
            )
        nodes.append(n)
        workers.append(k)
        local.append(int(cell_number(r, "local_batch", configs, line, integer=True)))
        accum.append(
            int(cell_number(r, "accum_steps", configs, line, integer=True))
            if r.get("accum_steps")
            else 1
        )
    step = perfmodel.step_time(model, nodes, workers, local, accum)
    comp = perfmodel.compute_time(model, local)
    sync = perfmodel.sync_time(model, nodes, workers)
    z90 = math.exp(1.2815515655446004 * model.log_sigma)
    out = []
    for i, r in enumerate(rows):
        out.append(
            {
                **r,
                "step_time": float(step[i]),
                "step_time_p90": float(step[i] * z90),
                "compute_time": float(comp[i]),
                "sync_time": float(sync[i]),
            }
        )
    return out


def to_csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    return buf.getvalue()
