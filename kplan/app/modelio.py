"""``kplan model fit|predict`` as library calls over the measurements/configurations CSVs."""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kplan.core.errors import DataFileError, InputError
from kplan.core.files import cell_number, read_csv_rows, read_json
from kplan.planner import fit, perfmodel
from kplan.planner.fit import fit_perf_params
from kplan.planner.perfmodel import PerfParams, params_from_dict
from kplan.planner.profile import (
    MAX_BATCH,
    MAX_BYTES,
    MAX_NODES,
    MAX_SECONDS,
    MAX_WORKERS,
    Measurement,
)
from kplan.planner.profile_checks import MIN_STEP_S

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
                    nodes=_count(r, "nodes", path, line, MAX_NODES),
                    workers=_count(r, "workers", path, line, MAX_WORKERS),
                    local_batch=_count(r, "local_batch", path, line, MAX_BATCH),
                    step_time=cell_number(
                        r,
                        "step_time",
                        path,
                        line,
                        upper=MAX_SECONDS,
                        lower=MIN_STEP_S,
                        lower_hint="step times are in seconds, e.g. 0.25",
                    ),
                    sync_time=cell_number(
                        r, "sync_time", path, line, positive=False, upper=MAX_SECONDS
                    )
                    if sync
                    else None,
                    accum_steps=_count(r, "accum_steps", path, line, MAX_BATCH)
                    if r.get("accum_steps")
                    else 1,
                    instance_type=_name(r, "instance_type", path, line),
                    gpu=_name(r, "gpu", path, line),
                )
            )
        except ValueError as err:
            raise DataFileError(f"{path}, line {line}: {err}", hint="fix the row") from None
    return out


def _count(r: dict[str, str], col: str, path: Path, line: int, upper: int) -> int:
    return int(cell_number(r, col, path, line, integer=True, upper=upper))


def _name(r: dict[str, str], col: str, path: Path, line: int) -> str | None:
    value = r.get(col) or None
    if value is not None and (len(value) > 128 or not value.isprintable()):
        raise DataFileError(
            f"{path}, line {line}: {col} is not a plain name ({value[:40]!r})", hint="fix the row"
        )
    return value


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
        upper = MAX_BYTES if name == "--gradient-bytes" else 1e7
        if value is not None and not (value > 0 and math.isfinite(value) and value <= upper):
            raise InputError(
                f"{name} {value} must be a finite number > 0 and <= {upper:g}",
                hint="or leave it out",
            )
    rows = read_measurements(measurements)
    _check_types(rows, measurements)
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


def _check_types(rows: list[Measurement], path: Path) -> None:
    """Rows naming an instance type of the catalog: their workers fit on its GPUs, and their
    gpu is its GPU (a type the catalog lacks, a machine of one's own, is taken as given)."""
    if not any(m.instance_type for m in rows):
        return
    by_name = _types_by_name(_catalog())
    for line, m in enumerate(rows, start=2):
        inst = by_name.get(m.instance_type or "")
        if inst is None:
            continue
        check_fits_type(path, line, m.nodes, m.workers, inst)
        _check_gpu_of(path, line, inst, m.gpu)


def _types_by_name(catalog: Any) -> dict[str, Any]:
    """The catalog's instance types by name (a name on both clouds: the first by cloud)."""
    return {t: i for (_c, t), i in sorted(catalog.instances.items(), reverse=True)}


def _check_gpu_of(source: Path, line: int, inst: Any, gpu: str | None) -> None:
    """A row's gpu cell, where given, is its instance type's GPU."""
    if gpu and gpu.lower() != inst.gpu.lower():
        raise DataFileError(
            f"{source}, line {line}: {inst.name} has {inst.gpu} GPUs, not {gpu}",
            hint="leave one of the gpu and instance_type cells empty, or make them agree",
        )


def _catalog() -> Any:
    """The current catalog (its folder's files checked first: a FIFO there would hang)."""
    from kplan.catalogs.current import current_catalog_dir, load_current
    from kplan.core.files import check_folder_files

    check_folder_files(current_catalog_dir(), "catalog")
    return load_current()


