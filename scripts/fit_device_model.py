"""Fit kplan's cross-device compute-speed model (schema 2.0) on the shared GPU data.

Run from the repository root::

    .venv/bin/python -m scripts.fit_device_model            # writes catalogs/data/device_model.json
    .venv/bin/python -m scripts.fit_device_model --dry-run  # prints the document only

Data (the shared data folder: $KPLAN_SHARED_DATA, else ../shared/data beside the repository):

- ``gpu/neusight-asplos25``: FP32 per-iteration latencies of transformer layer stacks, single
  GPU, training and forward-only inference, on 8 NVIDIA GPUs (specs from ``device_configs/``).
- ``gpu/nvidia-dle``: NVIDIA DeepLearningExamples' published training throughput by model, GPU
  (V100 16/32 GB, A100 40/80 GB), precision (fp32, tf32, amp, bf16), per-GPU batch and GPU count
  (specs from kplan's GPU catalog). Following its README's caveats, ``fp32`` rows on A100 are
  TF32 (the frameworks' default) and ``amp`` is fp16.

Model (``kplan.planner.devices``): a roofline, ``t ~ k_p / P_p(g) + c_p / P_fp32(g) + m_p / BW(g)``,
where ``P_p(g)`` is GPU g's peak for precision p (FP32 CUDA cores, TF32 or FP16/BF16 tensor
cores, with fallbacks) in TFLOPS, ``P_fp32(g)`` its FP32 CUDA-core peak and ``BW(g)`` its memory
bandwidth in GB/s. ``k_p`` (compute work per unit of memory traffic, i.e. a global roofline
share), ``c_p`` (fp16/bf16 only: the work of a mixed-precision step that stays on the CUDA cores),
``m_p`` (memory traffic relative to FP32) and ``gamma``, the exponent with which a workload's
fixed per-step share moves, are fitted by
non-linear least squares on log time ratios of the same job measured twice (two GPUs, or two
precisions on one GPU). The fixed share of a pair is read from the source GPU's own rows of the
workload at other per-GPU batches (the intercept of step time against batch, as a profile on
the source GPU shows it), never from the destination; for an fp32/tf32 source, its compute
share is read from the workload's per-sample time in fp16/bf16 on the same source GPU, and the
exponent with which that share enters is fitted too. Sigmas come from held-out residuals only
(leave one GPU out, leave one model out, and leave one GPU die out: a GPU's twins on the same
die leave with it, as for the many GPUs without a twin in the data), per precision and as a
function of the spec distance between GPUs.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import itertools
import json
import math
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kplan.planner.catalog import GpuSpec
from kplan.planner.devices import (
    FIT_PRECISIONS,
    DeviceModel,
    compute_scale,
    held_out_sigma,
    is_projection,
    spec_distance,
)

NEUSIGHT = Path("gpu") / "neusight-asplos25"
DLE = Path("gpu") / "nvidia-dle" / "training_throughput.csv"
NEUSIGHT_GPUS = (
    "Tesla_P4",
    "Tesla_T4",
    "Tesla_P100-PCIE-16GB",
    "Tesla_V100-PCIE-32GB",
    "NVIDIA_A100-PCIE-40GB",
    "NVIDIA_A100_80GB_PCIe",
    "NVIDIA_H100_80GB_HBM3",
    "NVIDIA_L4",
)
MULTI_GPU_SUFFIXES = ("-dp4", "-tp4", "-pp4_1")
DLE_GPUS = {
    "V100-16GB": "V100",
    "V100-32GB": "V100-32GB",
    "A100-40GB": "A100",
    "A100-80GB": "A100-80GB",
}
# The die of each GPU in the data (NVIDIA product briefs and architecture whitepapers): GPUs on
# one die share their compute units and differ at most in clocks and memory.
DIES = {
    "Tesla_P4": "GP104",
    "Tesla_P100-PCIE-16GB": "GP100",
    "Tesla_T4": "TU104",
    "Tesla_V100-PCIE-32GB": "GV100",
    "V100": "GV100",
    "V100-32GB": "GV100",
    "NVIDIA_A100-PCIE-40GB": "GA100",
    "NVIDIA_A100_80GB_PCIe": "GA100",
    "A100": "GA100",
    "A100-80GB": "GA100",
    "NVIDIA_H100_80GB_HBM3": "GH100",
    "NVIDIA_L4": "AD104",
}
# More than this times the one-GPU per-GPU throughput on more GPUs: the one-GPU figure is wrong.
SUPERLINEAR_LIMIT = 1.5
DLE_PRECISION = {"fp32": "fp32", "tf32": "tf32", "amp": "fp16", "bf16": "bf16"}
SHIPPED_PATH = (
    Path(__file__).resolve().parents[1] / "kplan" / "catalogs" / "data" / "device_model.json"
)
SOURCE = (
    "scripts/fit_device_model.py on the shared data: NeuSight (github.com/sitar-lab/NeuSight "
    "@6945927, MIT; FP32 single-GPU latencies, 8 NVIDIA GPUs) and NVIDIA DeepLearningExamples "
    "@729963d (published training throughput by GPU, precision and batch; V100 and A100)"
)
# Starting point of the fit: log k (TFLOPS per GB/s) per precision, log m for fp16/bf16, log
# batch_half, log gamma, log workload_exponent, log c for fp16/bf16.
START = np.array(
    [
        math.log(0.05),
        math.log(0.05),
        math.log(0.05),
        math.log(0.6),
        math.log(4.0),
        math.log(0.5),
        math.log(0.5),
        math.log(0.02),
    ]
)


def data_root() -> Path:
    """The shared data folder: $KPLAN_SHARED_DATA, else ../shared/data beside the repo."""
    env = os.environ.get("KPLAN_SHARED_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "data"


@dataclass(frozen=True)
class Sample:
    """One measured step time of one job on one GPU in one precision."""

    gpu: str
    model: str  # the workload family, held out together ("neusight:bert_large", "dle:BERT ...")
    job: str  # the exact configuration (model, batch, GPU count, mode): pairs share it
    precision: str
    batch: float | None
    ms: float
    # Share of ms that does not grow with the batch, from this GPU's own rows of the workload
    # at other batches (what a profile on this GPU shows); None when it has no other batch.
    fixed: float | None = None
    # (other precision, time in it / time in this precision) for the workload on this GPU, per
    # sample at their batches (geometric means), from the other precision family; or None.
    alt: tuple[str, float] | None = None


@dataclass(frozen=True)
class Pair:
    """The same job measured twice: ``log_ratio = log(t_dst / t_src)``."""

    src: Sample
    dst: Sample

    @property
    def log_ratio(self) -> float:
        return math.log(self.dst.ms / self.src.ms)

    @property
    def cross_gpu(self) -> bool:
        return self.src.gpu != self.dst.gpu


# ---------------------------------------------------------------------------------- loading


def neusight_specs(root: Path) -> dict[str, GpuSpec]:
    """NeuSight's devices: FP32 peak ``SingleFLOPs``/1000, bandwidth ``Mem_Bw``, SM count."""
    specs = {}
    for gpu in NEUSIGHT_GPUS:
        path = root / NEUSIGHT / "device_configs" / f"{gpu}.json"
        cfg = json.loads(path.read_text())
        specs[gpu] = GpuSpec(
            name=gpu,
            memory_gb=float(cfg["Dev_Mem"]),
            fp32_tflops=float(cfg["SingleFLOPs"]) / 1000.0,
            fp16_tflops=float(cfg["SingleFLOPs"]) / 1000.0,  # unused: NeuSight rows are FP32
            mem_bw_gbs=float(cfg["Mem_Bw"]),
            source=f"NeuSight device_configs/{path.name}",
            sm_count=int(cfg["Num_Sm"]),
        )
    return specs