def load_model(path: Path) -> PerfParams:
    return params_from_dict(read_json(path, "model"), str(path))


@dataclass(frozen=True)
class Prediction:
    """One configuration's predicted step time (``row``: its line of the configurations CSV)."""

    row: dict[str, str]
    step_time: float
    step_time_p90: float
    step_time_log_sigma: float
    compute_time: float
    sync_time: float
    transferred_from: str  # the GPU the model was transferred from ("": its own)
    extrapolated: str  # why the row is outside what was measured ("": inside)

    def to_dict(self) -> dict[str, object]:
        """The row's columns, then the prediction's (``--json`` and the CSV)."""
        return {
            **self.row,
            "step_time": self.step_time,
            "step_time_p90": self.step_time_p90,
            "step_time_log_sigma": self.step_time_log_sigma,
            "compute_time": self.compute_time,
            "sync_time": self.sync_time,
            "transferred_from": self.transferred_from,
            "extrapolated": self.extrapolated,
        }


def predict_file(model: PerfParams, configs: Path) -> list[Prediction]:
    """Each configuration's step time on the row's device: the model's own GPU (its fitted
    sigma), or another GPU named by the row's ``gpu`` or ``instance_type`` column, predicted by
    transferring the model through the device model (with that transfer's wider sigma)."""
    rows = read_csv_rows(configs, CONFIG_REQUIRED, CONFIG_OPTIONAL, "configurations")
    nodes, workers, local, accum = [], [], [], []
    targets: list[tuple[str | None, str | None]] = []
    for line, r in enumerate(rows, start=2):
        n = _count(r, "nodes", configs, line, MAX_NODES)
        k = _count(r, "workers", configs, line, MAX_WORKERS)
        if k < n:
            raise DataFileError(
                f"{configs}, line {line}: workers={k} < nodes={n}",
                hint="workers counts every GPU of every node",
            )
        nodes.append(n)
        workers.append(k)
        local.append(_count(r, "local_batch", configs, line, MAX_BATCH))
        accum.append(
            _count(r, "accum_steps", configs, line, MAX_BATCH) if r.get("accum_steps") else 1
        )
        targets.append((_name(r, "gpu", configs, line), _name(r, "instance_type", configs, line)))
    resolver = _Transfer(model, configs)
    per_row = [resolver.params(line, g, t) for line, (g, t) in enumerate(targets, start=2)]
    out = []
    for i, r in enumerate(rows):
        p, source = per_row[i]
        if (itype := targets[i][1]) is not None:
            check_fits_type(configs, i + 2, nodes[i], workers[i], resolver.instance(itype))
        refused = fit.unknown_link(p, nodes[i], workers[i])
        if refused is not None:
            raise DataFileError(
                f"{configs}, line {i + 2}: cannot predict {refused}",
                hint="fit the model on measurements that include such rows, or give "
                "`kplan model fit` the link: --gradient-bytes with --inter-gbps / --intra-gbps",
            )
        step = float(perfmodel.step_time(p, [nodes[i]], [workers[i]], [local[i]], [accum[i]])[0])
        # the fit's sigma, widened where the row is outside what was measured
        sigma = fit.extrapolated_log_sigma(p, nodes[i], workers[i])
        out.append(
            Prediction(
                row=r,
                step_time=step,
                step_time_p90=step * math.exp(_Z90 * sigma),
                step_time_log_sigma=sigma,
                compute_time=float(perfmodel.compute_time(p, [local[i]])[0]),
                sync_time=float(perfmodel.sync_time(p, [nodes[i]], [workers[i]])[0]),
                transferred_from=source,
                extrapolated=fit.extrapolation(p, nodes[i], workers[i]),
            )
        )
    return out


_Z90 = 1.2815515655446004  # the standard normal's 90th percentile