def load_neusight(root: Path) -> list[Sample]:
    samples = []
    for gpu in NEUSIGHT_GPUS:
        for path in sorted((root / NEUSIGHT / "label" / gpu).glob("*.json")):
            if path.stem.endswith(MULTI_GPU_SUFFIXES):
                continue
            parts = path.stem.removesuffix("-fusion").split("-")
            ms = float(json.loads(path.read_text())["e2e_latency"])
            if not (ms > 0 and math.isfinite(ms)):
                raise ValueError(f"{path}: e2e_latency={ms!r} is not a positive time")
            samples.append(
                Sample(gpu, f"neusight:{parts[0]}", path.stem, "fp32", float(parts[-1]), ms)
            )
    return samples


def load_dle(root: Path) -> list[Sample]:
    """Per-step times of DLE training rows (``num_gpus * batch / throughput``, or 1/throughput).

    Repeated figures of one configuration (different containers) are averaged in log.
    """
    groups: dict[tuple[str, str, str, str], list[float]] = {}
    meta: dict[tuple[str, str, str, str], tuple[str, float | None]] = {}
    with (root / DLE).open(newline="") as f:
        rows = list(csv.DictReader(f))
    bad = superlinear_rows(rows)
    for i, row in enumerate(rows):
        if i in bad:
            continue
        gpu = DLE_GPUS[row["gpu"]]
        precision = DLE_PRECISION[row["precision"]]
        if precision == "fp32" and gpu.startswith("A100"):
            precision = "tf32"  # README caveat: labelled FP32, run as TF32 (default)
        raw = row["batch_per_gpu"].strip().lower()
        batch = float(raw[:-1]) * 1000 if raw.endswith("k") else float(raw) if raw else None
        tput = float(row["throughput"]) / float(row["num_gpus"])
        ms = 1000.0 * (batch or 1.0) / tput
        family = f"dle:{row['framework']}:{row['model_dir']}"
        job = f"{family}:{row['model']}:b{row['batch_per_gpu']}:n{row['num_gpus']}"
        key = (gpu, job, precision, row["throughput_unit"])
        groups.setdefault(key, []).append(math.log(ms))
        meta[key] = (family, batch)
    return [
        Sample(gpu, meta[k][0], f"{job}:{unit}", prec, meta[k][1], math.exp(float(np.mean(v))))
        for k, v in sorted(groups.items())
        for gpu, job, prec, unit in [k]
    ]


def superlinear_rows(rows: Sequence[dict[str, str]]) -> set[int]:
    """Indices of single-GPU figures that the same table contradicts.

    At an equal per-GPU batch, data-parallel training on n GPUs cannot run more than n times
    faster than on one; a table whose per-GPU throughput on more GPUs is over
    ``SUPERLINEAR_LIMIT`` times its one-GPU figure has a wrong one-GPU figure (PyTorch
    EfficientNet on DGX-1 V100 32GB, flagged in the data's README: 36 img/s on one GPU, 641 on
    eight), so that figure is dropped.
    """
    tables: dict[tuple[str, ...], dict[int, list[tuple[int, float]]]] = {}
    for i, row in enumerate(rows):
        key = tuple(
            row[c]
            for c in (
                "model_dir",
                "model",
                "system",
                "precision",
                "batch_per_gpu",
                "throughput_unit",
                "container",
            )
        )
        n = int(row["num_gpus"])
        tables.setdefault(key, {}).setdefault(n, []).append((i, float(row["throughput"]) / n))
    bad: set[int] = set()
    for by_n in tables.values():
        best_multi = max((t for n, v in by_n.items() if n > 1 for _, t in v), default=0.0)
        bad.update(i for i, t in by_n.get(1, []) if best_multi > SUPERLINEAR_LIMIT * t)
    return bad


@dataclass(frozen=True)
class Dataset:
    specs: dict[str, GpuSpec]
    samples: list[Sample]


def load_dataset(
    root: Path | None = None, catalog_gpus: dict[str, GpuSpec] | None = None
) -> Dataset:
    root = root or data_root()
    if catalog_gpus is None:
        from kplan.catalogs.loader import load_catalog

        catalog_gpus = load_catalog().gpus
    specs = neusight_specs(root)
    specs.update({name: catalog_gpus[name] for name in DLE_GPUS.values()})
    samples = with_fixed_fractions(load_neusight(root) + load_dle(root))
    return Dataset(specs, with_precision_ratios(samples))


def with_precision_ratios(samples: Sequence[Sample]) -> list[Sample]:
    """Each sample with ``alt``: the same GPU's per-sample time of the workload in a precision
    of the other family (fp32/tf32 against fp16/bf16) over its own, each a geometric mean over
    the workload's batches on that GPU. Only the same GPU's rows: a profile on the source GPU in
    two precisions shows this."""
    per_sample: dict[tuple[str, str], dict[str, list[float]]] = {}
    for s in samples:
        gpu, job, prec = workload_key(s)
        per_sample.setdefault((gpu, job), {}).setdefault(prec, []).append(
            math.log(s.ms / (s.batch or 1.0))
        )
    out = []
    for s in samples:
        gpu, job, prec = workload_key(s)
        table = per_sample[(gpu, job)]
        others = sorted(q for q in table if _family(q) != _family(prec))
        if not others:
            out.append(s)
            continue
        q = others[0]
        ratio = math.exp(float(np.mean(table[q])) - float(np.mean(table[prec])))
        out.append(dataclasses.replace(s, alt=(q, ratio)))
    return out


def workload_key(s: Sample) -> tuple[str, str, str]:
    """The sample's workload without its per-GPU batch: (GPU, job less batch, precision)."""
    if s.model.startswith("dle:"):
        job = re.sub(r":b[^:]*:n", ":b?:n", s.job)
    else:  # NeuSight: model-mode-seq-batch[-fusion]
        job = re.sub(r"-\d+(-fusion)?$", r"-?\1", s.job)
    return (s.gpu, job, s.precision)