def check_fits_type(source: Path, line: int, nodes: int, workers: int, inst: Any) -> None:
    """A row's workers fit on its nodes of instance type ``inst`` (one worker per GPU)."""
    per_node = -(-workers // nodes)  # the fullest node
    if inst is not None and per_node > inst.gpu_count:
        raise DataFileError(
            f"{source}, line {line}: {workers} workers on {nodes} node(s) is {per_node} on a "
            f"node, and {inst.name} has {inst.gpu_count} GPUs",
            hint="workers counts every GPU of every node: at most nodes x the type's GPUs",
        )


class _Transfer:
    """The model's parameters on each row's device; the catalog and device model are loaded
    only when some row names another device than the model's."""

    def __init__(self, model: PerfParams, source: Path) -> None:
        self.model = model
        self.source = source
        self._cache: dict[tuple[str, str | None], PerfParams] = {}
        self._catalog: Any = None
        self._types: dict[str, Any] | None = None

    def params(self, line: int, gpu: str | None, itype: str | None) -> tuple[PerfParams, str]:
        if gpu is None and itype is None:
            return self.model, ""
        own = (self.model.gpu or "").lower()
        if itype is None and gpu is not None and gpu.lower() == own:
            return self.model, ""
        cat = self._load()
        inst = None
        if itype is not None:
            inst = self.instance(itype)
            if inst is None:
                import difflib

                names = sorted({t for (_c, t) in cat.instances})
                close = difflib.get_close_matches(itype, names, n=3, cutoff=0.5)
                raise DataFileError(
                    f"{self.source}, line {line}: unknown instance type {itype!r}",
                    hint=f"did you mean {', '.join(close)}?"
                    if close
                    else "see `kplan catalog list`",
                )
            _check_gpu_of(self.source, line, inst, gpu)
            gpu = inst.gpu
        known = {g.lower(): g for g in cat.gpus}
        assert gpu is not None
        if gpu.lower() not in known:
            raise DataFileError(
                f"{self.source}, line {line}: unknown GPU {gpu!r}",
                hint=f"known GPUs: {', '.join(sorted(cat.gpus))}",
            )
        dst = cat.gpus[known[gpu.lower()]]
        if dst.name.lower() == own and inst is None:
            return self.model, ""
        if not own or own not in known:
            raise DataFileError(
                f"{self.source}, line {line}: names {dst.name}, but the model does not say "
                f"which GPU it was fitted on"
                + (f" ({self.model.gpu!r} is not in the catalog)" if own else ""),
                hint="fit it from measurements with a gpu column (`kplan model fit`), or leave "
                "the row's gpu and instance_type empty",
            )
        key = (dst.name, inst.name if inst is not None else None)
        if key not in self._cache:
            self._cache[key] = self._transfer(cat, cat.gpus[known[own]], dst, inst)
        return self._cache[key], cat.gpus[known[own]].name

    def instance(self, itype: str) -> Any:
        """The catalog's instance type of that name (None: not in the catalog)."""
        if self._types is None:
            self._types = _types_by_name(self._load())
        return self._types.get(itype)

    def _load(self) -> Any:
        if self._catalog is None:
            self._catalog = _catalog()
        return self._catalog

    def _transfer(self, cat: Any, ref: Any, dst: Any, inst: Any) -> PerfParams:
        """``workload.for_instance`` on a workload that is just this model."""
        from kplan.catalogs.device_model import load_device_model
        from kplan.planner.catalog import InstanceType
        from kplan.planner.workload import Workload, for_instance

        if inst is None or not self.model.gradient_bytes:
            # A GPU alone, or a model without gradient bytes (its links cannot be rebuilt from
            # the instance's): keep the model's links, transfer the compute.
            inst = InstanceType(
                "aws", dst.name, dst.name, self.model.gpus_per_node or 1, 0, 0.0, 0.0, "none",
                0.0, "model predict",
            )  # fmt: skip
        w = Workload(
            name="model",
            params=self.model,
            ref_gpu=ref,
            base_batch=1,
            samples_at_base=1.0,
            gns=(),
            gradient_bytes=self.model.gradient_bytes or 0.0,
            max_local_batch_ref=1,
            static_memory_gb=None,
            per_sample_memory_gb=None,
            ref_is_cpu=False,
        )
        return for_instance(w, inst, dst, load_device_model()).params


def to_csv(predictions: list[Prediction]) -> str:
    rows = [p.to_dict() for p in predictions]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    return buf.getvalue()