def with_fixed_fractions(samples: Sequence[Sample]) -> list[Sample]:
    """Each sample with ``fixed``: on its own GPU and precision, the workload's step times at
    two or more per-GPU batches give ``t(b) = a + c b`` (least squares) and ``fixed = a / t(b)``
    at the sample's batch, clipped to 0-1. Only the same GPU's rows are used: a profile on the
    source GPU can show this, nothing about the destination is needed."""
    groups: dict[tuple[str, str, str], list[Sample]] = {}
    for s in samples:
        if s.batch:
            groups.setdefault(workload_key(s), []).append(s)
    out = []
    for s in samples:
        group = groups.get(workload_key(s), []) if s.batch else []
        if len({g.batch for g in group}) < 2:
            out.append(s)
            continue
        b = np.array([g.batch for g in group], dtype=np.float64)
        t = np.array([g.ms for g in group], dtype=np.float64)
        slope, intercept = np.polyfit(b, t, 1)
        fit = intercept + slope * float(s.batch or 0.0)
        f = float(np.clip(intercept / fit, 0.0, 1.0)) if fit > 0 else 1.0
        out.append(dataclasses.replace(s, fixed=f))
    return out


def make_pairs(samples: Sequence[Sample]) -> list[Pair]:
    """Ordered pairs of the same job: across GPUs in one precision family, or across precisions
    on one GPU (both directions)."""
    by_job: dict[str, list[Sample]] = {}
    for s in samples:
        by_job.setdefault(s.job, []).append(s)
    pairs = []
    for group in by_job.values():
        for a, b in itertools.permutations(group, 2):
            across_gpus = a.gpu != b.gpu and _family(a.precision) == _family(b.precision)
            if across_gpus or (a.gpu == b.gpu and a.precision != b.precision):
                pairs.append(Pair(a, b))
    return pairs


def _family(precision: str) -> str:
    return "mixed" if precision in ("fp16", "bf16") else "full"


# ---------------------------------------------------------------------------------- fitting


def as_model(theta: NDArray[np.float64], digits: int | None = None, **extra: Any) -> DeviceModel:
    """A planner model from fitted parameters (log k_fp32, log k_tf32, log k_half, log m_half,
    then optionally log batch_half, log gamma, log workload_exponent, log c_half)."""
    k = {"fp32": theta[0], "tf32": theta[1], "fp16": theta[2], "bf16": theta[2]}
    m = {"fp32": 0.0, "tf32": 0.0, "fp16": theta[3], "bf16": theta[3]}
    return DeviceModel(
        compute_weight={p: _round(math.exp(k[p]), digits) for p in FIT_PRECISIONS},
        memory_weight={p: _round(math.exp(m[p]), digits) for p in FIT_PRECISIONS},
        fitted_on=extra.get("fitted_on", ()),
        source=extra.get("source", "in-memory fit"),
        sigma=extra.get("sigma"),
        held_out_error=extra.get("held_out_error", {}),
        batch_half=_round(math.exp(theta[4]), digits) if len(theta) > 4 else 0.0,
        fixed_exponent=_round(math.exp(theta[5]), digits) if len(theta) > 5 else 1.0,
        workload_exponent=_round(math.exp(theta[6]), digits) if len(theta) > 6 else 0.0,
        cuda_core_weight={p: _round(math.exp(theta[7]), digits) for p in ("fp16", "bf16")}
        if len(theta) > 7
        else {},
    )


def _round(x: float, digits: int | None) -> float:
    return float(x) if digits is None else float(f"{x:.{digits}g}")


def predict(model: DeviceModel, pair: Pair, specs: dict[str, GpuSpec]) -> float:
    """log(predicted t_dst / t_src) through the planner's own ``compute_scale``."""
    est = compute_scale(
        model,
        specs[pair.src.gpu],
        specs[pair.dst.gpu],
        src_precision=pair.src.precision,
        dst_precision=pair.dst.precision,
        batch=pair.src.batch,
        fixed_fraction=pair.src.fixed,
        precision_ratio=pair.src.alt if pair.cross_gpu else None,
    )
    return math.log(est.factor)


def log_factors(
    pairs: Sequence[Pair], specs: dict[str, GpuSpec]
) -> Callable[[NDArray[np.float64]], NDArray[np.float64]]:
    """``theta -> log(predicted t_dst / t_src)`` for every pair: the arithmetic of ``predict``
    (the planner's ``compute_scale``) on arrays, checked against it by a test."""
    from kplan.planner.devices import effective_precision, peak_tflops

    idx = {"fp32": 0, "tf32": 1, "fp16": 2, "bf16": 2}

    def end(s: Sample, prec: str) -> tuple[int, float, float]:
        g = specs[s.gpu]
        eff = effective_precision(g, prec)
        return idx[eff], 1.0 / peak_tflops(g, eff), 1.0 / g.mem_bw_gbs

    def cuda(s: Sample) -> float:
        return 1.0 / specs[s.gpu].fp32_tflops

    rows = []
    for p in pairs:
        a, d = p.src, p.dst
        ia, pa, ba = end(a, a.precision)
        id_, pd, bd = end(d, d.precision)
        # the other precision on src: index, 1/peak, measured ratio (0: none)
        ja, qa, rho = ia, pa, 0.0
        if a.alt is not None and p.cross_gpu:
            ja, qa, _ = end(a, a.alt[0])
            rho = a.alt[1] if ia not in (ja, 2) else 0.0  # from fp32/tf32 only
        sma, smd = specs[a.gpu].sm_count or 0, specs[d.gpu].sm_count or 0
        fixed, batch = a.fixed or 0.0, a.batch or 0.0
        rows.append(
            (ia, pa, ba, id_, pd, bd, ja, qa, rho, fixed, batch, sma, smd, cuda(a), cuda(d))
        )
    arr = np.array(rows, dtype=np.float64).T
    ia, id_, ja = (arr[i].astype(int) for i in (0, 3, 6))
    pa, ba, pd, bd, qa, rho, f, batch, sma, smd, ca, cd = (
        arr[i] for i in (1, 2, 4, 5, 7, 8, 9, 10, 11, 12, 13, 14)
    )
    has_alt, has_b = rho > 0, batch > 0
    r = np.where(has_alt, rho, 1.0)

    def util(model: DeviceModel, sm: NDArray[np.float64]) -> NDArray[np.float64]:
        with np.errstate(divide="ignore", invalid="ignore"):
            u = batch / (batch + model.batch_half * sm / model.sm_ref)
        return np.where(has_b & (sm > 0), u, 1.0)

    def log_factor(theta: NDArray[np.float64]) -> NDArray[np.float64]:
        model = as_model(theta)
        k = np.array([model.compute_weight[q] for q in ("fp32", "tf32", "fp16")])
        m = np.array([model.memory_weight[q] for q in ("fp32", "tf32", "fp16")])
        c = np.array([model.cuda_core_weight[q] for q in ("fp32", "tf32", "fp16")])
        # what a workload's share does not scale: CUDA-core work and memory traffic
        rest_a, rest_q, rest_d = (
            c[ia] * ca + m[ia] * ba,
            c[ja] * ca + m[ja] * ba,
            c[id_] * cd + m[id_] * bd,
        )
        num = rest_q - r * rest_a
        den = r * k[ia] * pa - k[ja] * qa
        ok = num * den > 0
        with np.errstate(divide="ignore", invalid="ignore"):
            raw = np.where(ok, np.clip(num / den, 1e-3, 1e3), np.where(den > 0, 1e-3, 1e3))
        use = has_alt & (model.workload_exponent > 0)
        scale = np.where(use, np.exp(np.clip(model.workload_exponent * np.log(raw), -50, 50)), 1.0)
        factor = (scale * k[id_] * pd + rest_d) / (scale * k[ia] * pa + rest_a)
        if model.batch_half:
            factor = factor * util(model, sma) / util(model, smd)
        factor = np.where(f > 0, (1 - f) * factor + f * factor**model.fixed_exponent, factor)
        out: NDArray[np.float64] = np.log(factor)
        return out

    return log_factor


def fit_theta(pairs: Sequence[Pair], specs: dict[str, GpuSpec]) -> NDArray[np.float64]:
    """Least squares on log ratios (soft-L1 loss against outlying published figures)."""
    from scipy.optimize import least_squares

    y = np.array([p.log_ratio for p in pairs])
    log_factor = log_factors(pairs, specs)

    def residual(theta: NDArray[np.float64]) -> NDArray[np.float64]:
        out: NDArray[np.float64] = log_factor(theta) - y
        return out

    res = least_squares(residual, START, loss="soft_l1", f_scale=0.2, bounds=(-12.0, 8.0))
    x: NDArray[np.float64] = np.asarray(res.x, dtype=np.float64)
    return x


# ------------------------------------------------------------------------------- evaluation


@dataclass(frozen=True)
class Prediction:
    pair: Pair
    fold: str  # what was held out
    residual: float  # log(predicted / measured)
    peak_residual: float  # baseline: ratio of the precision's peaks
    bw_residual: float  # baseline: ratio of memory bandwidths
    distance: float
    src_spec: GpuSpec
    dst_spec: GpuSpec

    @property
    def projected(self) -> bool:
        """Whether the pair runs in another (effective) precision on dst than on src."""
        return is_projection(
            self.src_spec, self.dst_spec, self.pair.src.precision, self.pair.dst.precision
        )


def _baselines(pair: Pair, specs: dict[str, GpuSpec]) -> tuple[float, float]:
    from kplan.planner.devices import peak_tflops

    s, d = specs[pair.src.gpu], specs[pair.dst.gpu]
    peak = math.log(peak_tflops(s, pair.src.precision) / peak_tflops(d, pair.dst.precision))
    bw = math.log(s.mem_bw_gbs / d.mem_bw_gbs)
    return peak - pair.log_ratio, bw - pair.log_ratio


def fold_key(s: Sample, by: str) -> str:
    """What a fold holds out of ``s``: its GPU, its model family, or its GPU's die."""
    if by == "die":
        return DIES.get(s.gpu, s.gpu)
    return str(getattr(s, by))


def held_out(data: Dataset, by: str) -> list[Prediction]:
    """Leave one GPU out (``by="gpu"``), one model family out (``by="model"``) or one GPU die
    out (``by="die"``: a GPU's twins on the same die, e.g. V100 16 and 32 GB, leave with it).

    Each fold fits on the pairs without the held-out GPU/model/die and predicts every cross-GPU
    pair involving it (and, leaving a model out, its cross-precision pairs too). Leaving a die
    out, a pair that also changes precision across GPUs (FP32 on one, TF32 on the other) is
    judged only if the fold's training pairs have such a pair: otherwise nothing in the fit
    ties the TF32 peak to the FP32 one (all TF32 rows are on GA100 parts, all pairs from FP32
    to TF32 have a GV100 part on the other side).
    """
    pairs = make_pairs(data.samples)
    keys = sorted({fold_key(s, by) for s in data.samples})
    out = []
    for key in keys:

        def involved(p: Pair, key: str = key) -> bool:
            return fold_key(p.src, by) == key or fold_key(p.dst, by) == key

        train = [p for p in pairs if not involved(p)]
        test = [p for p in pairs if involved(p) and (p.cross_gpu or by == "model")]
        if by == "die" and not any(_changes_unit(p, data.specs) for p in train):
            test = [p for p in test if not _changes_unit(p, data.specs)]
        if not test:
            continue
        model = as_model(fit_theta(train, data.specs))
        for p in test:
            pk, bw = _baselines(p, data.specs)
            out.append(
                Prediction(
                    p,
                    key,
                    predict(model, p, data.specs) - p.log_ratio,
                    pk,
                    bw,
                    spec_distance(
                        data.specs[p.src.gpu],
                        data.specs[p.dst.gpu],
                        p.src.precision,
                        p.dst.precision,
                    ),
                    data.specs[p.src.gpu],
                    data.specs[p.dst.gpu],
                )
            )
    return out


def _changes_unit(p: Pair, specs: dict[str, GpuSpec]) -> bool:
    """A cross-GPU pair run in another effective precision on each side (FP32 <-> TF32)."""
    return p.cross_gpu and is_projection(
        specs[p.src.gpu], specs[p.dst.gpu], p.src.precision, p.dst.precision
    )


def fit_sigma(preds: Sequence[Prediction]) -> dict[str, Any]:
    """Sigma of log error from held-out residuals.

    Cross-GPU pairs in one precision: ``sigma(d) = base + per_distance * d`` per destination
    precision family, from a least-squares fit of ``sqrt(pi/2) * |residual|`` on the spec
    distance ``d`` (``E|r| = sigma * sqrt(2/pi)`` for a normal error). Cross-GPU pairs that also
    change precision within a family (FP32 on one GPU, TF32 on the other): the term ``e`` that,
    added in quadrature, gives ``E|r / sqrt(sigma(d)^2 + e^2)| = sqrt(2/pi)``. Same-GPU
    projections to another precision: the RMS residual per destination precision family.
    """
    from sklearn.linear_model import LinearRegression

    out: dict[str, Any] = {"cross_gpu": {}, "cross_precision": {}, "cross_gpu_projection": {}}
    for family in ("full", "mixed"):
        cross = [p for p in preds if p.pair.cross_gpu and _family(p.pair.dst.precision) == family]
        sel = [p for p in cross if not p.projected] or cross
        if len(sel) >= 3:
            x = np.array([[p.distance] for p in sel])
            y = math.sqrt(math.pi / 2) * np.abs([p.residual for p in sel])
            reg = LinearRegression().fit(x, y)
            base, slope = float(reg.intercept_), float(reg.coef_[0])
            if slope < 0 or base < 0:  # no distance trend the data supports: a constant
                base, slope = float(np.sqrt(np.mean(np.square([p.residual for p in sel])))), 0.0
            out["cross_gpu"][family] = {"base": round(base, 4), "per_distance": round(slope, 4)}
            both = [p for p in cross if p.projected]
            if len(both) >= 3 and len(sel) < len(cross):
                g = np.array([base + slope * p.distance for p in both])
                r = np.abs([p.residual for p in both])
                out["cross_gpu_projection"][family] = round(_extra_sigma(r, g), 4)
        same = [
            p for p in preds if not p.pair.cross_gpu and _family(p.pair.dst.precision) == family
        ]
        if same:
            rms = float(np.sqrt(np.mean(np.square([p.residual for p in same]))))
            out["cross_precision"][family] = round(rms, 4)
    return out


def _extra_sigma(r: NDArray[np.float64], g: NDArray[np.float64]) -> float:
    """``e >= 0`` with ``mean(r / sqrt(g^2 + e^2)) = sqrt(2/pi)`` (bisection; 0 if ``g`` alone
    already covers ``r``)."""
    target = math.sqrt(2.0 / math.pi)

    def z(e: float) -> float:
        return float(np.mean(r / np.sqrt(g**2 + e**2)))

    if z(0.0) <= target:
        return 0.0
    lo, hi = 0.0, 10.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if z(mid) > target else (lo, mid)
    return 0.5 * (lo + hi)


def sigma_of(sigma: dict[str, Any], pred: Prediction) -> float:
    """The sigma a model with ``sigma`` tables states for ``pred``'s pair: the planner's own
    ``held_out_sigma``, as ``compute_scale`` applies it."""
    return held_out_sigma(
        sigma,
        pred.src_spec,
        pred.dst_spec,
        pred.pair.src.precision,
        pred.pair.dst.precision,
        pred.projected,
    )


def calibration(preds: Sequence[Prediction], precision: str | None = None) -> dict[str, float]:
    """Nested: each fold's sigma is fitted on the other folds' residuals only (all of them);
    ``precision``: judge only the pairs with that destination precision."""
    within = below = 0
    n = 0
    for fold in sorted({p.fold for p in preds}):
        others = fit_sigma([p for p in preds if p.fold != fold])
        judged = (q for q in preds if q.fold == fold)
        for p in (q for q in judged if precision in (None, q.pair.dst.precision)):
            if not p.pair.cross_gpu and not others["cross_precision"]:
                continue
            s = sigma_of(others, p)
            # residual = log(pred/measured): measured within pred*exp(+-s) <=> |r| <= s;
            # measured at or below p90 = pred*exp(1.2816 s) <=> -r <= 1.2816 s.
            within += abs(p.residual) <= s
            below += -p.residual <= 1.2816 * s
            n += 1
    return {
        "within_1_sigma": round(within / n, 4) if n else math.nan,
        "at_or_below_p90": round(below / n, 4) if n else math.nan,
        "n_pairs": n,
    }


def coverage(preds: Sequence[Prediction], sigma: dict[str, Any]) -> dict[str, float]:
    """Share of ``preds`` whose measured time falls within +-1 ``sigma`` and at or below the
    p90 that ``sigma`` states (not nested: for predictions the sigma was not fitted on)."""
    s = np.array([sigma_of(sigma, p) for p in preds])
    r = np.array([p.residual for p in preds])
    n = len(r)
    return {
        "within_1_sigma": round(float(np.mean(np.abs(r) <= s)), 4) if n else math.nan,
        "at_or_below_p90": round(float(np.mean(-r <= 1.2816 * s)), 4) if n else math.nan,
        "n_pairs": n,
    }


def summary(residual: Sequence[float]) -> dict[str, float]:
    r = np.asarray(residual, dtype=np.float64)
    if not len(r):
        return {"n_pairs": 0}
    ape = np.abs(np.expm1(r))
    return {
        "mape": round(float(ape.mean()), 4),
        "median_ape": round(float(np.median(ape)), 4),
        "rms_log": round(float(np.sqrt(np.mean(r**2))), 4),
        "n_pairs": len(r),
    }


def table(preds: Sequence[Prediction], group: str) -> dict[str, dict[str, dict[str, float]]]:
    """Error summaries of kplan and both baselines, per group (``precision``, ``fold``, ``all``)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    keys: dict[str, list[Prediction]] = {}
    for p in preds:
        k = {"precision": p.pair.dst.precision, "fold": p.fold, "all": "all"}[group]
        keys.setdefault(k, []).append(p)
    for k, sel in sorted(keys.items()):
        out[k] = {
            "kplan": summary([p.residual for p in sel]),
            "peak_ratio": summary([p.peak_residual for p in sel]),
            "bandwidth_ratio": summary([p.bw_residual for p in sel]),
        }
    return out


# -------------------------------------------------------------------------------- the fit


def one_precision(data: Dataset) -> Dataset:
    """The data as a one-precision profile sees it: no workload has a measured precision ratio
    (what ``kplan estimate`` has from one profile)."""
    return Dataset(data.specs, [dataclasses.replace(s, alt=None) for s in data.samples])


def one_precision_folds(
    data: Dataset,
) -> tuple[list[Prediction], list[Prediction], list[Prediction]]:
    """Held-out predictions from one-precision profiles (the planner's default; a second
    profile only lowers the error): leaving one GPU out (cross-GPU pairs), one model out
    (cross-GPU pairs and same-GPU projections) and one GPU die out (cross-GPU pairs)."""
    one = one_precision(data)
    return (
        [p for p in held_out(one, "gpu") if p.pair.cross_gpu],
        held_out(one, "model"),
        [p for p in held_out(one, "die") if p.pair.cross_gpu],
    )


def sigma_residuals(data: Dataset) -> list[Prediction]:
    """The held-out predictions the shipped sigma is fitted on: all of ``one_precision_folds``.
    The die folds are there because most GPUs a user asks about have no twin in the data (a
    GPU fold keeps the held-out GPU's twin on the same die in the fit)."""
    logo, lomo, die = one_precision_folds(data)
    return logo + lomo + die


def fit_document(data: Dataset) -> dict[str, Any]:
    """Fit on every pair; held-out errors and sigmas from leave-one-GPU/model/die-out folds."""
    theta = fit_theta(make_pairs(data.samples), data.specs)
    logo = held_out(data, "gpu")
    lomo = held_out(data, "model")
    logo_x = [p for p in logo if p.pair.cross_gpu]
    lomo_x = [p for p in lomo if p.pair.cross_gpu]
    one_logo, one_lomo_all, one_die = one_precision_folds(data)
    one_lomo = [p for p in one_lomo_all if p.pair.cross_gpu]
    sigma = fit_sigma(one_logo + one_lomo_all + one_die)
    die = [p for p in held_out(data, "die") if p.pair.cross_gpu]
    held = {
        "metric": "APE = |predicted / measured - 1| of the destination's step time over ordered "
        "pairs of the same job (model, batch, GPU count) on two GPUs (same precision family) or "
        "two precisions on one GPU; residual = log(predicted / measured)",
        "leave_one_gpu_out": {
            "all": table(logo_x, "all")["all"],
            "per_precision": table(logo_x, "precision"),
            "per_gpu": table(logo_x, "fold"),
            "calibration": calibration(logo_x),
        },
        "leave_one_model_out": {
            "all": table(lomo_x, "all")["all"],
            "per_precision": table(lomo_x, "precision"),
            "cross_precision_same_gpu": summary([p.residual for p in lomo if not p.pair.cross_gpu]),
            "calibration": calibration(lomo_x),
        },
        "leave_one_die_out": {
            "note": "stricter: a GPU's twins on the same die leave with it; FP32 <-> TF32 "
            "pairs not judged (no fold keeps a pair to fit them on)",
            "per_precision": table(die, "precision"),
            "per_die": table(die, "fold"),
            "calibration": calibration(die),
        },
        "one_precision_profile": {
            "leave_one_gpu_out": table(one_logo, "precision"),
            "leave_one_model_out": table(one_lomo, "precision"),
            "calibration": {"leave_one_gpu_out": calibration(one_logo)},
        },
    }
    model = as_model(
        theta,
        digits=6,
        fitted_on=tuple(sorted({s.gpu for s in data.samples})),
        source=SOURCE,
        sigma=sigma,
        held_out_error=held,
    )
    return model.to_dict()


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
    logo = doc["held_out_error"]["leave_one_gpu_out"]["all"]
    print(f"wrote {args.out}: compute {doc['compute_weight']}, memory {doc['memory_weight']}")
    print(
        f"leave-one-GPU-out MAPE: kplan {logo['kplan']['mape']:.1%}, peak ratio "
        f"{logo['peak_ratio']['mape']:.1%}, bandwidth ratio {logo['bandwidth_ratio']['mape']:.1%}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
